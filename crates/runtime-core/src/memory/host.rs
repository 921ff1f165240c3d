//! Host backing for device memory: the only `unsafe` of the memory layer.
//!
//! An [`Arena`] is one shared mapping (`MAP_SHARED | MAP_NORESERVE`) of a range of the
//! process's *device memory file*, a `memfd` that another process of the same user can open
//! through `/proc/<pid>/fd/<n>` (inter-process buffers, `memory::ipc`). The file is sparse:
//! address space and file range only, no RAM until a page is touched. A device has one arena
//! for its slab spans ([`Arena::reserve`]) and one per large block ([`Arena::map`]). The OS
//! commits a page when it is first touched and hands it out zero-filled, so a fresh allocation
//! is zeroed for free and costs no RAM until used. [`Arena::release`] gives pages back
//! (`MADV_REMOVE`: on a shared file mapping `MADV_DONTNEED` would only unmap them, the file
//! would keep them); they read as zero again afterwards, which is how freed blocks return to
//! the allocator clean. Dropping an arena unmaps it and punches its range out of the file
//! (`FALLOC_FL_PUNCH_HOLE`), so RAM follows live blocks; the range is reused by a later arena
//! of the same length. An arena mapped from another process's file ([`Arena::map_file`],
//! imported memory) only unmaps.
//!
//! Fork: a child inherits the shared mappings, so its inherited arenas alias the parent's
//! memory; the runtime refuses inherited buffers in the child (generation checks), the child
//! never releases or punches an inherited arena (`forks` differs), and its own new memory
//! comes from a new file ([`after_fork_in_child`]).
//!
//! Soundness: the arena only hands out raw pointers and performs raw copies; it never creates
//! Rust references into device memory except through [`Arena::slice`] and
//! [`Arena::slice_mut`], whose callers promise the range lies inside a live allocation they
//! own for the duration. Who may touch which bytes when is decided above, in
//! `memory::access` (ops and safe host access hold an allocation's lock). Memory shared with
//! another process can be written by it at any time: the bytes are plain integers to Rust
//! (every device element type is valid for every bit pattern), and a mapping's range always
//! lies inside its file (imports check the file size; the runtime never shrinks its file), so
//! no access can fault.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::ConfigError;

/// Page size assumed for releases; large blocks are whole pages.
pub const PAGE: u64 = 4096;

/// Transparent huge page size: mappings at least this large are aligned to it.
pub const HUGE_PAGE: u64 = 2 << 20;

/// Bytes at the start of the device memory file kept for the export table (`memory::ipc`);
/// arenas are placed after it.
pub(crate) const FILE_HEADER: u64 = 128 << 10;

/// The process's device memory file: a sparse `memfd` whose ranges back the arenas.
pub(crate) struct SharedFile {
    file: File,
    /// Random per file: names it (`/memfd:runtime-mem-<nonce>`) so a handle can be checked
    /// against the file it was made for.
    nonce: u64,
    /// The fork count when the file was made; a forked child leaves it alone.
    forks: u64,
    space: crate::sync::lock::Mutex<FileSpace>,
    /// Export-table slots (`memory::ipc`): the next never-used one and the freed ones.
    pub(crate) slots: crate::sync::lock::Mutex<(u32, Vec<u32>)>,
}

/// Address ranges of this process's live arenas (start -> length): what
/// [`mapping_overlapping`] answers, so that a raw address from outside (the C ABI's callers)
/// can be recognised as device memory even where no live allocation covers it.
static MAPPED: crate::sync::StaticMutex<std::collections::BTreeMap<usize, usize>> =
    crate::sync::StaticMutex::new(std::collections::BTreeMap::new());

/// The live arena overlapping `[start, start + len)` (an empty range: containing `start`),
/// as `(base, length)`.
pub(crate) fn mapping_overlapping(start: usize, len: usize) -> Option<(usize, usize)> {
    let end = start.saturating_add(len.max(1));
    let m = MAPPED.lock();
    let (&base, &n) = m.range(..end).next_back()?;
    (base + n > start).then_some((base, n))
}

/// Which ranges of the file are free: everything past `end`, and ranges given back by
/// dropped arenas (by length, reused only by an arena of that exact length).
struct FileSpace {
    end: u64,
    size: u64,
    free: HashMap<u64, Vec<u64>>,
}

impl SharedFile {
    fn create() -> io::Result<SharedFile> {
        let nonce = random_u64();
        let name = std::ffi::CString::new(format!("runtime-mem-{nonce:016x}"))
            .expect("no NUL in the name");
        // SAFETY: a plain system call with a valid C string; it returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
        let file = unsafe { File::from_raw_fd(fd) };
        Ok(SharedFile {
            file,
            nonce,
            forks: crate::generation::forks(),
            space: crate::sync::lock::Mutex::new(FileSpace {
                end: FILE_HEADER,
                size: 0,
                free: HashMap::new(),
            }),
            slots: crate::sync::lock::Mutex::new((0, Vec::new())),
        })
    }

    /// The open file.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// The file's descriptor number in this process.
    pub(crate) fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    /// The random number in the file's name.
    pub(crate) fn nonce(&self) -> u64 {
        self.nonce
    }

    /// Whether this process made the file (not inherited through `fork()`).
    pub(crate) fn is_own(&self) -> bool {
        self.forks == crate::generation::forks()
    }

    /// A free range of `len` bytes, `align`-aligned; the file grows to cover it.
    fn take(&self, len: u64, align: u64) -> io::Result<u64> {
        let mut sp = self.space.lock();
        if let Some(off) = sp.free.get_mut(&len).and_then(Vec::pop) {
            return Ok(off);
        }
        let off = sp.end.next_multiple_of(align);
        let end = off
            .checked_add(len)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| io::Error::other("the device memory file is full"))?;
        if end > sp.size {
            // Grow in steps of 1 GiB or more, so most arenas cost no system call.
            let size = end.max(sp.size.saturating_mul(2)).next_multiple_of(1 << 30);
            let size = size.min(i64::MAX as u64 / 2).max(end);
            self.file.set_len(size)?;
            sp.size = size;
        }
        sp.end = end;
        Ok(off)
    }

    /// Give `[off, off + len)` back for reuse by an arena of `len` bytes.
    fn give_back(&self, off: u64, len: u64) {
        self.space.lock().free.entry(len).or_default().push(off);
    }
}

