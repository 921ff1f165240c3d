//! Multi-block launches (`kernel::block`): every block runs once with its index, blocks of
//! one launch run at the same time, a failing block fails the launch naming it, graphs keep
//! `block_dim`, blocks reach the launch's buffers through safe calls, and the built-ins give
//! the same results split into any number of blocks. Native kernels (`kernel::native`): Rust
//! `extern "C"` functions and C compiled here with `cc` (skipped without one).
//!
//! All tests share one runtime (same settings, never shut down).

mod common;

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runtime_core::error::{ArgError, Error, KernelFailure, StreamError};
use runtime_core::kernel::native::NativeKernel;
use runtime_core::kernel::{
    self, Args, DType, Kernel, KernelArg, LaunchKernel, RunContext, Tensor,
};
use runtime_core::memory::Buffer;
use runtime_core::stream::Stream;

use common::init;

fn stream(dev: usize) -> Stream {
    let rt = init();
    Stream::new(rt.device(dev).unwrap(), 0).unwrap()
}

fn alloc(dev: usize, bytes: u64) -> Buffer {
    init()
        .device(dev)
        .unwrap()
        .memory()
        .allocate(bytes)
        .unwrap()
}

fn kernel_failure(e: Error) -> KernelFailure {
    match e {
        Error::Stream(StreamError::Kernel(k)) => k,
        other => panic!("expected a kernel failure, got {other:?}"),
    }
}

/// Counts, per block index, how often it ran, and checks `block_num`.
struct Census {
    seen: Mutex<Vec<u32>>,
    nums: Mutex<Vec<u32>>,
}

impl Kernel for Census {
    fn name(&self) -> &str {
        "test.census"
    }
    fn check(&self, _: &[KernelArg]) -> Result<(), ArgError> {
        Ok(())
    }
    fn run(&self, _: &Args, cx: &RunContext) -> Result<(), KernelFailure> {
        assert_eq!(
            kernel::block::current(),
            Some(*cx),
            "current() is the block"
        );
        let mut seen = self.seen.lock().unwrap();
        let i = cx.block_idx() as usize;
        if seen.len() <= i {
            seen.resize(i + 1, 0);
        }
        seen[i] += 1;
        self.nums.lock().unwrap().push(cx.block_num());
        Ok(())
    }
}

fn census() -> Arc<Census> {
    Arc::new(Census {
        seen: Mutex::new(Vec::new()),
        nums: Mutex::new(Vec::new()),
    })
}

#[test]
fn every_block_runs_exactly_once_with_its_index() {
    let s = stream(0);
    for n in [1u32, 2, 3, 8, 64, 1000] {
        let c = census();
        kernel::launch_blocks(&s, c.clone(), vec![], Some(n)).unwrap();
        s.synchronize(None).unwrap();
        assert_eq!(
            *c.seen.lock().unwrap(),
            vec![1; n as usize],
            "block_dim {n}"
        );
        assert!(c.nums.lock().unwrap().iter().all(|&m| m == n));
    }
    // Without block_dim a kernel that does not choose runs as one block.
    let c = census();
    kernel::launch(&s, c.clone(), vec![]).unwrap();
    s.synchronize(None).unwrap();
    assert_eq!(*c.seen.lock().unwrap(), vec![1]);
    assert_eq!(kernel::block::current(), None, "no block outside a kernel");
}

/// Each block arrives, then waits (up to 10 s) for every other block of the launch to
/// arrive: it can only succeed when all blocks run at the same time.
struct Rendezvous {
    arrived: AtomicU32,
}

impl Kernel for Rendezvous {
    fn name(&self) -> &str {
        "test.rendezvous"
    }
    fn check(&self, _: &[KernelArg]) -> Result<(), ArgError> {
        Ok(())
    }
    fn run(&self, _: &Args, cx: &RunContext) -> Result<(), KernelFailure> {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(10);
        while self.arrived.load(Ordering::SeqCst) < cx.block_num() {
            if Instant::now() > until {
                return Err(KernelFailure::new(
                    "test.rendezvous",
                    format!("block {} waited alone", cx.block_idx()),
                ));
            }
            std::thread::yield_now();
        }
        Ok(())
    }
}

