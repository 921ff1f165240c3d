//! Memory as ACL hands it out: the table from raw addresses back to allocations, and the
//! calls that take addresses (`aclrtMalloc`, `aclrtFree`, `aclrtMallocHost`, `aclrtFreeHost`,
//! `aclrtMemcpy[Async]`, `aclrtMemset[Async]`, `aclrtGetMemInfo`).
//!
//! Every address a call receives is resolved against the table (a `BTreeMap` by start
//! address): inside a live allocation, the range `[ptr, ptr + count)` must fit in it, and the
//! copy goes through the runtime's checked buffer operations with an offset, so a pointer past
//! an allocation's end is an error, never a write into the next one. An address in no
//! allocation is, for C callers ([`Foreign::Allow`]), the caller's own host memory: it must not
//! overlap any allocation, and it is read or written only by the kernel on our behalf
//! (`hostmem`), so a bogus pointer is an error, not a crash. The Python face passes
//! [`Foreign::Refuse`]: there every host address must be one the table knows (memory from
//! `aclrtMallocHost`, or a Python object registered with [`register_host`]).
//!
//! Device memory is the device's allocator (`DeviceMemory::malloc`, so a plugged allocator and
//! `runtime.memory_allocated()` see it); host memory from `aclrtMallocHost` is the runtime's
//! pinned memory, so stream-ordered copies from it read it when they run. Freeing a block
//! removes it from the table at once; the memory itself returns to its pool when the
//! copies still queued on it have run.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use runtime_core::bindings::submit_blocking_on;
use runtime_core::error::KernelFailure;
use runtime_core::memory::access::{Access, AccessSet};
use runtime_core::memory::pinned::{self, PinnedBuffer};
use runtime_core::memory::Buffer;
use runtime_core::stream::copy::{self, HostMemory};
use runtime_core::stream::{FnOp, Op, OpKind, Stream};

use crate::codes::*;
use crate::error::{AclError, AclResult};
use crate::hostmem;
use crate::state;

/// Who made a device block, and so which call frees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// `aclrtMalloc` (freed by `aclrtFree`).
    Malloc,
    /// `acl.media.dvpp_malloc` (freed by `dvpp_free` only).
    Dvpp,
}

/// What a table entry is.
#[derive(Clone)]
pub enum Block {
    /// Device memory.
    Device {
        /// The allocation.
        buf: Buffer,
        /// Who made it.
        kind: DeviceKind,
    },
    /// Host memory from `aclrtMallocHost`.
    Pinned(PinnedBuffer),
    /// Host memory of a caller's object, registered by the Python face (`bytes_to_ptr`, ...).
    Registered {
        /// The memory (keeps its owner alive).
        mem: Arc<dyn HostMemory>,
        /// The call that registered it (for messages).
        tag: &'static str,
    },
}

/// One live range `[start, start + size)` of the table.
#[derive(Clone)]
pub struct Entry {
    start: usize,
    size: u64,
    block: Block,
}

impl Entry {
    /// Start address.
    pub fn start(&self) -> usize {
        self.start
    }
    /// Size in bytes (what the caller asked for; every access is checked against it).
    pub fn size(&self) -> u64 {
        self.size
    }
    /// What the range is.
    pub fn block(&self) -> &Block {
        &self.block
    }
    /// Whether it is device memory.
    pub fn is_device(&self) -> bool {
        matches!(self.block, Block::Device { .. })
    }
    fn describe(&self) -> &'static str {
        match &self.block {
            Block::Device { .. } => "device allocation",
            Block::Pinned(_) => "aclrtMallocHost block",
            Block::Registered { .. } => "host buffer",
        }
    }
    /// The host memory of a host entry.
    fn host(&self) -> Option<Arc<dyn HostMemory>> {
        match &self.block {
            Block::Device { .. } => None,
            Block::Pinned(p) => Some(Arc::new(p.clone())),
            Block::Registered { mem, .. } => Some(mem.clone()),
        }
    }
}

static TABLE: crate::fork::Mutex<BTreeMap<usize, Arc<Entry>>> =
    crate::fork::Mutex::new(BTreeMap::new());

/// Bumped whenever an entry leaves the table: an address resolved before may name nothing
/// (or something else) now.
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The table's generation, bumped whenever an entry leaves it: callers that cache resolved
/// addresses (the Python face's operator plans) compare it.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