/// The device memory file of this process (made on first use, and again in a forked child).
static SHARED: crate::sync::StaticMutex<Option<Arc<SharedFile>>> =
    crate::sync::StaticMutex::new(None);

/// This process's device memory file.
pub(crate) fn shared_file() -> io::Result<Arc<SharedFile>> {
    let mut slot = SHARED.lock();
    if let Some(f) = slot.as_ref() {
        return Ok(f.clone());
    }
    let f = Arc::new(SharedFile::create()?);
    *slot = Some(f.clone());
    Ok(f)
}

/// The nonce of this process's device memory file, if it has made one.
pub(crate) fn own_file_nonce() -> Option<u64> {
    SHARED.lock().as_ref().map(|f| f.nonce)
}

/// A random 64-bit number (not for cryptography: it tells files and handles apart).
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u64(crate::clock::now_ns());
    h.write_u32(std::process::id());
    h.finish()
}

/// What backs an arena.
enum Backing {
    /// A range of this process's device memory file.
    Own { file: Arc<SharedFile>, offset: u64 },
    /// A range of another process's file (or of ours, opened again): only unmapped.
    Imported,
}

/// A reserved, lazily committed address range.
pub struct Arena {
    base: NonNull<u8>,
    len: u64,
    backing: Backing,
    /// Leave the pages in the file when dropped (another process may map them).
    keep: std::sync::atomic::AtomicBool,
}

// SAFETY: the arena is a plain memory range; all accesses go through raw pointer copies whose
// ordering the runtime establishes with streams, events and locks.
unsafe impl Send for Arena {}
// SAFETY: as above; no interior state besides the mapping itself.
unsafe impl Sync for Arena {}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Arena({:p}, {} bytes)", self.base, self.len)
    }
}

impl Arena {
    /// Reserve `len` bytes of address space for device `device`.
    pub fn reserve(device: usize, len: u64) -> Result<Arena, ConfigError> {
        Arena::map_anonymous(len).map_err(|reason| ConfigError::Reserve {
            device,
            bytes: len,
            reason,
        })
    }

    /// Map `len` bytes of fresh, zero-filled address space; `None` when the OS refuses (the
    /// address space or the number of mappings is exhausted). Mappings of at least
    /// [`HUGE_PAGE`] bytes start on a huge-page boundary.
    pub fn map(len: u64) -> Option<Arena> {
        Arena::map_anonymous(len).ok()
    }

    fn map_anonymous(len: u64) -> Result<Arena, String> {
        let size = usize::try_from(len).map_err(|_| "larger than the address space".to_string())?;
        if size == 0 {
            return Err("an empty mapping".into());
        }
        let file = shared_file().map_err(|e| format!("no device memory file: {e}"))?;
        let align = if len >= HUGE_PAGE { HUGE_PAGE } else { PAGE };
        let offset = file.take(len, align).map_err(|e| e.to_string())?;
        match map_range(&file.file, offset, size, align as usize) {
            Ok(base) => Ok(Arena::noted(Arena {
                base,
                len,
                backing: Backing::Own { file, offset },
                keep: std::sync::atomic::AtomicBool::new(false),
            })),
            Err(e) => {
                file.give_back(offset, len);
                Err(e)
            }
        }
    }

