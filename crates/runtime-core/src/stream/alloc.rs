//! Stream-ordered allocation: [`Stream::malloc_async`] and [`Stream::free_async`] over the
//! device's async pool (`memory::async_pool`), and the zeroing op a reused block gets.
//!
//! Neither call waits for anything: a block freed on a stream is reused by later calls on the
//! same stream at once (the work using it runs first, in stream order), and by other streams
//! once the freeing stream has reached the free (read from two atomics). A reused block is
//! zeroed by an op queued on the stream ahead of the caller's work, so every allocation reads
//! zero in stream order, as `device_malloc`'s do.

use std::sync::Arc;

use super::command::{FnOp, OpKind};
use super::Stream;
use crate::error::{ArgError, DeviceError, KernelFailure, Result};
use crate::memory::access::Access;
use crate::memory::{Buffer, DeviceMemory, StreamFence};

impl Stream {
    /// The memory of this stream's device.
    fn device_memory(&self) -> Result<Arc<DeviceMemory>> {
        self.0.exec.memory().ok_or_else(|| {
            DeviceError::InvalidHandle {
                what: format!("{self:?}"),
                why: "its device's memory is gone".into(),
            }
            .into()
        })
    }

    /// Allocate `size` bytes on this stream's device in this stream's order (CUDA's
    /// `cudaMallocAsync`): usable by work queued on this stream from now on (and by other
    /// streams ordered after it with events). Never waits. The bytes read zero in stream order.
    ///
    /// # Errors
    /// `OutOfMemory`; `InvalidHandle` (destroyed stream, after shutdown); `Capturing` while
    /// the stream captures (a graph cannot own an allocation).
    pub fn malloc_async(&self, size: u64) -> Result<Buffer> {
        self.check()?;
        self.refuse_if_capturing("malloc_async()")?;
        let mem = self.device_memory()?;
        let fence: Arc<dyn StreamFence> = Arc::new(self.clone());
        let (buf, dirty) = mem.malloc_async(size, &fence)?;
        if dirty {
            // Queued ahead of the caller's work; a failure to queue drops the lease, whose
            // block goes back to the pool.
            self.enqueue(zero_op(&buf))?;
        }
        Ok(buf)
    }

    /// Free `buf` (from [`Stream::malloc_async`] on this device, any stream) in this stream's
    /// order (CUDA's `cudaFreeAsync`): work queued before this call may still use it; its
    /// block serves later `malloc_async` calls on this stream at once, and on other streams
    /// once this stream has run what is queued now. Never waits.
    ///
    /// # Errors
    /// `ArgError` (argument `buf`) for a buffer `malloc_async` did not make on this stream's
    /// device, or a view into one; `InvalidHandle` when it was freed already, or for a
    /// destroyed stream.
    pub fn free_async(&self, buf: &Buffer) -> Result<()> {
        self.check()?;
        if buf.device() != self.device_index() {
            return Err(ArgError::new(
                "buf",
                format!(
                    "{buf:?} is on device {}, but {self:?} is on device {}",
                    buf.device(),
                    self.device_index()
                ),
            )
            .into());
        }
        let mem = self.device_memory()?;
        mem.free_async(buf, Arc::new(self.clone()))
    }

    /// Give the free blocks of the device's async pool that were freed on this stream back to
    /// the device (CuPy's `free_all_blocks(stream=)`: this stream's arena only); returns how
    /// many went. Blocks freed on other streams stay pooled. Never waits: a block still used
    /// by work queued before its free stays mapped until that work has run.
    ///
    /// # Errors
    /// `InvalidHandle` for a destroyed stream or after shutdown.
    pub fn release_async_free_blocks(&self) -> Result<usize> {
        self.check()?;
        Ok(self.device_memory()?.trim_async_pool_of(self.id()))
    }
}

/// Zero a reused block in stream order (as the scrubber zeroes cached blocks).
fn zero_op(buf: &Buffer) -> Arc<dyn super::Op> {
    let b = buf.clone();
    FnOp::with_accesses(
        "malloc_async (zero a reused block)",
        OpKind::Copy,
        buf.access(Access::Write),
        move || {
            b.scrub()
                .map_err(|e| KernelFailure::new("malloc_async", e.to_string()))
        },
    )
}
