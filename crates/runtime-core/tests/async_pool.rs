//! Stream-ordered allocation (`memory::async_pool`, `Stream::malloc_async` /
//! `Stream::free_async`): a block freed on a stream is reused by later work on that stream
//! without any synchronisation, by other streams only once the freeing stream has passed the
//! free; a reused block reads zero in stream order; host access of a block waits for the work
//! queued on it under every lease; the release threshold is applied at synchronisation; free
//! blocks go back before an allocation fails; misuse is refused. A model test checks the pool's
//! numbers and that live leases never share memory, over random sequences on two streams.
//!
//! The streams are held back with user events, so "no synchronisation happened" is observed
//! directly: the stream has completed nothing when the reuse happens.

mod common;

use std::sync::Arc;
use std::time::Duration;

use runtime_core::error::{Error, MemoryError};
use runtime_core::event::Event;
use runtime_core::memory::access::Access;
use runtime_core::memory::{AsyncPoolStats, Buffer};
use runtime_core::runtime::Runtime;
use runtime_core::stream::{FnOp, OpKind, Stream};

const MIB: u64 = 1 << 20;

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn rt() -> Arc<Runtime> {
    common::init()
}

/// A fresh stream on device `d`, held back until the returned event is set.
fn held(r: &Runtime, d: usize) -> (Stream, Event) {
    let s = Stream::new(&r.devices()[d], 0).unwrap();
    let gate = Event::user();
    s.wait_event(&gate).unwrap();
    (s, gate)
}

fn fill_op(b: &Buffer, byte: u8) -> Arc<dyn runtime_core::stream::Op> {
    let b2 = b.clone();
    FnOp::with_accesses(
        "fill",
        OpKind::Compute,
        b.access(Access::Write),
        move || {
            b2.fill(0, b2.size(), byte)
                .map_err(|e| runtime_core::error::KernelFailure::new("fill", e.to_string()))
        },
    )
}

fn stats(r: &Runtime, d: usize) -> AsyncPoolStats {
    r.devices()[d].memory().async_pool_stats()
}

/// Empty the pool of device `d` and reset its marks.
fn clean(r: &Runtime, d: usize) {
    let m = r.devices()[d].memory();
    m.set_async_release_threshold(0);
    m.trim_async_pool_to(0);
    m.reset_async_pool_peaks();
}

/// What each test starts with: the work an earlier test left queued has run (a reused
/// block's zeroing op holds its lease until a worker has run and dropped it, and until then
/// the lease counts as used), then [`clean`].
fn fresh(r: &Runtime, d: usize) {
    r.devices()[d]
        .synchronize(Some(Duration::from_secs(60)))
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while stats(r, d).used > 0 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    clean(r, d);
}

#[test]
fn a_block_freed_on_a_stream_is_reused_by_that_stream_without_waiting() {
    let _s = serial();
    let r = rt();
    fresh(&r, 0);
    let before = stats(&r, 0);
    let (s, gate) = held(&r, 0);
    let x = s.malloc_async(MIB).unwrap();
    s.launch(fill_op(&x, 7)).unwrap();
    s.free_async(&x).unwrap();
    let y = s.malloc_async(MIB).unwrap();
    // The same memory, handed out while the stream has run nothing yet.
    assert_eq!(x.as_ptr(), y.as_ptr());
    assert!(x.overlaps(0, MIB, &y, 0, MIB));
    assert_eq!(
        s.counters().1,
        0,
        "nothing ran: no synchronisation happened"
    );
    let st = stats(&r, 0);
    assert_eq!(st.reuse_same_stream, before.reuse_same_stream + 1);
    assert_eq!((st.used, st.free), (MIB, 0));
    // In stream order the fill ran first, then the reused block was zeroed.
    let z = y.clone();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    s.launch(FnOp::with_accesses(
        "read",
        OpKind::Compute,
        y.access(Access::Read),
        move || {
            *seen2.lock().unwrap() = z.to_vec::<u8>(0, 4096).unwrap();
            Ok(())
        },
    ))
    .unwrap();
    gate.set().unwrap();
    s.synchronize(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![0u8; 4096]);
    drop((x, y));
}

