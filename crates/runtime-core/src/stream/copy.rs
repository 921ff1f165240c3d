//! Stream-ordered copies and memsets between host memory and device buffers.
//!
//! Host memory is anything that implements [`HostMemory`]: the Python bindings wrap an
//! exported buffer-protocol object, so the host object stays alive (and pinned) until the copy
//! has run. All ranges are checked when the copy is queued; nothing is written when a check
//! fails.

use std::sync::Arc;

use crate::error::{arg_error, KernelFailure, MemoryError, Result};
use crate::memory::{Buffer, Element};
use crate::stream::{FnOp, Op, OpKind, Stream};

/// Host memory a copy may read, and write if [`HostMemory::as_mut_ptr`] says so.
///
/// # Safety
/// `as_ptr()` must be valid for reads of `len()` bytes, and `as_mut_ptr()` (when `Some`) for
/// writes of `len()` bytes, for as long as the object lives; the memory must not be a device
/// buffer's.
pub unsafe trait HostMemory: Send + Sync {
    /// Start of the memory.
    fn as_ptr(&self) -> *const u8;
    /// Writable start, or `None` for read-only memory.
    fn as_mut_ptr(&self) -> Option<*mut u8>;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the memory is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn host_range(arg: &'static str, len: usize, offset: u64, count: u64) -> Result<()> {
    match offset.checked_add(count) {
        Some(end) if end <= len as u64 => Ok(()),
        _ => Err(MemoryError::OutOfBounds {
            arg,
            offset,
            count,
            size: len as u64,
            what: "host buffer",
        }
        .into()),
    }
}

fn fail(name: &str) -> impl Fn(crate::error::Error) -> KernelFailure + '_ {
    move |e| KernelFailure::new(name, e.to_string())
}

/// A host-to-device copy of `count` bytes as a stream op. Ranges are checked now.
pub fn h2d(
    dst: &Buffer,
    dst_off: u64,
    src: Arc<dyn HostMemory>,
    src_off: u64,
    count: u64,
) -> Result<Arc<dyn Op>> {
    dst.check_range("dst_offset", dst_off, count)?;
    host_range("src_offset", src.len(), src_off, count)?;
    let dst = dst.clone();
    Ok(FnOp::shared("memcpy_h2d", OpKind::Copy, move || {
        // SAFETY: the range was checked against `src.len()`; `src` is alive (owned by this op).
        unsafe { dst.write_raw(dst_off, src.as_ptr().add(src_off as usize), count as usize) }
            .map_err(fail("memcpy_h2d"))
    }))
}

/// A device-to-host copy as a stream op. The host memory must be writable.
pub fn d2h(
    dst: Arc<dyn HostMemory>,
    dst_off: u64,
    src: &Buffer,
    src_off: u64,
    count: u64,
) -> Result<Arc<dyn Op>> {
    if dst.as_mut_ptr().is_none() {
        return Err(arg_error("dst", "the host destination is read-only"));
    }
    host_range("dst_offset", dst.len(), dst_off, count)?;
    src.check_range("src_offset", src_off, count)?;
    let src = src.clone();
    Ok(FnOp::shared("memcpy_d2h", OpKind::Copy, move || {
        let p = dst.as_mut_ptr().expect("checked writable");
        // SAFETY: the range was checked against `dst.len()`; `dst` is alive (owned by this op).
        unsafe { src.read_raw(src_off, p.add(dst_off as usize), count as usize) }
            .map_err(fail("memcpy_d2h"))
    }))
}

/// A device-to-device copy (any two devices) as a stream op.
pub fn d2d(
    dst: &Buffer,
    dst_off: u64,
    src: &Buffer,
    src_off: u64,
    count: u64,
) -> Result<Arc<dyn Op>> {
    dst.check_range("dst_offset", dst_off, count)?;
    src.check_range("src_offset", src_off, count)?;
    let (dst, src) = (dst.clone(), src.clone());
    Ok(FnOp::shared("memcpy_d2d", OpKind::Copy, move || {
        dst.copy_from(dst_off, &src, src_off, count)
            .map_err(fail("memcpy_d2d"))
    }))
}

