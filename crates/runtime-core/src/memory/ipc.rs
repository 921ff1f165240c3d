//! Inter-process device memory: exporting a buffer as a handle another process of the same
//! user opens zero-copy (CUDA's `cudaIpcGetMemHandle` / `cudaIpcOpenMemHandle`, ACL's
//! `aclrtIpcMemGetExportKey` / `aclrtIpcMemImportByKey`).
//!
//! Every arena is a range of the process's device memory file (a `memfd`, see `host`). A
//! handle ([`HANDLE_LEN`] bytes) names the exporting process (pid and start time), the file's
//! descriptor number and random name, the block's offset and length in the file, and a slot of
//! the *export table* (the first 128 KiB of the file) holding the same range and
//! a random nonce. The exporter fills the slot when the buffer is first exported and clears it
//! when the allocation is freed, so a stale handle is refused.
//!
//! The importer opens `/proc/<pid>/fd/<fd>` (allowed for processes of the same user), checks
//! the file is the one the handle names and the slot still describes the block, and maps only
//! the pages covering the block; the buffer's bounds are exactly the block. The mapping keeps
//! the file's pages alive: the exporter exiting leaves the importer's view intact.
//!
//! Semantics, as in CUDA: once the exporter frees the buffer, the importer's view stays mapped
//! (never a fault) but its content is unspecified: it reads zeros, or aliases a later
//! allocation of the exporter that reuses the block. Order accesses across processes with
//! interprocess events. A handle is not a capability boundary: any process of the same user
//! may read another's memory anyway.
//!
//! Imported buffers belong to the device they were opened on (for copies and kernels), but
//! are accounted apart from its allocator ([`imported_stats`]): they take none of its
//! capacity and appear in none of its statistics.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::host::{Arena, SharedFile, FILE_HEADER, PAGE};
use super::{Allocation, Buffer, DeviceMemory, Place};
use crate::error::{ArgError, DeviceError, Result};

/// Length of a memory handle in bytes.
pub const HANDLE_LEN: usize = 72;

const MAGIC: &[u8; 8] = b"RTIPCMEM";
const VERSION: u32 = 1;
/// Bytes of one export-table slot: offset, length, nonce, live marker.
const SLOT_BYTES: u64 = 32;
/// Slots in the export table.
pub const MAX_EXPORTS: u32 = (FILE_HEADER / SLOT_BYTES) as u32;
const LIVE: u64 = 0x4556_494c_4350_4952; // "RIPCLIVE"

/// Ids of imported buffers (kept apart from allocator ids, which count from 1 per device).
static NEXT_IMPORT_ID: AtomicU64 = AtomicU64::new(1 << 48);

/// The allocations of this process that other handles may name, by the memory they are (the
/// file's nonce and the block's offset in it): blocks this process exported, and blocks it
/// imported. Opening a handle this process has open already returns that allocation.
///
/// Two handles can name overlapping bytes of one exporter's memory under different offsets:
/// a plugged allocator's block and the buffer it is a range of are both exportable, and an
/// import can outlive its exporter's buffer while a later export reuses part of its bytes.
/// Such imports are separate allocations but share one tracker (as the exporter's plugged
/// blocks share their buffer's), so their ops and host accesses take turns: two trackers
/// over the same bytes would let a write through one import tear a read through the other.
/// An import that would overlap imports with two different trackers is refused.
static OPEN: OpenTable = crate::sync::StaticMutex::new(Vec::new());

/// Note `alloc` as the allocation of the memory `key` (dropping entries whose allocation is
/// gone; those of a runtime shut down stay while the program holds them, for
/// [`tracker_for`]).
fn note_open(key: (u64, u64), alloc: &Arc<Allocation>) {
    let mut open = OPEN.lock();
    open.retain(|(_, a)| a.strong_count() > 0);
    open.push((key, Arc::downgrade(alloc)));
}

