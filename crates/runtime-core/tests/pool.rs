//! The pool face of the allocator (`memory::pool`, `memory::allocator`): views and pointer
//! arithmetic on `Buffer`, the pool limit, `record_stream` (a freed block is not reused
//! until the recorded streams finished the work queued at free time), and a plugged Rust
//! allocator (sub-allocating from one buffer; blocks validated; every block given back once).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use runtime_core::config::Options;
use runtime_core::error::{Error, MemoryError};
use runtime_core::memory::{Allocator, Block, DeviceMemory};
use runtime_core::stream::{FnOp, OpKind};

const MIB: u64 = 1 << 20;

fn fresh(capacity: u64) -> Arc<DeviceMemory> {
    Arc::new(DeviceMemory::new(0, capacity, Arc::new(Options::default())).unwrap())
}

#[test]
fn views_are_bounds_checked_ranges_of_one_allocation() {
    let m = fresh(16 * MIB);
    let b = m.allocate(100).unwrap();
    let v = b.view(10, 20).unwrap();
    assert_eq!((v.offset(), v.size(), v.allocation_size()), (10, 20, 100));
    assert_eq!(v.as_ptr() as usize, b.as_ptr() as usize + 10);
    assert!(v.same_allocation(&b) && v.id() == b.id());
    v.write(0, &[7; 20]).unwrap();
    let mut out = [0u8; 100];
    b.read(0, &mut out).unwrap();
    assert!(out[10..30].iter().all(|&x| x == 7));
    assert!(out[..10].iter().chain(&out[30..]).all(|&x| x == 0));
    // Ranges are relative to the view and checked against it.
    assert!(matches!(
        v.write(15, &[1; 6]),
        Err(Error::Memory(MemoryError::OutOfBounds { size: 20, .. }))
    ));
    assert!(b.view(90, 11).is_err());
    assert!(v.view(0, 21).is_err());
    assert!(b.view(u64::MAX, 2).is_err());
}

#[test]
fn pointer_arithmetic_moves_the_start_and_keeps_the_end() {
    // CuPy tests/cupy_tests/cuda_tests/test_memory.py, TestMemoryPointer.test_add/test_sub.
    let m = fresh(16 * MIB);
    let b = m.allocate(8).unwrap();
    let p = b.as_ptr() as usize;
    let b4 = b.shifted(4).unwrap();
    assert_eq!((b4.as_ptr() as usize, b4.size()), (p + 4, 4));
    let back = b4.shifted(-4).unwrap();
    assert_eq!((back.as_ptr() as usize, back.size()), (p, 8));
    assert_eq!(b.shifted(8).unwrap().size(), 0);
    assert!(b.shifted(9).is_err());
    assert!(b.shifted(-1).is_err());
    assert!(b4.shifted(i64::MIN).is_err());
    // A view keeps the allocation alive after the original handle is gone.
    let before = m.stats().active_allocations;
    drop((b, back));
    assert_eq!(m.stats().active_allocations, before);
    drop(b4);
    assert_eq!(m.stats().active_allocations, before - 1);
}

#[test]
fn limit_caps_reserved_bytes() {
    let m = fresh(64 * MIB);
    assert_eq!(m.get_limit(), 0);
    assert!(m.set_limit(Some(65 * MIB)).is_err());
    assert_eq!(m.get_limit(), 0);
    m.set_limit(Some(8 * MIB)).unwrap();
    let a = m.allocate(6 * MIB).unwrap();
    let e = m.allocate(4 * MIB).unwrap_err();
    assert!(matches!(e, Error::Memory(MemoryError::OutOfMemory { .. })));
    assert!(m.stats().reserved <= 8 * MIB);
    m.set_limit(None).unwrap();
    let b = m.allocate(4 * MIB).unwrap();
    drop((a, b));
}

/// A gate an op on a stream waits on until the test opens it.
type Gate = Arc<(Mutex<bool>, Condvar)>;

fn gated(s: &runtime_core::stream::Stream) -> Gate {
    let gate: Gate = Arc::new((Mutex::new(false), Condvar::new()));
    let g = gate.clone();
    s.launch(FnOp::shared("hold", OpKind::Compute, move || {
        let (l, cv) = &*g;
        let mut open = l.lock().unwrap();
        while !*open {
            open = cv.wait(open).unwrap();
        }
        Ok(())
    }))
    .unwrap();
    gate
}

