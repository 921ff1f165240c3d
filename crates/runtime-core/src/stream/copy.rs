//! Stream-ordered copies and memsets between host memory and device buffers, 1-D and 2-D
//! (pitched, [`Rect`]), and the prefetch marker of managed memory.
//!
//! Host memory is anything that implements [`HostMemory`]: the Python bindings wrap an
//! exported buffer-protocol object, so the host object stays alive until the copy has run;
//! [`PinnedBuffer`] is one too. All ranges are checked when the copy is queued; nothing is
//! written when a check fails.
//!
//! Host-to-device copies queued on a stream follow CUDA's rule ([`h2d_async`],
//! [`h2d_2d_async`]): from pinned memory ([`crate::memory::pinned`]) the command reads the host
//! bytes when it runs, holding the pinned block until it is done; from any other (pageable)
//! host memory the bytes are staged when the copy is queued, so the caller may reuse the
//! source as soon as the call returns. Blocking copies read the source directly (the caller
//! waits for them).

use std::sync::Arc;

use crate::error::{arg_error, KernelFailure, MemoryError, Result};
use crate::memory::access::{Access, AccessSet};
use crate::memory::managed::{self, Location};
use crate::memory::pinned::{self, PinnedBuffer};
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
    Ok(FnOp::with_accesses(
        "memcpy_h2d",
        OpKind::Copy,
        dst.access(Access::Write),
        move || {
            // SAFETY: the range was checked against `src.len()`; `src` is alive (owned by
            // this op) and host memory, never a device buffer's; the op holds `dst`'s
            // allocation exclusively while it runs.
            unsafe {
                dst.write_raw_unsynchronized(
                    dst_off,
                    src.as_ptr().add(src_off as usize),
                    count as usize,
                )
            }
            .map_err(fail("memcpy_h2d"))
        },
    ))
}

/// The pinned block holding `count` bytes of `src` at `src_off`, if `src` is pinned memory.
///
/// # Errors
/// The block was freed with `free_host`.
fn pinned_source(src: &dyn HostMemory, src_off: u64, count: u64) -> Result<Option<PinnedBuffer>> {
    let start = (src.as_ptr() as usize).wrapping_add(src_off as usize) as *const u8;
    match pinned::find(start, count as usize) {
        Some(p) => p.check().map(|()| Some(p)),
        None => Ok(None),
    }
}

/// Copy `count` bytes of `src` at `src_off` into a staging buffer now: a block of the pinned
/// cache up to [`STAGE_PINNED_MAX`] (as CUDA stages pageable memory through pinned buffers:
/// after the first copy of a size the block is reused, so staging costs one memcpy and no
/// page faults), else or when no pinned block can be mapped a vector.
fn stage(src: &dyn HostMemory, src_off: u64, count: u64) -> Arc<dyn HostMemory> {
    // SAFETY: the caller checked `[src_off, src_off + count)` against `src.len()`; `src` is
    // valid for reads of `len()` bytes while it lives (the `HostMemory` contract).
    let bytes =
        unsafe { std::slice::from_raw_parts(src.as_ptr().add(src_off as usize), count as usize) };
    if count <= STAGE_PINNED_MAX {
        if let Ok(block) = pinned::allocate(count) {
            if block.write(0, bytes).is_ok() {
                return Arc::new(block);
            }
        }
    }
    HostVec::new(bytes.to_vec())
}

/// Largest staging copy served from the pinned cache; larger ones use a plain vector, so a
/// one-off huge copy does not leave that much locked memory in the cache.
pub const STAGE_PINNED_MAX: u64 = 256 << 20;