fn bump() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The entry whose range holds `ptr` (an empty range holds only its start).
pub fn find(ptr: usize) -> Option<Arc<Entry>> {
    let t = TABLE.lock();
    let (_, e) = t.range(..=ptr).next_back()?;
    let inside = ptr == e.start || ((ptr - e.start) as u64) < e.size;
    inside.then(|| e.clone())
}

/// The entry that starts exactly at `ptr`.
pub fn at(ptr: usize) -> Option<Arc<Entry>> {
    TABLE.lock().get(&ptr).cloned()
}

fn add(entry: Entry) {
    TABLE.lock().insert(entry.start, Arc::new(entry));
}

/// Take the entry starting at `ptr` out of the table if `pred` accepts it.
fn take_if(ptr: usize, pred: impl Fn(&Entry) -> bool) -> Option<Arc<Entry>> {
    let mut t = TABLE.lock();
    if t.get(&ptr).is_some_and(|e| pred(e)) {
        bump();
        t.remove(&ptr)
    } else {
        None
    }
}

/// Every entry, taken out (`aclFinalize`).
pub(crate) fn take_all() -> Vec<Arc<Entry>> {
    bump();
    std::mem::take(&mut *TABLE.lock()).into_values().collect()
}

/// Whether host addresses the table does not know may be used (C callers) or not (Python).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Foreign {
    /// An unknown address is the caller's host memory, reached through the kernel.
    Allow,
    /// An unknown address is an error.
    Refuse,
}

// --------------------------------------------------------------------------- allocation

/// `aclrtMalloc` (and the Python face's `dvpp_malloc`, `kind` [`DeviceKind::Dvpp`], 128-byte
/// aligned): `size` bytes of device memory on the current context's device, 64-byte aligned,
/// rounded up to 32 bytes inside (every access is checked against `size`).
pub fn malloc(size: u64, kind: DeviceKind) -> AclResult<usize> {
    let name = match kind {
        DeviceKind::Malloc => "aclrtMalloc",
        DeviceKind::Dvpp => "acldvppMalloc",
    };
    let dev = state::current_device(name)?;
    if size == 0 {
        return Err(AclError::param(format!("{name}: size 0 (must be > 0)")));
    }
    let rounded = size.checked_add(31).map(|s| s & !31).ok_or_else(|| {
        AclError::new(
            ACL_ERROR_BAD_ALLOC,
            format!("{name}: size {size} is too large"),
        )
    })?;
    let buf = dev
        .memory()
        .malloc(rounded)
        .map_err(|e| AclError::core(name, &e))?;
    let ptr = buf.as_ptr() as usize;
    let align = if kind == DeviceKind::Dvpp { 128 } else { 64 };
    if !ptr.is_multiple_of(align) {
        return Err(AclError::new(
            ACL_ERROR_RT_MEMORY_ALLOCATION,
            format!("{name}: the device allocator returned {ptr:#x}, not {align}-byte aligned"),
        ));
    }
    add(Entry {
        start: ptr,
        size,
        block: Block::Device { buf, kind },
    });
    Ok(ptr)
}

/// `aclrtFree` (`kind` [`DeviceKind::Dvpp`]: `dvpp_free`): free device memory from the
/// matching allocation call. Copies still queued on it finish first.
pub fn free(ptr: usize, kind: DeviceKind) -> AclResult<()> {
    let (name, other) = match kind {
        DeviceKind::Malloc => ("aclrtFree", "acldvppFree"),
        DeviceKind::Dvpp => ("acldvppFree", "aclrtFree"),
    };
    state::check_init(name)?;
    let taken = take_if(
        ptr,
        |e| matches!(&e.block, Block::Device { kind: k, .. } if *k == kind),
    );
    if taken.is_some() {
        return Ok(()); // the buffer is dropped here, outside the table's lock
    }
    let why = if ptr == 0 {
        "is NULL".to_string()
    } else {
        match find(ptr) {
            Some(e) if e.start == ptr && e.is_device() => {
                format!("was allocated by the other allocation call; free it with {other}")
            }
            Some(e) if e.is_device() => format!(
                "is {} bytes inside the device allocation at {:#x}, not its start",
                ptr - e.start,
                e.start
            ),
            Some(_) => "is host memory (aclrtFreeHost frees aclrtMallocHost memory)".to_string(),
            None => {
                "is not a live device allocation (freed already, or never allocated)".to_string()
            }
        }
    };
    Err(AclError::param(format!("{name}: devPtr {ptr:#x} {why}")))
}