/// The live allocation of the memory `key` that was exported or imported as `handle`, if
/// this process has one.
fn find_open(key: (u64, u64), handle: &[u8]) -> Option<Arc<Allocation>> {
    find_in(&OPEN.lock(), key, handle)
}

fn find_in(
    open: &[((u64, u64), std::sync::Weak<Allocation>)],
    key: (u64, u64),
    handle: &[u8],
) -> Option<Arc<Allocation>> {
    open.iter()
        .filter(|(k, _)| *k == key)
        .filter_map(|(_, a)| live(a))
        .find(|a| was_opened_as(a, handle))
}

/// The tracker a new import of `len` bytes at `key` shares: the one of the allocations over
/// any of those bytes, a new one when there are none; `None` when they have two. Every
/// allocation the program still holds counts, one of a runtime shut down since included: a
/// host copy through it may still be running (a shutdown drains the streams, not the host
/// threads), and the new import must take turns with it.
fn tracker_for(
    open: &[((u64, u64), std::sync::Weak<Allocation>)],
    key: (u64, u64),
    len: u64,
) -> Option<Arc<super::access::Tracker>> {
    let (file, start) = key;
    let end = start.saturating_add(len);
    let mut shared: Option<Arc<super::access::Tracker>> = None;
    for a in open
        .iter()
        .filter(|(k, _)| k.0 == file)
        .filter_map(|(_, a)| a.upgrade())
    {
        let (_, at) = a.memory();
        if at < end && start < at.saturating_add(a.size) {
            match &shared {
                Some(t) if !Arc::ptr_eq(t, &a.tracker) => return None,
                Some(_) => {}
                None => shared = Some(a.tracker.clone()),
            }
        }
    }
    Some(shared.unwrap_or_else(super::access::Tracker::new))
}

/// The allocation behind `a`, unless it is gone or its runtime was shut down: a buffer the
/// program still holds from a runtime before the last `init` is no alias of a block opened
/// under this one, which must get an allocation of its own runtime.
fn live(a: &std::sync::Weak<Allocation>) -> Option<Arc<Allocation>> {
    a.upgrade()
        .filter(|a| !a.mem.closed.load(Ordering::Acquire))
}

type OpenTable = crate::sync::StaticMutex<Vec<((u64, u64), std::sync::Weak<Allocation>)>>;

static OPEN_FORK: crate::sync::ForkGuarded<OpenTable> = crate::sync::ForkGuarded::new(|| &OPEN);

/// The interprocess event pages this process has open (its own events' and those it opened
/// from handles), by the memory they are, each while its owner lives. An event page is
/// written with atomics, an allocation's bytes with plain copies under its lock: the two must
/// never be the same bytes, so an event handle naming memory that this process has imported
/// (or its own memory that is no event) is refused, and so is a memory import over an open
/// event page. Locked after [`OPEN`], never before.
static EVENT_PAGES: EventTable = crate::sync::StaticMutex::new(Vec::new());

type EventTable =
    crate::sync::StaticMutex<Vec<((u64, u64), std::sync::Weak<dyn std::any::Any + Send + Sync>)>>;

static EVENT_PAGES_FORK: crate::sync::ForkGuarded<EventTable> =
    crate::sync::ForkGuarded::new(|| &EVENT_PAGES);

/// Note the event page at `offset` of the memory file `file` as open while `owner` lives,
/// unless a live allocation of this process's memory table overlaps it.
///
/// # Errors
/// What overlaps it, for the caller's message.
pub(crate) fn claim_event_page(
    file: u64,
    offset: u64,
    owner: &Arc<dyn std::any::Any + Send + Sync>,
) -> std::result::Result<(), String> {
    let open = OPEN.lock();
    let end = offset + PAGE;
    let overlapping = open
        .iter()
        .filter(|(k, _)| k.0 == file)
        .filter_map(|(_, a)| a.upgrade())
        .find(|a| {
            let at = a.memory().1;
            at < end && offset < at.saturating_add(a.size)
        });
    if let Some(a) = overlapping {
        return Err(format!(
            "its page overlaps device memory this process holds (DeviceBuffer#{}, {} bytes)",
            a.id, a.size
        ));
    }
    let mut pages = EVENT_PAGES.lock();
    pages.retain(|(_, o)| o.strong_count() > 0);
    pages.push(((file, offset), Arc::downgrade(owner)));
    Ok(())
}