fn open(gate: &Gate) {
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
}

#[test]
fn record_stream_defers_the_free_until_the_queued_work_completes() {
    // torch test/test_cuda.py test_record_stream: the freed block is not reused while the
    // stream it was recorded on still has the work queued at free time.
    let rt = common::init();
    let d = rt.device(0).unwrap().clone();
    let m = d.memory().clone();
    let s = runtime_core::stream::Stream::on(d.executor(), 0).unwrap();
    let first = gated(&s);
    let b = m.allocate(4096).unwrap();
    let addr = b.as_ptr() as usize;
    b.record_stream(Arc::new(s.clone())).unwrap();
    b.record_stream(Arc::new(s.clone())).unwrap();
    let allocated = m.stats().allocated;
    drop(b);
    assert_eq!(m.deferred_frees(), 1);
    assert_eq!(m.stats().allocated, allocated);
    let other = m.allocate(4096).unwrap();
    assert_ne!(other.as_ptr() as usize, addr);
    // Work submitted after the free does not hold the block longer.
    let later = gated(&s);
    open(&first);
    while s.pending() > 1 {
        std::thread::yield_now();
    }
    drop(other);
    let again = m.allocate(4096).unwrap();
    assert_eq!(m.deferred_frees(), 0);
    drop(again);
    open(&later);
    s.synchronize(None).unwrap();
}

#[test]
fn record_stream_on_a_real_stream() {
    let rt = common::init();
    let d = rt.device(1).unwrap().clone();
    let m = d.memory().clone();
    let s = runtime_core::stream::Stream::on(d.executor(), 0).unwrap();
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let g = gate.clone();
    s.launch(FnOp::shared("hold", OpKind::Compute, move || {
        let (l, cv) = &*g;
        let mut open = l.lock().unwrap();
        while !*open {
            open = cv.wait(open).unwrap();
        }
        Ok(())
    }))
    .unwrap();
    let b = m.allocate(1000).unwrap();
    b.record_stream(Arc::new(s.clone())).unwrap();
    let before = m.stats().active_allocations;
    drop(b);
    assert_eq!(m.process_deferred_frees(), 0);
    assert_eq!(m.stats().active_allocations, before);
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    s.synchronize(None).unwrap();
    assert_eq!(m.process_deferred_frees(), 1);
    assert_eq!(m.stats().active_allocations, before - 1);
}

/// A bump sub-allocator over one arena buffer of the built-in pool.
struct Bump {
    arena: Mutex<Option<runtime_core::memory::Buffer>>,
    next: AtomicU64,
    freed: AtomicU64,
    /// Hand back a block smaller than asked (to test the core's check).
    short: bool,
}

impl Allocator for Bump {
    fn allocate(&self, mem: &Arc<DeviceMemory>, size: u64) -> runtime_core::Result<Block> {
        let mut a = self.arena.lock().unwrap();
        if a.is_none() {
            // Inside `allocate`, `malloc` goes to the built-in pool (no recursion).
            *a = Some(mem.malloc(MIB)?);
        }
        let off = self
            .next
            .fetch_add(size.next_multiple_of(256), Ordering::SeqCst);
        let len = if self.short { size - 1 } else { size };
        let v = a.as_ref().unwrap().view(off, len)?;
        Ok(Block::with_token(v, Box::new(off)))
    }