/// `aclrtMallocHost`: `size` bytes of page-locked host memory (the runtime's pinned memory).
pub fn malloc_host(size: u64) -> AclResult<usize> {
    const NAME: &str = "aclrtMallocHost";
    state::check_init(NAME)?;
    if size == 0 {
        return Err(AclError::param(format!("{NAME}: size 0 (must be > 0)")));
    }
    let p = pinned::allocate(size).map_err(|e| AclError::core(NAME, &e))?;
    let ptr = p.as_ptr() as usize;
    add(Entry {
        start: ptr,
        size,
        block: Block::Pinned(p),
    });
    Ok(ptr)
}

/// `aclrtFreeHost`: free `aclrtMallocHost` memory (copies already queued from it keep it
/// until they ran; later ones are refused).
pub fn free_host(ptr: usize) -> AclResult<()> {
    const NAME: &str = "aclrtFreeHost";
    state::check_init(NAME)?;
    if let Some(e) = take_if(ptr, |e| matches!(e.block, Block::Pinned(_))) {
        if let Block::Pinned(p) = &e.block {
            let _ = p.free();
        }
        return Ok(());
    }
    let why = if ptr == 0 {
        "is NULL"
    } else {
        match find(ptr) {
            Some(e) if e.is_device() => "is device memory (use aclrtFree)",
            Some(e) if e.start == ptr => "was not allocated by aclrtMallocHost",
            Some(_) => "is inside an aclrtMallocHost block, not its start",
            None => "is not a live aclrtMallocHost block (freed already, or never allocated)",
        }
    };
    Err(AclError::param(format!("{NAME}: hostPtr {ptr:#x} {why}")))
}

/// Register `size` bytes at `ptr` owned by `mem` (which keeps them alive) as host memory the
/// copy calls accept (the Python face's `bytes_to_ptr` / `numpy_to_ptr`). A range inside one
/// registered already needs no entry; `Ok(false)` then.
///
/// # Errors
/// `ACL_ERROR_INVALID_PARAM` when the range is device memory (a host view of a device
/// buffer): copies treat host memory as the caller's, not as an allocation's.
pub fn register_host(mem: Arc<dyn HostMemory>, tag: &'static str) -> AclResult<bool> {
    let ptr = mem.as_ptr() as usize;
    let size = mem.len() as u64;
    if let Some((base, _)) = runtime_core::memory::device_mapping_overlapping(ptr, size as usize) {
        return Err(AclError::param(format!(
            "{tag}: {ptr:#x} + {size} bytes is device memory (the mapping at {base:#x}), not host memory; copy it with acl.rt.memcpy instead"
        )));
    }
    let mut t = TABLE.lock();
    if let Some((_, e)) = t.range(..=ptr).next_back() {
        let inside = ptr >= e.start && (ptr - e.start) as u64 + size <= e.size;
        if inside && e.start != ptr && !e.is_device() {
            return Ok(false);
        }
    }
    t.insert(
        ptr,
        Arc::new(Entry {
            start: ptr,
            size,
            block: Block::Registered { mem, tag },
        }),
    );
    Ok(true)
}

/// Forget a range registered with [`register_host`] (its owner is released).
pub fn unregister_host(ptr: usize) -> bool {
    take_if(ptr, |e| matches!(e.block, Block::Registered { .. })).is_some()
}

// --------------------------------------------------------------------------- resolving

/// Where one side of a copy is.
enum Side {
    Device(Buffer, u64),
    Host(Arc<dyn HostMemory>, u64),
    Foreign(usize),
}