#[test]
fn other_streams_reuse_a_block_only_once_the_freeing_stream_passed_the_free() {
    let _s = serial();
    let r = rt();
    fresh(&r, 0);
    let before = stats(&r, 0).reuse_other_stream;
    let (s, gate) = held(&r, 0);
    let t = Stream::new(&r.devices()[0], 0).unwrap();
    let x = s.malloc_async(2 * MIB).unwrap();
    s.launch(fill_op(&x, 9)).unwrap();
    s.free_async(&x).unwrap();
    // s has not passed the free: t gets fresh memory, and x's bytes are untouched by it.
    let y = t.malloc_async(2 * MIB).unwrap();
    assert!(!x.overlaps(0, 2 * MIB, &y, 0, 2 * MIB));
    assert_eq!(stats(&r, 0).reuse_other_stream, before);
    gate.set().unwrap();
    r.devices()[0]
        .memory()
        .set_async_release_threshold(u64::MAX);
    s.synchronize(Some(Duration::from_secs(60))).unwrap();
    // Now it has: t takes x's block, zeroed in t's order.
    let z = t.malloc_async(2 * MIB).unwrap();
    assert!(x.overlaps(0, 2 * MIB, &z, 0, 2 * MIB));
    assert_eq!(stats(&r, 0).reuse_other_stream, before + 1);
    t.synchronize(Some(Duration::from_secs(60))).unwrap();
    assert!(z
        .to_vec::<u8>(0, (2 * MIB) as usize)
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    clean(&r, 0);
}

#[test]
fn host_access_of_a_reused_block_waits_for_the_work_queued_under_the_old_lease() {
    let _s = serial();
    let r = rt();
    fresh(&r, 0);
    let (s, gate) = held(&r, 0);
    let x = s.malloc_async(64 * 1024).unwrap();
    s.launch(fill_op(&x, 5)).unwrap();
    s.free_async(&x).unwrap();
    let y = s.malloc_async(64 * 1024).unwrap();
    assert_eq!(x.as_ptr(), y.as_ptr());
    // Release the stream a little later from another thread; the host read of the new
    // lease must wait for the old lease's fill and the zeroing, whatever the timing.
    let g = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        gate.set().unwrap();
    });
    let got = y.to_vec::<u8>(0, 64 * 1024).unwrap();
    assert!(
        got.iter().all(|&b| b == 0),
        "the read followed the fill and the zeroing"
    );
    g.join().unwrap();
    s.synchronize(Some(Duration::from_secs(60))).unwrap();
}

#[test]
fn a_lease_dropped_without_free_async_is_free_for_any_stream() {
    let _s = serial();
    let r = rt();
    fresh(&r, 0);
    let s = Stream::new(&r.devices()[0], 0).unwrap();
    let t = Stream::new(&r.devices()[0], 0).unwrap();
    r.devices()[0]
        .memory()
        .set_async_release_threshold(u64::MAX);
    let x = s.malloc_async(3 * MIB).unwrap();
    let p = x.as_ptr();
    s.synchronize(Some(Duration::from_secs(60))).unwrap();
    drop(x);
    assert_eq!(stats(&r, 0).free, 3 * MIB);
    let y = t.malloc_async(3 * MIB).unwrap();
    assert_eq!(y.as_ptr(), p);
    drop(y);
    clean(&r, 0);
}

