//! Device memory: zeroed allocations (after reuse too), statistics, out-of-memory (only when
//! capacity is really exhausted, never from fragmentation, and never while freed memory is
//! only held by queued work), zero-byte allocations, the `enableMemoryReuse` option, buffer
//! lifetimes, and stream-ordered copies.
//!
//! The tests on the shared runtime hold a file-level lock: they read allocator statistics and
//! one of them flips a process-wide option. Others use a device memory of their own.

mod common;

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use runtime_core::config::{ConfigBuilder, Options};
use runtime_core::error::{Error, KernelFailure, MemoryError};
use runtime_core::memory::{self, Buffer, DeviceMemory, SLAB_SPAN, SMALL_MAX};
use runtime_core::runtime::{self, Runtime};
use runtime_core::stream::copy::{self, HostMemory, HostVec};
use runtime_core::stream::{FnOp, Op, OpKind, Stream};

const MIB: u64 = 1 << 20;

static LOCK: Mutex<()> = Mutex::new(());

fn init() -> (MutexGuard<'static, ()>, Arc<Runtime>) {
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let rt = runtime::init(&ConfigBuilder {
        device_count: Some(2),
        memory: Some(runtime_core::Bytes::mib(256)),
        profile: None,
    })
    .expect("init the runtime");
    (g, rt)
}

fn mem(rt: &Runtime, device: usize) -> Arc<DeviceMemory> {
    rt.device(device).unwrap().memory().clone()
}

fn all_zero(b: &Buffer) -> bool {
    let mut bytes = vec![0xFFu8; b.size() as usize];
    b.read(0, &mut bytes).unwrap();
    bytes.iter().all(|&x| x == 0)
}

/// Wait (bounded) until `f` holds; the background scrubber finishes cached blocks shortly
/// after they are freed.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Restores `enableMemoryReuse` when dropped, even if the test fails.
struct ReuseGuard;

impl Drop for ReuseGuard {
    fn drop(&mut self) {
        runtime::set_option(runtime_core::config::RuntimeOption::MemoryReuse, true);
    }
}

/// An op that blocks its stream until `open` is called (or fails after 10 s).
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn new() -> Gate {
        Gate(Arc::new((Mutex::new(false), Condvar::new())))
    }

    fn op(&self) -> Arc<dyn Op> {
        let g = self.0.clone();
        FnOp::shared("gate", OpKind::Compute, move || {
            let (lock, cv) = &*g;
            let open = lock.lock().unwrap();
            let (open, _) = cv
                .wait_timeout_while(open, Duration::from_secs(10), |o| !*o)
                .unwrap();
            if *open {
                Ok(())
            } else {
                Err(KernelFailure::new("gate", "never opened"))
            }
        })
    }

    fn open(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }
}

const SIZES: &[u64] = &[
    1,
    63,
    64,
    100,
    4095,
    4096,
    8192,
    32 * 1024 - 1,
    32 * 1024,
    32 * 1024 + 1,
    64 * 1024,
    MIB,
];

#[test]
fn allocations_read_as_zero_even_after_reuse() {
    let (_g, rt) = init();
    let m = mem(&rt, 0);
    for &size in SIZES {
        for round in 0..20 {
            // A few at once, freed in another order, so slots are handed out shuffled.
            let bufs: Vec<Buffer> = (0..3).map(|_| m.allocate(size).unwrap()).collect();
            for (i, b) in bufs.iter().enumerate() {
                assert_eq!(b.size(), size);
                assert!(all_zero(b), "size {size}, round {round}, buffer {i}");
                b.fill(0, size, 0xA5).unwrap();
                b.write(size - 1, &[0x5A]).unwrap();
            }
            let mut bufs = bufs;
            bufs.swap(0, 2);
            drop(bufs);
        }
    }
    // A large block that certainly came back from the cache reads as zero as well.
    let hits = m.stats().cache_hits;
    eventually("a cache hit", || {
        let b = m.allocate(MIB).unwrap();
        assert!(all_zero(&b));
        b.fill(0, MIB, 0xFF).unwrap();
        m.stats().cache_hits > hits
    });
}