/// Whether this process has an event page open at `offset` of the memory file `file`.
pub(crate) fn is_event_page(file: u64, offset: u64) -> bool {
    EVENT_PAGES
        .lock()
        .iter()
        .any(|(k, o)| *k == (file, offset) && o.strong_count() > 0)
}

/// Whether an open event page lies in `[start, start + len)` of the memory file `file`
/// (called with [`OPEN`] held).
fn event_page_in(file: u64, start: u64, len: u64) -> bool {
    let end = start.saturating_add(len);
    EVENT_PAGES
        .lock()
        .iter()
        .any(|((f, at), o)| *f == file && *at < end && start < at + PAGE && o.strong_count() > 0)
}

/// Around `fork()`: hold the table's lock so no other thread is inside it when the process
/// is copied; released by [`after_fork`].
pub(crate) fn before_fork(wait: std::time::Duration) {
    OPEN_FORK.before_fork(wait);
    EVENT_PAGES_FORK.before_fork(wait);
    IMPORTED_FORK.before_fork(wait);
}

/// After `fork()`, in the parent or the child: release what [`before_fork`] took. The
/// child's entries are the parent's allocations, which it refuses anyway: it forgets them.
pub(crate) fn after_fork(child: bool) {
    IMPORTED_FORK.after_fork(child);
    EVENT_PAGES_FORK.after_fork(child);
    OPEN_FORK.after_fork(child);
    if child {
        std::mem::forget(std::mem::take(&mut *OPEN.lock()));
        std::mem::forget(std::mem::take(&mut *EVENT_PAGES.lock()));
    }
}

/// Imported buffers and their bytes, by device.
static IMPORTED: crate::sync::StaticMutex<Vec<(u64, u64)>> =
    crate::sync::StaticMutex::new(Vec::new());

static IMPORTED_FORK: crate::sync::ForkGuarded<crate::sync::StaticMutex<Vec<(u64, u64)>>> =
    crate::sync::ForkGuarded::new(|| &IMPORTED);

/// Live imported buffers on a device and their bytes (mapped pages, whole pages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImportStats {
    /// Imported buffers alive now.
    pub buffers: u64,
    /// Bytes they map (each rounded out to whole pages).
    pub bytes: u64,
}

/// The imported buffers of device `device`.
pub fn imported_stats(device: usize) -> ImportStats {
    let t = IMPORTED.lock();
    let (buffers, bytes) = t.get(device).copied().unwrap_or((0, 0));
    ImportStats { buffers, bytes }
}

fn account(device: usize, bytes: u64, add: bool) {
    let mut t = IMPORTED.lock();
    if t.len() <= device {
        t.resize(device + 1, (0, 0));
    }
    let e = &mut t[device];
    if add {
        e.0 += 1;
        e.1 += bytes;
    } else {
        e.0 = e.0.saturating_sub(1);
        e.1 = e.1.saturating_sub(bytes);
    }
}

/// The fields of a handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Handle {
    pid: u32,
    start_time: u64,
    fd: i32,
    slot: u32,
    file_nonce: u64,
    nonce: u64,
    offset: u64,
    len: u64,
    device: u32,
}