/// CuPy's `free_all_blocks(stream=)` (tests/cupy_tests/cuda_tests/test_memory.py,
/// `TestSingleDeviceMemoryPool::test_free_all_blocks_stream`): only the blocks freed on that
/// stream go back to the device; a later allocation on the other stream still reuses its own.
#[test]
fn releasing_one_streams_free_blocks_keeps_the_other_streams() {
    let _s = serial();
    let r = rt();
    fresh(&r, 0);
    let m = r.devices()[0].memory().clone();
    m.set_async_release_threshold(u64::MAX);
    let s = Stream::new(&r.devices()[0], 0).unwrap();
    let t = Stream::new(&r.devices()[0], 0).unwrap();
    let (a, b) = (
        s.malloc_async(4 * MIB).unwrap(),
        t.malloc_async(4 * MIB).unwrap(),
    );
    let pb = b.as_ptr();
    s.free_async(&a).unwrap();
    t.free_async(&b).unwrap();
    drop((a, b));
    let st = stats(&r, 0);
    assert_eq!(
        (st.free_blocks, st.free, st.reserved),
        (2, 8 * MIB, 8 * MIB)
    );
    assert_eq!(s.release_async_free_blocks().unwrap(), 1);
    let st = stats(&r, 0);
    assert_eq!(
        (st.free_blocks, st.free, st.reserved),
        (1, 4 * MIB, 4 * MIB)
    );
    // Nothing more of s's to release; t's block is still t's to reuse.
    assert_eq!(s.release_async_free_blocks().unwrap(), 0);
    let c = t.malloc_async(4 * MIB).unwrap();
    assert_eq!(c.as_ptr(), pb);
    t.free_async(&c).unwrap();
    drop(c);
    assert_eq!(t.release_async_free_blocks().unwrap(), 1);
    assert_eq!(stats(&r, 0).reserved, 0);
    // A destroyed stream is refused.
    let u = Stream::new(&r.devices()[0], 0).unwrap();
    u.destroy().unwrap();
    assert!(u.release_async_free_blocks().is_err());
    clean(&r, 0);
}

#[test]
fn the_release_threshold_is_applied_at_synchronisation() {
    let _s = serial();
    let r = rt();
    fresh(&r, 0);
    let m = r.devices()[0].memory().clone();
    let s = Stream::new(&r.devices()[0], 0).unwrap();
    let reserved_before = m.stats().reserved;
    let x = s.malloc_async(8 * MIB).unwrap();
    s.free_async(&x).unwrap();
    drop(x);
    let st = stats(&r, 0);
    assert_eq!((st.free, st.reserved, st.used), (8 * MIB, 8 * MIB, 0));
    // Threshold 0 (the default): a synchronisation gives the free block back.
    s.synchronize(Some(Duration::from_secs(60))).unwrap();
    let st = stats(&r, 0);
    assert_eq!((st.free, st.reserved, st.free_blocks), (0, 0, 0));
    assert!(st.released >= 1);
    assert!(m.stats().allocated <= reserved_before.max(m.stats().allocated));
    // A threshold keeps that much free memory across synchronisations.
    m.set_async_release_threshold(16 * MIB);
    let a = s.malloc_async(8 * MIB).unwrap();
    let b = s.malloc_async(8 * MIB).unwrap();
    let c = s.malloc_async(8 * MIB).unwrap();
    for x in [&a, &b, &c] {
        s.free_async(x).unwrap();
    }
    drop((a, b, c));
    s.synchronize(Some(Duration::from_secs(60))).unwrap();
    let st = stats(&r, 0);
    assert_eq!((st.free, st.release_threshold), (16 * MIB, 16 * MIB));
    assert_eq!(st.reserved_high, 24 * MIB);
    assert_eq!(m.trim_async_pool_to(8 * MIB), 1);
    assert_eq!(stats(&r, 0).free, 8 * MIB);
    clean(&r, 0);
    assert_eq!(stats(&r, 0).reserved, 0);
}

