//! Host backing for device memory: the only `unsafe` of the memory layer.
//!
//! An [`Arena`] is one private anonymous mapping with `MAP_NORESERVE`: address space only, no
//! RAM and no swap accounting. A device has one for its slab spans ([`Arena::reserve`]) and one
//! per large block ([`Arena::map`]). The OS commits a page when it is first touched and hands it
//! out zero-filled, so a fresh allocation is zeroed for free and costs no RAM until used.
//! [`Arena::release`] gives pages back (`MADV_DONTNEED`); they read as zero again afterwards,
//! which is how freed blocks return to the allocator clean. Dropping an arena unmaps it.
//!
//! Soundness: the arena only hands out raw pointers and performs raw copies; it never creates
//! Rust references into device memory except through [`Arena::slice`] and
//! [`Arena::slice_mut`], whose callers promise the range lies inside a live allocation they
//! own for the duration. Concurrent access to the same bytes from two streams, or from a
//! stream and a host view, is a data race in the device's memory model exactly as on a real
//! accelerator; the runtime orders it only through streams and events.

use std::io;
use std::ptr::NonNull;

use crate::error::ConfigError;

/// Page size assumed for releases; large blocks are whole pages.
pub const PAGE: u64 = 4096;

/// Transparent huge page size: mappings at least this large are aligned to it.
pub const HUGE_PAGE: u64 = 2 << 20;

/// A reserved, lazily committed address range.
pub struct Arena {
    base: NonNull<u8>,
    len: u64,
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
        // Large mappings are over-reserved by a huge page less one page and trimmed, so that
        // they start on a huge-page boundary and every whole huge page of them can be backed
        // by one.
        let align = HUGE_PAGE as usize;
        let slack = if size >= align {
            align - PAGE as usize
        } else {
            0
        };
        let total = size
            .checked_add(slack)
            .ok_or_else(|| "larger than the address space".to_string())?;
        // SAFETY: a fresh anonymous private mapping at an address the kernel chooses; no
        // existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error().to_string());
        }
        let addr = p as usize;
        let start = if slack > 0 {
            addr.next_multiple_of(align)
        } else {
            addr
        };
        let (head, tail) = (start - addr, addr + total - (start + size));
        // SAFETY: unmapping the unused, page-aligned head and tail of the mapping made above;
        // nothing refers to them.
        unsafe {
            if head > 0 {
                libc::munmap(p, head);
            }
            if tail > 0 {
                libc::munmap((start + size) as *mut libc::c_void, tail);
            }
        }
        let base =
            NonNull::new(start as *mut u8).ok_or_else(|| "mmap returned null".to_string())?;
        // Transparent huge pages where the kernel offers them (THP "madvise" mode): first
        // touch of a large buffer faults 2 MiB at a time (~5x faster here) and large copies
        // run with fewer TLB misses. Only touched memory is committed either way. Failure is
        // harmless (no THP support), so the result is ignored.
        if size >= align {
            // SAFETY: advice on our own fresh mapping.
            unsafe { libc::madvise(base.as_ptr().cast(), size, libc::MADV_HUGEPAGE) };
        }
        Ok(Arena { base, len })
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
        // SAFETY: [start, end) is page aligned and inside the mapping; DONTNEED on a private
        // anonymous mapping only drops the pages, which then read as zero.
        let rc = unsafe {
            libc::madvise(
                self.ptr(start).cast(),
                (end - start) as usize,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            // Cannot happen for a valid range; fall back to zeroing so the invariant holds.
            self.fill(start, end - start, 0);
        }
    }

    /// Make `[offset, offset + len)` read as zero, writing only pages that are resident.
    ///
    /// A private anonymous page that is not resident has never been touched since its last
    /// release, so it already reads as zero, provided it cannot have been swapped out: with
    /// swap configured every page is written. Whole-page interiors are asked with `mincore`;
    /// partial pages at the ends are always written.
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
        // SAFETY: unmapping our own mapping. The slab arena lives as long as its
        // `DeviceMemory`, which every allocation holds through an `Arc`; a large block's arena
        // is owned by its allocation, then by the caches, so no pointer into either survives.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len as usize);
        }
    }
}

/// Whether the host has swap space (then a non-resident page may hold data).
fn swap_configured() -> bool {
    static SWAP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SWAP.get_or_init(|| {
        std::fs::read_to_string("/proc/swaps").map_or(true, |t| t.lines().count() > 1)
    })
}

