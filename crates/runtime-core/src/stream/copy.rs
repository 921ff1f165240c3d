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
//! bytes when it runs, holding the pinned block until it is done (registered host memory,
//! [`pinned::register`], is pinned memory here too: the copy holds the registration); from
//! any other (pageable)
//! host memory the bytes are staged when the copy is queued, so the caller may reuse the
//! source as soon as the call returns; on an idle stream such a copy instead runs at once,
//! reading the source directly (one copy instead of two, [`Planned::run_now_or_stage`]).
//! Blocking copies read the source directly (the caller waits for them).
//!
//! Copies into host memory queued on a stream follow CUDA's rule too
//! ([`completes_before_return`]): into pinned memory the command writes the host bytes when it
//! runs (truly asynchronous); into pageable memory the call that queued it returns only once
//! the copy is complete, so code that reads its array right after the call (as CUDA programs
//! may) reads the copied bytes. The bindings do that wait, interruptibly.
//!
//! [`copy`] and [`copy_2d`] are the entry points for a caller holding two ends of any kind
//! ([`End`]: device buffer, host memory, or host memory that is a view of device memory):
//! they check the ranges, refuse a host-device copy whose host side covers the device bytes
//! it copies, make the staging choice above, and say which devices a blocking copy orders
//! on ([`Planned`]). The Python bindings build every `memcpy*` through them. [`d2d_layout`]
//! copies elements between two layouts of one shape (`memory::layout`), numpy's `copyto`.

use std::sync::Arc;

use crate::error::{arg_error, KernelFailure, MemoryError, Result};
use crate::memory::access::{Access, AccessSet, HostTracker};
use crate::memory::layout::{copy_elements, Layout};
use crate::memory::managed::{self, Location};
use crate::memory::pinned::{self, KeepAlive, PinnedBuffer};
use crate::memory::{Buffer, Element};
use crate::stream::{FnOp, Op, OpKind, Stream};

/// Host memory a copy may read, and write if [`HostMemory::as_mut_ptr`] says so.
///
/// Stream ops that use host memory are ordered by its tracker ([`HostTracker`]), as ops on
/// device memory are by their allocation's: the memory's own ([`HostMemory::tracker`]: a
/// [`HostVec`], a [`PinnedBuffer`]), else that of the pinned block or registered range
/// holding the bytes, found by address.
///
/// # Safety
/// `as_ptr()` must be valid for reads of `len()` bytes, and `as_mut_ptr()` (when `Some`) for
/// writes of `len()` bytes, for as long as the object lives; the memory must not be a device
/// buffer's. Memory with no tracker (`tracker()` is `None`, and it is neither a live pinned
/// block nor a registered range) must not be used by two stream ops at once, one of them
/// writing, unless its owner accepts the race as its own: the memory is private to one op,
/// or (the Python bindings' buffer exports) the program orders its arrays' users, numpy's
/// rule for memory it shares between threads.
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
    /// The tracker that orders the stream ops using this memory, if it has its own (one per
    /// piece of memory, shared by every handle on it).
    fn tracker(&self) -> Option<&HostTracker> {
        None
    }
}

/// The tracker of bytes `[off, off + count)` of `mem` (see [`HostMemory`]): its own, or that
/// of the pinned block or registered range holding them; `None` for an empty range. Every
/// op this module builds names it; an op built elsewhere that touches host memory should
/// too (the ACL face's host memset does).
pub fn host_tracker(mem: &dyn HostMemory, off: u64, count: u64) -> Option<HostTracker> {
    if count == 0 {
        return None;
    }
    if let Some(t) = mem.tracker() {
        return Some(t.clone());
    }
    let start = (mem.as_ptr() as usize).wrapping_add(off as usize) as *const u8;
    match pinned::find(start, count as usize) {
        Some(block) => Some(block.tracker().clone()),
        None => pinned::registered_tracker(start, count as usize),
    }
}