impl Handle {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HANDLE_LEN);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.start_time.to_le_bytes());
        b.extend_from_slice(&self.fd.to_le_bytes());
        b.extend_from_slice(&self.slot.to_le_bytes());
        b.extend_from_slice(&self.file_nonce.to_le_bytes());
        b.extend_from_slice(&self.nonce.to_le_bytes());
        b.extend_from_slice(&self.offset.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&self.device.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        debug_assert_eq!(b.len(), HANDLE_LEN);
        b
    }

    fn decode(b: &[u8]) -> Result<Handle> {
        let f = HandleFields::check(b, HANDLE_LEN, MAGIC, VERSION, "memory", "DeviceBuffer")?;
        let (u32_at, u64_at) = (|i| f.u32_at(i), |i| f.u64_at(i));
        Ok(Handle {
            pid: u32_at(12),
            start_time: u64_at(16),
            fd: u32_at(24) as i32,
            slot: u32_at(28),
            file_nonce: u64_at(32),
            nonce: u64_at(40),
            offset: u64_at(48),
            len: u64_at(56),
            device: u32_at(64),
        })
    }
}

/// The state (field 3 of `/proc/<pid>/stat`) and start time (field 22, clock ticks since
/// boot) of process `pid`.
fn process_stat(pid: u32) -> Option<(char, u64)> {
    let mut s = String::new();
    std::fs::File::open(format!("/proc/{pid}/stat"))
        .ok()?
        .read_to_string(&mut s)
        .ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let mut fields = s[s.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.nth(18)?.parse().ok()?))
}

/// The start time of process `pid`: with the pid it names one process, even after the pid is
/// reused.
pub(crate) fn process_start_time(pid: u32) -> Option<u64> {
    process_stat(pid).map(|(_, t)| t)
}

/// Whether process `pid`, started at `start_time`, is alive: it exists, is that process (not a
/// reuse of its pid), and is neither a zombie (exited, not yet reaped: it runs nothing more,
/// and its descriptors are closed) nor dead. Every liveness check of the IPC code is this one.
pub(crate) fn process_alive(pid: u32, start_time: u64) -> bool {
    matches!(process_stat(pid), Some((state, t)) if t == start_time && !matches!(state, 'Z' | 'X' | 'x'))
}

/// An exported allocation's slot in the export table; clears it when the allocation is freed.
pub(crate) struct Export {
    file: Arc<SharedFile>,
    slot: u32,
    handle: Vec<u8>,
}

impl Drop for Export {
    fn drop(&mut self) {
        if !self.file.is_own() {
            // Inherited through fork(): the table is the parent's.
            return;
        }
        let _ = self
            .file
            .file()
            .write_all_at(&[0; SLOT_BYTES as usize], u64::from(self.slot) * SLOT_BYTES);
        self.file.slots.lock().1.push(self.slot);
    }
}

/// An imported mapping: the pages around the exported block, and where the block starts.
pub(crate) struct Imported {
    arena: Arena,
    offset: u64,
    handle: Vec<u8>,
    device: usize,
    /// The exporter's device memory file and the block's offset in it: what the block *is*,
    /// whatever address it is mapped at here.
    file_nonce: u64,
    file_offset: u64,
}

impl Imported {
    /// The mapping and the offset of the block's byte 0 in it.
    pub(crate) fn at(&self) -> (&Arena, u64) {
        (&self.arena, self.offset)
    }

    /// The memory behind byte 0: the exporter's file and the offset in it.
    pub(crate) fn memory(&self) -> (u64, u64) {
        (self.file_nonce, self.file_offset)
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        account(self.device, self.arena.len(), false);
    }
}

/// An exported block freed after shutdown (usually during interpreter exit): leave its bytes
/// to the processes that imported it. A large block is unmapped here without releasing its
/// pages; a slab slot is left as it is and keeps the slab mapping's pages when it goes.
pub(super) fn keep_after_shutdown(mem: &DeviceMemory, place: Place) {
    match place {
        Place::Large(arena) => arena.keep_content(),
        Place::Slab(_) => mem.slab_arena.keep_content(),
        // A plugged block goes back to its allocator, which owns that memory's fate.
        Place::Empty | Place::Imported(_) | Place::Plugged(_) | Place::Pooled(_) => {}
    }
}

