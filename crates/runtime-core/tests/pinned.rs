//! Pinned host memory (`memory::pinned`): the caching allocator, its statistics, `find`, the
//! explicit free, and the stream-ordered copies that know pinned memory (read when the copy
//! runs, block kept alive meanwhile) beside pageable memory (staged when queued).
//!
//! The allocator is process-wide, so the tests that read its statistics hold a file lock.

mod common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};

use runtime_core::memory::pinned::{self, PinnedBuffer};
use runtime_core::stream::copy::{self, HostVec};
use runtime_core::stream::{FnOp, OpKind, Stream};

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Queue a command on `s` that blocks it until the returned sender is dropped or sent to.
fn gate(s: &Stream) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    s.launch(FnOp::shared("gate", OpKind::Compute, move || {
        let _ = rx.lock().unwrap().recv();
        Ok(())
    }))
    .unwrap();
    tx
}

#[test]
fn block_sizes_round_to_powers_of_two_then_pages() {
    assert_eq!(pinned::block_size(0), 0);
    assert_eq!(pinned::block_size(1), 4096);
    assert_eq!(pinned::block_size(4097), 8192);
    assert_eq!(pinned::block_size(3 << 20), 4 << 20);
    assert_eq!(
        pinned::block_size(pinned::ROUND_POW2_MAX + 1),
        pinned::ROUND_POW2_MAX + 4096
    );
}

#[test]
fn allocate_read_write_and_bounds() {
    let _g = lock();
    let p = pinned::allocate(100).unwrap();
    assert_eq!(p.len(), 100);
    assert_eq!(p.as_ptr() as usize % 4096, 0);
    let mut back = [0u8; 3];
    // SAFETY: this thread alone holds the block, and no copy uses it.
    unsafe {
        p.write(10, &[1, 2, 3]).unwrap();
        p.read(10, &mut back).unwrap();
        assert_eq!(back, [1, 2, 3]);
        assert!(p.write(98, &[0; 3]).is_err());
        assert!(p.read(u64::MAX, &mut back).is_err());
    }
    let z = pinned::allocate(0).unwrap();
    assert!(z.is_empty());
}

/// torch: test/test_cuda.py::TestCuda::test_caching_pinned_memory: a dropped block is reused
/// for the next request of its size; one a queued copy still holds is not.
#[test]
fn dropped_block_is_reused_unless_a_copy_holds_it() {
    let _g = lock();
    let rt = common::init();
    let dev = rt.device(0).unwrap();
    let p = pinned::allocate(24_000).unwrap();
    let ptr = p.as_ptr();
    drop(p);
    let p = pinned::allocate(24_000).unwrap();
    assert_eq!(p.as_ptr(), ptr, "block not reused");
    // SAFETY: this thread alone holds the block, and no copy uses it yet.
    unsafe { p.write(0, &[9; 16]) }.unwrap();
    let s = Stream::new(dev, 0).unwrap();
    let buf = dev.memory().allocate(16).unwrap();
    let release = gate(&s);
    s.copy_from_pinned(&buf, 0, &p, 0, 16).unwrap();
    drop(p);
    let q = pinned::allocate(24_000).unwrap();
    assert_ne!(q.as_ptr(), ptr, "block reused while a queued copy reads it");
    drop(release);
    s.synchronize(None).unwrap();
    let mut back = [0u8; 16];
    buf.read(0, &mut back).unwrap();
    assert_eq!(back, [9; 16]);
}

#[test]
fn stats_follow_allocations_the_cache_and_empty_cache() {
    let _g = lock();
    pinned::empty_cache();
    let before = pinned::stats();
    assert_eq!(before.reserved_bytes, before.allocated_bytes);
    let p = pinned::allocate(5000).unwrap();
    let s = pinned::stats();
    assert_eq!(s.allocations, before.allocations + 1);
    assert_eq!(s.allocated_bytes, before.allocated_bytes + 8192);
    assert_eq!(s.reserved_bytes, before.reserved_bytes + 8192);
    assert_eq!(s.num_host_alloc, before.num_host_alloc + 1);
    drop(p);
    let s = pinned::stats();
    assert_eq!(s.allocations, before.allocations);
    assert_eq!(s.frees_total, before.frees_total + 1);
    assert_eq!(s.reserved_bytes, before.reserved_bytes + 8192, "cached");
    let p = pinned::allocate(8000).unwrap(); // same block size: a cache hit
    assert_eq!(pinned::stats().cache_hits, s.cache_hits + 1);
    assert_eq!(pinned::stats().num_host_alloc, s.num_host_alloc);
    drop(p);
    pinned::empty_cache();
    let s = pinned::stats();
    assert_eq!(s.reserved_bytes, s.allocated_bytes);
    assert_eq!(s.num_host_free, before.num_host_free + 1);
}

#[test]
fn find_locates_ranges_inside_live_blocks_only() {
    let _g = lock();
    let p = pinned::allocate(4096).unwrap();
    let base = p.as_ptr();
    assert_eq!(pinned::find(base, 4096), Some(p.clone()));
    // SAFETY: pointer arithmetic inside the block, never dereferenced.
    let inner = unsafe { base.add(100) };
    assert_eq!(pinned::find(inner, 50), Some(p.clone()));
    assert_eq!(pinned::find(inner, 4096), None, "runs past the block");
    assert_eq!(pinned::find(base, 0), None);
    let v = [0u8; 64];
    assert_eq!(pinned::find(v.as_ptr(), 64), None, "pageable memory");
    drop(p);
    assert_eq!(pinned::find(base, 16), None, "block returned to the cache");
}