    /// Map `[offset, offset + len)` of `file` (another process's device memory file, opened
    /// through `/proc`) read-write and shared. The caller has checked that the range lies
    /// inside the file and is page aligned; dropping the arena only unmaps it.
    pub(crate) fn map_file(file: &File, offset: u64, len: u64) -> Result<Arena, String> {
        let size = usize::try_from(len).map_err(|_| "larger than the address space".to_string())?;
        if size == 0 || !offset.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
            return Err(format!(
                "range [{offset}, +{len}) is empty or not page aligned"
            ));
        }
        let size_now = file.metadata().map_err(|e| e.to_string())?.len();
        if offset.checked_add(len).is_none_or(|e| e > size_now) {
            return Err(format!(
                "range [{offset}, +{len}) is outside the {size_now}-byte memory file"
            ));
        }
        let base = map_range(file, offset, size, PAGE as usize)?;
        Ok(Arena::noted(Arena {
            base,
            len,
            backing: Backing::Imported,
            keep: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// `arena`, with its range noted in [`MAPPED`].
    fn noted(arena: Arena) -> Arena {
        MAPPED
            .lock()
            .insert(arena.base.as_ptr() as usize, arena.len as usize);
        arena
    }

    /// When dropped, unmap only: the pages stay in the file for other processes that map
    /// them, and the range is not reused.
    pub(crate) fn keep_content(&self) {
        self.keep.store(true, std::sync::atomic::Ordering::Release);
    }

    /// The device memory file range behind the arena: the file and the offset of byte 0;
    /// `None` for an imported arena.
    pub(crate) fn file_range(&self) -> Option<(&Arc<SharedFile>, u64)> {
        match &self.backing {
            Backing::Own { file, offset } => Some((file, *offset)),
            Backing::Imported => None,
        }
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Address of `offset` (at most one past the end of the mapping; checked).
    pub fn ptr(&self, offset: u64) -> *mut u8 {
        assert!(
            offset <= self.len,
            "arena offset {offset} outside {} bytes",
            self.len
        );
        // SAFETY: `offset <= len` (checked above), so the result stays inside the mapping or
        // one past its end.
        unsafe { self.base.as_ptr().add(offset as usize) }
    }

    fn check(&self, offset: u64, len: u64) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "arena range [{offset}, +{len}) outside {} bytes",
            self.len
        );
    }

    /// The 8 bytes at `offset` (8-aligned, inside the mapping; checked) as an atomic, for
    /// counters shared with other processes (interprocess events).
    pub(crate) fn atomic_u64(&self, offset: u64) -> &std::sync::atomic::AtomicU64 {
        self.check(offset, 8);
        let p = self.ptr(offset).cast::<u64>();
        assert!(
            p.is_aligned(),
            "atomic at offset {offset} is not 8-byte aligned"
        );
        // SAFETY: the 8 bytes are inside the mapping (checked), which lives as long as the
        // returned reference (it borrows `self`), and aligned (checked); every bit pattern is
        // a valid `u64`. This process and others access these bytes only atomically.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(p) }
    }

    /// Fill `[offset, offset + len)` with `byte`.
    pub fn fill(&self, offset: u64, len: u64, byte: u8) {
        self.check(offset, len);
        // SAFETY: the range is inside the mapping (checked); the caller owns it.
        unsafe { std::ptr::write_bytes(self.ptr(offset), byte, len as usize) }
    }

    /// Give the pages of `[offset, offset + len)` back to the OS; the range reads as zero
    /// afterwards. Partial pages at the ends are zeroed in place.
    pub fn release(&self, offset: u64, len: u64) {
        self.check(offset, len);
        let start = offset.next_multiple_of(PAGE);
        let end = (offset + len) / PAGE * PAGE;
        if end <= start {
            self.fill(offset, len, 0);
            return;
        }
        self.fill(offset, start - offset, 0);
        self.fill(end, offset + len - end, 0);
        // SAFETY: [start, end) is page aligned and inside the mapping; REMOVE on a shared
        // mapping of our memory file frees the pages (punches them out of the file), which
        // then read as zero.
        let rc = unsafe {
            libc::madvise(
                self.ptr(start).cast(),
                (end - start) as usize,
                libc::MADV_REMOVE,
            )
        };
        if rc != 0 {
            // Cannot happen for a valid range; fall back to zeroing so the invariant holds.
            self.fill(start, end - start, 0);
        }
    }

    /// Make `[offset, offset + len)` read as zero, writing only pages that hold data.
    ///
    /// A page of the memory file that holds no data has never been touched since its last
    /// release (a hole), so it already reads as zero, provided it cannot have been swapped out
    /// unnoticed: with swap configured every page is written. Partial pages at the ends are
    /// always written. For the whole-page interior, the file is asked first where its data
    /// starts ([`Arena::first_data`]: one `lseek`, so a block nobody touched costs one
    /// system call); from there, the mapping is asked which pages are resident (`mincore`).
    /// `mincore` alone looks up every page the mapping never touched in the file (about 8 us
    /// per untouched MiB here), and `lseek(SEEK_HOLE)` walks every page that holds data
    /// (about 7 us per touched MiB), while `mincore` reads a touched page's table entry.
    pub fn zero(&self, offset: u64, len: u64) {
        self.check(offset, len);
        let start = offset.next_multiple_of(PAGE);
        let end = (offset + len) / PAGE * PAGE;
        if end <= start || swap_configured() {
            self.fill(offset, len, 0);
            return;
        }
        self.fill(offset, start - offset, 0);
        self.fill(end, offset + len - end, 0);
        match self.first_data(start, end) {
            Some(None) => {}
            Some(Some(data)) => self.zero_resident(data, end),
            None => self.zero_resident(start, end),
        }
    }

    /// The first page of `[start, end)` (arena offsets, page aligned) whose file range holds
    /// data (`lseek(SEEK_DATA)` on the device memory file), `Some(None)` when none does;
    /// `None` when the arena has no range of our file (an imported one) or the file cannot be
    /// asked.
    fn first_data(&self, start: u64, end: u64) -> Option<Option<u64>> {
        let Backing::Own { file, offset: base } = &self.backing else {
            return None;
        };
        let at = libc::off_t::try_from(base + start).ok()?;
        // SAFETY: a plain system call on our own open file; it moves only the file position,
        // which nothing of the runtime uses (the file is only mapped).
        let r = unsafe { libc::lseek(file.fd(), at, libc::SEEK_DATA) };
        if r < 0 {
            // ENXIO: no data from `start` to the end of the file.
            return (io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO))
                .then_some(None);
        }
        let data = (r as u64).checked_sub(*base)? / PAGE * PAGE;
        Some((data < end).then_some(data.max(start)))
    }

    /// Zero the pages of `[start, end)` (page aligned) that are resident in the mapping,
    /// asking `mincore`; every page when it cannot be asked.
    fn zero_resident(&self, start: u64, end: u64) {
        let pages = ((end - start) / PAGE) as usize;
        let mut resident = vec![0u8; pages];
        // SAFETY: [start, end) is page aligned and inside the mapping; `resident` holds one
        // byte per page as mincore requires.
        let rc = unsafe {
            libc::mincore(
                self.ptr(start).cast(),
                (end - start) as usize,
                resident.as_mut_ptr(),
            )
        };
        if rc != 0 {
            self.fill(start, end - start, 0);
            return;
        }
        let mut i = 0;
        while i < pages {
            if resident[i] & 1 == 0 {
                i += 1;
                continue;
            }
            let run = resident[i..].iter().take_while(|&&r| r & 1 == 1).count();
            self.fill(start + i as u64 * PAGE, run as u64 * PAGE, 0);
            i += run;
        }
    }

    /// Copy `src` into the arena at `offset`.
    pub fn write(&self, offset: u64, src: &[u8]) {
        self.check(offset, src.len() as u64);
        // SAFETY: destination inside the mapping; `src` is a valid slice that cannot overlap
        // a device allocation the caller owns exclusively for the copy.
        unsafe { copy_bytes(src.as_ptr(), self.ptr(offset), src.len()) }
    }

    /// Copy arena bytes at `offset` into `dst`.
    pub fn read(&self, offset: u64, dst: &mut [u8]) {
        self.check(offset, dst.len() as u64);
        // SAFETY: source inside the mapping; `dst` is a valid, exclusive slice.
        unsafe { copy_bytes(self.ptr(offset), dst.as_mut_ptr(), dst.len()) }
    }

    /// Copy `len` bytes from `src_off` of `src` to `dst_off` of `self` (ranges may overlap
    /// when both are the same arena).
    pub fn copy_from(&self, dst_off: u64, src: &Arena, src_off: u64, len: u64) {
        self.check(dst_off, len);
        src.check(src_off, len);
        let (s, d) = (src.ptr(src_off), self.ptr(dst_off));
        let (s_end, d_end) = (s as usize + len as usize, d as usize + len as usize);
        if (s as usize) < d_end && (d as usize) < s_end {
            // SAFETY: both ranges are inside their mappings; `copy` handles overlap.
            unsafe { std::ptr::copy(s, d, len as usize) }
        } else {
            // SAFETY: both ranges are inside their mappings and do not overlap.
            unsafe { copy_bytes(s, d, len as usize) }
        }
    }

    /// Copy from raw host memory into the arena.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes and must not overlap the destination.
    pub unsafe fn write_raw(&self, offset: u64, src: *const u8, len: usize) {
        self.check(offset, len as u64);
        // SAFETY: destination checked; the caller vouches for `src`.
        unsafe { copy_bytes(src, self.ptr(offset), len) }
    }

    /// Copy from the arena into raw host memory.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes and must not overlap the source.
    pub unsafe fn read_raw(&self, offset: u64, dst: *mut u8, len: usize) {
        self.check(offset, len as u64);
        // SAFETY: source checked; the caller vouches for `dst`.
        unsafe { copy_bytes(self.ptr(offset), dst, len) }
    }

    /// A typed shared view of the `bytes` bytes at `offset`, as `count` elements of `T`.
    ///
    /// # Safety
    /// `bytes == count * size_of::<T>()`; the range lies inside one live allocation, is
    /// aligned for `T`, and no byte of it is written while the slice lives. `T` is valid for
    /// every bit pattern.
    pub(crate) unsafe fn slice<T: Copy>(&self, offset: u64, bytes: u64, count: usize) -> &[T] {
        self.check(offset, bytes);
        // SAFETY: inside the mapping (checked); the caller upholds the rest of the contract.
        unsafe { std::slice::from_raw_parts(self.ptr(offset).cast::<T>(), count) }
    }

    /// A typed exclusive view; see [`Arena::slice`].
    ///
    /// # Safety
    /// As for [`Arena::slice`], and no other access to the range happens while it lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut<T: Copy>(
        &self,
        offset: u64,
        bytes: u64,
        count: usize,
    ) -> &mut [T] {
        self.check(offset, bytes);
        // SAFETY: as for `slice`, and the caller guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(offset).cast::<T>(), count) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        MAPPED.lock().remove(&(self.base.as_ptr() as usize));
        // SAFETY: unmapping our own mapping. The slab arena lives as long as its
        // `DeviceMemory`, which every allocation holds through an `Arc`; a large block's arena
        // is owned by its allocation, then by the caches; an imported arena by its allocation;
        // so no pointer into either survives.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len as usize);
        }
        if let Backing::Own { file, offset } = &self.backing {
            if file.is_own() && !self.keep.load(std::sync::atomic::Ordering::Acquire) {
                // Free the pages (another process's mapping of them now reads zeros), then
                // offer the range again. Failure leaves them allocated: a leak, not a fault.
                // SAFETY: a plain system call on our own file's range, which nothing of
                // this process maps any more.
                unsafe {
                    libc::fallocate(
                        file.fd(),
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        *offset as libc::off_t,
                        self.len as libc::off_t,
                    );
                }
                file.give_back(*offset, self.len);
            }
        }
    }
}

