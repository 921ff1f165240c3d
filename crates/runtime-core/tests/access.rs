//! Host access ordered by the executor (`memory::access`): safe reads and writes of a buffer
//! wait for the stream work queued on it and never overlap a running op or another host
//! thread's copy; an op's own code reaches its buffers re-entrantly; what a runtime thread
//! may not wait for is refused, never hung on.
//!
//! Each race below was observed before the tracker and the lock existed (19-49 of 200 reads
//! saw a half-written buffer behind a queued kernel; 98 of 100 reads were torn by a plain
//! thread writing), so each is run many times.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use runtime_core::error::{ArgError, KernelFailure, StreamError};
use runtime_core::kernel::{self, Args, DType, Kernel, KernelArg, RunContext, Tensor};
use runtime_core::memory::access::Access;
use runtime_core::stream::{FnOp, OpKind, Stream};
use runtime_core::Error;

const LEN: usize = 1 << 20;

#[test]
fn a_read_waits_for_the_kernel_queued_on_the_buffer() {
    let rt = common::init();
    let d = rt.device(0).unwrap();
    let s = Stream::new(d, 0).unwrap();
    let b = d.memory().allocate(LEN as u64).unwrap();
    let mut back = vec![0u8; LEN];
    for round in 1..=200u8 {
        common::launch_halves(&s, &b, 0, LEN, round.into());
        b.read(0, &mut back).unwrap();
        assert!(
            common::uniform(&back) && back[0] == round,
            "round {round}: read before the queued kernel finished ({} then {})",
            back[0],
            back[LEN - 1]
        );
    }
    s.synchronize(None).unwrap();
}

#[test]
fn a_write_waits_for_the_kernels_reading_the_buffer() {
    // A copy queued to read `src` must see the value before the host overwrites it.
    let rt = common::init();
    let d = rt.device(1).unwrap();
    let s = Stream::new(d, 0).unwrap();
    let src = d.memory().allocate(LEN as u64).unwrap();
    let dst = d.memory().allocate(LEN as u64).unwrap();
    let mut back = vec![0u8; LEN];
    for round in 1..=100u8 {
        src.write(0, &vec![round; LEN]).unwrap();
        s.launch(runtime_core::stream::copy::d2d(&dst, 0, &src, 0, LEN as u64).unwrap())
            .unwrap();
        src.write(0, &vec![0; LEN]).unwrap();
        dst.read(0, &mut back).unwrap();
        assert!(
            common::uniform(&back) && back[0] == round,
            "round {round}: {}",
            back[0]
        );
    }
}

#[test]
fn host_threads_writing_and_reading_one_buffer_never_tear() {
    let rt = common::init();
    let b = rt.device(0).unwrap().memory().allocate(LEN as u64).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (b, stop) = (b.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut v = 0u8;
            while !stop.load(Ordering::Relaxed) {
                v = v.wrapping_add(1);
                b.write(0, &vec![v; LEN]).unwrap();
            }
        })
    };
    let mut back = vec![0u8; LEN];
    for i in 0..100 {
        b.read(0, &mut back).unwrap();
        assert!(common::uniform(&back), "read {i} was torn");
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}

#[test]
fn two_streams_writing_one_buffer_take_turns() {
    // Unordered work on two streams is the program's race in the device's model, but in
    // Rust's it would be two `&mut [u8]` at once: the ops take turns instead.
    let rt = common::init();
    let d = rt.device(0).unwrap();
    let (s1, s2) = (Stream::new(d, 0).unwrap(), Stream::new(d, 0).unwrap());
    let b = d.memory().allocate(LEN as u64).unwrap();
    let mut back = vec![0u8; LEN];
    for round in 0..50i64 {
        for (s, v) in [(&s1, 2 * round + 1), (&s2, 2 * round + 2)] {
            common::launch_halves(s, &b, 0, LEN, v);
        }
        s1.synchronize(None).unwrap();
        s2.synchronize(None).unwrap();
        b.read(0, &mut back).unwrap();
        assert!(
            common::uniform(&back),
            "round {round}: two kernels interleaved their halves"
        );
    }
}

#[test]
fn an_op_reaches_its_own_buffers_and_a_read_only_hold_refuses_writes() {
    // A kernel that declares its tensor read-only and then writes it through the safe API is
    // refused: the write would race the other readers the declaration lets in.
    struct Liar;
    impl Kernel for Liar {
        fn name(&self) -> &str {
            "test_liar"
        }
        fn check(&self, _: &[KernelArg]) -> Result<(), ArgError> {
            Ok(())
        }
        fn access(&self, _: usize) -> Access {
            Access::Read
        }
        fn run(&self, args: &Args, _: &RunContext) -> Result<(), KernelFailure> {
            let KernelArg::Tensor(t) = &args[0] else {
                unreachable!()
            };
            let mut x = [0u8; 4];
            t.buffer().read(0, &mut x).expect("reading what it holds");
            t.buffer()
                .write(0, &[1, 2, 3, 4])
                .map_err(|e| KernelFailure::new("test_liar", e.to_string()))
        }
    }
    let rt = common::init();
    let d = rt.device(0).unwrap();
    let s = Stream::new(d, 0).unwrap();
    let b = d.memory().allocate(64).unwrap();
    let t = Tensor::new(b.clone(), 0, DType::U8, vec![64]).unwrap();
    kernel::launch(&s, Arc::new(Liar), vec![KernelArg::Tensor(t)]).unwrap();
    let e = s.synchronize(None).unwrap_err();
    assert!(e.to_string().contains("only for reading"), "{e}");
    let mut x = [9u8; 4];
    b.read(0, &mut x).unwrap();
    assert_eq!(x, [0; 4], "the refused write changed nothing");
}

#[test]
fn a_host_function_reading_a_buffer_its_stream_writes_later_is_refused_not_hung() {
    // The read would wait for work queued behind the host function on its own stream.
    let rt = common::init();
    let d = rt.device(1).unwrap();
    let s = Stream::new(d, 0).unwrap();
    let b = d.memory().allocate(4096).unwrap();
    let gate = Arc::new(AtomicBool::new(false));
    let result = Arc::new(parking_lot::Mutex::new(None));
    {
        let (b, gate, result) = (b.clone(), gate.clone(), result.clone());
        s.launch(FnOp::shared("reader", OpKind::Compute, move || {
            while !gate.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            *result.lock() = Some(b.read(0, &mut [0u8; 16]));
            Ok(())
        }))
        .unwrap();
    }
    s.launch(runtime_core::stream::copy::memset(&b, 0, 4096, 7).unwrap())
        .unwrap();
    gate.store(true, Ordering::Release);
    s.synchronize(None).unwrap();
    let r = result.lock().take().expect("the host function ran");
    assert!(
        matches!(r, Err(Error::Stream(StreamError::NotPermitted { .. }))),
        "{r:?}"
    );
}
