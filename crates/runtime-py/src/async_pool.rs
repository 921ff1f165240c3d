//! The `MemoryAsyncPool` class: a handle to a device's async pool (the core's
//! `memory::async_pool`), in CuPy's `MemoryAsyncPool` shape with CUDA's memory-pool
//! attributes (`cudaMemPoolAttrReleaseThreshold`, `…ReservedMemCurrent/High`,
//! `…UsedMemCurrent/High`, `cudaMemPoolTrimTo`). Every handle to one device's pool shows the
//! same numbers.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use runtime_core::device::Device;
use runtime_core::runtime as rt;

use crate::context;
use crate::convert::{nonneg, resolve, stream_arg};
use crate::errors::RtErr;
use crate::handles::{PyDevice, PyDeviceBuffer};

/// A device's async pool: `malloc` in stream order; memory returns to the pool in stream
/// order with `free` (`free_async`), or when the buffer's last handle goes.
#[pyclass(name = "MemoryAsyncPool", module = "runtime", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash)]
pub struct PyMemoryAsyncPool {
    device: usize,
}

impl PyMemoryAsyncPool {
    fn dev(&self) -> PyResult<Device> {
        Ok(rt::get()
            .map_err(RtErr)?
            .device(self.device)
            .map_err(RtErr)?
            .clone())
    }

    /// A `ValueError` unless `s` is on the pool's device.
    fn check_stream(&self, s: &runtime_core::stream::Stream) -> PyResult<()> {
        if s.device_index() != self.device {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "stream: {s:?} is on device {}, this pool on device {}",
                s.device_index(),
                self.device
            )));
        }
        Ok(())
    }

    /// `stream`, or the current stream of the pool's device.
    fn stream(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<runtime_core::stream::Stream> {
        match stream_arg(stream)? {
            Some(s) => Ok(s),
            None => context::stream(py, &self.dev()?),
        }
    }
}

#[pymethods]
impl PyMemoryAsyncPool {
    /// The async pool of `device` (the current device when None).
    #[new]
    #[pyo3(signature = (device=None))]
    fn new(py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        Ok(PyMemoryAsyncPool {
            device: resolve(py, device, "device")?.index(),
        })
    }

    /// The pool's device.
    #[getter]
    fn device(&self) -> PyDevice {
        PyDevice::from_index(self.device)
    }

    /// Allocate `size` bytes in the order of `stream` (the device's current stream when
    /// None): `cudaMallocAsync`. Never waits.
    #[pyo3(signature = (size, stream=None))]
    fn malloc(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyDeviceBuffer> {
        let size = nonneg(size, "size")?;
        let s = self.stream(py, stream)?;
        self.check_stream(&s)?;
        let b = py.detach(|| s.malloc_async(size)).map_err(RtErr)?;
        Ok(PyDeviceBuffer::raw(b))
    }

    /// Free `buf` in the order of `stream` (the device's current stream when None):
    /// `cudaFreeAsync`. Never waits.
    #[pyo3(signature = (buf, stream=None))]
    fn free(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let h = crate::convert::buffer_arg(buf, "buf")?.get();
        let s = self.stream(py, stream)?;
        h.free_with(py, "MemoryAsyncPool.free()", |b| s.free_async(b))
    }

    /// Bytes of blocks handed out and not freed (`cudaMemPoolAttrUsedMemCurrent`).
    fn used_bytes(&self) -> PyResult<u64> {
        Ok(self.dev()?.memory().async_pool_stats().used)
    }

    /// Bytes of the blocks the pool holds, in use or free
    /// (`cudaMemPoolAttrReservedMemCurrent`).
    fn total_bytes(&self) -> PyResult<u64> {
        Ok(self.dev()?.memory().async_pool_stats().reserved)
    }

    /// Bytes of free blocks (`total_bytes() - used_bytes()`).
    fn free_bytes(&self) -> PyResult<u64> {
        Ok(self.dev()?.memory().async_pool_stats().free)
    }

    /// Free blocks held.
    fn n_free_blocks(&self) -> PyResult<u64> {
        Ok(self.dev()?.memory().async_pool_stats().free_blocks)
    }

    /// Give free blocks back to the device; never waits (a block still used by work queued
    /// before its free stays mapped until that work ran). `stream=None`: every free block
    /// (`cudaMemPoolTrimTo(pool, 0)`); a stream: only the blocks freed on it (CuPy's
    /// `free_all_blocks(stream=)`, that stream's arena), those of other streams stay pooled.
    #[pyo3(signature = (stream=None))]
    fn free_all_blocks(&self, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        match stream_arg(stream)? {
            None => {
                self.dev()?.memory().trim_async_pool_to(0);
            }
            Some(s) => {
                self.check_stream(&s)?;
                s.release_async_free_blocks().map_err(RtErr)?;
            }
        }
        Ok(())
    }

    /// CuPy's deprecated name of `free_all_blocks()` (warns `DeprecationWarning`).
    fn free_all_free(&self, py: Python<'_>) -> PyResult<()> {
        crate::errors::deprecated_free_all_free(py)?;
        self.free_all_blocks(None)
    }

    /// Give free blocks back until at most `min_bytes_to_keep` free bytes remain
    /// (`cudaMemPoolTrimTo`); returns how many blocks went.
    fn trim_to(&self, min_bytes_to_keep: &Bound<'_, PyAny>) -> PyResult<usize> {
        let keep = nonneg(min_bytes_to_keep, "min_bytes_to_keep")?;
        Ok(self.dev()?.memory().trim_async_pool_to(keep))
    }

    /// Free bytes the pool keeps across synchronisations (`cudaMemPoolAttrReleaseThreshold`;
    /// 0 by default: every stream or device synchronisation gives free blocks back).
    #[getter]
    fn release_threshold(&self) -> PyResult<u64> {
        Ok(self.dev()?.memory().async_pool_stats().release_threshold)
    }

    #[setter]
    fn set_release_threshold(&self, bytes: &Bound<'_, PyAny>) -> PyResult<()> {
        let b = nonneg(bytes, "release_threshold")?;
        self.dev()?.memory().set_async_release_threshold(b);
        Ok(())
    }

    /// The pool's numbers as a dict: `reserved_mem_current`, `reserved_mem_high`,
    /// `used_mem_current`, `used_mem_high`, `free_bytes`, `free_blocks`, `release_threshold`,
    /// `num_allocs`, `num_frees`, `reuse_same_stream`, `reuse_other_stream`, `released`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.dev()?.memory().async_pool_stats();
        let d = PyDict::new(py);
        d.set_item("reserved_mem_current", s.reserved)?;
        d.set_item("reserved_mem_high", s.reserved_high)?;
        d.set_item("used_mem_current", s.used)?;
        d.set_item("used_mem_high", s.used_high)?;
        d.set_item("free_bytes", s.free)?;
        d.set_item("free_blocks", s.free_blocks)?;
        d.set_item("release_threshold", s.release_threshold)?;
        d.set_item("num_allocs", s.num_allocs)?;
        d.set_item("num_frees", s.num_frees)?;
        d.set_item("reuse_same_stream", s.reuse_same_stream)?;
        d.set_item("reuse_other_stream", s.reuse_other_stream)?;
        d.set_item("released", s.released)?;
        Ok(d)
    }

    /// Reset the high-water marks to the current values.
    fn reset_peak_stats(&self) -> PyResult<()> {
        self.dev()?.memory().reset_async_pool_peaks();
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("runtime.MemoryAsyncPool(device={})", self.device)
    }
}