#[test]
fn free_blocks_go_back_before_an_allocation_fails() {
    let _s = serial();
    let r = rt();
    fresh(&r, 1);
    let m = r.devices()[1].memory().clone();
    m.set_async_release_threshold(u64::MAX);
    let s = Stream::new(&r.devices()[1], 0).unwrap();
    // 256 MiB devices: 200 MiB in the pool, then 200 MiB from the allocator.
    let x = s.malloc_async(200 * MIB).unwrap();
    s.free_async(&x).unwrap();
    drop(x);
    s.synchronize(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(stats(&r, 1).free, 200 * MIB);
    let big = m
        .allocate(200 * MIB)
        .expect("the pool's free block went back");
    assert_eq!(stats(&r, 1).free, 0);
    drop(big);
    clean(&r, 1);
}

#[test]
fn misuse_is_refused() {
    let _s = serial();
    let r = rt();
    fresh(&r, 0);
    let s = Stream::new(&r.devices()[0], 0).unwrap();
    let other = Stream::new(&r.devices()[1], 0).unwrap();
    let x = s.malloc_async(4096).unwrap();
    // A view, another device's stream, a buffer of the allocator.
    let e = s.free_async(&x.view(16, 16).unwrap()).unwrap_err();
    assert!(e.to_string().contains("view at offset 16"), "{e}");
    let e = other.free_async(&x).unwrap_err();
    assert!(e.to_string().contains("device 0"), "{e}");
    let plain = r.devices()[0].memory().allocate(4096).unwrap();
    let e = s.free_async(&plain).unwrap_err();
    assert!(
        e.to_string().contains("not allocated by malloc_async"),
        "{e}"
    );
    s.free_async(&x).unwrap();
    let e = s.free_async(&x).unwrap_err();
    assert!(matches!(e, Error::Device(_)), "{e}");
    // Zero bytes: a buffer of no memory, not pooled.
    let z = s.malloc_async(0).unwrap();
    assert_eq!(z.size(), 0);
    // Capturing streams refuse (a graph cannot own an allocation).
    let c = Stream::new(&r.devices()[0], 0).unwrap();
    c.begin_capture().unwrap();
    assert!(c.malloc_async(16).is_err());
    c.end_capture().unwrap();
    // Too large for the device.
    assert!(matches!(
        s.malloc_async(1 << 40),
        Err(Error::Memory(MemoryError::OutOfMemory { .. }))
    ));
    s.synchronize(Some(Duration::from_secs(60))).unwrap();
    clean(&r, 0);
}

/// Random malloc_async / free_async / drop / synchronise on two held-back streams against a
/// model: the pool's numbers add up (used is what live leases hold, reserved is used + free),
/// and no two live leases share memory, whatever the streams have run.
#[test]
fn random_sequences_keep_the_numbers_and_never_share_a_live_block() {
    let _s = serial();
    let r = rt();
    fresh(&r, 0);
    let m = r.devices()[0].memory().clone();
    let mut rng = common::Rng(0x5eed);
    let sizes = [4096u64, 40 * 1024, MIB, 3 * MIB];
    for round in 0..20 {
        m.set_async_release_threshold(if round % 2 == 0 { 0 } else { u64::MAX });
        let (s0, g0) = held(&r, 0);
        let (s1, g1) = held(&r, 0);
        let streams = [&s0, &s1];
        let mut live: Vec<(Buffer, u64)> = Vec::new();
        for _ in 0..60 {
            let s = streams[(rng.next() % 2) as usize];
            match rng.next() % 4 {
                0 | 1 => {
                    let size = sizes[(rng.next() % 4) as usize];
                    let b = s.malloc_async(size).unwrap();
                    s.launch(fill_op(&b, 1)).unwrap();
                    live.push((b, runtime_core::memory::block_size(size)));
                }
                2 if !live.is_empty() => {
                    let (b, _) = live.swap_remove((rng.next() as usize) % live.len());
                    s.free_async(&b).unwrap();
                }
                _ if !live.is_empty() => {
                    // A handle dropped without free_async: only once no work uses it.
                    let i = (rng.next() as usize) % live.len();
                    let (b, block) = live.swap_remove(i);
                    drop(b);
                    let _ = block;
                }
                _ => {}
            }
            for (i, (a, _)) in live.iter().enumerate() {
                for (b, _) in &live[i + 1..] {
                    assert!(
                        !a.overlaps(0, a.size(), b, 0, b.size()),
                        "two live leases share memory"
                    );
                }
            }
            let st = m.async_pool_stats();
            assert_eq!(st.reserved, st.used + st.free);
        }
        g0.set().unwrap();
        g1.set().unwrap();
        s0.synchronize(Some(Duration::from_secs(60))).unwrap();
        s1.synchronize(Some(Duration::from_secs(60))).unwrap();
        let held_bytes: u64 = live.iter().map(|(_, b)| b).sum();
        let st = m.async_pool_stats();
        assert_eq!(st.used, held_bytes, "used is what live leases hold");
        for (b, _) in &live {
            assert!(b
                .to_vec::<u8>(0, b.size() as usize)
                .unwrap()
                .iter()
                .all(|&x| x == 1));
        }
        for (b, _) in live.drain(..) {
            s0.free_async(&b).unwrap();
        }
        s0.synchronize(Some(Duration::from_secs(60))).unwrap();
    }
    clean(&r, 0);
    assert_eq!(m.async_pool_stats().reserved, 0);
}
