//! Devices: the `Device` class, the property records (`DeviceProperties`, `MemoryInfo`,
//! `ComputeInfo`), and the device functions (`get_device_*`, `set_device`, `get_device`).

use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use runtime_core::runtime as rt;

use crate::context;
use crate::convert::{device_arg, device_at, resolve, resolve_required, timeout_obj};
use crate::errors::{RtErr, RtResult};
use crate::handles::PyDevice;
use crate::wait;

/// Defines an immutable record class: getters, `repr`, `==`, `to_dict()`, and `keys()` +
/// `__getitem__` so that `dict(record)` works.
macro_rules! record {
    ($(#[$doc:meta])* $name:ident, $pyname:literal { $($(#[$fdoc:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[pyclass(name = $pyname, module = "runtime", frozen, eq, get_all)]
        #[derive(Clone, PartialEq)]
        pub struct $name { $($(#[$fdoc])* pub $field: $ty),* }

        #[pymethods]
        impl $name {
            fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                let d = PyDict::new(py);
                $(d.set_item(stringify!($field), self.$field.clone())?;)*
                Ok(d)
            }
            fn keys(&self) -> Vec<&'static str> {
                vec![$(stringify!($field)),*]
            }
            fn __getitem__<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
                self.to_dict(py)?.get_item(key)?.ok_or_else(|| PyKeyError::new_err(key.to_string()))
            }
            fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
                let d = self.to_dict(py)?;
                let mut parts = Vec::new();
                for (k, v) in d.iter() {
                    parts.push(format!("{}={}", k, v.repr()?));
                }
                Ok(format!("{}({})", $pyname, parts.join(", ")))
            }
        }
    };
}

record!(
    /// What a device reports about itself.
    DeviceProperties, "DeviceProperties" {
        index: usize, name: String, total_memory: u64, clock_rate: u64, cores: u32,
        fpeak: f64, memory_bandwidth: f64, profile: String,
        /// Stable per profile and index: `uuid.uuid5(uuid.NAMESPACE_URL, f"runtime://{profile}/{index}")`.
        uuid: String,
    }
);

record!(
    /// Memory of one device in bytes: `used` (live allocations) + `cached` + `free` == `total`;
    /// `reserved` = `used` + `cached`; `peak` is the highest `used` since the last reset.
    MemoryInfo, "MemoryInfo" {
        device: usize, total: u64, used: u64, free: u64, reserved: u64, cached: u64, peak: u64,
    }
);

record!(
    /// Compute capability of one device.
    ComputeInfo, "ComputeInfo" {
        device: usize, fpeak: f64, cores: u32, clock_rate: u64, compute_engines: usize,
    }
);

#[pymethods]
impl PyDevice {
    #[new]
    fn new(index: &Bound<'_, PyAny>) -> PyResult<Self> {
        let d = resolve_required(index, "index")?;
        Ok(PyDevice { index: d.index() })
    }

    /// Properties of this device.
    fn get_properties(&self) -> PyResult<DeviceProperties> {
        get_device_properties_impl(self.index as i64)
    }

    /// Memory usage of this device.
    fn get_memory_info(&self) -> PyResult<MemoryInfo> {
        memory_info_impl(self.index as i64)
    }

    /// Wait for every stream of this device (GIL released, Ctrl-C works).
    #[pyo3(signature = (timeout=None))]
    fn synchronize(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let timeout = timeout_obj(timeout)?;
        let d = device_at(self.index as i64)?;
        wait::wait_result(
            py,
            || format!("Device({})", self.index),
            timeout,
            |slice| runtime_core::bindings::device_wait(&d, Some(slice)),
        )
    }

    /// Make this device current for the block (in this thread or asyncio task only); restored
    /// on exit. The current streams stay as they were.
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let d = device_at(slf.get().index as i64)?;
        context::enter(slf.py(), &d, None)?;
        Ok(slf)
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        context::exit(py)
    }

    fn __repr__(&self) -> String {
        format!("runtime.Device({})", self.index)
    }

    fn __int__(&self) -> usize {
        self.index
    }

    fn __index__(&self) -> usize {
        self.index
    }
}

fn get_device_properties_impl(i: i64) -> PyResult<DeviceProperties> {
    let d = device_at(i)?;
    let p = d.properties();
    Ok(DeviceProperties {
        index: p.index,
        name: p.name.clone(),
        total_memory: p.total_memory,
        clock_rate: p.clock_rate,
        cores: p.cores,
        fpeak: p.fpeak,
        memory_bandwidth: p.memory_bandwidth,
        profile: p.profile.clone(),
        uuid: p.uuid.clone(),
    })
}

fn memory_info_impl(i: i64) -> PyResult<MemoryInfo> {
    let d = device_at(i)?;
    let s = d.memory().stats();
    Ok(MemoryInfo {
        device: d.index(),
        total: s.total,
        used: s.allocated,
        free: s.free,
        reserved: s.reserved,
        cached: s.cached,
        peak: s.peak_allocated,
    })
}

#[pyfunction]
pub fn get_device_count() -> RtResult<usize> {
    Ok(rt::get()?.devices().len())
}

/// All devices.
#[pyfunction]
pub fn get_available_devices() -> RtResult<Vec<PyDevice>> {
    Ok(rt::get()?
        .devices()
        .iter()
        .map(|d| PyDevice::from_index(d.index()))
        .collect())
}

/// Properties of device `device` (a Device or an int; the current device when None).
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn get_device_properties(
    py: Python<'_>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<DeviceProperties> {
    get_device_properties_impl(resolve(py, device, "device")?.index() as i64)
}

/// Memory usage of device `device` (the current device when None).
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn get_device_memory_info(
    py: Python<'_>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<MemoryInfo> {
    memory_info_impl(resolve(py, device, "device")?.index() as i64)
}

/// Compute capability of device `device` (the current device when None).
#[pyfunction]
#[pyo3(signature = (device=None))]
pub fn get_device_compute_info(
    py: Python<'_>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<ComputeInfo> {
    let d = resolve(py, device, "device")?;
    let c = d.compute_info();
    Ok(ComputeInfo {
        device: d.index(),
        fpeak: c.fpeak,
        cores: c.cores,
        clock_rate: c.clock_rate,
        compute_engines: c.compute_engines,
    })
}

/// Make `device` the calling thread's current device. Inside a `with` (stream or device) it is
/// current for the rest of that block, and the block's exit restores the device from before it.
#[pyfunction]
pub fn set_device(py: Python<'_>, device: &Bound<'_, PyAny>) -> PyResult<()> {
    let d = device_at(device_arg(device, "device")?)?;
    if !context::set_device(py, &d)? {
        rt::set_device(d.index()).map_err(RtErr)?;
    }
    Ok(())
}

/// The current device index: the innermost `with`'s in this thread or task, else the
/// thread's (`set_device`, default 0).
#[pyfunction]
pub fn get_device(py: Python<'_>) -> PyResult<usize> {
    rt::get().map_err(RtErr)?;
    context::device_index(py)
}