#[test]
fn stats_follow_allocations_and_frees() {
    let (_g, rt) = init();
    let m = mem(&rt, 1);
    m.empty_cache();
    let s0 = m.stats();
    assert_eq!(s0.total, 256 * MIB);
    assert_eq!(s0.reserved, s0.allocated + s0.cached);
    assert_eq!(s0.free, s0.total - s0.reserved);

    // 5 MiB + 1: a large allocation, rounded up to whole pages (no other test uses that
    // size, so no cache can serve it).
    let size = 5 * MIB + 1;
    let block = 5 * MIB + 4096;
    let b = m.allocate(size).unwrap();
    let s1 = m.stats();
    assert_eq!(s1.allocated, s0.allocated + block);
    assert_eq!(s1.requested, s0.requested + size);
    assert_eq!(s1.reserved, s0.reserved + block);
    assert_eq!(s1.active_allocations, s0.active_allocations + 1);
    assert_eq!(s1.num_allocs, s0.num_allocs + 1);
    assert!(s1.peak_allocated >= s1.allocated);
    assert!(s1.peak_reserved >= s1.reserved);

    // A small one comes from a slab class.
    let small = m.allocate(100).unwrap();
    let s2 = m.stats();
    assert_eq!(s2.allocated, s1.allocated + 128);
    assert_eq!(s2.requested, s1.requested + 100);
    assert_eq!(s2.active_allocations, s1.active_allocations + 1);
    drop(small);
    assert_eq!(m.stats().allocated, s1.allocated);

    m.reset_peak_stats();
    let s3 = m.stats();
    assert_eq!(s3.peak_allocated, s3.allocated);
    assert_eq!(s3.peak_reserved, s3.reserved);

    drop(b);
    let s4 = m.stats();
    assert_eq!(s4.allocated, s0.allocated);
    assert_eq!(s4.requested, s0.requested);
    assert_eq!(s4.active_allocations, s0.active_allocations);
    assert_eq!(s4.num_frees, s3.num_frees + 1);
    // Reuse is on: the block stays reserved, as cache.
    assert!(s4.reserved >= s0.reserved + block, "{s4:?}");
    assert_eq!(s4.cached, s4.reserved - s4.allocated);
    assert_eq!(s4.peak_allocated, s3.peak_allocated, "peaks do not fall");

    // empty_cache gives it back (once the scrubber has finished with it).
    eventually("reserved back to its start", || {
        m.empty_cache();
        m.stats().reserved == s0.reserved
    });
}