/// The entry holding all of `[ptr, ptr + len)` and the offset of `ptr` in it, or
/// `ACL_ERROR_INVALID_PARAM` naming the problem (for callers outside the copy calls: the
/// Python face's converters and operators).
pub fn resolve_known(name: &str, ptr: usize, len: u64) -> AclResult<(Arc<Entry>, u64)> {
    match find(ptr) {
        Some(e) => {
            let off = (ptr - e.start) as u64;
            if off + len > e.size {
                return Err(AclError::param(format!(
                    "{name}: {ptr:#x} + {len} bytes runs past the end of its {} ({:#x}, {} bytes) by {} bytes",
                    e.describe(),
                    e.start,
                    e.size,
                    off + len - e.size
                )));
            }
            Ok((e, off))
        }
        None if ptr == 0 => Err(AclError::param(format!("{name}: the address is NULL"))),
        None => Err(AclError::param(format!(
            "{name}: {ptr:#x} is not inside any live allocation (device memory from aclrtMalloc, host memory from aclrtMallocHost or registered with acl.util.bytes_to_ptr / numpy_to_ptr)"
        ))),
    }
}

/// Resolve `[ptr, ptr + len)` named `what` for the call `name`.
fn resolve(name: &str, what: &str, ptr: usize, len: u64, foreign: Foreign) -> AclResult<Side> {
    if let Some(e) = find(ptr) {
        let off = (ptr - e.start) as u64;
        if off + len > e.size {
            return Err(AclError::param(format!(
                "{name}: {what} {ptr:#x} + {len} bytes runs past the end of its {} ({:#x}, {} bytes) by {} bytes",
                e.describe(),
                e.start,
                e.size,
                off + len - e.size
            )));
        }
        return Ok(match &e.block {
            Block::Device { buf, .. } => Side::Device(buf.clone(), off),
            _ => Side::Host(e.host().expect("a host entry"), off),
        });
    }
    if ptr == 0 {
        return Err(AclError::param(format!("{name}: {what} is NULL")));
    }
    if foreign == Foreign::Refuse {
        return Err(AclError::param(format!(
            "{name}: {what} {ptr:#x} is not inside any live allocation (device memory from aclrtMalloc, host memory from aclrtMallocHost or registered with acl.util.bytes_to_ptr / numpy_to_ptr)"
        )));
    }
    let end = (ptr as u64).checked_add(len).ok_or_else(|| {
        AclError::param(format!(
            "{name}: {what} {ptr:#x} + {len} bytes wraps around the address space"
        ))
    })?;
    let t = TABLE.lock();
    if let Some((_, e)) = t.range(ptr..).next() {
        if (e.start as u64) < end {
            return Err(AclError::param(format!(
                "{name}: {what} {ptr:#x} + {len} bytes is not inside one allocation: it runs into the {} at {:#x}",
                e.describe(),
                e.start
            )));
        }
    }
    drop(t);
    if let Some((base, n)) = runtime_core::memory::device_mapping_overlapping(ptr, len as usize) {
        return Err(AclError::param(format!(
            "{name}: {what} {ptr:#x} + {len} bytes is device memory (the mapping at {base:#x}, {n} bytes) outside every live allocation: freed already, or never allocated"
        )));
    }
    Ok(Side::Foreign(ptr))
}

fn check_kind(name: &str, kind: i32) -> AclResult<()> {
    if (ACL_MEMCPY_HOST_TO_HOST..=ACL_MEMCPY_INTER_DEVICE_TO_DEVICE).contains(&kind) {
        Ok(())
    } else {
        Err(AclError::param(format!(
            "{name}: kind {kind} is not an aclrtMemcpyKind (0..7)"
        )))
    }
}

// --------------------------------------------------------------------------- ops

/// How an op that touches foreign host memory reports back.
struct Outcome {
    state: AtomicU8,
    msg: Mutex<String>,
}

const PENDING: u8 = 0;
const RAN: u8 = 1;
const FAILED: u8 = 2;

impl Outcome {
    fn new() -> Arc<Outcome> {
        Arc::new(Outcome {
            state: AtomicU8::new(PENDING),
            msg: Mutex::new(String::new()),
        })
    }
}