/// Map `size` bytes of `file` from `offset` shared and read-write, starting on an `align`
/// boundary (over-reserve address space, map the file over the aligned part, trim).
fn map_range(file: &File, offset: u64, size: usize, align: usize) -> Result<NonNull<u8>, String> {
    let slack = align.saturating_sub(PAGE as usize);
    let total = size
        .checked_add(slack)
        .ok_or_else(|| "larger than the address space".to_string())?;
    // SAFETY: a fresh inaccessible reservation at an address the kernel chooses; no existing
    // memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error().to_string());
    }
    let addr = p as usize;
    let start = addr.next_multiple_of(align);
    // SAFETY: `[start, start + size)` lies inside the reservation made above, which nothing
    // else uses; MAP_FIXED replaces that part of it with the file range.
    let q = unsafe {
        libc::mmap(
            start as *mut libc::c_void,
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE | libc::MAP_FIXED,
            file.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if q == libc::MAP_FAILED {
        let err = io::Error::last_os_error().to_string();
        // SAFETY: unmapping the reservation made above.
        unsafe { libc::munmap(p, total) };
        return Err(err);
    }
    let (head, tail) = (start - addr, addr + total - (start + size));
    // SAFETY: unmapping the unused, page-aligned head and tail of the reservation; nothing
    // refers to them.
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap((start + size) as *mut libc::c_void, tail);
        }
    }
    // Transparent huge pages where the kernel offers them for shared memory: first touch of a
    // large buffer faults 2 MiB at a time. Failure is harmless, so the result is ignored.
    if size >= HUGE_PAGE as usize && align >= HUGE_PAGE as usize {
        // SAFETY: advice on our own fresh mapping.
        unsafe { libc::madvise(start as *mut libc::c_void, size, libc::MADV_HUGEPAGE) };
    }
    NonNull::new(start as *mut u8).ok_or_else(|| "mmap returned null".to_string())
}

/// Whether the host has swap space (then a non-resident page may hold data).
fn swap_configured() -> bool {
    static SWAP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SWAP.get_or_init(|| {
        std::fs::read_to_string("/proc/swaps").map_or(true, |t| t.lines().count() > 1)
    })
}