#[test]
fn blocks_of_one_launch_run_at_the_same_time() {
    let s = stream(1);
    let k = Arc::new(Rendezvous {
        arrived: AtomicU32::new(0),
    });
    kernel::launch_blocks(&s, k.clone(), vec![], Some(2)).unwrap();
    s.synchronize(None).unwrap();
    assert_eq!(k.arrived.load(Ordering::SeqCst), 2);
}

/// Fails in block 3 of a launch of 8, panics in block 5; succeeds elsewhere.
struct Flaky;

impl Kernel for Flaky {
    fn name(&self) -> &str {
        "test.flaky"
    }
    fn check(&self, _: &[KernelArg]) -> Result<(), ArgError> {
        Ok(())
    }
    fn run(&self, _: &Args, cx: &RunContext) -> Result<(), KernelFailure> {
        match cx.block_idx() {
            3 if cx.block_num() == 8 => Err(KernelFailure::new("test.flaky", "block three fails")),
            5 => panic!("block five panics"),
            _ => Ok(()),
        }
    }
}

#[test]
fn a_failing_block_fails_the_launch_naming_it_and_the_stream_goes_on() {
    let s = stream(0);
    kernel::launch_blocks(&s, Arc::new(Flaky), vec![], Some(8)).unwrap();
    let f = kernel_failure(s.synchronize(None).unwrap_err());
    assert_eq!(f.block, Some(3), "the lowest failing block: {f}");
    assert!(f.message.contains("block 3 of 8"), "{f}");
    assert!(f.message.contains("block three fails"), "{f}");
    // Only block 5 fails now: its panic is the launch's failure.
    kernel::launch_blocks(&s, Arc::new(Flaky), vec![], Some(6)).unwrap();
    let f = kernel_failure(s.synchronize(None).unwrap_err());
    assert_eq!(f.block, Some(5));
    assert!(f.message.contains("block five panics"), "{f}");
    // The stream goes on.
    let c = census();
    kernel::launch_blocks(&s, c.clone(), vec![], Some(4)).unwrap();
    s.synchronize(None).unwrap();
    assert_eq!(*c.seen.lock().unwrap(), vec![1; 4]);
}

#[test]
fn graph_replays_keep_block_dim() {
    let s = stream(1);
    let c = census();
    s.begin_capture().unwrap();
    kernel::launch_blocks(&s, c.clone(), vec![], Some(5)).unwrap();
    let g = s.end_capture().unwrap();
    assert!(
        c.seen.lock().unwrap().is_empty(),
        "captured work does not run"
    );
    for _ in 0..3 {
        s.launch_graph(&g).unwrap();
    }
    s.synchronize(None).unwrap();
    assert_eq!(*c.seen.lock().unwrap(), vec![3; 5]);
}

/// Writes `value + i` into element `i` of its block's share of an int64 tensor, through the
/// safe `Buffer::write` (a host access from a block: the blocks borrow the launch's hold).
struct SafeWriter;

impl Kernel for SafeWriter {
    fn name(&self) -> &str {
        "test.safe_writer"
    }
    fn check(&self, args: &[KernelArg]) -> Result<(), ArgError> {
        match args {
            [KernelArg::Tensor(t), KernelArg::Int(_)] if t.dtype() == DType::I64 => Ok(()),
            _ => Err(ArgError::new("args", "takes (int64 x, value)")),
        }
    }
    fn run(&self, args: &Args, cx: &RunContext) -> Result<(), KernelFailure> {
        let (KernelArg::Tensor(t), KernelArg::Int(v)) = (&args[0], &args[1]) else {
            unreachable!("checked")
        };
        let share = cx.share(t.len());
        let values: Vec<u8> = share
            .clone()
            .flat_map(|i| (v + i as i64).to_ne_bytes())
            .collect();
        t.buffer()
            .write(t.offset() + share.start as u64 * 8, &values)
            .map_err(|e| KernelFailure::new("test.safe_writer", e.to_string()))?;
        // Reading the whole tensor back is a host access of the same allocation too.
        t.to_vec::<i64>()
            .map_err(|e| KernelFailure::new("test.safe_writer", e.to_string()))?;
        Ok(())
    }
}