/// `set` and the host memory `host` uses with `access`, if it has a tracker.
fn and_host(set: AccessSet, host: Option<HostTracker>, access: Access) -> AccessSet {
    match host {
        Some(t) => set.with_host([(&t, access)]),
        None => set,
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
    let host = host_tracker(&*src, src_off, count);
    let dst = dst.clone();
    Ok(FnOp::with_accesses(
        "memcpy_h2d",
        OpKind::Copy,
        and_host(dst.access(Access::Write), host, Access::Read),
        move || {
            // SAFETY: the range was checked against `src.len()`; `src` is alive (owned by
            // this op) and host memory, never a device buffer's, held for reading through
            // its tracker (or ordered by its owner: the `HostMemory` contract); the op holds
            // `dst`'s allocation exclusively while it runs.
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

/// What keeps the pinned memory holding `count` bytes of `src` at `src_off` valid, if it is
/// pinned memory: its block of the pinned allocator, or its registration
/// ([`pinned::register`]).
///
/// # Errors
/// The block was freed with `free_host`.
fn pinned_source(src: &dyn HostMemory, src_off: u64, count: u64) -> Result<Option<KeepAlive>> {
    let start = (src.as_ptr() as usize).wrapping_add(src_off as usize) as *const u8;
    match pinned::find(start, count as usize) {
        Some(p) => p.check().map(|()| Some(Arc::new(p) as KeepAlive)),
        None => Ok(pinned::find_registered(start, count as usize)),
    }
}

/// The registration of host memory `dst` at `dst_off` for `count` bytes, if it is registered
/// memory: a queued copy into it holds this until it ran.
fn registered_dest(dst: &End, dst_off: u64, count: u64) -> Option<KeepAlive> {
    match dst {
        End::Host(h) => {
            let start = (h.as_ptr() as usize).wrapping_add(dst_off as usize) as *const u8;
            pinned::find_registered(start, count as usize)
        }
        _ => None,
    }
}

/// `op`, holding `keep` until it has run (and been dropped).
fn holding(op: Arc<dyn Op>, keep: Option<KeepAlive>) -> Arc<dyn Op> {
    let Some(keep) = keep else {
        return op;
    };
    let (name, kind, accesses) = (op.name().to_string(), op.kind(), op.accesses().clone());
    FnOp::with_accesses(name, kind, accesses, move || {
        let _keep = &keep;
        op.run()
    })
}

/// Copy `count` bytes of `src` at `src_off` into a staging buffer now: a block of the pinned
/// cache up to [`STAGE_PINNED_MAX`] (as CUDA stages pageable memory through pinned buffers:
/// after the first copy of a size the block is reused, so staging costs one memcpy and no
/// page faults), else or when no pinned block can be mapped a vector. Memory with a tracker
/// of its own (a `HostVec`) is read as a safe host access of it: after the queued ops that
/// write it, holding it for reading.
///
/// # Errors
/// Waiting for those ops was refused (`NotPermitted`, from a runtime thread).
fn stage(src: &dyn HostMemory, src_off: u64, count: u64) -> Result<Arc<dyn HostMemory>> {
    match src.tracker() {
        Some(t) => AccessSet::default()
            .with_host([(t, Access::Read)])
            .host(|| stage_now(src, src_off, count)),
        None => Ok(stage_now(src, src_off, count)),
    }
}

/// [`stage`], reading `src` at once.
fn stage_now(src: &dyn HostMemory, src_off: u64, count: u64) -> Arc<dyn HostMemory> {
    // SAFETY: the caller checked `[src_off, src_off + count)` against `src.len()`; `src` is
    // valid for reads of `len()` bytes while it lives (the `HostMemory` contract).
    let bytes =
        unsafe { std::slice::from_raw_parts(src.as_ptr().add(src_off as usize), count as usize) };
    if count <= STAGE_PINNED_MAX {
        if let Ok(block) = pinned::allocate(count) {
            // SAFETY: the block was just allocated here and nothing else holds it yet.
            if unsafe { block.write(0, bytes) }.is_ok() {
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
        None => h2d(dst, dst_off, stage(&*src, src_off, count)?, 0, count),
    }
}

/// Whether a copy queued on a stream that writes the `count` bytes of host memory `dst` at
/// `dst_off` must be complete before the call that queued it returns (CUDA's rule for
/// device-to-host and host-to-host copies): true for pageable memory; false for pinned memory
/// (a live block of [`crate::memory::pinned`]), which the stream writes when it reaches the
/// copy, and for an empty range. Host views of device memory (which only the caller can
/// recognise) are device-accessible like pinned memory.
pub fn completes_before_return(dst: &dyn HostMemory, dst_off: u64, count: u64) -> bool {
    if count == 0 {
        return false;
    }
    let start = (dst.as_ptr() as usize).wrapping_add(dst_off as usize) as *const u8;
    pinned::find(start, count as usize).is_none()
        && pinned::find_registered(start, count as usize).is_none()
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
    let host = host_tracker(&*dst, dst_off, count);
    Ok(FnOp::with_accesses(
        "memcpy_d2h",
        OpKind::Copy,
        and_host(src.access(Access::Read), host, Access::Write),
        move || {
            let p = dst.as_mut_ptr().expect("checked writable");
            // SAFETY: the range was checked against `dst.len()`; `dst` is alive (owned by
            // this op) and host memory, never a device buffer's, held for writing by this op
            // through its tracker (or ordered by its owner: the `HostMemory` contract); the
            // op holds `src`'s allocation while it runs, so nothing writes it meanwhile.
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

/// A device-to-device copy between two layouts of one shape (numpy's `copyto`: every element
/// of `src` to the same index of `dst`; the layouts may differ, C into F, a step slice into a
/// dense buffer) as a stream op. The first element of `dst` is at byte `dst_off`, that of
/// `src` at `src_off`; bytes of `dst` that no element covers keep their values. The source
/// is read whole before anything is written, so the two may be views of one allocation.
///
/// # Errors
/// `ArgError` when the shapes or item sizes differ (naming `dst`) or a layout leaves its
/// buffer (naming `shape`).
pub fn d2d_layout(
    dst: &Buffer,
    dst_off: u64,
    dst_layout: &Layout,
    src: &Buffer,
    src_off: u64,
    src_layout: &Layout,
) -> Result<Arc<dyn Op>> {
    dst.check()?;
    src.check()?;
    let (dst_span, src_span) = (dst_layout.span(), src_layout.span());
    dst_layout.check_fits(dst_off, dst.size())?;
    src_layout.check_fits(src_off, src.size())?;
    if dst_layout.shape() != src_layout.shape() || dst_layout.itemsize() != src_layout.itemsize() {
        return Err(arg_error(
            "dst",
            format!(
                "shape {:?} of {}-byte items differs from the source's {:?} of {}-byte items",
                dst_layout.shape(),
                dst_layout.itemsize(),
                src_layout.shape(),
                src_layout.itemsize()
            ),
        ));
    }
    let (dst, src) = (dst.clone(), src.clone());
    let (dst_layout, src_layout) = (dst_layout.clone(), src_layout.clone());
    let uses = AccessSet::new([(&dst, Access::Write), (&src, Access::Read)]);
    Ok(FnOp::with_accesses(
        "memcpy_d2d_layout",
        OpKind::Copy,
        uses,
        move || {
            let mut from = vec![0u8; src_span as usize];
            src.read(src_off, &mut from)
                .map_err(fail("memcpy_d2d_layout"))?;
            let mut to = vec![0u8; dst_span as usize];
            if !dst_layout.is_dense() {
                // The gaps between a strided destination's elements keep their bytes.
                dst.read(dst_off, &mut to)
                    .map_err(fail("memcpy_d2d_layout"))?;
            }
            copy_elements(&mut to, &dst_layout, &from, &src_layout)
                .map_err(fail("memcpy_d2d_layout"))?;
            dst.write(dst_off, &to).map_err(fail("memcpy_d2d_layout"))
        },
    ))
}

/// A copy of host values `src` (the elements of `dst_layout`'s shape in C order, staged by
/// the caller) into the elements of `dst` laid out by `dst_layout` from byte `dst_off`, as
/// numpy's `copyto`: one stream op that holds `dst` while it copies, so the bytes between a
/// strided destination's elements keep whatever the work before it left there.
///
/// # Errors
/// `ArgError` naming `src` when its length is not the layout's element bytes, or `shape`
/// when the layout leaves `dst`.
pub fn h2d_layout(
    dst: &Buffer,
    dst_off: u64,
    dst_layout: &Layout,
    src: Vec<u8>,
) -> Result<Arc<dyn Op>> {
    dst.check()?;
    dst_layout.check_fits(dst_off, dst.size())?;
    if src.len() as u64 != dst_layout.nbytes() {
        return Err(arg_error(
            "src",
            format!(
                "{} bytes for {} elements of {} bytes (shape {:?})",
                src.len(),
                dst_layout.len(),
                dst_layout.itemsize(),
                dst_layout.shape()
            ),
        ));
    }
    let dst_span = dst_layout.span();
    let src_layout = Layout::c(dst_layout.shape().to_vec(), dst_layout.itemsize());
    let (dst, dst_layout) = (dst.clone(), dst_layout.clone());
    Ok(FnOp::with_accesses(
        "memcpy_h2d_layout",
        OpKind::Copy,
        dst.access(Access::Write),
        move || {
            let mut to = vec![0u8; dst_span as usize];
            if !dst_layout.is_dense() {
                dst.read(dst_off, &mut to)
                    .map_err(fail("memcpy_h2d_layout"))?;
            }
            copy_elements(&mut to, &dst_layout, &src, &src_layout)
                .map_err(fail("memcpy_h2d_layout"))?;
            dst.write(dst_off, &to).map_err(fail("memcpy_h2d_layout"))
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

    /// Bytes of the destination the rows cover, first row's start to last row's end.
    fn dst_span(&self) -> u64 {
        Rect::span(self.dpitch, self.width, self.height).unwrap_or(0)
    }

    /// Bytes of the source the rows cover, first row's start to last row's end.
    fn src_span(&self) -> u64 {
        Rect::span(self.spitch, self.width, self.height).unwrap_or(0)
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
    dst.check()?;
    rect.check(dst.size(), "device buffer", src.len() as u64, "host buffer")?;
    let host = host_tracker(&*src, rect.src_off, rect.src_span());
    let dst = dst.clone();
    Ok(FnOp::with_accesses(
        "memcpy_2d_h2d",
        OpKind::Copy,
        and_host(dst.access(Access::Write), host, Access::Read),
        move || {
            for (d, s) in rect.rows() {
                // SAFETY: every row lies inside `src` (checked by `Rect::check`); `src` is
                // alive (owned by this op) and host memory, held for reading through its
                // tracker (or ordered by its owner: the `HostMemory` contract);
                // `write_raw_unsynchronized` checks the destination range; the op holds
                // `dst`'s allocation exclusively.
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
        None => h2d_2d(dst, stage(&*src, rect.src_off, span)?, rect.staged()),
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
    let host = host_tracker(&*dst, rect.dst_off, rect.dst_span());
    Ok(FnOp::with_accesses(
        "memcpy_2d_d2h",
        OpKind::Copy,
        and_host(src.access(Access::Read), host, Access::Write),
        move || {
            let p = dst.as_mut_ptr().expect("checked writable");
            for (d, s) in rect.rows() {
                // SAFETY: every row lies inside `dst` (checked); `dst` is alive (owned by
                // this op) and host memory, held for writing through its tracker (or ordered
                // by its owner: the `HostMemory` contract); `read_raw_unsynchronized` checks
                // the source range; the op holds `src`'s allocation, so nothing writes it
                // meanwhile.
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
    let uses = AccessSet::default().with_host(
        [
            host_tracker(&*dst, rect.dst_off, rect.dst_span()).map(|t| (t, Access::Write)),
            host_tracker(&*src, rect.src_off, rect.src_span()).map(|t| (t, Access::Read)),
        ]
        .iter()
        .flatten()
        .map(|(t, m)| (t, *m)),
    );
    Ok(FnOp::with_accesses(
        "memcpy_2d_h2h",
        OpKind::Copy,
        uses,
        move || {
            let p = dst.as_mut_ptr().expect("checked writable");
            for (d, s) in rect.rows() {
                // SAFETY: every row lies inside its end (checked by `Rect::check`); both ends are
                // alive (owned by this op) and held through their trackers (or ordered by their
                // owners: the `HostMemory` contract); `copy` tolerates overlap.
                unsafe {
                    std::ptr::copy(
                        src.as_ptr().add(s as usize),
                        p.add(d as usize),
                        rect.width as usize,
                    )
                };
            }
            Ok(())
        },
    ))
}

/// One end of a copy ([`copy`], [`copy_2d`]).
#[derive(Clone)]
pub enum End {
    /// Device memory: a buffer (a view; offsets are relative to it).
    Device(Buffer),
    /// Host memory.
    Host(Arc<dyn HostMemory>),
    /// Host memory through which device memory is seen (a host view of a device buffer, as
    /// the Python package's numpy views of `DeviceBuffer`s): a queued copy from it reads it
    /// when the copy runs, in stream order, and never stages it when queued.
    DeviceView(Arc<dyn HostMemory>),
}

impl End {
    fn len(&self) -> u64 {
        match self {
            End::Device(b) => b.size(),
            End::Host(h) | End::DeviceView(h) => h.len() as u64,
        }
    }

    fn noun(&self) -> &'static str {
        match self {
            End::Device(_) => "device buffer",
            End::Host(_) | End::DeviceView(_) => "host buffer",
        }
    }

    /// Host address of byte `offset` of this end (the device is host-backed).
    fn addr(&self, offset: u64) -> usize {
        let base = match self {
            End::Device(b) => b.as_ptr() as usize,
            End::Host(h) | End::DeviceView(h) => h.as_ptr() as usize,
        };
        base.wrapping_add(offset as usize)
    }

    fn check_range(&self, arg: &'static str, offset: u64, count: u64) -> Result<()> {
        match self {
            End::Device(b) => b.check_range(arg, offset, count),
            End::Host(h) | End::DeviceView(h) => host_range(arg, h.len(), offset, count),
        }
    }
}

/// How a copy is submitted, which decides when a pageable host source is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submit {
    /// Queued on a stream, returning before it runs: a pageable host source is staged now
    /// (the caller may reuse it at once), unless the copy runs at once on an idle stream
    /// ([`Planned::run_now_or_stage`]); pinned memory and host views of device memory are
    /// read when the copy runs, in stream order (CUDA's rule).
    Queued,
    /// Waited for by the caller: the source is read when the copy runs.
    Blocking,
}

/// What builds a queued copy's op from a staged source ([`Planned::into_op`]).
type Stager = Box<dyn FnOnce() -> Result<Arc<dyn Op>> + Send>;

/// A copy built by [`copy`] or [`copy_2d`], ready to be submitted: [`Planned::into_op`] for
/// the op to queue or run, or [`Planned::run_now_or_stage`] for a copy queued on a stream.
pub struct Planned {
    /// The stream op; for a queued copy from pageable host memory, the same copy reading the
    /// source where it is, which may only run at once ([`Planned::stage`]).
    op: Arc<dyn Op>,
    /// For a queued copy from pageable host memory: what stages the source (copies it aside
    /// now) and builds the op that reads the staged bytes, the op to queue when the copy
    /// cannot run at once.
    stage: Option<Stager>,
    /// The device whose stream a blocking copy runs on: the destination's, or the source's
    /// for a device-to-host copy; `None` for a host-to-host copy (the caller's current
    /// device).
    pub device: Option<usize>,
    /// For a device-to-device copy, the source's device: a blocking copy is ordered after
    /// its current stream's work too (as `cudaMemcpyPeer`).
    pub peer: Option<usize>,
    /// A queued copy into pageable host memory ([`completes_before_return`]): the call that
    /// queues it returns only once it is complete (CUDA's rule); the caller waits.
    pub finish: bool,
}

impl Planned {
    fn new(op: Arc<dyn Op>, device: Option<usize>, peer: Option<usize>) -> Planned {
        Planned {
            op,
            stage: None,
            device,
            peer,
            finish: false,
        }
    }

    /// The op to queue (or, for a blocking copy, to run): a queued copy from pageable host
    /// memory stages its source now, so the caller may reuse the source once this returns.
    ///
    /// # Errors
    /// Staging waited for queued ops writing the source and was refused (`NotPermitted`,
    /// from a runtime thread).
    pub fn into_op(self) -> Result<Arc<dyn Op>> {
        match self.stage {
            Some(stage) => stage(),
            None => Ok(self.op),
        }
    }

    /// For a copy queued on `stream`: a copy from pageable host memory runs at once, on the
    /// calling thread and without staging, when the stream is idle (nothing queued, not
    /// capturing, the copy's memory free), counted as submitted and completed as a blocking
    /// copy is; otherwise (and for every other copy) [`Planned::into_op`]. Returns the op
    /// and whether it already ran; an op that did not is the caller's to queue on `stream`.
    /// Either way the caller may reuse the source once this returns (CUDA's rule for
    /// pageable memory, which lets the copy complete before the call returns).
    ///
    /// # Errors
    /// As [`Planned::into_op`]; the stream was destroyed or its runtime shut down.
    pub fn run_now_or_stage(self, stream: &Stream) -> Result<(Arc<dyn Op>, bool)> {
        if self.stage.is_some() && !stream.is_capturing() && stream.try_run_inline(&self.op)? {
            return Ok((self.op, true));
        }
        Ok((self.into_op()?, false))
    }
}

/// Refuse a host-device copy whose host side covers the device bytes it copies (`span`s
/// of `count`-byte rows from each end's first byte).
fn refuse_host_view_overlap(
    dst: &End,
    dst_at: usize,
    dst_span: u64,
    src: &End,
    src_at: usize,
    src_span: u64,
    hint: &'static str,
) -> Result<()> {
    let host_device = matches!(
        (dst, src),
        (End::Device(_), End::Host(_) | End::DeviceView(_))
            | (End::Host(_) | End::DeviceView(_), End::Device(_))
    );
    let (dn, sn) = (dst_span as usize, src_span as usize);
    if host_device
        && dn > 0
        && sn > 0
        && dst_at < src_at.saturating_add(sn)
        && src_at < dst_at.saturating_add(dn)
    {
        return Err(MemoryError::HostViewOverlap { hint }.into());
    }
    Ok(())
}

/// A copy of `count` bytes from `src` at `src_off` to `dst` at `dst_off`, either end host or
/// device memory, as a stream op to be submitted as `submit` says. The one place that
/// decides, for every caller:
///
/// - ranges: each checked against its end (`OutOfBounds` naming `dst_offset`/`src_offset`);
/// - overlap: a copy between host and device memory whose host side is a view of the same
///   device bytes is refused (`HostViewOverlap`): it would be a memcpy over overlapping
///   ranges. Device-to-device copies move overlapping ranges as `memmove`;
/// - staging: a queued host-to-device copy stages a pageable source now and reads pinned
///   memory or a [`End::DeviceView`] when it runs ([`h2d_async`]); a blocking one reads the
///   source when it runs ([`h2d`]).
///
/// # Errors
/// As above; the host destination is read-only; a pinned source was freed.
pub fn copy(
    dst: End,
    dst_off: u64,
    src: End,
    src_off: u64,
    count: u64,
    submit: Submit,
) -> Result<Planned> {
    dst.check_range("dst_offset", dst_off, count)?;
    src.check_range("src_offset", src_off, count)?;
    refuse_host_view_overlap(
        &dst,
        dst.addr(dst_off),
        count,
        &src,
        src.addr(src_off),
        count,
        "use memcpy_d2d for overlapping copies",
    )?;
    let finish = submit == Submit::Queued
        && matches!(&dst, End::Host(h) if completes_before_return(h.as_ref(), dst_off, count));
    let dst_keep = (submit == Submit::Queued)
        .then(|| registered_dest(&dst, dst_off, count))
        .flatten();
    let planned = match (dst, src) {
        (End::Device(d), End::Host(h)) if submit == Submit::Queued => {
            if pinned_source(&*h, src_off, count)?.is_some() {
                Planned::new(
                    h2d_async(&d, dst_off, h, src_off, count)?,
                    Some(d.device()),
                    None,
                )
            } else {
                let direct = h2d(&d, dst_off, h.clone(), src_off, count)?;
                let device = Some(d.device());
                Planned {
                    stage: Some(Box::new(move || {
                        h2d(&d, dst_off, stage(&*h, src_off, count)?, 0, count)
                    })),
                    ..Planned::new(direct, device, None)
                }
            }
        }
        (End::Device(d), End::Host(h) | End::DeviceView(h)) => {
            Planned::new(h2d(&d, dst_off, h, src_off, count)?, Some(d.device()), None)
        }
        (End::Host(h) | End::DeviceView(h), End::Device(s)) => {
            Planned::new(d2h(h, dst_off, &s, src_off, count)?, Some(s.device()), None)
        }
        (End::Device(d), End::Device(s)) => Planned::new(
            d2d(&d, dst_off, &s, src_off, count)?,
            Some(d.device()),
            Some(s.device()),
        ),
        (End::Host(dh) | End::DeviceView(dh), End::Host(sh) | End::DeviceView(sh)) => {
            let row = Rect {
                dst_off,
                dpitch: count,
                src_off,
                spitch: count,
                width: count,
                height: 1,
            };
            Planned::new(h2h_2d(dh, sh, row)?, None, None)
        }
    };
    // A queued copy into registered memory holds the registration until it ran.
    Ok(Planned {
        op: holding(planned.op, dst_keep),
        finish,
        ..planned
    })
}

/// A 2-D (pitched) copy of `rect` from `src` to `dst`, either end host or device memory, as
/// a stream op to be submitted as `submit` says: checked as `cudaMemcpy2D` checks it
/// ([`Rect::check`], naming each end by its kind), refused when the host side of a
/// host-device copy covers the device rows it copies, and staged or read in stream order
/// as [`copy`] decides.
///
/// # Errors
/// As [`Rect::check`] and [`copy`].
pub fn copy_2d(dst: End, src: End, rect: Rect, submit: Submit) -> Result<Planned> {
    rect.check(dst.len(), dst.noun(), src.len(), src.noun())?;
    let span = |pitch: u64| {
        if rect.is_empty() {
            0
        } else {
            (rect.height - 1) * pitch + rect.width
        }
    };
    refuse_host_view_overlap(
        &dst,
        dst.addr(rect.dst_off),
        span(rect.dpitch),
        &src,
        src.addr(rect.src_off),
        span(rect.spitch),
        "copy device to device instead",
    )?;
    let finish = submit == Submit::Queued
        && matches!(&dst, End::Host(h)
            if completes_before_return(h.as_ref(), rect.dst_off, span(rect.dpitch)));
    let dst_keep = (submit == Submit::Queued)
        .then(|| registered_dest(&dst, rect.dst_off, span(rect.dpitch)))
        .flatten();
    let planned = match (dst, src) {
        (End::Device(d), End::Host(h)) if submit == Submit::Queued => {
            let span = span(rect.spitch);
            if rect.is_empty() || pinned_source(&*h, rect.src_off, span)?.is_some() {
                Planned::new(h2d_2d_async(&d, h, rect)?, Some(d.device()), None)
            } else {
                let direct = h2d_2d(&d, h.clone(), rect)?;
                let device = Some(d.device());
                Planned {
                    stage: Some(Box::new(move || {
                        h2d_2d(&d, stage(&*h, rect.src_off, span)?, rect.staged())
                    })),
                    ..Planned::new(direct, device, None)
                }
            }
        }
        (End::Device(d), End::Host(h) | End::DeviceView(h)) => {
            Planned::new(h2d_2d(&d, h, rect)?, Some(d.device()), None)
        }
        (End::Host(h) | End::DeviceView(h), End::Device(s)) => {
            Planned::new(d2h_2d(h, &s, rect)?, Some(s.device()), None)
        }
        (End::Device(d), End::Device(s)) => {
            Planned::new(d2d_2d(&d, &s, rect)?, Some(d.device()), Some(s.device()))
        }
        (End::Host(dh) | End::DeviceView(dh), End::Host(sh) | End::DeviceView(sh)) => {
            Planned::new(h2h_2d(dh, sh, rect)?, None, None)
        }
    };
    // A queued copy into registered memory holds the registration until it ran.
    Ok(Planned {
        op: holding(planned.op, dst_keep),
        finish,
        ..planned
    })
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
        PinnedBuffer::len(self) as usize
    }
    fn tracker(&self) -> Option<&HostTracker> {
        Some(PinnedBuffer::tracker(self))
    }
}

/// Host memory owned by a `Vec<u8>`, for Rust callers and tests: stream ops reach its bytes
/// only through raw pointers, ordered by its tracker; the caller takes them back with
/// [`HostVec::into_inner`] once no op holds it.
pub struct HostVec {
    data: std::cell::UnsafeCell<Vec<u8>>,
    tracker: HostTracker,
}

// SAFETY: the vector itself is never resized or moved while shared; its bytes are reached
// only by stream ops, through raw pointers, and every op that uses them names this value's
// tracker in its access set (`host_tracker`), so two ops that conflict on them never run at
// once; `into_inner` needs the last reference.
unsafe impl Sync for HostVec {}

impl HostVec {
    /// Wrap a vector.
    pub fn new(v: Vec<u8>) -> Arc<HostVec> {
        Arc::new(HostVec {
            data: std::cell::UnsafeCell::new(v),
            tracker: HostTracker::new(),
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
    fn tracker(&self) -> Option<&HostTracker> {
        Some(&self.tracker)
    }
}

/// The body of [`Stream::copy_from_host`].
pub(super) fn copy_from_host<T: Element>(
    stream: &Stream,
    dst: &Buffer,
    offset: u64,
    src: &[T],
) -> Result<()> {
    let staged = HostVec::new(T::as_bytes(src).to_vec());
    let len = staged.len() as u64;
    stream.launch(h2d(dst, offset, staged, 0, len)?)
}

/// The body of [`Stream::copy_from_pinned`].
pub(super) fn copy_from_pinned(
    stream: &Stream,
    dst: &Buffer,
    dst_off: u64,
    src: &PinnedBuffer,
    src_off: u64,
    count: u64,
) -> Result<()> {
    stream.launch(h2d_async(
        dst,
        dst_off,
        Arc::new(src.clone()),
        src_off,
        count,
    )?)
}

/// The body of [`Stream::copy_to_host`].
pub(super) fn copy_to_host<T: Element>(
    stream: &Stream,
    src: &Buffer,
    offset: u64,
    dst: &mut [T],
) -> Result<()> {
    let len = size_of_val(dst) as u64;
    let staged = HostVec::new(vec![0u8; len as usize]);
    let op = d2h(staged.clone(), 0, src, offset, len)?;
    if stream.try_run_inline(&op)? {
        drop(op);
    } else {
        // The runner drops a command before counting it complete, so after the wait
        // below the staging buffer has no other owner.
        stream.enqueue(op)?;
    }
    stream.synchronize(None)?;
    let bytes = staged
        .into_inner()
        .ok_or_else(|| arg_error("dst", "the staging buffer is still in use"))?;
    T::as_bytes_mut(dst).copy_from_slice(&bytes);
    Ok(())
}