/// Copies of at least this many bytes are split across the copy helpers (from 128 KiB two
/// threads beat one on the 2-vCPU machines measured, and torch's `copy_` splits there too).
const PARALLEL_COPY_MIN: usize = 128 << 10;
/// Smallest piece a split copy hands to one thread.
const COPY_CHUNK_MIN: usize = 64 << 10;
/// Copies of at least this many bytes write with streaming (non-temporal) stores: source and
/// destination together fill the last-level cache (32 MiB on the machines measured), so the
/// destination would not stay cached for whoever reads it next, and streaming saves reading
/// each of its lines before writing it. glibc's `memcpy` streams only from its own threshold,
/// 240 MiB here; a 64 MiB copy took 0.61x its time with streaming stores (16 MiB: 0.65x).
const STREAM_COPY_MIN: usize = 16 << 20;
/// A streamed copy whose destination lies less than this many bytes past its source, modulo
/// 4 KiB, runs backwards ([`stream_copy`]). 16 and 32 bytes were slow forwards (3.2x and 1.6x
/// the page-aligned time, on AMD EPYC), 64 and more were not; the window leaves room for
/// CPUs that keep more stores in flight.
const ALIAS_WINDOW: usize = 256;
/// Spin-loop hints a copy spends waiting for a helper's piece before it starts yielding
/// (about 10 us here: a running helper finishes a piece well within it).
const WAIT_SPINS: u32 = 1000;
/// Most copy helper threads (one per extra core).
const MAX_COPY_HELPERS: usize = 3;
/// How long an idle copy helper spins for the next job before it sleeps.
const HELPER_SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// One piece of a split copy. Addresses are plain integers so the job can cross threads; the
/// copy that posted it waits (`left`) until every piece has been copied.
struct CopyJob {
    src: usize,
    dst: usize,
    len: usize,
    /// Written with streaming stores: the whole copy is large ([`STREAM_COPY_MIN`]).
    stream: bool,
    left: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The CPU the posting copy ran on when it posted (`sync::current_cpu`).
    poster_cpu: u32,
}

impl CopyJob {
    /// Run the piece on a helper. A helper on its poster's core first moves to another
    /// (`sync::move_off_feeders_core`): Linux starts a helper and wakes it beside the thread
    /// that made or woke it, and there the piece runs only when the poster stops to wait, so
    /// every copy ran at one thread's speed for whole bench rows (1 MiB H2D: 23 us against 13
    /// in the same run's other directions).
    fn run_on_helper(self) {
        if crate::sync::current_cpu() == self.poster_cpu {
            crate::sync::move_off_feeders_core(std::time::Instant::now());
        }
        self.run();
    }

    fn run(self) {
        // SAFETY: the posting copy keeps both ranges valid, disjoint and unaliased until
        // `left` reaches zero, which happens only after this copy.
        unsafe {
            copy_piece(
                self.src as *const u8,
                self.dst as *mut u8,
                self.len,
                self.stream,
            )
        };
        self.left.fetch_sub(1, std::sync::atomic::Ordering::Release);
    }
}

/// Persistent helper threads for large copies (one per extra core, at most three). A helper
/// spins briefly after each job and after each wake-up, so back-to-back copies split without
/// a wake-up; a copy never waits for a sleeping helper because the caller takes back pieces
/// nobody has started.
///
/// Sleeping is the helpers' own protocol, not the channel's blocking `recv`: a helper woken
/// for a piece that the caller took back first must go back to spinning (the next copy is
/// likely microseconds away), where `recv` would sleep again at once, and every later copy
/// would then run on its caller alone while paying the wake-up.
struct CopyPool {
    tx: crossbeam_channel::Sender<CopyJob>,
    rx: crossbeam_channel::Receiver<CopyJob>,
    /// Helpers started (set once they are).
    helpers: std::sync::atomic::AtomicUsize,
    /// Helpers parked (or about to park); a poster that sees none wakes nobody.
    sleepers: std::sync::atomic::AtomicUsize,
    /// Each helper's thread, set by the helper itself as it starts, for posters to unpark.
    /// Parking (a futex per thread, no lock and no process-wide table) keeps a poster from
    /// ever blocking on a helper: with a mutex and condvar, a poster could wait for the lock
    /// that a just-woken helper held while it was not running (250 us stalls were measured),
    /// and parking_lot's table of parked threads could be left locked across a `fork()`.
    threads: [std::sync::OnceLock<std::thread::Thread>; MAX_COPY_HELPERS],
}

impl CopyPool {
    /// Post a piece, waking the helpers if any sleeps.
    ///
    /// Against [`CopyPool::helper`]: the poster sends, then (after a SeqCst fence) reads
    /// `sleepers`; a helper counts itself in `sleepers`, then (after a SeqCst fence) looks at
    /// the channel before it parks. Either the helper sees the piece, or the poster sees the
    /// helper and unparks it, and an unpark that comes before the park makes the park
    /// return at once: no wake-up is lost.
    fn post(&self, job: CopyJob) {
        use std::sync::atomic::{fence, Ordering};
        let _ = self.tx.send(job);
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            for t in self.threads.iter().filter_map(std::sync::OnceLock::get) {
                t.unpark();
            }
        }
    }

    /// A helper thread's loop: run pieces; spin [`HELPER_SPIN`] for the next; then park
    /// until a piece is posted, and spin again.
    fn helper(&self, index: usize) {
        use std::sync::atomic::{fence, Ordering};
        let _ = self.threads[index].set(std::thread::current());
        loop {
            if self.spin_for_job() {
                continue;
            }
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            crate::sync::forget_move();
            if self.rx.is_empty() {
                std::thread::park(); // may return early; the loop looks again
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Run the first piece posted within [`HELPER_SPIN`]; false if none came.
    fn spin_for_job(&self) -> bool {
        let start = std::time::Instant::now();
        while start.elapsed() < HELPER_SPIN {
            if let Ok(j) = self.rx.try_recv() {
                j.run_on_helper();
                return true;
            }
            std::hint::spin_loop();
        }
        false
    }
}

/// The process's copy pool: made on first use, and made again in a forked child (whose
/// helpers did not survive the fork; the parent's pool is leaked there).
static POOL: std::sync::atomic::AtomicPtr<CopyPool> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
static POOL_INIT: crate::sync::StaticMutex<()> = crate::sync::StaticMutex::new(());

fn copy_pool() -> &'static CopyPool {
    use std::sync::atomic::Ordering;
    let p = POOL.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a non-null POOL points to a leaked (never freed) pool.
        return unsafe { &*p };
    }
    let _init = POOL_INIT.lock();
    let p = POOL.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: as above.
        return unsafe { &*p };
    }
    let pool = new_copy_pool();
    POOL.store(std::ptr::from_ref(pool).cast_mut(), Ordering::Release);
    pool
}

