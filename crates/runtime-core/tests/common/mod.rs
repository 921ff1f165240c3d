//! Helpers shared by the integration tests (each test file is its own binary and includes
//! this module with `mod common;`).
#![allow(dead_code)] // each binary uses a different subset

use std::sync::Arc;

use runtime_core::config::ConfigBuilder;
use runtime_core::error::{ArgError, KernelFailure};
use runtime_core::kernel::{Args, DType, Kernel, KernelArg, RunContext, Tensor};
use runtime_core::memory::Buffer;
use runtime_core::runtime::{self, Runtime};
use runtime_core::stream::Stream;

/// The settings most test binaries share: 2 devices of 256 MiB.
pub fn settings() -> ConfigBuilder {
    ConfigBuilder {
        device_count: Some(2),
        memory: Some(runtime_core::Bytes::mib(256)),
        profile: None,
    }
}

/// The runtime shared by the tests of one binary (initialised by the first, never shut
/// down: `init` with the same settings is idempotent).
pub fn init() -> Arc<Runtime> {
    runtime::init(&settings()).expect("init the runtime")
}

/// Whether `r` is the error of a wait that ran out of time.
pub fn timed_out<T: std::fmt::Debug>(r: runtime_core::Result<T>) -> bool {
    matches!(
        r,
        Err(runtime_core::Error::Stream(
            runtime_core::error::StreamError::Timeout { .. }
        ))
    )
}

/// SplitMix64: a small seeded PRNG, so randomized tests need no extra dependency.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A size from `min` to `max` bytes, log-uniformly distributed.
    pub fn log_size(&mut self, min: u64, max: u64) -> u64 {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        let (lo, hi) = ((min as f64).ln(), (max as f64).ln());
        ((lo + u * (hi - lo)).exp() as u64).clamp(min, max)
    }
}

/// Writes byte `value` over its tensor in two halves with a pause between them: a reader
/// that does not wait for it sees a half-written buffer.
pub struct Halves;

impl Kernel for Halves {
    fn name(&self) -> &str {
        "test_halves"
    }
    fn check(&self, args: &[KernelArg]) -> Result<(), ArgError> {
        match args {
            [KernelArg::Tensor(_), KernelArg::Int(_)] => Ok(()),
            _ => Err(ArgError::new("args", "tensor, value")),
        }
    }
    fn run(&self, args: &Args, _: &RunContext) -> Result<(), KernelFailure> {
        let (KernelArg::Tensor(t), KernelArg::Int(v)) = (&args[0], &args[1]) else {
            unreachable!("checked")
        };
        let half = t.nbytes() / 2;
        let fill = |off: u64| {
            t.buffer()
                .write(t.offset() + off, &vec![*v as u8; half as usize])
                .map_err(|e| KernelFailure::new("test_halves", e.to_string()))
        };
        fill(0)?;
        std::thread::sleep(std::time::Duration::from_micros(200));
        fill(half)
    }
}

/// Queue [`Halves`] on `s`, writing byte `value` over `len` bytes of `buf` from `offset`.
pub fn launch_halves(s: &Stream, buf: &Buffer, offset: u64, len: usize, value: i64) {
    let t = Tensor::new(buf.clone(), offset, DType::U8, vec![len]).unwrap();
    runtime_core::kernel::launch(
        s,
        Arc::new(Halves),
        vec![KernelArg::Tensor(t), KernelArg::Int(value)],
    )
    .unwrap();
}

/// Whether every byte equals the first.
pub fn uniform(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == bytes[0])
}