/// A memset of `count` bytes to `value` as a stream op.
pub fn memset(dst: &Buffer, offset: u64, count: u64, value: u8) -> Result<Arc<dyn Op>> {
    dst.check_range("offset", offset, count)?;
    let dst = dst.clone();
    Ok(FnOp::shared("memset", OpKind::Copy, move || {
        dst.fill(offset, count, value).map_err(fail("memset"))
    }))
}

/// Host memory owned by a `Vec<u8>` behind a lock-free cell, for Rust callers and tests.
pub struct HostVec {
    data: std::cell::UnsafeCell<Vec<u8>>,
}

// SAFETY: the bytes are only accessed through raw pointers by stream ops, whose ordering the
// caller establishes with synchronisation, exactly as for device memory.
unsafe impl Sync for HostVec {}

impl HostVec {
    /// Wrap a vector.
    pub fn new(v: Vec<u8>) -> Arc<HostVec> {
        Arc::new(HostVec {
            data: std::cell::UnsafeCell::new(v),
        })
    }

    /// Take the bytes back (after the copies that use them have completed).
    pub fn into_inner(self: Arc<Self>) -> Option<Vec<u8>> {
        Arc::into_inner(self).map(|h| h.data.into_inner())
    }
}

// SAFETY: the vector is never resized while shared, so the pointer stays valid for `len`.
unsafe impl HostMemory for HostVec {
    fn as_ptr(&self) -> *const u8 {
        // SAFETY: reading the vector's pointer; it is never resized while shared.
        unsafe { (*self.data.get()).as_ptr() }
    }
    fn as_mut_ptr(&self) -> Option<*mut u8> {
        // SAFETY: as above.
        Some(unsafe { (*self.data.get()).as_mut_ptr() })
    }
    fn len(&self) -> usize {
        // SAFETY: as above.
        unsafe { (*self.data.get()).len() }
    }
}

impl Stream {
    /// Copy `src` into `dst` at byte `offset`, in stream order. The values are staged first,
    /// so this returns as soon as `src` may be reused (CUDA's rule for pageable host
    /// memory); the copy itself runs when the stream gets there.
    ///
    /// # Errors
    /// The range does not fit in `dst` (nothing is queued); stream errors as for
    /// [`Stream::launch`].
    pub fn copy_from_host<T: Element>(&self, dst: &Buffer, offset: u64, src: &[T]) -> Result<()> {
        let staged = HostVec::new(T::as_bytes(src).to_vec());
        let len = staged.len() as u64;
        self.launch(h2d(dst, offset, staged, 0, len)?)
    }

    /// Copy from `src` at byte `offset` into `dst` after the work queued so far on this
    /// stream, and wait for it (run at once when the stream is idle). Like any
    /// synchronisation it reports an error the stream's earlier work raised.
    ///
    /// # Errors
    /// The range does not fit in `src`; the stream is capturing (`Capturing`); the stream's
    /// pending error.
    pub fn copy_to_host<T: Element>(&self, src: &Buffer, offset: u64, dst: &mut [T]) -> Result<()> {
        let len = size_of_val(dst) as u64;
        let staged = HostVec::new(vec![0u8; len as usize]);
        let op = d2h(staged.clone(), 0, src, offset, len)?;
        if self.try_run_inline(&op)? {
            drop(op);
        } else {
            // The runner drops a command before counting it complete, so after the wait
            // below the staging buffer has no other owner.
            self.enqueue(op)?;
        }
        self.synchronize(None)?;
        let bytes = staged
            .into_inner()
            .ok_or_else(|| arg_error("dst", "the staging buffer is still in use"))?;
        T::as_bytes_mut(dst).copy_from_slice(&bytes);
        Ok(())
    }
}