/// After `fork()`, in the child: forget the parent's pool (its helpers are gone and its
/// channel may be locked by one of them); the next large copy makes a new one.
pub(crate) fn after_fork_in_child() {
    // The parent's file stays mapped under inherited arenas; new memory comes from a new one.
    std::mem::forget(SHARED.lock().take());
    POOL.store(std::ptr::null_mut(), std::sync::atomic::Ordering::Release);
}

static SHARED_FORK: crate::sync::ForkGuarded<crate::sync::StaticMutex<Option<Arc<SharedFile>>>> =
    crate::sync::ForkGuarded::new(|| &SHARED);
static POOL_INIT_FORK: crate::sync::ForkGuarded<crate::sync::StaticMutex<()>> =
    crate::sync::ForkGuarded::new(|| &POOL_INIT);
static MAPPED_FORK: crate::sync::ForkGuarded<
    crate::sync::StaticMutex<std::collections::BTreeMap<usize, usize>>,
> = crate::sync::ForkGuarded::new(|| &MAPPED);

/// Around `fork()`: hold the device memory file's slot, the copy pool's start lock and the
/// arenas' range map (see `runtime::install_fork_handlers`).
pub(crate) fn before_fork(wait: std::time::Duration) {
    SHARED_FORK.before_fork(wait);
    POOL_INIT_FORK.before_fork(wait);
    MAPPED_FORK.before_fork(wait);
}

/// After `fork()`: release what [`before_fork`] took (in the child also a hold of a thread
/// that vanished in the fork).
pub(crate) fn after_fork(child: bool) {
    MAPPED_FORK.after_fork(child);
    POOL_INIT_FORK.after_fork(child);
    SHARED_FORK.after_fork(child);
}

/// A pool with its helpers started, as many as the OS lets start (a copy with none runs on
/// its caller). Leaked: the helpers run for the life of the process.
fn new_copy_pool() -> &'static CopyPool {
    let (tx, rx) = crossbeam_channel::unbounded::<CopyJob>();
    let pool: &'static CopyPool = Box::leak(Box::new(CopyPool {
        tx,
        rx,
        helpers: std::sync::atomic::AtomicUsize::new(0),
        sleepers: std::sync::atomic::AtomicUsize::new(0),
        threads: Default::default(),
    }));
    let wanted = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_COPY_HELPERS + 1)
        - 1;
    let mut helpers = 0;
    for i in 0..wanted {
        let started =
            crate::sync::spawn_thread(format!("runtime-copy-{i}"), move || pool.helper(i));
        if started.is_ok() {
            helpers += 1;
        }
    }
    pool.helpers
        .store(helpers, std::sync::atomic::Ordering::Relaxed);
    pool
}

/// `memcpy`, split across the copy helpers for large copies (on a 2-vCPU VM one thread moves
/// ~12 GB/s from DRAM, two ~16 GB/s, and cache-resident copies scale too).
///
/// # Safety
/// `src` valid for `len` reads, `dst` valid for `len` writes, the ranges do not overlap.
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    let pool = if (PARALLEL_COPY_MIN..=crate::config::copy_split_max()).contains(&len) {
        Some(copy_pool())
    } else {
        None
    };
    let pieces = pool
        .map_or(1, |p| {
            (p.helpers.load(std::sync::atomic::Ordering::Relaxed) + 1).min(len / COPY_CHUNK_MIN)
        })
        .max(1);
    let stream = len >= STREAM_COPY_MIN;
    if pieces <= 1 {
        // SAFETY: the caller's contract.
        unsafe { copy_piece(src, dst, len, stream) };
        return;
    }
    let pool = pool.expect("pieces > 1 only with a pool");
    let chunk = len.div_ceil(pieces).next_multiple_of(4096);
    let left = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (s, d) = (src as usize, dst as usize);
    let poster_cpu = crate::sync::current_cpu();
    let mut start = chunk;
    while start < len {
        let n = chunk.min(len - start);
        left.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        pool.post(CopyJob {
            src: s + start,
            dst: d + start,
            len: n,
            stream,
            left: left.clone(),
            poster_cpu,
        });
        start += n;
    }
    // SAFETY: the first piece, disjoint from the posted ones.
    unsafe { copy_piece(src, dst, chunk.min(len), stream) };
    // Take back pieces no helper has started (ours or another copy's: both are fine to run).
    // A piece a helper took is waited for by spinning, then by yielding: a helper just woken
    // can be placed on this very core, where it runs only when this thread lets it (a pure
    // spin measured 250 us stalls per 1 MiB copy, one scheduler tick each).
    let mut spins = 0u32;
    while left.load(std::sync::atomic::Ordering::Acquire) > 0 {
        match pool.rx.try_recv() {
            Ok(j) => j.run(),
            Err(_) if spins < WAIT_SPINS => {
                spins += 1;
                std::hint::spin_loop();
            }
            Err(_) => std::thread::yield_now(),
        }
    }
}