    fn free(&self, block: Block) {
        let off = *block.token.unwrap().downcast::<u64>().unwrap();
        assert_eq!(off % 256, 0);
        self.freed.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn a_plugged_rust_allocator_serves_malloc_and_gets_every_block_back() {
    let m = fresh(16 * MIB);
    let bump = Arc::new(Bump {
        arena: Mutex::new(None),
        next: AtomicU64::new(0),
        freed: AtomicU64::new(0),
        short: false,
    });
    m.set_allocator(Some(bump.clone()));
    let a = m.malloc(100).unwrap();
    let b = m.malloc(300).unwrap();
    let arena = bump.arena.lock().unwrap().clone().unwrap();
    assert_eq!(a.as_ptr(), arena.as_ptr());
    assert_eq!(b.as_ptr() as usize, arena.as_ptr() as usize + 256);
    assert_eq!((a.size(), b.size()), (100, 300));
    // Only the arena counts in the built-in pool.
    assert_eq!(m.stats().active_allocations, 1);
    assert_eq!(m.stats().allocated, MIB);
    // Handed out zeroed, bounded by the request.
    b.write(0, &[9; 300]).unwrap();
    assert!(b.write(1, &[9; 300]).is_err());
    drop(a);
    // Given back when the core next passes blocks on (never from the dropping thread, which
    // may be a stream worker or hold a runtime lock).
    assert_eq!(bump.freed.load(Ordering::SeqCst), 0);
    assert_eq!(m.return_blocks(), 1);
    assert_eq!(bump.freed.load(Ordering::SeqCst), 1);
    let view = b.view(8, 8).unwrap();
    drop(b);
    assert_eq!(m.return_blocks(), 0);
    assert_eq!(bump.freed.load(Ordering::SeqCst), 1);
    drop(view);
    let _ = m.malloc(16).unwrap(); // an allocation passes them on too
    assert_eq!(bump.freed.load(Ordering::SeqCst), 2);
    // Built-in again once unplugged.
    m.set_allocator(None);
    let c = m.malloc(100).unwrap();
    assert_eq!(m.stats().active_allocations, 2);
    drop((c, arena));
}

#[test]
fn a_block_too_small_or_of_another_device_is_refused_and_given_back() {
    let m = fresh(16 * MIB);
    let bump = Arc::new(Bump {
        arena: Mutex::new(None),
        next: AtomicU64::new(0),
        freed: AtomicU64::new(0),
        short: true,
    });
    m.set_allocator(Some(bump.clone()));
    let e = m.malloc(100).unwrap_err();
    assert!(
        e.to_string()
            .contains("returned 99 bytes for a request of 100"),
        "{e}"
    );
    assert_eq!(bump.freed.load(Ordering::SeqCst), 1);

    // A block from another device's memory.
    struct Foreign(Arc<DeviceMemory>, AtomicU64);
    impl Allocator for Foreign {
        fn allocate(&self, _: &Arc<DeviceMemory>, size: u64) -> runtime_core::Result<Block> {
            Ok(Block::new(self.0.allocate(size)?))
        }
        fn free(&self, _: Block) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }
    let other = fresh(16 * MIB);
    let foreign = Arc::new(Foreign(other.clone(), AtomicU64::new(0)));
    m.set_allocator(Some(foreign.clone()));
    let e = m.malloc(10).unwrap_err();
    assert!(e.to_string().contains("not memory of that device"), "{e}");
    assert_eq!(foreign.1.load(Ordering::SeqCst), 1);
    assert_eq!(other.stats().active_allocations, 0);
}

/// A plugged allocator is user code: a panic in `allocate` is an error of that allocation,
/// and a panic in `free` stays in the call that passes blocks back.
#[test]
fn a_panicking_plugged_allocator_is_an_error_not_an_unwind() {
    struct Bad {
        freed: AtomicU64,
    }
    impl Allocator for Bad {
        fn allocate(&self, mem: &Arc<DeviceMemory>, size: u64) -> runtime_core::Result<Block> {
            if size == 13 {
                panic!("allocate exploded");
            }
            Ok(Block::new(mem.allocate(size)?))
        }
        fn free(&self, _: Block) {
            self.freed.fetch_add(1, Ordering::SeqCst);
            panic!("free exploded");
        }
    }
    let m = fresh(16 * MIB);
    let bad = Arc::new(Bad {
        freed: AtomicU64::new(0),
    });
    m.set_allocator(Some(bad.clone()));
    let e = m.malloc(13).unwrap_err();
    assert!(
        e.to_string()
            .contains("allocate panicked: allocate exploded"),
        "{e}"
    );
    drop(m.malloc(100).unwrap());
    drop(m.malloc(200).unwrap()); // passes the first block back, whose free panics
    assert_eq!(m.return_blocks(), 1);
    assert_eq!(bad.freed.load(Ordering::SeqCst), 2);
    m.set_allocator(None);
}
