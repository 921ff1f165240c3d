//! What only language bindings need: not part of the documented API (hidden from the docs),
//! and free to change with the bindings (`crates/runtime-py` is its one user).
//!
//! The documented API waits in one call (`Stream::synchronize(timeout)`, `runtime::init`);
//! a binding that holds an interpreter lock must instead wait in short slices, releasing the
//! lock and looking for signals (Ctrl-C) between them. Each function here is one such slice,
//! or a conversion of an argument as a dynamic language gives it (a signed device index),
//! over behaviour that lives in the module that owns it.
//!
//! None of it is reachable from the documented API; each block below fails to compile:
//!
//! ```compile_fail
//! let _ = runtime_core::runtime::init_within; // bindings::init_within
//! ```
//! ```compile_fail
//! let _ = runtime_core::runtime::shutdown_within; // bindings::shutdown_within
//! ```
//! ```compile_fail
//! fn f(s: &runtime_core::stream::Stream) {
//!     let _ = s.wait_for(1, None); // bindings::wait_for; use Stream::synchronize
//! }
//! ```
//! ```compile_fail
//! fn f(s: &runtime_core::stream::Stream) {
//!     let _ = s.synchronize_target(); // bindings::synchronize_target
//! }
//! ```
//! ```compile_fail
//! fn f(s: &runtime_core::stream::Stream) {
//!     let _ = s.backlog_target(); // bindings::backlog_target; Stream::launch waits itself
//! }
//! ```
//! ```compile_fail
//! fn f(s: &runtime_core::stream::Stream, op: std::sync::Arc<dyn runtime_core::stream::Op>) {
//!     let _ = s.try_run_inline(&op); // internal to blocking copies
//! }
//! ```
//! ```compile_fail
//! fn f(rt: &runtime_core::runtime::Runtime) {
//!     let _ = rt.device(-1); // device indices are usize; bindings::device takes i64
//! }
//! ```
//! ```compile_fail
//! runtime_core::runtime::set_option("enableAsync", false); // RuntimeOption::Async
//! ```
//! ```compile_fail
//! let _ = runtime_core::config::ConfigBuilder {
//!     memory: Some("64MiB".into()), // Bytes::mib(64), or "64MiB".parse()?
//!     ..Default::default()
//! };
//! ```

use std::sync::Arc;
use std::time::Duration;

use crate::device::Device;
use crate::error::{DeviceError, Result};
use crate::runtime::Runtime;
use crate::stream::{Graph, Op, Stream};

/// Device `index` of `rt`, for an index as a dynamic language gives it (possibly negative).
///
/// # Errors
/// `InvalidDevice` naming `index` as given and the valid range.
pub fn device(rt: &Runtime, index: i64) -> Result<&Device> {
    match usize::try_from(index) {
        Ok(i) if i < rt.devices().len() => rt.device(i),
        _ => Err(DeviceError::InvalidDevice {
            index,
            count: rt.devices().len(),
        }
        .into()),
    }
}

/// The live stream of `rt` whose id is `id` ([`Stream::id`], the handle a dynamic language
/// shows), for wrapping a stream made elsewhere (CUDA's external streams); `device`, when
/// given, must be its device. The stream is the same one: work queued through the result is
/// queued on it.
///
/// # Errors
/// `InvalidHandle` when no live stream of `rt` has that id or it was destroyed; `ArgError`
/// (argument `device`) when it is on another device.
pub fn stream_by_id(rt: &Runtime, id: u64, device: Option<&Device>) -> Result<Stream> {
    let found = rt.devices().iter().find_map(|d| d.executor().stream(id));
    let Some(s) = found else {
        return Err(DeviceError::InvalidHandle {
            what: format!("stream handle {id}"),
            why: "no live stream of this runtime has it".into(),
        }
        .into());
    };
    s.check()?;
    if let Some(d) = device {
        if d.index() != s.device_index() {
            return Err(crate::error::arg_error(
                "device",
                format!(
                    "stream handle {id} is a stream of device {}, not of device {}",
                    s.device_index(),
                    d.index()
                ),
            ));
        }
    }
    Ok(s)
}

/// [`crate::runtime::init`] that waits at most `timeout` for a shutdown in progress
/// (`Ok(None)` when the time ran out first; call again to keep waiting). A shutdown that was
/// begun but not finished (its caller was interrupted) is finished first.
///
/// # Errors
/// As `runtime::init`.
pub fn init_within(
    builder: &crate::config::ConfigBuilder,
    timeout: Option<Duration>,
) -> Result<Option<Arc<Runtime>>> {
    crate::runtime::init_within(builder, timeout)
}

/// [`crate::runtime::shutdown`] that waits at most `timeout` for the queued work: `Ok(false)`
/// when the time ran out first; the runtime then stays closing (new work refused, queued work
/// running) and the next call (or `init`) continues the drain.
///
/// # Errors
/// As `runtime::shutdown`.
pub fn shutdown_within(timeout: Option<Duration>) -> Result<bool> {
    crate::runtime::shutdown_within(timeout)
}