/// A stream-ordered host-to-device copy (for a copy queued on a stream): from pinned memory
/// the op reads `src` when it runs and keeps the pinned block alive until then; from pageable
/// memory the bytes are staged now, so `src` may be reused once this returns.
///
/// # Errors
/// As [`h2d`]; the pinned source was freed (`InvalidHandle`).
pub fn h2d_async(
    dst: &Buffer,
    dst_off: u64,
    src: Arc<dyn HostMemory>,
    src_off: u64,
    count: u64,
) -> Result<Arc<dyn Op>> {
    dst.check_range("dst_offset", dst_off, count)?;
    host_range("src_offset", src.len(), src_off, count)?;
    match pinned_source(&*src, src_off, count)? {
        Some(block) => {
            let op = h2d(dst, dst_off, src, src_off, count)?;
            Ok(FnOp::with_accesses(
                "memcpy_h2d",
                OpKind::Copy,
                op.accesses().clone(),
                move || {
                    let _keep = &block;
                    op.run()
                },
            ))
        }
        None => h2d(dst, dst_off, stage(&*src, src_off, count), 0, count),
    }
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
    Ok(FnOp::with_accesses(
        "memcpy_d2h",
        OpKind::Copy,
        src.access(Access::Read),
        move || {
            let p = dst.as_mut_ptr().expect("checked writable");
            // SAFETY: the range was checked against `dst.len()`; `dst` is alive (owned by
            // this op) and host memory, never a device buffer's; the op holds `src`'s
            // allocation while it runs, so nothing writes it meanwhile.
            unsafe { src.read_raw_unsynchronized(src_off, p.add(dst_off as usize), count as usize) }
                .map_err(fail("memcpy_d2h"))
        },
    ))
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
    let uses = AccessSet::new([(&dst, Access::Write), (&src, Access::Read)]);
    Ok(FnOp::with_accesses(
        "memcpy_d2d",
        OpKind::Copy,
        uses,
        move || {
            dst.copy_from(dst_off, &src, src_off, count)
                .map_err(fail("memcpy_d2d"))
        },
    ))
}

/// A memset of `count` bytes to `value` as a stream op.
pub fn memset(dst: &Buffer, offset: u64, count: u64, value: u8) -> Result<Arc<dyn Op>> {
    dst.check_range("offset", offset, count)?;
    let dst = dst.clone();
    Ok(FnOp::with_accesses(
        "memset",
        OpKind::Copy,
        dst.access(Access::Write),
        move || dst.fill(offset, count, value).map_err(fail("memset")),
    ))
}

/// The shape of a 2-D (pitched) copy, as `cudaMemcpy2D` takes it: `height` rows of `width`
/// bytes; row `i` starts at `dst_off + i * dpitch` in the destination and at
/// `src_off + i * spitch` in the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rect {
    /// Byte offset of the first destination row.
    pub dst_off: u64,
    /// Bytes between destination rows.
    pub dpitch: u64,
    /// Byte offset of the first source row.
    pub src_off: u64,
    /// Bytes between source rows.
    pub spitch: u64,
    /// Bytes per row.
    pub width: u64,
    /// Rows.
    pub height: u64,
}

impl Rect {
    /// Bytes from the first row's start to the last row's end (0 for an empty copy).
    fn span(pitch: u64, width: u64, height: u64) -> Option<u64> {
        if width == 0 || height == 0 {
            return Some(0);
        }
        (height - 1).checked_mul(pitch)?.checked_add(width)
    }

    /// Whether the copy moves no bytes.
    pub fn is_empty(&self) -> bool {
        self.width == 0 || self.height == 0
    }