/// An op that copies `len` bytes of device memory (`src`, a checked range of `from`) into the
/// caller's host memory at `dst` with the kernel's checked copy (`hostmem::copy`). It names
/// its read of `from` ([`AccessSet`]), so it is ordered with the allocation's other users and
/// holds it (alive and read-locked) while it runs.
fn vm_copy_op(
    name: &'static str,
    dst: usize,
    src: usize,
    len: usize,
    from: Buffer,
    outcome: Arc<Outcome>,
) -> Arc<dyn Op> {
    let uses = AccessSet::new([(&from, Access::Read)]);
    FnOp::with_accesses(name, OpKind::Copy, uses, move || {
        let _keep = &from;
        match hostmem::copy(dst, src, len) {
            Ok(()) => {
                outcome.state.store(RAN, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                let msg = format!("{len} bytes from {src:#x} to {dst:#x}: {e}");
                *outcome.msg.lock() = msg.clone();
                outcome.state.store(FAILED, Ordering::Release);
                Err(KernelFailure::new(name, msg))
            }
        }
    })
}

fn vm_fill_op(
    name: &'static str,
    dst: usize,
    byte: u8,
    len: usize,
    outcome: Arc<Outcome>,
) -> Arc<dyn Op> {
    FnOp::shared(name, OpKind::Copy, move || {
        match hostmem::fill(dst, byte, len) {
            Ok(()) => {
                outcome.state.store(RAN, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                let msg = format!("{len} bytes at {dst:#x}: {e}");
                *outcome.msg.lock() = msg.clone();
                outcome.state.store(FAILED, Ordering::Release);
                Err(KernelFailure::new(name, msg))
            }
        }
    })
}

fn writable(name: &str, what: &str, mem: &Arc<dyn HostMemory>) -> AclResult<()> {
    if mem.as_mut_ptr().is_none() {
        return Err(AclError::param(format!(
            "{name}: {what} {:#x} is read-only host memory",
            mem.as_ptr() as usize
        )));
    }
    Ok(())
}

/// The stream a blocking call runs on: the current context's default stream.
fn blocking_stream(name: &str) -> AclResult<Stream> {
    Ok(state::need_context(name)?.stream().clone())
}

/// Run `op` on `stream` and wait for it (blocking calls), or queue it (`wait` false).
/// Foreign-memory ops always wait: CANN returns from an asynchronous copy with pageable memory
/// only once it is done, and the caller may reuse that memory at once.
fn submit(
    name: &str,
    stream: &Stream,
    op: Arc<dyn Op>,
    wait: bool,
    outcome: Option<&Arc<Outcome>>,
) -> AclResult<()> {
    let core = |e: runtime_core::Error| AclError::core(name, &e);
    if !wait {
        return stream.launch(op).map_err(core);
    }
    let s = submit_blocking_on(stream, None, op).map_err(core)?;
    let target = runtime_core::bindings::submitted(&s);
    runtime_core::bindings::wait_for(&s, target, None).map_err(core)?;
    if let Some(o) = outcome {
        match o.state.load(Ordering::Acquire) {
            RAN => return Ok(()),
            FAILED => {
                // The failure is this call's: take it off the stream.
                let _ = runtime_core::bindings::take_error(&s);
                return Err(AclError::param(format!(
                    "{name}: host memory the runtime does not know is not accessible: {}",
                    o.msg.lock()
                )));
            }
            _ => {}
        }
    }
    // Skipped (an earlier failure on the stream) or a checked op that failed: report it.
    runtime_core::bindings::take_error(&s).map_err(core)
}

/// `aclrtMemcpy` (`stream` `None`) and `aclrtMemcpyAsync`: copy `count` bytes from `src` to
/// `dst`; both ranges are checked (see the module documentation). The direction follows the
/// addresses (CANN's newer documentation calls `kind` reserved; it only has to be a valid
/// `aclrtMemcpyKind`). A host-to-host copy on a stream is refused
/// (`ACL_ERROR_RT_FEATURE_NOT_SUPPORT`, as CANN in EP mode).
///
/// # Safety
/// With [`Foreign::Allow`], an address in no allocation is taken as the caller's host memory:
/// it must be memory the caller owns, with no Rust reference to it alive, valid for the call
/// (a copy or memset into it completes before this returns). The kernel checks that it is
/// mapped (a bogus address is an error, not a crash), not whose it is. With
/// [`Foreign::Refuse`] no such address is touched and there is nothing to promise.
pub unsafe fn memcpy(
    dst: usize,
    dest_max: u64,
    src: usize,
    count: u64,
    kind: i32,
    stream: Option<&Stream>,
    foreign: Foreign,
) -> AclResult<()> {
    let name = if stream.is_some() {
        "aclrtMemcpyAsync"
    } else {
        "aclrtMemcpy"
    };
    state::check_init(name)?;
    check_kind(name, kind)?;
    if count > dest_max {
        return Err(AclError::param(format!(
            "{name}: count {count} exceeds destMax {dest_max}"
        )));
    }
    let d = resolve(name, "dst", dst, dest_max, foreign)?;
    let s = resolve(name, "src", src, count, foreign)?;
    if count == 0 {
        return Ok(());
    }
    let core = |e: runtime_core::Error| AclError::core(name, &e);
    let (st, wait) = match stream {
        Some(s) => (s.clone(), false),
        None => (blocking_stream(name)?, true),
    };
    match (d, s) {
        (Side::Device(db, doff), Side::Device(sb, soff)) => {
            let op = copy::d2d(&db, doff, &sb, soff, count).map_err(core)?;
            submit(name, &st, op, wait, None)
        }
        (Side::Device(db, doff), Side::Host(mem, soff)) => {
            let op = if wait {
                copy::h2d(&db, doff, mem, soff, count)
            } else {
                copy::h2d_async(&db, doff, mem, soff, count)
            }
            .map_err(core)?;
            submit(name, &st, op, wait, None)
        }
        (Side::Device(db, doff), Side::Foreign(addr)) => {
            // Read the caller's memory now into a staging block (as the runtime stages
            // pageable memory), so an asynchronous copy need not wait.
            let staged = copy::HostVec::new(vec![0u8; count as usize]);
            hostmem::copy(staged.as_ptr() as usize, addr, count as usize).map_err(|e| {
                AclError::param(format!(
                    "{name}: src {addr:#x} + {count} bytes is not readable host memory: {e}"
                ))
            })?;
            let op = copy::h2d(&db, doff, staged, 0, count).map_err(core)?;
            submit(name, &st, op, wait, None)
        }
        (Side::Host(mem, doff), Side::Device(sb, soff)) => {
            writable(name, "dst", &mem)?;
            // CUDA's and CANN's rule: queued into pageable memory, the copy is complete when
            // the call returns (into pinned memory it runs in stream order).
            let finish = wait || copy::completes_before_return(mem.as_ref(), doff, count);
            let op = copy::d2h(mem, doff, &sb, soff, count).map_err(core)?;
            submit(name, &st, op, finish, None)
        }
        (Side::Foreign(addr), Side::Device(sb, soff)) => {
            sb.check_range("src", soff, count).map_err(core)?;
            let outcome = Outcome::new();
            let from = sb.as_ptr() as usize + soff as usize;
            let op = vm_copy_op(
                "aclrtMemcpy(device to host)",
                addr,
                from,
                count as usize,
                sb,
                outcome.clone(),
            );
            submit(name, &st, op, true, Some(&outcome))
        }
        (d, s) => {
            if !wait {
                return Err(AclError::new(
                    ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                    format!("{name}: an asynchronous host-to-host copy is not supported (as in CANN's EP mode); use aclrtMemcpy"),
                ));
            }
            let addr = |side: &Side| -> usize {
                match side {
                    Side::Host(m, off) => m.as_ptr() as usize + *off as usize,
                    Side::Foreign(a) => *a,
                    Side::Device(..) => unreachable!("device sides are handled above"),
                }
            };
            if let Side::Host(m, _) = &d {
                writable(name, "dst", m)?;
            }
            let (to, from) = (addr(&d), addr(&s));
            // Pinned blocks and registered ranges have trackers: the copy waits for the
            // stream copies queued into (or out of) them and holds them meanwhile, as a
            // safe host access of a device buffer does. The caller's own memory has none.
            let tracker = |side: &Side| match side {
                Side::Host(m, off) => copy::host_tracker(&**m, *off, count),
                _ => None,
            };
            let (dt, st) = (tracker(&d), tracker(&s));
            let uses = AccessSet::default().with_host(
                [
                    dt.as_ref().map(|t| (t, Access::Write)),
                    st.as_ref().map(|t| (t, Access::Read)),
                ]
                .into_iter()
                .flatten(),
            );
            // Registered ranges stay alive while `d` and `s` hold them.
            uses.host(|| hostmem::copy(to, from, count as usize))
                .map_err(core)?
                .map_err(|e| {
                    AclError::param(format!(
                        "{name}: {count} bytes from {from:#x} to {to:#x}: host memory the runtime does not know is not accessible: {e}"
                    ))
                })
        }
    }
}

/// `aclrtMemset` (`stream` `None`) and `aclrtMemsetAsync`: set `count` bytes at `ptr` to
/// `value & 0xFF`, device or host memory (`maxCount` bytes must lie in one allocation).
///
/// # Safety
/// As for [`memcpy`].
pub unsafe fn memset(
    ptr: usize,
    max_count: u64,
    value: i32,
    count: u64,
    stream: Option<&Stream>,
    foreign: Foreign,
) -> AclResult<()> {
    let name = if stream.is_some() {
        "aclrtMemsetAsync"
    } else {
        "aclrtMemset"
    };
    state::check_init(name)?;
    if count > max_count {
        return Err(AclError::param(format!(
            "{name}: count {count} exceeds maxCount {max_count}"
        )));
    }
    let side = resolve(name, "devPtr", ptr, max_count, foreign)?;
    if count == 0 {
        return Ok(());
    }
    let byte = (value & 0xFF) as u8;
    let core = |e: runtime_core::Error| AclError::core(name, &e);
    let (st, wait) = match stream {
        Some(s) => (s.clone(), false),
        None => (blocking_stream(name)?, true),
    };
    match side {
        Side::Device(buf, off) => {
            let op = copy::memset(&buf, off, count, byte).map_err(core)?;
            submit(name, &st, op, wait, None)
        }
        Side::Host(mem, off) => {
            writable(name, "devPtr", &mem)?;
            let addr = mem.as_mut_ptr().expect("checked writable") as usize + off as usize;
            // Named as a write of the host memory's tracker, as the core's copies name it,
            // so a copy queued into the same block on another stream takes turns with it.
            let uses = match copy::host_tracker(&*mem, off, count) {
                Some(t) => AccessSet::default().with_host([(&t, Access::Write)]),
                None => AccessSet::default(),
            };
            let op = FnOp::with_accesses("aclrtMemset(host)", OpKind::Copy, uses, move || {
                let _keep = &mem;
                hostmem::fill(addr, byte, count as usize)
                    .map_err(|e| KernelFailure::new("aclrtMemset", e.to_string()))
            });
            submit(name, &st, op, wait, None)
        }
        Side::Foreign(addr) => {
            let outcome = Outcome::new();
            let op = vm_fill_op(
                "aclrtMemset(host)",
                addr,
                byte,
                count as usize,
                outcome.clone(),
            );
            submit(name, &st, op, true, Some(&outcome))
        }
    }
}

/// `aclrtGetMemInfo`: `(free, total)` bytes of the current device for `attr`. The virtual
/// device's memory is its HBM (every HBM and generic attribute reports it); DDR attributes
/// report 0, 0.
pub fn get_mem_info(attr: i32) -> AclResult<(u64, u64)> {
    const NAME: &str = "aclrtGetMemInfo";
    let dev = state::current_device(NAME)?;
    if !(ACL_DDR_MEM..=ACL_MEM_P2P_HUGE1G).contains(&attr) {
        return Err(AclError::param(format!(
            "{NAME}: attr {attr} is not an aclrtMemAttr (0..17)"
        )));
    }
    if matches!(
        attr,
        ACL_DDR_MEM
            | ACL_DDR_MEM_HUGE
            | ACL_DDR_MEM_NORMAL
            | ACL_DDR_MEM_P2P_HUGE
            | ACL_DDR_MEM_P2P_NORMAL
    ) {
        return Ok((0, 0));
    }
    // CANN's free returns memory to the device at once: blocks the allocator caches for reuse
    // count as free here.
    let s = dev.memory().stats();
    Ok((s.total.saturating_sub(s.allocated), s.total))
}

// --------------------------------------------------------------------------- fork

static TABLE_FORK: crate::fork::Guarded<BTreeMap<usize, Arc<Entry>>> =
    crate::fork::Guarded::new(|| &TABLE);

pub(crate) fn before_fork() {
    TABLE_FORK.before_fork();
}

pub(crate) fn after_fork(child: bool) {
    TABLE_FORK.after_fork(child);
}

/// In a forked child: forget (leak) the parent's allocations, which belong to the runtime the
/// child abandoned.
pub(crate) fn forget_in_child() {
    bump();
    std::mem::forget(std::mem::take(&mut *TABLE.lock()));
}