#[test]
fn blocks_reach_the_launch_buffers_through_safe_calls() {
    let s = stream(0);
    let n = 1000usize;
    let buf = alloc(0, n as u64 * 8);
    let t = Tensor::new(buf.clone(), 0, DType::I64, vec![n]).unwrap();
    kernel::launch_blocks(
        &s,
        Arc::new(SafeWriter),
        vec![KernelArg::Tensor(t), KernelArg::Int(7)],
        Some(8),
    )
    .unwrap();
    s.synchronize(None).unwrap();
    let got = buf.to_vec::<i64>(0, n).unwrap();
    assert_eq!(got, (0..n as i64).map(|i| 7 + i).collect::<Vec<_>>());
}

#[test]
fn bad_block_dim_is_refused_and_queues_nothing() {
    let s = stream(0);
    let before = s.counters();
    for bad in [0u32, kernel::MAX_BLOCK_DIM + 1, u32::MAX] {
        let e = kernel::launch_blocks(&s, census(), vec![], Some(bad)).unwrap_err();
        assert!(e.to_string().contains("block_dim"), "{e}");
    }
    assert_eq!(s.counters(), before, "nothing was queued");
    assert!(s.launch_kernel_blocks("noop", vec![], 0).is_err());
}

fn f32_tensor(dev: usize, values: &[f32], shape: Vec<usize>) -> (Buffer, Tensor) {
    let buf = alloc(dev, (values.len() * 4).max(1) as u64);
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    buf.write(0, &bytes).unwrap();
    let t = Tensor::new(buf.clone(), 0, DType::F32, shape).unwrap();
    (buf, t)
}

#[test]
fn built_ins_give_the_same_results_in_any_number_of_blocks() {
    let s = stream(1);
    for n in [0usize, 1, 17, 1000, 4099] {
        let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..n).map(|i| 3.0 - i as f32).collect();
        let (_, ta) = f32_tensor(1, &a, vec![n]);
        let (_, tb) = f32_tensor(1, &b, vec![n]);
        for blocks in [None, Some(1), Some(2), Some(3), Some(8), Some(64)] {
            let (ob, to) = f32_tensor(1, &vec![0.0; n], vec![n]);
            let args = vec![
                KernelArg::Tensor(to.clone()),
                KernelArg::Tensor(ta.clone()),
                KernelArg::Tensor(tb.clone()),
            ];
            kernel::launch_blocks(&s, kernel::find("add").unwrap(), args, blocks).unwrap();
            // In place: out = out * 2 (axpy with itself: y = 1 * y + y).
            let args = vec![
                KernelArg::Tensor(to.clone()),
                KernelArg::Tensor(to.clone()),
                KernelArg::Float(1.0),
            ];
            kernel::launch_blocks(&s, kernel::find("axpy").unwrap(), args, blocks).unwrap();
            s.synchronize(None).unwrap();
            let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| 2.0 * (x + y)).collect();
            assert_eq!(
                ob.to_vec::<f32>(0, n).unwrap(),
                want,
                "n {n} blocks {blocks:?}"
            );
        }
    }
    // matmul 7x5 @ 5x3 in 1 and 3 blocks (and more blocks than rows).
    let (m, k, n) = (7, 5, 3);
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 2.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.25).collect();
    let (_, ta) = f32_tensor(1, &a, vec![m, k]);
    let (_, tb) = f32_tensor(1, &b, vec![k, n]);
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    for blocks in [Some(1), Some(3), Some(16)] {
        let (cb, tc) = f32_tensor(1, &vec![0.0; m * n], vec![m, n]);
        let args = vec![
            KernelArg::Tensor(tc),
            KernelArg::Tensor(ta.clone()),
            KernelArg::Tensor(tb.clone()),
        ];
        kernel::launch_blocks(&s, kernel::find("matmul").unwrap(), args, blocks).unwrap();
        s.synchronize(None).unwrap();
        let got = cb.to_vec::<f32>(0, m * n).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() < 1e-4,
                "matmul blocks {blocks:?}: {got:?} vs {want:?}"
            );
        }
    }
}

/// `out[i] += 1` for its share of `n` int32 elements: params = (out, n).
unsafe extern "C" fn add_one(idx: u32, num: u32, params: *mut *mut c_void) -> i32 {
    // SAFETY: the test launches it with (int32 buffer of n elements, int n).
    unsafe {
        let out = *params as *mut i32;
        let n = *(*params.add(1) as *const i64) as usize;
        let cx = RunContext::new(idx, num);
        for i in cx.share(n) {
            *out.add(i) += 1;
        }
    }
    0
}