/// The fields of a handle (memory or event) whose length, magic and version were checked:
/// little-endian integers at byte offsets.
pub(crate) struct HandleFields<'a>(&'a [u8]);

impl<'a> HandleFields<'a> {
    /// Check that `b` is a `len`-byte handle starting with `magic` and `version`; `what`
    /// ("memory", "event") and `maker` (the class whose `ipc_handle()` makes it) name it in
    /// the errors.
    ///
    /// # Errors
    /// An argument error naming `handle` for other bytes.
    pub(crate) fn check(
        b: &'a [u8],
        len: usize,
        magic: &[u8; 8],
        version: u32,
        what: &str,
        maker: &str,
    ) -> Result<HandleFields<'a>> {
        if b.len() != len || &b[..8] != magic {
            return Err(ArgError::new(
                "handle",
                format!(
                    "not a runtime IPC {what} handle ({} bytes; a handle is the {len} bytes \
                     {maker}.ipc_handle() returns)",
                    b.len()
                ),
            )
            .into());
        }
        let f = HandleFields(b);
        if f.u32_at(8) != version {
            return Err(ArgError::new(
                "handle",
                format!(
                    "IPC {what} handle version {} is not supported (this runtime makes \
                     version {version})",
                    f.u32_at(8)
                ),
            )
            .into());
        }
        Ok(f)
    }

    /// The `u32` at byte `i`.
    pub(crate) fn u32_at(&self, i: usize) -> u32 {
        u32::from_le_bytes(self.0[i..i + 4].try_into().expect("4 bytes"))
    }

    /// The `u64` at byte `i`.
    pub(crate) fn u64_at(&self, i: usize) -> u64 {
        u64::from_le_bytes(self.0[i..i + 8].try_into().expect("8 bytes"))
    }
}

fn invalid(why: impl Into<String>) -> crate::error::Error {
    DeviceError::InvalidHandle {
        what: "the IPC memory handle".into(),
        why: why.into(),
    }
    .into()
}

