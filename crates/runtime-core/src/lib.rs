//! `runtime-core`: a virtual accelerator runtime in the mould of the CUDA runtime and the
//! Ascend CANN runtime, with devices backed by host memory and host threads.
//!
//! | layer (bottom to top) | module | owns |
//! |---|---|---|
//! | time | [`clock`] | the shared monotonic clock, deadlines |
//! | host probe | [`probe`] | what one hand-off between two threads costs on this host now |
//! | sizes | [`size`] | [`Bytes`]: the size type of the API, its parser and printing |
//! | lifecycle epoch | `generation` | which runtime is live; handles compare against it |
//! | errors | [`error`] | one `thiserror` enum per domain, [`Error`] over them |
//! | tracing | [`trace`] | timeline records of commands, events and allocations |
//! | configuration | [`config`] | init settings, process options, every environment variable |
//! | memory | [`memory`] | the allocator of one device and its reference-counted buffers |
//! | events | [`event`] | records, waits, timing on one shared monotonic clock |
//! | interprocess events | [`ipc_event`] | events another process waits on (exported page, watcher) |
//! | execution | [`stream`] | streams, engines, executors, copies, capture and replay |
//! | devices | [`device`] | a device's memory, executor and default stream; current device/stream |
//! | kernels | [`kernel`] | the `Kernel` trait, checked arguments, registry, built-ins |
//! | collectives | [`comm`] | communicators over devices of this process or across processes (a byte transport); stream-ordered collectives |
//! | lifecycle | [`runtime`] | the devices between `init` and `shutdown`; barriers |
//!
//! (`sync`, crate-private, holds the lock and atomic types that loom model-checks.)
//!
//! Soundness: no safe public function can cause undefined behaviour, whatever its arguments
//! or the threads calling it. Device memory is reached only through [`memory::Buffer`], whose
//! methods check every range against the allocation and are ordered by the executor
//! ([`memory::access`]: a host read or write waits for the stream work queued on the
//! allocation and never overlaps a running op or another host copy; unordered access is an
//! `unsafe fn …_unsynchronized`); kernels see it only through [`kernel::Tensor`] (checked
//! when built, fields private) and run only with [`kernel::Args`] that their own check
//! accepted (they hold that kernel). User code the core calls (kernels, host functions,
//! completion callbacks, plugged allocators) runs under `catch_unwind` and never under a
//! runtime lock; `fork()` is handled by the core's own `pthread_atfork` handlers. Every
//! `unsafe` block is listed, with its argument, in ARCHITECTURE.md's inventory (checked by
//! `tests/unsafe_inventory.rs`) and carries a `SAFETY:` comment.
//!
//! ---
//!
#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

#[doc(hidden)]
pub mod bindings;
pub mod clock;
pub mod comm;
pub mod config;
pub mod device;
pub mod error;
pub mod event;
pub(crate) mod generation;
pub mod ipc_event;
pub mod kernel;
pub mod memory;
pub mod probe;
pub mod runtime;
pub mod size;
pub mod stream;
mod sync;

#[cfg(all(test, loom))]
mod loom_tests;
pub mod trace;

pub use error::{Error, Result};
pub use size::Bytes;