    /// Check the copy against the pitches and against a destination of `dst_len` bytes and a
    /// source of `src_len` bytes (`dst_what`/`src_what` name them in errors), as
    /// `cudaMemcpy2D` does: `width` may not exceed either pitch, and every row must lie inside
    /// its end.
    ///
    /// # Errors
    /// An argument error naming `width` and the pitch, or `dst`/`src` and the numbers.
    pub fn check(&self, dst_len: u64, dst_what: &str, src_len: u64, src_what: &str) -> Result<()> {
        let Rect {
            dst_off,
            dpitch,
            src_off,
            spitch,
            width,
            height,
        } = *self;
        for (pitch, name) in [(dpitch, "dpitch"), (spitch, "spitch")] {
            if width > pitch {
                return Err(arg_error(
                    "width",
                    format!("{width} bytes per row is more than {name} ({pitch} bytes)"),
                ));
            }
        }
        for (arg, off, pitch, len, what) in [
            ("dst", dst_off, dpitch, dst_len, dst_what),
            ("src", src_off, spitch, src_len, src_what),
        ] {
            let end = Rect::span(pitch, width, height).and_then(|s| s.checked_add(off));
            if self.is_empty() && off <= len {
                continue;
            }
            if end.is_none_or(|e| e > len) {
                let end = end.map_or_else(|| "past 2^64".to_string(), |e| e.to_string());
                return Err(arg_error(
                    arg,
                    format!(
                        "{height} rows of {width} bytes, {pitch} bytes apart, from offset {off} end at byte {end}, outside the {len}-byte {what}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// (destination offset, source offset) of each row.
    fn rows(self) -> impl Iterator<Item = (u64, u64)> {
        let n = if self.width == 0 { 0 } else { self.height };
        (0..n).map(move |i| {
            (
                self.dst_off + i * self.dpitch,
                self.src_off + i * self.spitch,
            )
        })
    }

    /// The same copy with its source moved to offset 0 of a staged copy of its span.
    fn staged(self) -> Rect {
        Rect { src_off: 0, ..self }
    }
}

/// A 2-D host-to-device copy read from `src` when it runs (for blocking copies).
///
/// # Errors
/// As [`Rect::check`] (nothing is queued).
pub fn h2d_2d(dst: &Buffer, src: Arc<dyn HostMemory>, rect: Rect) -> Result<Arc<dyn Op>> {
    dst.check()?;
    rect.check(dst.size(), "device buffer", src.len() as u64, "host buffer")?;
    let dst = dst.clone();
    Ok(FnOp::with_accesses(
        "memcpy_2d_h2d",
        OpKind::Copy,
        dst.access(Access::Write),
        move || {
            for (d, s) in rect.rows() {
                // SAFETY: every row lies inside `src` (checked by `Rect::check`); `src` is
                // alive (owned by this op) and host memory; `write_raw_unsynchronized` checks
                // the destination range; the op holds `dst`'s allocation exclusively.
                unsafe {
                    dst.write_raw_unsynchronized(
                        d,
                        src.as_ptr().add(s as usize),
                        rect.width as usize,
                    )
                }
                .map_err(fail("memcpy_2d_h2d"))?;
            }
            Ok(())
        },
    ))
}

/// A 2-D host-to-device copy queued on a stream: from pinned memory read when it runs, from
/// pageable memory staged now (see [`h2d_async`]).
///
/// # Errors
/// As [`Rect::check`]; the pinned source was freed.
pub fn h2d_2d_async(dst: &Buffer, src: Arc<dyn HostMemory>, rect: Rect) -> Result<Arc<dyn Op>> {
    dst.check()?;
    rect.check(dst.size(), "device buffer", src.len() as u64, "host buffer")?;
    let span = Rect::span(rect.spitch, rect.width, rect.height).unwrap_or(0);
    if rect.is_empty() {
        return h2d_2d(dst, src, rect);
    }
    match pinned_source(&*src, rect.src_off, span)? {
        Some(block) => {
            let op = h2d_2d(dst, src, rect)?;
            Ok(FnOp::with_accesses(
                "memcpy_2d_h2d",
                OpKind::Copy,
                op.accesses().clone(),
                move || {
                    let _keep = &block;
                    op.run()
                },
            ))
        }
        None => h2d_2d(dst, stage(&*src, rect.src_off, span), rect.staged()),
    }
}

/// A 2-D device-to-host copy as a stream op. The host memory must be writable.
///
/// # Errors
/// As [`Rect::check`]; `dst` is read-only.
pub fn d2h_2d(dst: Arc<dyn HostMemory>, src: &Buffer, rect: Rect) -> Result<Arc<dyn Op>> {
    if dst.as_mut_ptr().is_none() {
        return Err(arg_error("dst", "the host destination is read-only"));
    }
    src.check()?;
    rect.check(dst.len() as u64, "host buffer", src.size(), "device buffer")?;
    let src = src.clone();
    Ok(FnOp::with_accesses(
        "memcpy_2d_d2h",
        OpKind::Copy,
        src.access(Access::Read),
        move || {
            let p = dst.as_mut_ptr().expect("checked writable");
            for (d, s) in rect.rows() {
                // SAFETY: every row lies inside `dst` (checked); `dst` is alive (owned by
                // this op) and host memory; `read_raw_unsynchronized` checks the source
                // range; the op holds `src`'s allocation, so nothing writes it meanwhile.
                unsafe { src.read_raw_unsynchronized(s, p.add(d as usize), rect.width as usize) }
                    .map_err(fail("memcpy_2d_d2h"))?;
            }
            Ok(())
        },
    ))
}

/// A 2-D device-to-device copy (any two devices) as a stream op.
///
/// # Errors
/// As [`Rect::check`].
pub fn d2d_2d(dst: &Buffer, src: &Buffer, rect: Rect) -> Result<Arc<dyn Op>> {
    dst.check()?;
    src.check()?;
    rect.check(dst.size(), "device buffer", src.size(), "device buffer")?;
    let (dst, src) = (dst.clone(), src.clone());
    let uses = AccessSet::new([(&dst, Access::Write), (&src, Access::Read)]);
    Ok(FnOp::with_accesses(
        "memcpy_2d_d2d",
        OpKind::Copy,
        uses,
        move || {
            for (d, s) in rect.rows() {
                dst.copy_from(d, &src, s, rect.width)
                    .map_err(fail("memcpy_2d_d2d"))?;
            }
            Ok(())
        },
    ))
}

/// A 2-D host-to-host copy as a stream op (rows may overlap: each is moved as by `memmove`).
///
/// # Errors
/// As [`Rect::check`]; `dst` is read-only.
pub fn h2h_2d(
    dst: Arc<dyn HostMemory>,
    src: Arc<dyn HostMemory>,
    rect: Rect,
) -> Result<Arc<dyn Op>> {
    if dst.as_mut_ptr().is_none() {
        return Err(arg_error("dst", "the host destination is read-only"));
    }
    rect.check(
        dst.len() as u64,
        "host buffer",
        src.len() as u64,
        "host buffer",
    )?;
    Ok(FnOp::shared("memcpy_2d_h2h", OpKind::Copy, move || {
        let p = dst.as_mut_ptr().expect("checked writable");
        for (d, s) in rect.rows() {
            // SAFETY: every row lies inside its end (checked by `Rect::check`); both ends are
            // alive (owned by this op); `copy` tolerates overlap.
            unsafe {
                std::ptr::copy(
                    src.as_ptr().add(s as usize),
                    p.add(d as usize),
                    rect.width as usize,
                )
            };
        }
        Ok(())
    }))
}

/// The stream-ordered prefetch of managed buffer `buf` to `location`
/// (`cudaMemPrefetchAsync`): the memory of virtual devices is host memory, so nothing moves;
/// the op orders like a copy, shows in the trace, and records where the buffer was last
/// prefetched ([`managed::state`]).
///
/// # Errors
/// `buf` is not managed memory.
pub fn prefetch(buf: &Buffer, location: Location) -> Result<Arc<dyn Op>> {
    managed::check_managed(buf, "buf")?;
    let buf = buf.clone();
    let name = format!("prefetch {} B to {location}", buf.size());
    Ok(FnOp::shared(name, OpKind::Copy, move || {
        managed::note_prefetch(&buf, location);
        Ok(())
    }))
}

// SAFETY: `as_ptr` is valid for reads and writes of `len()` bytes while any clone lives (the
// block's mapping is owned by the block all clones share), and it is never a device buffer's.
unsafe impl HostMemory for PinnedBuffer {
    fn as_ptr(&self) -> *const u8 {
        PinnedBuffer::as_ptr(self)
    }
    fn as_mut_ptr(&self) -> Option<*mut u8> {
        Some(PinnedBuffer::as_ptr(self))
    }
    fn len(&self) -> usize {
        PinnedBuffer::len(self)
    }
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

    /// Copy `count` bytes of pinned `src` at `src_off` into `dst` at `dst_off`, in stream
    /// order and truly asynchronously: the command reads `src` when it runs (it holds a clone
    /// of the block until then), so writes to `src` before the stream reaches the copy are
    /// seen by it.
    ///
    /// # Errors
    /// A range does not fit; `src` was freed; stream errors as for [`Stream::launch`].
    pub fn copy_from_pinned(
        &self,
        dst: &Buffer,
        dst_off: u64,
        src: &PinnedBuffer,
        src_off: u64,
        count: u64,
    ) -> Result<()> {
        self.launch(h2d_async(
            dst,
            dst_off,
            Arc::new(src.clone()),
            src_off,
            count,
        )?)
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
