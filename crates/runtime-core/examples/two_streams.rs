//! Two streams with an event dependency, and a custom kernel registered from outside the
//! crate: the producer stream fills a buffer with a built-in kernel, the consumer stream waits
//! for the producer's event and runs `square` (registered here) on it.
//!
//! Run with `cargo run -p runtime-core --example two_streams`.

use std::sync::Arc;

use runtime_core::config::ConfigBuilder;
use runtime_core::error::{ArgError, KernelFailure};
use runtime_core::event::Event;
use runtime_core::kernel::{self, Args, DType, Kernel, KernelArg, RunContext, Tensor};
use runtime_core::runtime;
use runtime_core::stream::Stream;

/// `x = x * x` for float32 tensors.
struct Square;

impl Kernel for Square {
    fn name(&self) -> &str {
        "square"
    }

    fn check(&self, args: &[KernelArg]) -> Result<(), ArgError> {
        match args {
            [KernelArg::Tensor(t)] if t.dtype() == DType::F32 => Ok(()),
            _ => Err(ArgError::new("args", "square takes one float32 tensor")),
        }
    }

    fn run(&self, args: &Args, _: &RunContext) -> Result<(), KernelFailure> {
        let [KernelArg::Tensor(t)] = &args[..] else {
            unreachable!("checked")
        };
        let fail = |e: runtime_core::Error| KernelFailure::new("square", e.to_string());
        let squares: Vec<f32> = t
            .to_vec::<f32>()
            .map_err(fail)?
            .iter()
            .map(|v| v * v)
            .collect();
        t.write(&squares).map_err(fail)
    }
}

fn main() -> runtime_core::Result<()> {
    let rt = runtime::init(&ConfigBuilder {
        device_count: Some(1),
        memory: Some(runtime_core::Bytes::mib(64)),
        profile: None,
    })?;
    kernel::register(Arc::new(Square));

    let dev = rt.device(0)?.clone();
    let buf = dev.memory().allocate(1024 * 4)?;
    let x = Tensor::new(buf.clone(), 0, DType::F32, vec![1024])?;

    let producer = Stream::new(&dev, 0)?;
    let consumer = Stream::new(&dev, 0)?;
    let ready = Event::new();
    let done = Event::new();

    kernel::launch(
        &producer,
        kernel::find("fill")?,
        vec![KernelArg::Tensor(x.clone()), KernelArg::Float(3.0)],
    )?;
    producer.record(&ready)?;
    consumer.wait_event(&ready)?;
    kernel::launch(
        &consumer,
        kernel::find("square")?,
        vec![KernelArg::Tensor(x)],
    )?;
    consumer.record(&done)?;
    consumer.synchronize(None)?;

    let mut out = [0u8; 4];
    buf.read(4 * 1023, &mut out)?;
    let v = f32::from_ne_bytes(out);
    assert_eq!(v, 9.0);
    println!("x[1023] = {v} after fill(3) on one stream and square on another");
    println!("from ready to done: {:.3} ms", ready.elapsed_time(&done)?);
    runtime::shutdown()?;
    Ok(())
}
