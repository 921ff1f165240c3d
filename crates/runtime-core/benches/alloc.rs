//! Allocation + free pairs: the runtime's device allocator beside two peers, in one run.
//!
//! * `runtime/reuse`: `DeviceMemory::allocate(n)` then drop, with `enableMemoryReuse` on (the
//!   default: freed large blocks are cached and zeroed by a background scrubber);
//! * `runtime/no-reuse`: the same with reuse off (freed blocks go straight back to the buddy,
//!   their pages released with `MADV_DONTNEED`);
//! * `system`: `std::alloc::alloc_zeroed` / `dealloc` with alignment 16 (glibc `calloc`/`free`);
//! * `buddy+zero`: a `buddy_system_allocator::Heap` over a pre-faulted region, then zeroing
//!   the block (`write_bytes`) so it gives the same guarantee (zeroed memory) as the others.
//!
//! Run: `cargo bench -p runtime-core --bench alloc` (add `-- --warm-up-time 1
//! --measurement-time 3` for a short run).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::hint::black_box;
use std::ptr::NonNull;

use buddy_system_allocator::Heap;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use runtime_core::config::ConfigBuilder;
use runtime_core::runtime;

const SIZES: [(u64, &str); 5] = [
    (64, "64B"),
    (4 << 10, "4KiB"),
    (64 << 10, "64KiB"),
    (1 << 20, "1MiB"),
    (64 << 20, "64MiB"),
];

/// Bytes behind the buddy heap: room for a 64 MiB block (and its buddy split path).
const HEAP_BYTES: usize = 256 << 20;

struct BuddyPeer {
    heap: Heap<33>,
    region: NonNull<u8>,
    layout: Layout,
}

impl BuddyPeer {
    fn new() -> BuddyPeer {
        let layout = Layout::from_size_align(HEAP_BYTES, 4096).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let region = NonNull::new(p).expect("allocate the buddy heap's region");
        // Pre-fault the region so the peer measures its allocator, not first-touch faults.
        // SAFETY: `p` points to HEAP_BYTES writable bytes owned here.
        unsafe { std::ptr::write_bytes(p, 1, HEAP_BYTES) };
        let mut heap = Heap::<33>::new();
        // SAFETY: the region is valid, exclusively owned by this heap and outlives it (freed
        // in Drop after the heap is no longer used).
        unsafe { heap.init(p as usize, HEAP_BYTES) };
        BuddyPeer {
            heap,
            region,
            layout,
        }
    }

    fn alloc_free_zeroed(&mut self, n: usize) {
        let layout = Layout::from_size_align(n, 64).expect("valid layout");
        let p = self.heap.alloc(layout).expect("buddy heap has room");
        // SAFETY: `p` is a fresh block of at least `n` bytes from the heap.
        unsafe { std::ptr::write_bytes(p.as_ptr(), 0, n) };
        black_box(p);
        self.heap.dealloc(p, layout);
    }
}

impl Drop for BuddyPeer {
    fn drop(&mut self) {
        // SAFETY: `region` came from `alloc_zeroed(self.layout)` and the heap is dropped with
        // `self`, never touching the region again.
        unsafe { dealloc(self.region.as_ptr(), self.layout) };
    }
}

fn system_alloc_free(n: usize) {
    // Alignment 16 (the platform's malloc alignment) so that `alloc_zeroed` is glibc `calloc`,
    // which hands out lazily zeroed fresh pages for large sizes; a larger alignment would make
    // std fall back to `posix_memalign` + an explicit memset.
    let layout = Layout::from_size_align(n, 16).expect("valid layout");
    // SAFETY: non-zero size.
    let p = unsafe { alloc_zeroed(layout) };
    assert!(!p.is_null(), "system allocator failed");
    black_box(p);
    // SAFETY: `p` was allocated above with `layout`.
    unsafe { dealloc(p, layout) };
}

fn bench_alloc(c: &mut Criterion) {
    let rt = runtime::init(&ConfigBuilder {
        device_count: Some(1),
        memory: Some(runtime_core::Bytes::gib(2)),
        ..Default::default()
    })
    .expect("init the runtime");
    let mem = rt.device(0).expect("device 0").memory().clone();
    let mut buddy = BuddyPeer::new();

    let mut g = c.benchmark_group("alloc_free");
    for (n, label) in SIZES {
        g.throughput(Throughput::Elements(1));
        runtime::set_option(runtime_core::config::RuntimeOption::MemoryReuse, true);
        g.bench_with_input(BenchmarkId::new("runtime/reuse", label), &n, |b, &n| {
            b.iter(|| drop(black_box(mem.allocate(n).expect("allocate"))))
        });
        mem.empty_cache();
        runtime::set_option(runtime_core::config::RuntimeOption::MemoryReuse, false);
        g.bench_with_input(BenchmarkId::new("runtime/no-reuse", label), &n, |b, &n| {
            b.iter(|| drop(black_box(mem.allocate(n).expect("allocate"))))
        });
        runtime::set_option(runtime_core::config::RuntimeOption::MemoryReuse, true);
        g.bench_with_input(BenchmarkId::new("system", label), &n, |b, &n| {
            b.iter(|| system_alloc_free(n as usize))
        });
        g.bench_with_input(BenchmarkId::new("buddy+zero", label), &n, |b, &n| {
            b.iter(|| buddy.alloc_free_zeroed(n as usize))
        });
    }
    g.finish();
    let s = mem.stats();
    eprintln!(
        "runtime allocator after the run: reserved {} MiB, cached {} MiB, allocs {}, cache hits {}, cache flushes {}",
        s.reserved >> 20,
        s.cached >> 20,
        s.num_allocs,
        s.cache_hits,
        s.cache_flushes
    );
    drop(mem);
    runtime::shutdown().expect("shutdown");
}

criterion_group!(benches, bench_alloc);
criterion_main!(benches);