/// Copies of at least this many bytes are split across the copy helpers.
const PARALLEL_COPY_MIN: usize = 512 << 10;
/// Smallest piece a split copy hands to one thread.
const COPY_CHUNK_MIN: usize = 256 << 10;
/// How long an idle copy helper spins for the next job before it sleeps.
const HELPER_SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// One piece of a split copy. Addresses are plain integers so the job can cross threads; the
/// copy that posted it waits (`left`) until every piece has been copied.
struct CopyJob {
    src: usize,
    dst: usize,
    len: usize,
    left: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl CopyJob {
    fn run(self) {
        // SAFETY: the posting copy keeps both ranges valid, disjoint and unaliased until
        // `left` reaches zero, which happens only after this copy.
        unsafe {
            std::ptr::copy_nonoverlapping(self.src as *const u8, self.dst as *mut u8, self.len)
        };
        self.left.fetch_sub(1, std::sync::atomic::Ordering::Release);
    }
}

/// Persistent helper threads for large copies (one per extra core, at most three). A helper
/// spins briefly after each job, so back-to-back copies split without a wake-up; a copy never
/// waits for a sleeping helper because the caller takes back pieces nobody has started.
struct CopyPool {
    tx: crossbeam_channel::Sender<CopyJob>,
    rx: crossbeam_channel::Receiver<CopyJob>,
    helpers: usize,
}

/// The process's copy pool: made on first use, and made again in a forked child (whose
/// helpers did not survive the fork; the parent's pool is leaked there).
static POOL: std::sync::atomic::AtomicPtr<CopyPool> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
static POOL_INIT: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

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
    let pool: &'static CopyPool = Box::leak(Box::new(new_copy_pool()));
    POOL.store(std::ptr::from_ref(pool).cast_mut(), Ordering::Release);
    pool
}

/// After `fork()`, in the child: forget the parent's pool (its helpers are gone and its
/// channel may be locked by one of them); the next large copy makes a new one.
pub(crate) fn after_fork_in_child() {
    if POOL_INIT.is_locked() {
        // SAFETY: the child has one thread, which is here: the holder vanished in the fork.
        unsafe { POOL_INIT.force_unlock() };
    }
    POOL.store(std::ptr::null_mut(), std::sync::atomic::Ordering::Release);
}

/// Start the helpers; as many as the OS lets start (a copy with none runs on its caller).
fn new_copy_pool() -> CopyPool {
    let (tx, rx) = crossbeam_channel::unbounded::<CopyJob>();
    let wanted = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4)
        - 1;
    let mut helpers = 0;
    for i in 0..wanted {
        let rx = rx.clone();
        let started = crate::sync::spawn_thread(format!("runtime-copy-{i}"), move || loop {
            let start = std::time::Instant::now();
            let mut job = None;
            while start.elapsed() < HELPER_SPIN {
                if let Ok(j) = rx.try_recv() {
                    job = Some(j);
                    break;
                }
                std::hint::spin_loop();
            }
            match job.map_or_else(|| rx.recv().ok(), Some) {
                Some(j) => j.run(),
                None => return,
            }
        });
        if started.is_ok() {
            helpers += 1;
        }
    }
    CopyPool { tx, rx, helpers }
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
        .map_or(1, |p| (p.helpers + 1).min(len / COPY_CHUNK_MIN))
        .max(1);
    if pieces <= 1 {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    let pool = pool.expect("pieces > 1 only with a pool");
    let chunk = len.div_ceil(pieces).next_multiple_of(4096);
    let left = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (s, d) = (src as usize, dst as usize);
    let mut start = chunk;
    while start < len {
        let n = chunk.min(len - start);
        left.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = pool.tx.send(CopyJob {
            src: s + start,
            dst: d + start,
            len: n,
            left: left.clone(),
        });
        start += n;
    }
    // SAFETY: the first piece, disjoint from the posted ones.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, chunk.min(len)) };
    // Take back pieces no helper has started (ours or another copy's: both are fine to run).
    while left.load(std::sync::atomic::Ordering::Acquire) > 0 {
        match pool.rx.try_recv() {
            Ok(j) => j.run(),
            Err(_) => std::hint::spin_loop(),
        }
    }
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