/// Returns 40 + its block index in blocks 2 and up.
unsafe extern "C" fn fail_from_two(idx: u32, _: u32, _: *mut *mut c_void) -> i32 {
    if idx >= 2 {
        40 + idx as i32
    } else {
        0
    }
}

static ARRIVED: AtomicU32 = AtomicU32::new(0);

/// Arrives, then waits up to 10 s for `block_num` arrivals: returns 1 if alone.
unsafe extern "C" fn native_rendezvous(_: u32, num: u32, _: *mut *mut c_void) -> i32 {
    ARRIVED.fetch_add(1, Ordering::SeqCst);
    let until = Instant::now() + Duration::from_secs(10);
    while ARRIVED.load(Ordering::SeqCst) < num {
        if Instant::now() > until {
            return 1;
        }
        std::thread::yield_now();
    }
    0
}

#[test]
fn native_kernels_run_every_block_and_report_their_codes() {
    let s = stream(0);
    // SAFETY: `add_one` follows the ABI and stays inside the buffer it is given.
    let k = unsafe { NativeKernel::from_raw("add_one", add_one, None) }
        .with_nargs(2)
        .into_kernel();
    let n = 1001;
    let buf = alloc(0, n as u64 * 4);
    let t = Tensor::new(buf.clone(), 0, DType::I32, vec![n]).unwrap();
    for blocks in [1, 2, 7] {
        kernel::launch_blocks(
            &s,
            k.clone(),
            vec![KernelArg::Tensor(t.clone()), KernelArg::Int(n as i64)],
            Some(blocks),
        )
        .unwrap();
    }
    s.synchronize(None).unwrap();
    assert_eq!(buf.to_vec::<i32>(0, n).unwrap(), vec![3; n]);
    // The declared argument count is checked at launch.
    assert!(kernel::launch(&s, k.clone(), vec![]).is_err());

    // SAFETY: touches no memory.
    let f = unsafe { NativeKernel::from_raw("fail_from_two", fail_from_two, None) }.into_kernel();
    kernel::launch_blocks(&s, f, vec![], Some(4)).unwrap();
    let e = kernel_failure(s.synchronize(None).unwrap_err());
    assert_eq!((e.code, e.block), (Some(42), Some(2)), "{e}");
    assert!(e.message.contains("returned 42"), "{e}");
    // The stream goes on.
    kernel::launch_blocks(
        &s,
        k,
        vec![KernelArg::Tensor(t), KernelArg::Int(n as i64)],
        Some(3),
    )
    .unwrap();
    s.synchronize(None).unwrap();
    assert_eq!(buf.to_vec::<i32>(0, n).unwrap(), vec![4; n]);
}

#[test]
fn blocks_of_one_native_launch_run_at_the_same_time() {
    let s = stream(1);
    // SAFETY: touches only a static atomic.
    let k = unsafe { NativeKernel::from_raw("rendezvous", native_rendezvous, None) };
    kernel::launch_blocks(&s, k.into_kernel(), vec![], Some(2)).unwrap();
    s.synchronize(None).unwrap();
}

#[test]
fn a_zero_address_is_refused() {
    // SAFETY: refused before anything could call it.
    let e = unsafe { NativeKernel::from_address("null", 0, None) }.unwrap_err();
    assert!(e.to_string().contains("address"), "{e}");
}

