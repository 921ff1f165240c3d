//! A kernel defined outside the crate: registered with `kernel::register`, found by name and
//! launched like a built-in one (argument checks at launch, failures at synchronize).
//!
//! All tests share one runtime (same settings, never shut down); each registers its own
//! kernel names.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use runtime_core::error::{ArgError, Error, KernelFailure, StreamError};
use runtime_core::kernel::{self, Args, DType, Kernel, KernelArg, KernelRef, RunContext, Tensor};
use runtime_core::stream::Stream;

use common::init;

/// `x[i] = start + i * step` for an int64 tensor `x`.
struct Iota {
    name: String,
    runs: AtomicUsize,
}

impl Kernel for Iota {
    fn name(&self) -> &str {
        &self.name
    }

    fn check(&self, args: &[KernelArg]) -> Result<(), ArgError> {
        match args {
            [KernelArg::Tensor(t), KernelArg::Int(_), KernelArg::Int(_)]
                if t.dtype() == DType::I64 =>
            {
                Ok(())
            }
            [KernelArg::Tensor(t), ..] if t.dtype() != DType::I64 => Err(ArgError::new(
                "x",
                format!("{}: x must be int64, got {}", self.name, t.dtype().name()),
            )),
            _ => Err(ArgError::new(
                "args",
                format!("{} takes (x, start, step)", self.name),
            )),
        }
    }

    fn run(&self, args: &Args, _: &RunContext) -> Result<(), KernelFailure> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let (KernelArg::Tensor(t), KernelArg::Int(start), KernelArg::Int(step)) =
            (&args[0], &args[1], &args[2])
        else {
            unreachable!("checked at launch")
        };
        if *step == 0 {
            return Err(KernelFailure::new(
                self.name.clone(),
                "step must not be zero",
            ));
        }
        let values: Vec<i64> = (0..t.len() as i64).map(|i| start + i * step).collect();
        t.write(&values)
            .map_err(|e| KernelFailure::new(self.name.clone(), e.to_string()))
    }
}

fn iota(name: &str) -> Arc<Iota> {
    Arc::new(Iota {
        name: name.into(),
        runs: AtomicUsize::new(0),
    })
}