#[test]
fn out_of_memory_is_reported_and_recovered_from() {
    let (_g, rt) = init();
    let m = mem(&rt, 0);
    let ooms = m.stats().num_ooms;
    match m.allocate(512 * MIB) {
        Err(Error::Memory(e @ MemoryError::OutOfMemory { .. })) => {
            let MemoryError::OutOfMemory {
                device,
                requested,
                total,
                ..
            } = e
            else {
                unreachable!()
            };
            assert_eq!((device, requested, total), (0, 512 * MIB, 256 * MIB));
            let text = e.to_string();
            assert!(text.contains("536870912"), "{text}");
            assert!(text.contains("268435456"), "{text}");
            assert!(text.contains("device 0"), "{text}");
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
    assert_eq!(m.stats().num_ooms, ooms + 1);
    let b = m.allocate(MIB).unwrap();
    assert!(all_zero(&b));
    drop(b);

    // Fill most of the device: the next big request fails until something is freed, and
    // then succeeds (flushing the cache the freed block went to).
    let a = m.allocate(128 * MIB).unwrap();
    let b = m.allocate(64 * MIB).unwrap();
    assert!(matches!(
        m.allocate(128 * MIB),
        Err(Error::Memory(MemoryError::OutOfMemory { .. }))
    ));
    a.fill(0, 128 * MIB, 1).unwrap();
    drop(a);
    let c = m.allocate(128 * MIB).unwrap();
    let mut probe = vec![0xFFu8; 4096];
    for off in [0, 64 * MIB, 128 * MIB - 4096] {
        c.read(off, &mut probe).unwrap();
        assert!(probe.iter().all(|&x| x == 0), "offset {off}");
    }
    drop((b, c));
    m.empty_cache();
}

#[test]
fn without_reuse_reserved_memory_falls_back_after_frees() {
    let (_g, rt) = init();
    let m = mem(&rt, 1);
    let _restore = ReuseGuard;
    runtime::set_option(runtime_core::config::RuntimeOption::MemoryReuse, false);
    assert!(!runtime::get_option(
        runtime_core::config::RuntimeOption::MemoryReuse
    ));
    // Blocks freed before the switch may still be with the scrubber; it releases them.
    eventually("no cached memory", || m.stats().cached == 0);
    let base = m.stats();

    let sizes = [100, 5000, 32 * 1024, 40_000, MIB, 3 * MIB];
    let bufs: Vec<Buffer> = sizes.iter().map(|&s| m.allocate(s).unwrap()).collect();
    let held = m.stats();
    let sum: u64 = sizes.iter().sum();
    assert!(held.allocated >= base.allocated + sum, "{held:?}");
    assert!(held.reserved >= base.reserved + sum, "{held:?}");
    for b in &bufs {
        assert!(all_zero(b));
        b.fill(0, b.size(), 0x11).unwrap();
    }
    drop(bufs);
    let after = m.stats();
    assert_eq!(after.allocated, base.allocated);
    assert_eq!(after.reserved, base.reserved, "{after:?} vs {base:?}");
    assert_eq!(after.cached, 0);

    // Still zeroed on the next allocation, without a cache.
    for &s in &sizes {
        let b = m.allocate(s).unwrap();
        assert!(all_zero(&b), "size {s}");
    }
    assert_eq!(m.stats().reserved, base.reserved);

    drop(_restore);
    assert!(runtime::get_option(
        runtime_core::config::RuntimeOption::MemoryReuse
    ));
}

#[test]
fn a_clone_keeps_the_memory_alive() {
    let (_g, rt) = init();
    let m = mem(&rt, 0);
    let active = m.stats().active_allocations;
    let a = m.allocate(MIB).unwrap();
    let pattern: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    a.write(0, &pattern).unwrap();
    let b = a.clone();
    assert_eq!(a, b);
    assert_eq!(b.ref_count(), 2);
    drop(a);
    assert_eq!(b.ref_count(), 1);
    assert_eq!(m.stats().active_allocations, active + 1);
    let mut back = vec![0u8; MIB as usize];
    b.read(0, &mut back).unwrap();
    assert_eq!(back, pattern);
    drop(b);
    assert_eq!(m.stats().active_allocations, active);
}

#[test]
fn buffer_ranges_are_checked() {
    let (_g, rt) = init();
    let b = mem(&rt, 0).allocate(100).unwrap();
    assert!(matches!(
        b.write(90, &[0; 11]),
        Err(Error::Memory(MemoryError::OutOfBounds { size: 100, .. }))
    ));
    assert!(b.read(u64::MAX, &mut [0; 2]).is_err());
    assert!(b.fill(50, 51, 1).is_err());
    b.write(90, &[7; 10]).unwrap();
    let mut x = [0u8; 10];
    b.read(90, &mut x).unwrap();
    assert_eq!(x, [7; 10]);
}

#[test]
fn queued_copies_hold_their_buffers_and_copy_the_right_bytes() {
    let (_g, rt) = init();
    let dev = rt.device(0).unwrap();
    let m = dev.memory().clone();
    let m1 = mem(&rt, 1);
    let s = Stream::new(dev, 0).unwrap();
    let n = 10_000u64;
    let active = (m.stats().active_allocations, m1.stats().active_allocations);
    let pattern: Vec<u8> = (0..n).map(|i| (i * 7 % 256) as u8).collect();

    let gate = Gate::new();
    s.launch(gate.op()).unwrap();

    // h2d into `a`; memset part of it; d2d to `b` (same device) and `c` (other device);
    // d2h of each into host vectors. All queued behind the gate; the device handles are
    // dropped before anything runs.
    let a = m.allocate(n).unwrap();
    let b = m.allocate(n).unwrap();
    let c = m1.allocate(n).unwrap();
    let src = HostVec::new(pattern.clone());
    s.launch(copy::h2d(&a, 0, src.clone(), 0, n).unwrap())
        .unwrap();
    s.launch(copy::memset(&a, 100, 50, 0xEE).unwrap()).unwrap();
    s.launch(copy::d2d(&b, 0, &a, 0, n).unwrap()).unwrap();
    s.launch(copy::d2d(&c, 10, &a, 0, n - 10).unwrap()).unwrap();
    let (out_a, out_b, out_c) = (
        HostVec::new(vec![0; n as usize]),
        HostVec::new(vec![0; n as usize]),
        HostVec::new(vec![1; n as usize + 5]),
    );
    s.launch(copy::d2h(out_a.clone(), 0, &a, 0, n).unwrap())
        .unwrap();
    s.launch(copy::d2h(out_b.clone(), 0, &b, 0, n).unwrap())
        .unwrap();
    s.launch(copy::d2h(out_c.clone(), 5, &c, 0, n).unwrap())
        .unwrap();
    assert!(a.ref_count() > 1, "queued ops hold `a`");
    assert!(b.ref_count() > 1 && c.ref_count() > 1);
    assert_eq!(out_a.len(), n as usize);
    drop((a, b, c, src));
    assert_eq!(m.stats().active_allocations, active.0 + 2);
    assert_eq!(m1.stats().active_allocations, active.1 + 1);
    assert!(!s.query().unwrap());

    gate.open();
    s.synchronize(Some(Duration::from_secs(10))).unwrap();
    // The ops are gone, and with them the last references to the buffers.
    assert_eq!(m.stats().active_allocations, active.0);
    assert_eq!(m1.stats().active_allocations, active.1);

    let mut want = pattern.clone();
    want[100..150].fill(0xEE);
    assert_eq!(out_a.into_inner().expect("the ops released it"), want);
    assert_eq!(out_b.into_inner().unwrap(), want);
    let got_c = out_c.into_inner().unwrap();
    assert_eq!(&got_c[..5], &[1; 5]);
    assert_eq!(&got_c[5..15], &[0; 10]);
    assert_eq!(&got_c[15..], &want[..(n - 10) as usize]);
}

#[test]
fn copy_ranges_are_checked_when_queued() {
    let (_g, rt) = init();
    let dev = rt.device(0).unwrap();
    let s = Stream::new(dev, 0).unwrap();
    let a = dev.memory().allocate(100).unwrap();
    let host = HostVec::new(vec![0; 50]);
    let oob = |r: runtime_core::Result<Arc<dyn Op>>, arg: &str| match r {
        Err(Error::Memory(MemoryError::OutOfBounds { arg: a, .. })) => assert_eq!(a, arg),
        Err(e) => panic!("{arg}: {e}"),
        Ok(_) => panic!("{arg}: accepted"),
    };
    oob(copy::h2d(&a, 0, host.clone(), 0, 51), "src_offset");
    oob(copy::h2d(&a, 60, host.clone(), 0, 50), "dst_offset");
    oob(copy::d2h(host.clone(), 1, &a, 0, 50), "dst_offset");
    oob(copy::d2h(host.clone(), 0, &a, 99, 2), "src_offset");
    oob(copy::d2d(&a, 0, &a, 1, 100), "src_offset");
    oob(copy::memset(&a, u64::MAX, 2, 0), "offset");
    assert_eq!(s.counters(), (0, 0));
}

/// One allocation of the randomized workloads: its first and last byte carry a tag.
struct Tagged {
    buf: Buffer,
    tag: u8,
}

impl Tagged {
    fn new(buf: Buffer, tag: u8) -> Tagged {
        let n = buf.size();
        let mut probe = [0xFFu8; 2];
        buf.read(0, &mut probe[..1]).unwrap();
        buf.read(n - 1, &mut probe[1..]).unwrap();
        assert_eq!(
            probe,
            [0, 0],
            "a fresh allocation of {n} bytes reads as zero"
        );
        buf.write(0, &[tag]).unwrap();
        buf.write(n - 1, &[tag]).unwrap();
        Tagged { buf, tag }
    }

    fn check(&self) {
        let n = self.buf.size();
        let mut probe = [0u8; 2];
        self.buf.read(0, &mut probe[..1]).unwrap();
        self.buf.read(n - 1, &mut probe[1..]).unwrap();
        assert_eq!(probe, [self.tag; 2], "{:?} kept its bytes", self.buf);
    }
}

/// Random allocations of 1 B .. 40 MiB (log-distributed) and random frees on a 128 MiB
/// device. Address space never fragments, so an allocation may fail only when the capacity
/// is really exhausted: after the caches were flushed, the request's fresh block (a slab span
/// for a small request) exceeds what is not reserved, and all that is reserved beyond the live
/// allocations is the unused part of slab spans holding live small allocations (slab
/// rounding). Without live small allocations that is exactly `allocated + block > capacity`;
/// with them, a large request that fits next to the worst-case slab rounding must succeed.
fn randomized_workload(seed: u64, min: u64, steps: usize) -> (u64, u64) {
    const CAPACITY: u64 = 128 * MIB;
    let m = Arc::new(DeviceMemory::new(0, CAPACITY, Arc::new(Options::default())).unwrap());
    let mut rng = common::Rng(seed);
    let mut live: Vec<Tagged> = Vec::new();
    let (mut ok, mut ooms) = (0u64, 0u64);
    for step in 0..steps {
        if !live.is_empty() && rng.next() % 5 < 2 {
            let t = live.swap_remove((rng.next() % live.len() as u64) as usize);
            t.check();
            continue;
        }
        let size = rng.log_size(min, 40 * MIB);
        let block = memory::block_size(size);
        let allocated: u64 = live.iter().map(|t| memory::block_size(t.buf.size())).sum();
        let small = live.iter().filter(|t| t.buf.size() <= SMALL_MAX).count() as u64;
        match m.allocate(size) {
            Ok(buf) => {
                ok += 1;
                live.push(Tagged::new(buf, (step % 251) as u8 + 1));
                let s = m.stats();
                assert!(s.reserved <= s.total, "{s:?}");
            }
            Err(Error::Memory(MemoryError::OutOfMemory {
                requested,
                free,
                total,
                allocated: reported,
                cached,
                ..
            })) => {
                ooms += 1;
                assert_eq!((requested, total, reported), (size, CAPACITY, allocated));
                let need = memory::fresh_block_size(size);
                assert!(
                    need > free,
                    "step {step}: {size} B refused with {free} B free (needs {need} B)"
                );
                assert!(
                    cached <= small * SLAB_SPAN,
                    "step {step}: {cached} B still cached beyond the spans of {small} small allocations"
                );
                if small == 0 {
                    assert!(
                        allocated + block > CAPACITY,
                        "step {step}: {size} B ({block} B block) refused with {allocated} B allocated"
                    );
                } else if size > SMALL_MAX {
                    assert!(
                        allocated + block + small * SLAB_SPAN > CAPACITY,
                        "step {step}: {size} B refused with {allocated} B allocated and {small} small allocations"
                    );
                }
                assert_eq!(m.stats().num_ooms, ooms);
                // Make room, as a caller would.
                for _ in 0..2 {
                    if !live.is_empty() {
                        let t = live.swap_remove((rng.next() % live.len() as u64) as usize);
                        t.check();
                    }
                }
            }
            Err(e) => panic!("step {step}: allocate({size}) failed with {e}"),
        }
    }
    for t in &live {
        t.check();
    }
    drop(live);
    m.empty_cache();
    let s = m.stats();
    assert_eq!(
        (s.allocated, s.reserved, s.active_allocations),
        (0, 0, 0),
        "{s:?}"
    );
    (ok, ooms)
}

#[test]
fn fragmentation_never_causes_out_of_memory() {
    for seed in [1, 2, 3] {
        let (ok, ooms) = randomized_workload(seed, 1, 1500);
        // The workload does run into the capacity, and mostly succeeds.
        assert!(
            ooms >= 10 && ok > 10 * ooms,
            "seed {seed}: {ok} ok, {ooms} oom"
        );
    }
}

#[test]
fn large_allocations_fail_exactly_when_capacity_is_exhausted() {
    // Only large requests: nothing but live blocks is ever reserved once the caches are
    // flushed, so `allocated + block > capacity` is the whole rule, both ways.
    let (ok, ooms) = randomized_workload(7, SMALL_MAX + 1, 1500);
    assert!(ooms >= 10 && ok > 5 * ooms, "{ok} ok, {ooms} oom");
}

#[test]
fn zero_byte_allocations_count_but_consume_no_bytes() {
    let m = Arc::new(DeviceMemory::new(0, 4 * MIB, Arc::new(Options::default())).unwrap());
    let other = m.allocate(100).unwrap();
    let s0 = m.stats();
    let bufs: Vec<Buffer> = (0..1000).map(|_| m.allocate(0).unwrap()).collect();
    let s1 = m.stats();
    assert_eq!(
        (s1.allocated, s1.requested, s1.reserved, s1.peak_allocated),
        (s0.allocated, s0.requested, s0.reserved, s0.peak_allocated)
    );
    assert_eq!(s1.active_allocations, s0.active_allocations + 1000);
    assert_eq!(s1.num_allocs, s0.num_allocs + 1000);
    assert_eq!(memory::block_size(0), 0);
    let mut ids: Vec<u64> = bufs.iter().map(Buffer::id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 1000, "every allocation has its own id");
    for b in &bufs {
        assert_eq!(b.size(), 0);
        assert!(!b.as_ptr().is_null());
        b.write(0, &[]).unwrap();
        b.read(0, &mut []).unwrap();
        b.fill(0, 0, 0xAB).unwrap();
        b.copy_from(0, &other, 0, 0).unwrap();
        assert!(b.write(0, &[1]).is_err() && b.read(1, &mut []).is_err());
        // SAFETY: an empty view of a live buffer.
        assert!(unsafe { b.slice_unsynchronized::<f32>(0, 0) }.is_empty());
    }
    let mut probe = [0xFFu8; 100];
    other.read(0, &mut probe).unwrap();
    assert_eq!(probe, [0; 100], "empty copies and fills wrote nothing");
    drop(bufs);
    let s2 = m.stats();
    assert_eq!(s2.active_allocations, s0.active_allocations);
    assert_eq!(s2.num_frees, s0.num_frees + 1000);
    assert_eq!((s2.allocated, s2.reserved), (s0.allocated, s0.reserved));
}

#[test]
fn allocation_waits_for_queued_work_that_holds_freed_memory() {
    let (_g, rt) = init();
    let dev = rt.device(1).unwrap();
    let m = dev.memory().clone();
    m.empty_cache();
    let s0 = m.stats();
    // Only one of these fits on the 256 MiB device.
    let big = 160 * MIB;
    assert!(s0.reserved + 2 * big > s0.total && s0.reserved + big <= s0.total);
    let s = Stream::new(dev, 0).unwrap();
    let a = m.allocate(big).unwrap();
    a.fill(0, 4096, 0x77).unwrap();

    // A queued op holds a clone of `a`. It waits behind a gate that opens only once the
    // allocation below has failed once (its caches flushed), so only waiting for the stream
    // can make room.
    let gate = Gate::new();
    s.launch(gate.op()).unwrap();
    let held = a.clone();
    s.launch(FnOp::shared("hold", OpKind::Compute, move || {
        held.fill(4096, 1, 0x77)
            .map_err(|e| KernelFailure::new("hold", e.to_string()))
    }))
    .unwrap();
    drop(a);
    assert_eq!(m.stats().active_allocations, s0.active_allocations + 1);

    let flushes = m.stats().cache_flushes;
    let opener = {
        let m = m.clone();
        let gate = Gate(gate.0.clone());
        std::thread::spawn(move || {
            eventually("the allocation to run out of memory once", || {
                m.stats().cache_flushes > flushes
            });
            gate.open();
        })
    };
    let b = m
        .allocate(big)
        .expect("the freed block is reclaimed from the queued work");
    opener.join().unwrap();
    let s1 = m.stats();
    assert_eq!(
        s1.num_ooms, s0.num_ooms,
        "no out-of-memory error was raised"
    );
    assert_eq!(s.counters().0, s.counters().1, "the queued work has run");
    assert_eq!(s1.active_allocations, s0.active_allocations + 1);
    let mut probe = vec![0xFFu8; 8192];
    b.read(0, &mut probe).unwrap();
    assert!(
        probe.iter().all(|&x| x == 0),
        "the reclaimed block reads as zero"
    );
    drop(b);
    s.synchronize(Some(Duration::from_secs(10))).unwrap();
    m.empty_cache();
}

#[test]
fn allocation_in_queued_work_fails_at_once_instead_of_waiting_for_itself() {
    let (_g, rt) = init();
    let dev = rt.device(0).unwrap();
    let m = dev.memory().clone();
    let s = Stream::new(dev, 0).unwrap();
    let result: Arc<Mutex<Option<bool>>> = Arc::new(Mutex::new(None));
    let (mem, out) = (m.clone(), result.clone());
    s.launch(FnOp::shared("alloc", OpKind::Compute, move || {
        let oom = matches!(
            mem.allocate(512 * MIB),
            Err(Error::Memory(MemoryError::OutOfMemory { .. }))
        );
        *out.lock().unwrap() = Some(oom);
        Ok(())
    }))
    .unwrap();
    s.synchronize(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(*result.lock().unwrap(), Some(true));
}

/// torch: test/test_cuda.py::TestCuda::test_set_per_process_memory_fraction: within the
/// fraction allocations succeed; beyond it they fail with an out-of-memory error that names
/// the fraction, and lifting it lets them through.
#[test]
fn memory_fraction_limits_reserved_bytes() {
    let m = Arc::new(DeviceMemory::new(0, 64 * MIB, Arc::new(Options::default())).unwrap());
    for bad in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
        let e = m.set_memory_fraction(bad).unwrap_err().to_string();
        assert!(
            e.starts_with("fraction: must be a number between 0 and 1"),
            "{e}"
        );
    }
    assert_eq!(m.memory_fraction(), 1.0);
    m.set_memory_fraction(0.5).unwrap();
    assert_eq!(m.limit(), 32 * MIB);
    let a = m.allocate(20 * MIB).unwrap();
    match m.allocate(16 * MIB) {
        Err(Error::Memory(e @ MemoryError::OverFraction { .. })) => {
            let msg = e.to_string();
            assert!(
                msg.contains("fraction 0.500 allows 33554432 of 67108864 bytes"),
                "{msg}"
            );
        }
        other => panic!("expected OverFraction, got {other:?}"),
    }
    let small = m.allocate(1000).unwrap(); // a slab span still fits
    m.set_memory_fraction(1.0).unwrap();
    let b = m.allocate(16 * MIB).unwrap();
    // Past the capacity itself: the ordinary out-of-memory error.
    assert!(matches!(
        m.allocate(40 * MIB),
        Err(Error::Memory(MemoryError::OutOfMemory { .. }))
    ));
    drop((a, b, small));
    m.set_memory_fraction(0.0).unwrap();
    assert!(m.allocate(1).is_err());
    assert_eq!(m.allocate(0).unwrap().size(), 0);
}

#[test]
fn device_mappings_are_recognised_by_address() {
    // Own device memory (no shared runtime): its slab arena and its large blocks are device
    // mappings while they live; host memory never is.
    let m = Arc::new(DeviceMemory::new(0, 64 * MIB, Arc::new(Options::default())).unwrap());
    let small = m.allocate(64).unwrap();
    let large = m.allocate(4 * MIB).unwrap();
    for b in [&small, &large] {
        let p = b.as_ptr() as usize;
        let (base, len) = memory::device_mapping_overlapping(p, 1).expect("a device mapping");
        assert!(base <= p && p < base + len);
        // a range that starts before the block and runs into it overlaps device memory too
        assert!(memory::device_mapping_overlapping(p - 8, 16).is_some());
    }
    let host = vec![0u8; 4096];
    assert_eq!(
        memory::device_mapping_overlapping(host.as_ptr() as usize, host.len()),
        None
    );
    // a large block's own mapping goes away with it (reuse off: not cached)
    let m2 = Arc::new(
        DeviceMemory::new(1, 64 * MIB, {
            let o = Options::default();
            o.set(runtime_core::config::RuntimeOption::MemoryReuse, false);
            Arc::new(o)
        })
        .unwrap(),
    );
    let big = m2.allocate(8 * MIB).unwrap();
    let p = big.as_ptr() as usize;
    assert!(memory::device_mapping_overlapping(p, 8 * MIB as usize).is_some());
    drop(big);
    let still = memory::device_mapping_overlapping(p, 1);
    assert!(
        still.is_none_or(|(base, _)| base != p),
        "the freed block's mapping is gone"
    );
}