/// `dst = src` (equal lengths) with streaming stores ([`stream_copy`]): for outputs larger
/// than the caches (the built-in `copy` kernel's).
pub(crate) fn stream_copy_slice(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "stream_copy_slice: lengths differ");
    // SAFETY: two live slices of `len` bytes, `dst` borrowed exclusively, so they do not
    // overlap.
    unsafe { stream_copy(src.as_ptr(), dst.as_mut_ptr(), dst.len()) }
}

/// One thread's piece of a copy: `memcpy`, or [`stream_copy`] when `stream`.
///
/// # Safety
/// As [`copy_bytes`].
unsafe fn copy_piece(src: *const u8, dst: *mut u8, len: usize, stream: bool) {
    if stream {
        // SAFETY: the caller's contract.
        unsafe { stream_copy(src, dst, len) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

/// `memcpy` with streaming stores: SSE2's `movntdq`, which every x86-64 CPU has, for the
/// 16-byte-aligned body of `dst` (a plain copy for the head and tail, and on other
/// architectures). A sequentially consistent fence ends it (`mfence`, which orders the
/// weakly ordered streaming stores before the stores that follow, such as the release that
/// tells the copy's poster this piece is done).
///
/// The body runs backwards when `dst` lies a little past `src` modulo 4 KiB
/// ([`ALIAS_WINDOW`]). Going forwards, each load would then match a just-issued store in its
/// address's low 12 bits, which is all the CPU compares before it lets a load pass a store
/// ("4K aliasing"), and wait for it: a 64 MiB device-to-host copy into a numpy array (whose
/// data starts 16 bytes into a page) took 15.5 ms against 4.8 ms page-aligned. Backwards,
/// every load is below the stores before it, and the same copy takes the aligned time.
///
/// # Safety
/// As [`copy_bytes`]: `src` valid for `len` reads, `dst` valid for `len` writes, the ranges
/// do not overlap.
unsafe fn stream_copy(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let head = dst.align_offset(16).min(len);
        let end = head + (len - head) / 16 * 16;
        let backwards =
            (1..ALIAS_WINDOW).contains(&((dst as usize).wrapping_sub(src as usize) % 4096));
        // SAFETY: the caller's contract covers `0..len` of both ranges: the head and tail
        // copies stay inside it, and each 16-byte load and store in the loops is at
        // `i..i + 16` with `head <= i` and `i + 16 <= end <= len`. The store's address is
        // 16-byte aligned as `_mm_stream_si128` requires (`dst + head` is aligned, `i` moves
        // by 16 from `head` or from `end`, which is `head` plus whole units); the load is
        // unaligned. SSE2 is part of the x86-64 baseline.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            if backwards {
                let mut i = end;
                while i > head {
                    i -= 16;
                    let v = _mm_loadu_si128(src.add(i).cast::<__m128i>());
                    _mm_stream_si128(dst.add(i).cast::<__m128i>(), v);
                }
            } else {
                let mut i = head;
                while i < end {
                    let v = _mm_loadu_si128(src.add(i).cast::<__m128i>());
                    _mm_stream_si128(dst.add(i).cast::<__m128i>(), v);
                    i += 16;
                }
            }
            std::ptr::copy_nonoverlapping(src.add(end), dst.add(end), len - end);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
    #[cfg(any(miri, not(target_arch = "x86_64")))]
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_memory_reads_zero_and_release_rezeroes() {
        let a = Arena::reserve(0, 1 << 20).unwrap();
        let mut buf = vec![1u8; 10_000];
        a.read(100, &mut buf);
        assert!(buf.iter().all(|&b| b == 0));
        a.fill(0, 1 << 20, 7);
        a.release(10, 20_000);
        a.read(10, &mut buf);
        assert!(buf.iter().all(|&b| b == 0));
        let mut edge = [0u8; 2];
        a.read(9, &mut edge[..1]);
        a.read(20_010, &mut edge[1..]);
        assert_eq!(edge, [7, 7]);
    }

    #[test]
    fn zero_clears_touched_pages_and_leaves_untouched_ones_uncommitted() {
        let a = Arena::reserve(0, 1 << 20).unwrap();
        a.fill(5000, 3 * 4096, 9);
        a.fill(700_000, 10, 9);
        a.zero(0, 1 << 20);
        let mut back = vec![1u8; 1 << 20];
        a.read(0, &mut back);
        assert!(back.iter().all(|&b| b == 0));
        // Unaligned ranges too.
        a.fill(100, 9000, 3);
        a.zero(101, 8000);
        let mut b = vec![0u8; 9000];
        a.read(100, &mut b);
        assert_eq!(b[0], 3);
        assert!(b[1..8001].iter().all(|&x| x == 0));
        assert!(b[8001..].iter().all(|&x| x == 3));
    }

    #[test]
    fn the_file_says_where_the_first_touched_page_is() {
        let a = Arena::map(1 << 20).unwrap();
        // A block nobody touched holds no data at all.
        assert_eq!(a.first_data(0, 1 << 20), Some(None));
        a.fill(5 * PAGE + 1, 1, 9);
        a.fill(7 * PAGE, 3 * PAGE, 9);
        assert_eq!(a.first_data(0, 1 << 20), Some(Some(5 * PAGE)));
        assert_eq!(a.first_data(6 * PAGE, 1 << 20), Some(Some(7 * PAGE)));
        assert_eq!(a.first_data(8 * PAGE, 9 * PAGE), Some(Some(8 * PAGE)));
        // Data after the asked range does not count.
        assert_eq!(a.first_data(0, 5 * PAGE), Some(None));
        assert_eq!(a.first_data(10 * PAGE, 1 << 20), Some(None));
        a.zero(0, 1 << 20);
        let mut back = vec![1u8; 1 << 20];
        a.read(0, &mut back);
        assert!(back.iter().all(|&b| b == 0));
    }

    #[test]
    fn an_imported_arena_is_zeroed_through_its_resident_pages() {
        let a = Arena::map(1 << 20).unwrap();
        let (file, offset) = a.file_range().map(|(f, o)| (f.clone(), o)).unwrap();
        // Our own file, opened again (as another process would open it).
        let again = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", file.fd()))
            .unwrap();
        let b = Arena::map_file(&again, offset, 1 << 20).unwrap();
        assert_eq!(b.first_data(0, 1 << 20), None);
        b.fill(3 * PAGE, 2 * PAGE + 5, 4);
        let mut back = vec![0u8; 1 << 20];
        a.read(0, &mut back);
        assert_eq!(
            back.iter().filter(|&&x| x == 4).count() as u64,
            2 * PAGE + 5
        );
        b.zero(0, 1 << 20);
        a.read(0, &mut back);
        assert!(back.iter().all(|&x| x == 0));
    }

    /// The streaming copy writes exactly the bytes of `memcpy` for every alignment of source
    /// and destination and every length around its 16-byte units, and nothing past them.
    #[test]
    fn stream_copy_matches_memcpy_at_every_alignment() {
        let src: Vec<u8> = (0..200u32).map(|i| (i * 7 % 251) as u8 + 1).collect();
        for from in 0..16 {
            for to in 0..16 {
                for len in [0, 1, 15, 16, 17, 31, 32, 33, 100, 160] {
                    let mut dst = [0u8; 200];
                    stream_copy_slice(&mut dst[to..to + len], &src[from..from + len]);
                    assert_eq!(
                        &dst[to..to + len],
                        &src[from..from + len],
                        "{from} -> {to}, {len}"
                    );
                    assert!(dst[..to].iter().chain(&dst[to + len..]).all(|&b| b == 0));
                }
            }
        }
    }

    /// Where the destination lies just past the source modulo 4 KiB the streamed body runs
    /// backwards: it writes the same bytes as the forward one, at every distance in and
    /// around the window and every length around its 16-byte units.
    #[test]
    fn stream_copy_is_exact_at_every_distance_modulo_a_page() {
        let mut buf = vec![0u8; 4 * 4096 + 1024];
        let page = buf.as_ptr().align_offset(4096);
        let src: Vec<u8> = (0..1000u32).map(|i| (i * 13 % 251) as u8 + 1).collect();
        for delta in (0..ALIAS_WINDOW + 40).chain([4095, 4080]) {
            for (from, len) in [(0, 0), (0, 16), (3, 17), (0, 1000), (5, 999), (16, 640)] {
                let region = &mut buf[page..page + 3 * 4096];
                region.fill(0);
                let (s, d) = region.split_at_mut(4096 + 1024);
                s[from..from + len].copy_from_slice(&src[..len]);
                // `d` starts 4096 + 1024 bytes after `s`; `to` puts the destination `delta`
                // bytes past the source, modulo a page.
                let to = (delta + from + 4096 * 2 - 1024) % 4096;
                stream_copy_slice(&mut d[to..to + len], &s[from..from + len]);
                assert_eq!(
                    &d[to..to + len],
                    &src[..len],
                    "delta {delta}, from {from}, len {len}"
                );
                assert!(d[..to].iter().chain(&d[to + len..]).all(|&b| b == 0));
            }
        }
    }

    /// A copy large enough to stream is split across the helpers and streamed by each: every
    /// byte arrives, at an odd length and a misaligned destination.
    #[test]
    fn large_streamed_copies_split_correctly() {
        let n = (STREAM_COPY_MIN + 12345) as u64;
        let a = Arena::reserve(0, 2 * n + 4096).unwrap();
        let src: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        a.write(0, &src);
        a.copy_from(n + 3, &a, 0, n);
        let mut back = vec![0u8; n as usize];
        a.read(n + 3, &mut back);
        assert!(back == src, "the streamed copy differs");
    }

    #[test]
    fn large_copies_split_correctly() {
        let n = (PARALLEL_COPY_MIN * 3 + 12345) as u64;
        let a = Arena::reserve(0, 2 * n + 4096).unwrap();
        let src: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        a.write(0, &src);
        a.copy_from(n, &a, 0, n);
        let mut back = vec![0u8; n as usize];
        a.read(n, &mut back);
        assert_eq!(back, src);
        // overlapping move
        a.copy_from(1, &a, 0, 1000);
        let mut b = vec![0u8; 1001];
        a.read(0, &mut b);
        assert_eq!(&b[1..], &src[..1000]);
    }

    #[test]
    fn split_copies_from_several_threads_and_after_the_helpers_slept_land_every_byte() {
        let n = PARALLEL_COPY_MIN * 4 + 777;
        let check = |seed: usize| {
            let src: Vec<u8> = (0..n).map(|i| ((i * 7 + seed) % 253) as u8).collect();
            let mut dst = vec![0u8; n];
            // SAFETY: two distinct vectors of `n` bytes.
            unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), n) };
            assert!(dst == src, "copy {seed} differs");
        };
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || (0..20).for_each(|i| check(t * 100 + i)));
            }
        });
        // Past the helpers' spin: they sleep, and the next copies wake them.
        std::thread::sleep(HELPER_SPIN * 5);
        (0..5).for_each(check);
    }

    #[test]
    fn block_mappings_are_zeroed_and_large_ones_start_on_a_huge_page() {
        let len = 3 * HUGE_PAGE + PAGE;
        let a = Arena::map(len).unwrap();
        assert_eq!(a.len(), len);
        assert_eq!(a.ptr(0) as usize % HUGE_PAGE as usize, 0);
        let mut probe = [1u8; 8];
        a.read(len - 8, &mut probe);
        assert_eq!(probe, [0; 8]);
        a.write(len - 8, &[9; 8]);
        let small = Arena::map(PAGE).unwrap();
        small.read(PAGE - 8, &mut probe);
        assert_eq!(probe, [0; 8]);
        assert!(Arena::map(0).is_none());
    }

    #[test]
    fn huge_reservations_cost_no_ram() {
        let a = Arena::reserve(0, 64 << 30).unwrap();
        a.write((64 << 30) - 8, &[1; 8]);
        assert_eq!(a.len(), 64 << 30);
    }
}