/// A C kernel compiled here with the system compiler against the header the Python package
/// ships; skipped (with a message) where no `cc` exists.
#[test]
fn a_c_kernel_from_a_shared_library() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let include = root.join("python/runtime/include");
    let dir = std::env::temp_dir().join(format!("runtime-blocks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("k.c");
    let lib = dir.join("libk.so");
    std::fs::write(
        &src,
        r#"#include <runtime/kernel.h>
RUNTIME_KERNEL(axpb) {
    float *y = (float *)params[0];
    const float *x = (const float *)params[1];
    double a = *(const double *)params[2];
    float b = *(const float *)params[3];
    int64_t n = *(const int64_t *)params[4];
    uint64_t lo, hi;
    runtime_block_range((uint64_t)n, block_idx, block_num, &lo, &hi);
    for (uint64_t i = lo; i < hi; i++) y[i] = (float)(a * x[i]) + b;
    return 0;
}
RUNTIME_KERNEL(bad) { return -block_num; }
"#,
    )
    .unwrap();
    let built = std::process::Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-I"])
        .arg(&include)
        .arg(&src)
        .arg("-o")
        .arg(&lib)
        .status();
    match built {
        Ok(st) if st.success() => {}
        other => {
            eprintln!("skipped: no C compiler ({other:?})");
            return;
        }
    }
    let path = lib.to_str().unwrap();
    // SAFETY: the library is the one just compiled from the source above.
    let k = unsafe { NativeKernel::load(path, "axpb") }
        .unwrap()
        .with_read_only([1])
        .with_nargs(5);
    assert_eq!(k.name(), "axpb");
    let s = stream(0);
    let n = 513;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let (xb, tx) = f32_tensor(0, &x, vec![n]);
    let (yb, ty) = f32_tensor(0, &vec![0.0; n], vec![n]);
    let b = kernel::Scalar::from_bytes(DType::F32, &0.5f32.to_ne_bytes()).unwrap();
    kernel::launch_blocks(
        &s,
        k.into_kernel(),
        vec![
            KernelArg::Tensor(ty),
            KernelArg::Tensor(tx),
            KernelArg::Float(2.0),
            KernelArg::Typed(b),
            KernelArg::Int(n as i64),
        ],
        Some(4),
    )
    .unwrap();
    s.synchronize(None).unwrap();
    let want: Vec<f32> = x.iter().map(|v| 2.0 * v + 0.5).collect();
    assert_eq!(yb.to_vec::<f32>(0, n).unwrap(), want);
    assert_eq!(
        xb.to_vec::<f32>(0, n).unwrap(),
        x,
        "read-only input untouched"
    );

    // SAFETY: as above.
    let bad = unsafe { NativeKernel::load(path, "bad") }.unwrap();
    kernel::launch_blocks(&s, bad.into_kernel(), vec![], Some(3)).unwrap();
    let e = kernel_failure(s.synchronize(None).unwrap_err());
    assert_eq!((e.code, e.block), (Some(-3), Some(0)));

    // SAFETY: refused before any code runs.
    let e = unsafe { NativeKernel::load(path, "missing") }.unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
    // SAFETY: as above.
    let e = unsafe { NativeKernel::load("/no/such/lib.so", "axpb") }.unwrap_err();
    assert!(e.to_string().contains("/no/such/lib.so"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each block waits for the stream that runs it: refused in every block (on a worker, or on
/// the host thread that runs blocks while it waits for the stream), never a hang.
struct WaitsForItsStream {
    stream: Mutex<Option<Stream>>,
}

impl Kernel for WaitsForItsStream {
    fn name(&self) -> &str {
        "test.waits_for_its_stream"
    }
    fn check(&self, _: &[KernelArg]) -> Result<(), ArgError> {
        Ok(())
    }
    fn run(&self, _: &Args, _: &RunContext) -> Result<(), KernelFailure> {
        let s = self.stream.lock().unwrap().clone().unwrap();
        s.synchronize(Some(Duration::from_secs(30)))
            .map_err(|e| KernelFailure::new("test.waits_for_its_stream", e.to_string()))
    }
}

#[test]
fn a_block_that_waits_for_its_own_stream_is_refused_wherever_it_runs() {
    let s = stream(0);
    let k = Arc::new(WaitsForItsStream {
        stream: Mutex::new(Some(s.clone())),
    });
    for _ in 0..20 {
        kernel::launch_blocks(&s, k.clone(), vec![], Some(4)).unwrap();
        let f = kernel_failure(s.synchronize(None).unwrap_err());
        assert!(f.message.contains("not permitted"), "{f}");
    }
    *k.stream.lock().unwrap() = None;
}

#[test]
fn a_host_thread_waiting_for_the_stream_may_run_blocks() {
    // Whichever threads run the blocks, a waiter's synchronize returns once all have run.
    let s = stream(1);
    for n in [2u32, 3, 16] {
        for _ in 0..50 {
            let c = census();
            kernel::launch_blocks(&s, c.clone(), vec![], Some(n)).unwrap();
            s.synchronize(None).unwrap();
            assert_eq!(*c.seen.lock().unwrap(), vec![1; n as usize]);
        }
    }
}

/// Calls the built-in `add` directly, over its whole output, from every block.
struct CallsAdd {
    add: kernel::Args,
}

impl Kernel for CallsAdd {
    fn name(&self) -> &str {
        "test.calls_add"
    }
    fn check(&self, _: &[KernelArg]) -> Result<(), ArgError> {
        Ok(())
    }
    fn run(&self, _: &Args, _: &RunContext) -> Result<(), KernelFailure> {
        kernel::find("add")
            .unwrap()
            .run(&self.add, &RunContext::single())
    }
}

/// The built-ins' typed views need their tensors to themselves: called directly from the
/// blocks of another kernel's launch (which hold the tensors, but share no work out), they
/// take turns; called from a thread that holds nothing, they take the allocations as a host
/// access does.
#[test]
fn a_builtin_run_directly_takes_its_tensors_as_a_host_access_would() {
    let s = stream(0);
    let n = 100_000;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let (_, ta) = f32_tensor(0, &a, vec![n]);
    let (ob, to) = f32_tensor(0, &vec![0.0; n], vec![n]);
    let add = kernel::find("add").unwrap();
    let add_args = kernel::Args::check(
        &add,
        vec![
            KernelArg::Tensor(to.clone()),
            KernelArg::Tensor(ta.clone()),
            KernelArg::Tensor(ta.clone()),
        ],
    )
    .unwrap();
    let k = Arc::new(CallsAdd {
        add: add_args.clone(),
    });
    // The launch holds the output (its argument) for writing; every block writes all of it.
    kernel::launch_blocks(
        &s,
        k,
        vec![KernelArg::Tensor(to.clone()), KernelArg::Tensor(ta.clone())],
        Some(8),
    )
    .unwrap();
    s.synchronize(None).unwrap();
    let want: Vec<f32> = a.iter().map(|x| 2.0 * x).collect();
    assert_eq!(ob.to_vec::<f32>(0, n).unwrap(), want);
    // From this thread, which holds nothing: after the queued work, holding the locks.
    ob.fill(0, (n * 4) as u64, 0).unwrap();
    add.run(&add_args, &RunContext::new(1, 2)).unwrap();
    let got = ob.to_vec::<f32>(0, n).unwrap();
    let half = RunContext::new(1, 2).share_aligned(n, 16);
    assert!(got[..half.start].iter().all(|&v| v == 0.0));
    assert_eq!(&got[half.clone()], &want[half]);
}

/// `buf[0..n] = v` in two halves, a pause between (params: u8 buffer, n and v as int64).
unsafe extern "C" fn fill_in_halves(_: u32, _: u32, params: *mut *mut c_void) -> i32 {
    // SAFETY: the test passes a u8 buffer of `n` bytes and two int64 scalars.
    unsafe {
        let p = (*params).cast::<u8>();
        let n = *(*params.add(1)).cast::<i64>() as usize;
        let v = *(*params.add(2)).cast::<i64>() as u8;
        std::ptr::write_bytes(p, v, n / 2);
        for _ in 0..2000 {
            std::hint::spin_loop();
        }
        std::ptr::write_bytes(p.add(n / 2), v, n - n / 2);
    }
    0
}

/// A native kernel's `run` is a safe method any thread may call with arguments from the safe
/// `Args::check`. It used to call the function without taking the tensors, so the function
/// wrote a buffer while a host read (holding the allocation's lock) copied it: a data race,
/// seen as half-written reads (RELIABILITY.md W15). Now every read sees one fill.
#[test]
fn a_native_kernel_run_directly_takes_its_buffers_as_a_host_access_does() {
    const LEN: usize = 1 << 20;
    let _rt = init();
    let b = alloc(0, LEN as u64);
    // SAFETY: `fill_in_halves` follows the ABI and stays inside the buffer it is given.
    let k: Arc<dyn Kernel> =
        unsafe { NativeKernel::from_raw("fill_in_halves", fill_in_halves, None) }.into_kernel();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runner = {
        let (k, b, stop) = (k.clone(), b.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut v = 0i64;
            while !stop.load(Ordering::Relaxed) {
                v = (v + 1) % 200;
                let t = Tensor::new(b.clone(), 0, DType::U8, vec![LEN]).unwrap();
                let args = Args::check(
                    k.clone(),
                    vec![
                        KernelArg::Tensor(t),
                        KernelArg::Int(LEN as i64),
                        KernelArg::Int(v),
                    ],
                )
                .unwrap();
                k.run(&args, &RunContext::single()).unwrap();
            }
        })
    };
    let mut back = vec![0u8; LEN];
    let mut torn = 0;
    for _ in 0..50 {
        b.read(0, &mut back).unwrap();
        if back.iter().any(|&x| x != back[0]) {
            torn += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    runner.join().unwrap();
    assert_eq!(torn, 0, "{torn} of 50 host reads saw a half-written buffer");
}

/// Every block arrives and waits for block 0 to finish; block 0, once the test says the
/// second stream's copy is queued, reads `y` (whose pending writer is that copy) with a safe
/// `Buffer::read`, and records what it returned.
struct ReadsWhileEveryWorkerIsBusy {
    y: Buffer,
    arrived: AtomicU32,
    queued: std::sync::atomic::AtomicBool,
    read: Mutex<Option<Result<Vec<u8>, String>>>,
}

impl Kernel for ReadsWhileEveryWorkerIsBusy {
    fn name(&self) -> &str {
        "test.reads_while_every_worker_is_busy"
    }
    fn check(&self, _: &[KernelArg]) -> Result<(), ArgError> {
        Ok(())
    }
    fn run(&self, _: &Args, cx: &RunContext) -> Result<(), KernelFailure> {
        let fail = |what: &str| KernelFailure::new(self.name(), what.to_string());
        let until = Instant::now() + Duration::from_secs(30);
        self.arrived.fetch_add(1, Ordering::SeqCst);
        if cx.block_idx() == 0 {
            while !self.queued.load(Ordering::SeqCst) {
                if Instant::now() > until {
                    return Err(fail("the copy was never queued"));
                }
                std::thread::yield_now();
            }
            let mut b = vec![0u8; 16];
            let r = self.y.read(0, &mut b).map(|()| b);
            *self.read.lock().unwrap() = Some(r.map_err(|e| e.to_string()));
        } else {
            while self.read.lock().unwrap().is_none() {
                if Instant::now() > until {
                    return Err(fail("block 0 never read"));
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

/// A block's safe host read of a buffer whose pending writer is a built-in kernel queued on
/// another stream, while every compute worker runs a block of the launch: the read runs that
/// stream on the block's thread, and the kernel takes the launch's borrowed tensors there.
/// It took the launch's host mutex a second time on the thread that held it, and the thread
/// hung for good. The read now completes, with the copy's bytes.
#[test]
fn a_block_reading_a_buffer_runs_the_queued_kernel_that_writes_it() {
    let rt = init();
    let dev = rt.device(0).unwrap();
    let workers = u32::try_from(dev.compute_info().compute_engines).unwrap();
    let (x, y) = (alloc(0, 4096), alloc(0, 4096));
    x.fill(0, 4096, 0x5A).unwrap();
    let (s1, s2) = (stream(0), stream(0));
    let tx = Tensor::new(x.clone(), 0, DType::F32, vec![1024]).unwrap();
    let ty = Tensor::new(y.clone(), 0, DType::F32, vec![1024]).unwrap();
    let k = Arc::new(ReadsWhileEveryWorkerIsBusy {
        y: y.clone(),
        arrived: AtomicU32::new(0),
        queued: false.into(),
        read: Mutex::new(None),
    });
    let args = vec![KernelArg::Tensor(tx.clone())];
    kernel::launch_blocks(&s1, k.clone(), args, Some(workers)).unwrap();
    // Not `synchronize`: a waiting thread would run a block and leave a worker free.
    let until = Instant::now() + Duration::from_secs(30);
    while k.arrived.load(Ordering::SeqCst) < workers {
        assert!(Instant::now() < until, "the blocks never all ran at once");
        std::thread::sleep(Duration::from_millis(1));
    }
    let copy = kernel::find("copy").unwrap();
    kernel::launch(
        &s2,
        copy,
        vec![KernelArg::Tensor(ty), KernelArg::Tensor(tx)],
    )
    .unwrap();
    k.queued.store(true, Ordering::SeqCst);
    while !(s1.query().unwrap() && s2.query().unwrap()) {
        assert!(Instant::now() < until, "the block's read hung");
        std::thread::sleep(Duration::from_millis(1));
    }
    s1.synchronize(None).unwrap();
    let read = k.read.lock().unwrap().take().expect("block 0 read");
    assert_eq!(read.unwrap(), vec![0x5A; 16]);
}