/// One slice of [`crate::runtime::at_exit`]: `Ok(false)` when the time ran out first (call
/// again; the runtime stays closing).
///
/// # Errors
/// As `runtime::shutdown`.
pub fn at_exit_within(timeout: Option<Duration>) -> Result<bool> {
    crate::runtime::at_exit_within(timeout)
}

/// Whether an all-streams barrier has anything to wait for or report (one load per device):
/// when false, a binding skips releasing its lock.
///
/// # Errors
/// `NotInitialized`.
pub fn barrier_has_work() -> Result<bool> {
    crate::runtime::barrier_has_work()
}

/// One slice of [`crate::runtime::synchronize_all`]: `Ok(false)` on timeout.
///
/// # Errors
/// As `synchronize_all`, without `Timeout`.
pub fn wait_all(timeout: Option<Duration>) -> Result<bool> {
    crate::runtime::wait_all(timeout)
}

/// One slice of [`Device::synchronize`]: `Ok(false)` on timeout.
///
/// # Errors
/// As `Device::synchronize`, without `Timeout`.
pub fn device_wait(device: &Device, timeout: Option<Duration>) -> Result<bool> {
    device.wait_idle(timeout)
}

/// What [`Stream::synchronize`] checks and waits for: the count of commands submitted so far
/// (wait for it with [`wait_for`], then call [`take_error`]).
///
/// # Errors
/// `InvalidHandle` (destroyed, or after shutdown); `Capturing` while the stream captures.
pub fn synchronize_target(stream: &Stream) -> Result<u64> {
    stream.synchronize_target()
}

/// One slice of a wait until `stream` completed `target` commands: `Ok(false)` on timeout.
/// Reports no error of the stream ([`take_error`] does).
///
/// # Errors
/// `NotPermitted` from a runtime thread that would wait for itself.
pub fn wait_for(stream: &Stream, target: u64, timeout: Option<Duration>) -> Result<bool> {
    stream.wait_for(target, timeout)
}

/// Raise and clear `stream`'s pending error, as [`Stream::synchronize`] does after its wait.
///
/// # Errors
/// The stream's pending error.
pub fn take_error(stream: &Stream) -> Result<()> {
    stream.take_error()
}

/// Commands submitted to `stream` so far (a target for [`wait_for`]).
pub fn submitted(stream: &Stream) -> u64 {
    stream.submitted()
}

/// Whether `stream` completed `target` commands.
pub fn reached(stream: &Stream, target: u64) -> bool {
    stream.reached(target)
}

/// Queue `op` on `stream` without the waits [`Stream::launch`] makes (back-pressure, and the
/// whole op in synchronous mode): `Ok(true)` when queued, `Ok(false)` when captured. The
/// caller makes those waits after releasing its lock ([`backlog_target`], [`is_sync_mode`]).
///
/// # Errors
/// As [`Stream::launch`], without the op's own failure.
pub fn enqueue(stream: &Stream, op: Arc<dyn Op>) -> Result<bool> {
    stream.enqueue(op)
}

/// [`enqueue`] for a graph replay.
///
/// # Errors
/// As [`Stream::launch_graph`], without the replay's own failure.
pub fn enqueue_graph(stream: &Stream, graph: &Graph) -> Result<bool> {
    stream.enqueue_graph(graph)
}

/// Back-pressure after [`enqueue`]: the command count to wait for while `stream` holds more
/// than `MAX_QUEUED` pending commands, `None` when there is room (and on engine threads).
pub fn backlog_target(stream: &Stream) -> Option<u64> {
    stream.backlog_target()
}

/// Whether synchronous mode (`enableAsync` off) is in force for `stream`: after [`enqueue`],
/// wait for the stream and report its error.
pub fn is_sync_mode(stream: &Stream) -> bool {
    stream.is_sync_mode()
}

/// Submit `op`, which the caller will wait for (a blocking copy or memset), on `stream`,
/// ordered also after the work queued so far on `peer`: run here when the stream is idle,
/// else queued. Returns the stream to wait for ([`synchronize_target`], [`wait_for`],
/// [`take_error`]). Bindings that keep their own current stream (Python's context-local one)
/// pass it here.
///
/// # Errors
/// `Capturing` when `stream` captures; `InvalidHandle` after shutdown; `NotPermitted` from a
/// runtime thread when the stream is busy (nothing is queued then).
pub fn submit_blocking_on(
    stream: &Stream,
    peer: Option<&Stream>,
    op: Arc<dyn Op>,
) -> Result<Stream> {
    crate::device::submit_blocking_on(stream, peer, op)
}

/// Wrap every engine thread's body (a binding keeps per-thread interpreter state there).
pub use crate::stream::engine::{set_thread_wrapper, ThreadWrapper};

/// A gate that closes, waiting for the threads inside: the Python bindings' interpreter gate
/// (runtime threads enter it before they attach; the last exit hook closes it).
pub use crate::sync::gate::{Entered, EntryGate, EntryGuard};