/// The body of [`Buffer::ipc_handle`].
pub(super) fn ipc_handle(buf: &Buffer) -> Result<Vec<u8>> {
    buf.check()?;
    let a = &buf.alloc;
    if let Place::Imported(m) = &a.place {
        return Ok(m.handle.clone());
    }
    if a.size == 0 {
        return Err(ArgError::new(
            "buffer",
            format!("DeviceBuffer#{} has zero bytes: nothing to share", a.id),
        )
        .into());
    }
    if let Some(e) = a.export.get() {
        return Ok(e.handle.clone());
    }
    let (arena, base) = a.at();
    let (file, arena_off) = arena
        .file_range()
        .ok_or_else(|| invalid("the buffer has no device memory file"))?;
    let slot = {
        let mut s = file.slots.lock();
        match s.1.pop() {
            Some(slot) => slot,
            None if s.0 < MAX_EXPORTS => {
                s.0 += 1;
                s.0 - 1
            }
            None => {
                return Err(ArgError::new(
                    "buffer",
                    format!(
                        "{MAX_EXPORTS} buffers are exported already; free some exported \
                         buffers first"
                    ),
                )
                .into())
            }
        }
    };
    let h = Handle {
        pid: std::process::id(),
        start_time: process_start_time(std::process::id()).unwrap_or(0),
        fd: file.fd(),
        slot,
        file_nonce: file.nonce(),
        nonce: super::host::random_u64(),
        offset: arena_off + base,
        len: a.size,
        device: buf.device() as u32,
    };
    let mut entry = [0u8; SLOT_BYTES as usize];
    for (i, v) in [h.offset, h.len, h.nonce, LIVE].into_iter().enumerate() {
        entry[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    let export = Export {
        file: file.clone(),
        slot,
        handle: h.encode(),
    };
    file.file()
        .write_all_at(&entry, u64::from(slot) * SLOT_BYTES)
        .map_err(|e| invalid(format!("cannot write the export table: {e}")))?;
    // Two racing first exports: the loser's `Export` drops and clears its own slot.
    if a.export.set(export).is_ok() {
        note_open((h.file_nonce, h.offset), a);
    }
    Ok(a.export.get().expect("set above").handle.clone())
}

/// The body of [`Buffer::is_imported`].
pub(super) fn is_imported(buf: &Buffer) -> bool {
    matches!(buf.alloc.place, Place::Imported(_))
}

/// The body of [`DeviceMemory::open_ipc_handle`].
pub(super) fn open_ipc_handle(mem: &Arc<DeviceMemory>, handle: &[u8]) -> Result<Buffer> {
    if mem.closed.load(Ordering::Acquire) {
        return Err(DeviceError::InvalidHandle {
            what: format!("the memory of device {}", mem.device),
            why: "the runtime was shut down".into(),
        }
        .into());
    }
    let h = Handle::decode(handle)?;
    let gone = || {
        invalid(format!(
            "the exporting process (pid {}) has exited; a handle is valid only while its \
             exporter lives and keeps the buffer",
            h.pid
        ))
    };
    if h.len == 0 || h.offset < FILE_HEADER || h.slot >= MAX_EXPORTS {
        return Err(invalid(format!(
            "it names {} bytes at offset {} in slot {}, which no exporter makes (forged \
             or corrupted)",
            h.len, h.offset, h.slot
        )));
    }
    if !process_alive(h.pid, h.start_time) {
        return Err(gone());
    }
    let key = (h.file_nonce, h.offset);
    if super::host::own_file_nonce() == Some(h.file_nonce) {
        // This process's own memory: the exported allocation itself, or nothing. Mapping
        // the file again would alias whatever lives there now (after a free, a new
        // allocation that must read zero).
        return match find_open(key, handle) {
            Some(alloc) => Ok(opened(alloc)?),
            None => Err(invalid(
                "it names a block of this process's memory that is no longer exported \
                 (the buffer was freed) or never was (stale or forged handle)",
            )),
        };
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{}/fd/{}", h.pid, h.fd))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => gone(),
            _ => invalid(format!(
                "cannot open the memory of process {} ({e}); only processes of the same \
                 user can share memory",
                h.pid
            )),
        })?;
    // Identify what was opened (not what the fd number named a moment before).
    use std::os::fd::AsRawFd;
    let name = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let expected = format!("/memfd:runtime-mem-{:016x}", h.file_nonce);
    if !name.starts_with(&expected) {
        return Err(invalid(format!(
            "descriptor {} of process {} is not the runtime memory the handle names \
             (forged or stale handle)",
            h.fd, h.pid
        )));
    }
    let mut entry = [0u8; SLOT_BYTES as usize];
    file.read_exact_at(&mut entry, u64::from(h.slot) * SLOT_BYTES)
        .map_err(|e| invalid(format!("cannot read the export table: {e}")))?;
    let field = |i: usize| u64::from_le_bytes(entry[i * 8..i * 8 + 8].try_into().expect("8"));
    if field(3) != LIVE || field(2) != h.nonce {
        return Err(invalid(format!(
            "the exporting process (pid {}) freed the buffer, or never exported it \
             (stale or forged handle)",
            h.pid
        )));
    }
    if field(0) != h.offset || field(1) != h.len {
        return Err(invalid(format!(
            "it names {} bytes at offset {}, but the exporter exported {} bytes at offset \
             {} (forged or corrupted)",
            h.len,
            h.offset,
            field(1),
            field(0)
        )));
    }
    if let Some(alloc) = find_open(key, handle) {
        // Open here already: the same allocation.
        return opened(alloc);
    }
    let start = h.offset / PAGE * PAGE;
    let end = h
        .offset
        .checked_add(h.len)
        .and_then(|e| e.checked_next_multiple_of(PAGE))
        .ok_or_else(|| invalid("its range overflows"))?;
    let arena = Arena::map_file(&file, start, end - start)
        .map_err(|e| invalid(format!("cannot map the exported memory: {e}")))?;
    drop(file);
    account(mem.device, arena.len(), true);
    let imported = Imported {
        arena,
        offset: h.offset - start,
        handle: handle.to_vec(),
        device: mem.device,
        file_nonce: h.file_nonce,
        file_offset: h.offset,
    };
    // Under the table's lock, so two threads opening overlapping blocks at once agree on
    // one tracker; two threads opening the same handle: the first noted wins, the other's
    // mapping is dropped unused (after the lock is released).
    let mut open = OPEN.lock();
    let chosen = match find_in(&open, key, handle) {
        Some(first) => Ok(first),
        None if event_page_in(h.file_nonce, h.offset, h.len) => Err((
            imported,
            "overlap an interprocess event page this process has open (forged handle)",
        )),
        None => match tracker_for(&open, key, h.len) {
            Some(tracker) => {
                let alloc = Arc::new(Allocation {
                    mem: mem.clone(),
                    place: Place::Imported(imported),
                    size: h.len,
                    block: 0,
                    id: NEXT_IMPORT_ID.fetch_add(1, Ordering::Relaxed),
                    recorded: crate::sync::lock::Mutex::new(Vec::new()),
                    export: std::sync::OnceLock::new(),
                    tracker,
                });
                open.retain(|(_, a)| a.strong_count() > 0);
                open.push((key, Arc::downgrade(&alloc)));
                return Ok(Buffer {
                    alloc,
                    offset: 0,
                    len: h.len,
                });
            }
            None => Err((
                imported,
                "overlap two blocks this process imported separately from it; drop one of \
                 those buffers first",
            )),
        },
    };
    drop(open);
    let alloc = chosen.map_err(|(imported, why)| {
        drop(imported);
        invalid(format!(
            "its {} bytes at offset {} of process {}'s memory {why}",
            h.len, h.offset, h.pid
        ))
    })?;
    Ok(Buffer {
        alloc,
        offset: 0,
        len: h.len,
    })
}

/// A buffer over the whole of `alloc`, opened again.
fn opened(alloc: Arc<Allocation>) -> Result<Buffer> {
    let len = alloc.size;
    let buf = Buffer {
        alloc,
        offset: 0,
        len,
    };
    buf.check()?;
    Ok(buf)
}

/// Whether `handle` is exactly the handle `alloc` was exported as or imported from (every
/// field: a forged nonce or slot does not open it).
fn was_opened_as(alloc: &Allocation, handle: &[u8]) -> bool {
    match &alloc.place {
        Place::Imported(m) => m.handle == handle,
        _ => alloc.export.get().is_some_and(|e| e.handle == handle),
    }
}

/// The device index a handle was exported from (informative: it opens on any device).
///
/// # Errors
/// An argument error for bytes that are not a handle.
pub fn handle_device(handle: &[u8]) -> Result<usize> {
    Ok(Handle::decode(handle)?.device as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_reject_other_bytes() {
        let h = Handle {
            pid: 7,
            start_time: 9,
            fd: 3,
            slot: 2,
            file_nonce: 11,
            nonce: 12,
            offset: FILE_HEADER,
            len: 100,
            device: 1,
        };
        assert_eq!(Handle::decode(&h.encode()).unwrap(), h);
        assert!(Handle::decode(&[0; HANDLE_LEN]).is_err());
        assert!(Handle::decode(&h.encode()[1..]).is_err());
    }

    #[test]
    fn this_process_has_a_start_time() {
        assert!(process_start_time(std::process::id()).is_some());
        assert!(process_start_time(u32::MAX).is_none());
        let me = process_start_time(std::process::id()).unwrap();
        assert!(process_alive(std::process::id(), me));
        assert!(!process_alive(std::process::id(), me + 1));
        assert!(!process_alive(u32::MAX, me));
    }
}
