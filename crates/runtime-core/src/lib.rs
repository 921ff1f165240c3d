//! `runtime-core`: a virtual accelerator runtime in the mould of the CUDA runtime and the
//! Ascend CANN runtime, with devices backed by host memory and host threads.
//!
//! | layer | module | owns |
//! |---|---|---|
//! | configuration | [`config`] | device count, memory per device, profile (args + env) |
//! | lifecycle | [`runtime`] | the devices between `init` and `shutdown`; options |
//! | devices | [`device`] | properties, profiles, current device per thread |
//! | memory | [`memory`] | buddy + slab allocator over a lazily committed arena; buffers |
//! | execution | [`stream`] | streams, engines (worker threads), copies, capture/replay |
//! | events | [`event`] | records, waits, timing on one shared monotonic clock |
//! | kernels | [`kernel`] | the `Kernel` trait, the registry, built-in native kernels |
//! | tracing | [`trace`] | timeline records of commands, events and allocations |
//!
//! ```
//! use runtime_core::{config::ConfigBuilder, kernel, runtime, stream::Stream, event::Event};
//! let rt = runtime::init(&ConfigBuilder { device_count: Some(2), memory: Some("64MiB".into()), ..Default::default() })?;
//! let dev = rt.device(0)?.clone();
//! let buf = dev.memory().allocate(16 * 4)?;
//! let s = Stream::new(&dev, 0)?;
//! let (start, end) = (Event::new(true, false), Event::new(true, false));
//! s.record(&start)?;
//! let x = kernel::Tensor::new(buf.clone(), 0, kernel::DType::F32, vec![16])?;
//! kernel::launch(&s, kernel::find("fill")?, vec![kernel::KernelArg::Tensor(x), kernel::KernelArg::Float(2.5)])?;
//! s.record(&end)?;
//! s.synchronize(None)?;
//! let mut out = [0u8; 4];
//! buf.read(60, &mut out)?;
//! assert_eq!(f32::from_ne_bytes(out), 2.5);
//! assert!(start.elapsed_time(&end)? >= 0.0);
//! # runtime::shutdown()?;
//! # Ok::<(), runtime_core::error::Error>(())
//! ```
//!
//! Soundness: no safe public function can cause undefined behaviour, whatever its arguments.
//! Device memory is reached only through [`memory::Buffer`], whose methods check every range
//! against the allocation; kernels see it only through [`kernel::Tensor`] (checked when built,
//! fields private) and run only with [`kernel::Args`] that their own check accepted. Unsafe
//! code lives in `memory::host` (the mapping and raw copies), [`memory`] (typed views),
//! [`kernel`] (typed element copies), [`kernel::builtin`] (the gemm call) and [`stream::copy`]
//! (host memory behind raw pointers); each block carries a `SAFETY:` comment.
#![warn(missing_docs)]

pub mod clock;
pub mod config;
pub mod device;
pub mod error;
pub mod event;
pub mod generation;
pub mod kernel;
pub mod memory;
pub mod runtime;
pub mod stream;
mod sync;

#[cfg(all(test, loom))]
mod loom_tests;
pub mod trace;

pub use error::{Error, Result};