fn read_i64(t: &runtime_core::memory::Buffer, n: usize) -> Vec<i64> {
    let mut b = vec![0u8; n * 8];
    t.read(0, &mut b).unwrap();
    b.chunks_exact(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn a_registered_kernel_is_found_and_launched_by_name() {
    let rt = init();
    let k = iota("test.iota");
    assert!(kernel::register(k.clone()).is_none());
    assert!(kernel::names().iter().any(|n| n == "test.iota"));
    assert!(kernel::lookup("test.iota").is_some());

    let dev = rt.device(1).unwrap();
    let s = Stream::new(dev, -1).unwrap();
    let buf = dev.memory().allocate(16 * 8).unwrap();
    let x = Tensor::new(buf.clone(), 0, DType::I64, vec![16]).unwrap();
    let found = kernel::find("test.iota").unwrap();
    assert_eq!(found.name(), "test.iota");
    kernel::launch(
        &s,
        found,
        vec![KernelArg::Tensor(x), KernelArg::Int(5), KernelArg::Int(-2)],
    )
    .unwrap();
    s.synchronize(None).unwrap();
    assert_eq!(
        read_i64(&buf, 16),
        (0..16).map(|i| 5 - 2 * i).collect::<Vec<_>>()
    );
    assert_eq!(k.runs.load(Ordering::SeqCst), 1);

    // Built-ins and the custom kernel work on the same stream, in order.
    let x = Tensor::new(buf.clone(), 0, DType::I64, vec![16]).unwrap();
    kernel::launch(
        &s,
        kernel::find("scale").unwrap(),
        vec![
            KernelArg::Tensor(x.clone()),
            KernelArg::Tensor(x),
            KernelArg::Int(3),
        ],
    )
    .unwrap();
    s.synchronize(None).unwrap();
    assert_eq!(
        read_i64(&buf, 16),
        (0..16).map(|i| 3 * (5 - 2 * i)).collect::<Vec<_>>()
    );
}

#[test]
fn a_custom_kernel_checks_its_arguments_at_launch() {
    let rt = init();
    kernel::register(iota("test.iota_checked"));
    let dev = rt.device(0).unwrap();
    let s = Stream::new(dev, 0).unwrap();
    let buf = dev.memory().allocate(64).unwrap();
    let f = Tensor::new(buf.clone(), 0, DType::F64, vec![8]).unwrap();
    let k = kernel::find("test.iota_checked").unwrap();
    match kernel::launch(
        &s,
        k.clone(),
        vec![KernelArg::Tensor(f), KernelArg::Int(0), KernelArg::Int(1)],
    ) {
        Err(Error::Arg(e)) => {
            assert_eq!(e.arg, "x");
            assert!(e.message.contains("float64"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        kernel::launch(&s, k, vec![KernelArg::Int(0)]),
        Err(Error::Arg(ArgError { .. }))
    ));
    assert_eq!(s.counters(), (0, 0));
}

#[test]
fn a_custom_kernel_failure_names_the_kernel() {
    let rt = init();
    kernel::register(iota("test.iota_failing"));
    let dev = rt.device(0).unwrap();
    let s = Stream::new(dev, 0).unwrap();
    let buf = dev.memory().allocate(64).unwrap();
    let x = Tensor::new(buf, 0, DType::I64, vec![8]).unwrap();
    kernel::launch(
        &s,
        kernel::find("test.iota_failing").unwrap(),
        vec![KernelArg::Tensor(x), KernelArg::Int(0), KernelArg::Int(0)],
    )
    .unwrap();
    match s.synchronize(None) {
        Err(Error::Stream(StreamError::Kernel(f))) => {
            assert_eq!(f.kernel, "test.iota_failing");
            assert_eq!(f.stream, s.id());
            assert!(f.message.contains("step must not be zero"), "{f}");
        }
        other => panic!("{other:?}"),
    }
    s.synchronize(None).unwrap();
}

#[test]
fn registering_again_replaces_the_kernel() {
    let _rt = init();
    let first = iota("test.iota_replaced");
    let second = iota("test.iota_replaced");
    assert!(kernel::register(first.clone()).is_none());
    let old = kernel::register(second.clone()).expect("the first one is replaced");
    assert!(KernelRef::same(
        &old,
        &(first.clone() as Arc<dyn Kernel>).into()
    ));
    let now = kernel::find("test.iota_replaced").unwrap();
    assert!(KernelRef::same(&now, &(second as Arc<dyn Kernel>).into()));
}

/// A kernel whose `run` panics, and whose `name` panics too except on the thread that made
/// it: the launch asks the name where it runs (the op keeps no copy), so a panic there must
/// be contained like one in `run`.
struct Unnamable {
    maker: std::thread::ThreadId,
}

impl Kernel for Unnamable {
    fn name(&self) -> &str {
        assert!(
            std::thread::current().id() == self.maker,
            "name() asked off the launching thread"
        );
        "test.unnamable"
    }

    fn check(&self, _args: &[KernelArg]) -> Result<(), ArgError> {
        Ok(())
    }

    fn run(&self, _args: &Args, _cx: &RunContext) -> Result<(), KernelFailure> {
        panic!("run exploded");
    }
}

#[test]
fn a_kernel_whose_name_panics_where_it_runs_fails_its_launch_only() {
    let rt = init();
    let dev = rt.device(0).unwrap();
    let s = Stream::new(dev, 0).unwrap();
    let k: Arc<dyn Kernel> = Arc::new(Unnamable {
        maker: std::thread::current().id(),
    });
    for _ in 0..3 {
        kernel::launch(&s, &k, vec![]).unwrap();
        match s.synchronize(None) {
            Err(Error::Stream(StreamError::Kernel(f))) => {
                assert!(f.message.contains("run exploded"), "{f}");
                assert_eq!(f.kernel, "<a kernel whose name() panicked>", "{f}");
            }
            other => panic!("{other:?}"),
        }
        // The worker that asked is alive: the stream runs the next launch.
        kernel::launch(&s, kernel::find("noop").unwrap(), vec![]).unwrap();
        s.synchronize(None).unwrap();
    }
}