#[test]
fn free_refuses_later_copies_and_a_second_free() {
    let _g = lock();
    let rt = common::init();
    let dev = rt.device(0).unwrap();
    let buf = dev.memory().allocate(64).unwrap();
    let p = pinned::allocate(64).unwrap();
    p.free().unwrap();
    assert!(p.is_freed());
    assert!(p.free().is_err());
    let Err(err) = copy::h2d_async(&buf, 0, Arc::new(p.clone()), 0, 64) else {
        panic!("a copy from freed pinned memory was accepted");
    };
    assert!(err.to_string().contains("free_host"), "{err}");
}

#[test]
fn pinned_copies_read_when_they_run_and_pageable_ones_are_staged() {
    let _g = lock();
    let rt = common::init();
    let dev = rt.device(0).unwrap();
    let s = Stream::new(dev, 0).unwrap();
    let (a, b) = (
        dev.memory().allocate(32).unwrap(),
        dev.memory().allocate(32).unwrap(),
    );
    let p = pinned::allocate(32).unwrap();
    // SAFETY: this thread alone holds the block, and no copy uses it yet.
    unsafe { p.write(0, &[1; 32]) }.unwrap();
    let pageable = HostVec::new(vec![1u8; 32]);
    let release = gate(&s);
    s.launch(copy::h2d_async(&a, 0, Arc::new(p.clone()), 0, 32).unwrap())
        .unwrap();
    s.launch(copy::h2d_async(&b, 0, pageable.clone(), 0, 32).unwrap())
        .unwrap();
    // Both copies are queued behind the gate; change both sources.
    // SAFETY: the copy from the block cannot start until `release` opens the gate.
    unsafe { p.write(0, &[2; 32]) }.unwrap();
    // SAFETY: nothing else uses the vector: the copy staged its bytes when it was queued.
    unsafe { std::ptr::write_bytes(copy::HostMemory::as_mut_ptr(&*pageable).unwrap(), 2, 32) };
    p.free().unwrap(); // freeing while the copy is in flight is safe
    drop(p);
    drop(release);
    s.synchronize(None).unwrap();
    let mut back = [0u8; 32];
    a.read(0, &mut back).unwrap();
    assert_eq!(back, [2; 32], "pinned: read when the copy ran");
    b.read(0, &mut back).unwrap();
    assert_eq!(back, [1; 32], "pageable: staged when queued");
}

#[test]
fn pinned_buffers_are_shared_handles() {
    let _g = lock();
    let p: PinnedBuffer = pinned::allocate(10).unwrap();
    let q = p.clone();
    assert_eq!(p, q);
    assert_eq!(p.ref_count(), 2);
    assert_eq!(p.id(), q.id());
    assert!(format!("{p:?}").contains("10 bytes"));
}

/// Registered host memory (`cudaHostRegister`): one registration per range, found for any
/// sub-range, and not given back while a holder of its keep-alive (a queued copy) is left.
#[test]
fn registered_ranges_are_found_refused_twice_and_held_by_their_users() {
    let mem: Arc<Vec<u8>> = Arc::new(vec![0u8; 4096]);
    let p = mem.as_ptr();
    let keep: pinned::KeepAlive = mem.clone();
    assert!(pinned::find_registered(p, 16).is_none());
    pinned::register(p, 4096, keep).unwrap();
    assert!(pinned::is_registered(p));
    // Any range inside is registered memory; one running past the end is not.
    assert!(pinned::find_registered(p.wrapping_add(100), 200).is_some());
    assert!(pinned::find_registered(p.wrapping_add(4000), 200).is_none());
    // Registering it, or part of it, again is refused.
    let again: pinned::KeepAlive = mem.clone();
    assert!(pinned::register(p.wrapping_add(8), 8, again).is_err());
    // A holder (what a queued copy keeps) makes unregister refuse; without it, it goes.
    let held = pinned::find_registered(p, 4096).unwrap();
    assert!(pinned::unregister(p).is_err());
    assert!(pinned::is_registered(p));
    drop(held);
    pinned::unregister(p).unwrap();
    assert!(!pinned::is_registered(p));
    assert!(pinned::unregister(p).is_err());
    let empty: pinned::KeepAlive = mem.clone();
    assert!(pinned::register(p, 0, empty).is_err());
    // A range with any byte of a pinned block is refused, not only one starting in it: one
    // memory has one tracker. (Registration touches no byte, so the range before the block
    // need not be mapped.)
    // Pinned statistics are process-wide: allocate under the tests' lock.
    let _g = lock();
    let block = pinned::allocate(8192).unwrap();
    let base = block.as_ptr();
    for (at, len) in [(0, 16), (4096, 8192), (-4096, 8192), (-4096, 1 << 20)] {
        let keep: pinned::KeepAlive = mem.clone();
        let e = pinned::register(base.wrapping_offset(at), len, keep).unwrap_err();
        assert!(
            e.to_string().contains("overlaps the pinned block"),
            "{at}: {e}"
        );
    }
    drop(block);
    // Device memory has its allocations' trackers: it is not registered either.
    let rt = common::init();
    let buf = rt.device(0).unwrap().memory().allocate(8192).unwrap();
    let keep: pinned::KeepAlive = mem.clone();
    let e = pinned::register(buf.as_ptr().wrapping_add(4096), 16, keep).unwrap_err();
    assert!(e.to_string().contains("overlaps device memory"), "{e}");
    // Only `mem` and this test's handle are left: the registry let go of its clone.
    assert_eq!(Arc::strong_count(&mem), 1);
}
