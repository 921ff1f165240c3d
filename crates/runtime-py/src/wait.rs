//! GIL-aware submission and waiting: every blocking wait releases the GIL, wakes every 20 ms to
//! let Ctrl-C through and honours its timeout; submission waits (GIL released) when a stream's
//! backlog is full, and blocking copies run inline or queued on the current stream.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use runtime_core::bindings;
use runtime_core::runtime as rt;
use runtime_core::stream::{Op, Stream};

use crate::context;
use crate::convert::timeout_arg;
use crate::errors::{self, RtErr};

const SLICE: Duration = Duration::from_millis(20);

/// The one slice loop of the bindings: call `poll(slice)` without the GIL until it returns
/// true (`Ok(true)`), checking for signals between slices; `Ok(false)` once `limit` has
/// passed (`None`: no limit, as is one past the clock's range).
pub fn in_slices<F>(py: Python<'_>, limit: Option<Duration>, mut poll: F) -> PyResult<bool>
where
    F: FnMut(Duration) -> bool + Send,
{
    let deadline = limit.and_then(|t| Instant::now().checked_add(t));
    loop {
        let slice = match deadline {
            None => SLICE,
            Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
        };
        if py.detach(|| poll(slice)) {
            return Ok(true);
        }
        py.check_signals()?;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
    }
}

/// Call `poll(slice)` without the GIL until it returns true, checking for signals between
/// slices. On timeout raises `WaitTimeoutError` naming `what()` (built only then).
pub fn wait<F, W>(py: Python<'_>, what: W, timeout: Option<f64>, poll: F) -> PyResult<()>
where
    F: FnMut(Duration) -> bool + Send,
    W: Fn() -> String,
{
    if in_slices(py, timeout_arg(timeout)?, poll)? {
        Ok(())
    } else {
        Err(errors::timeout(py, &what(), timeout.unwrap_or_default()))
    }
}

/// [`wait`] for a core wait that can fail: `poll(slice)` answers `Ok(true)` when done,
/// `Ok(false)` when the slice ran out; its error is raised.
pub fn wait_result<F, W>(py: Python<'_>, what: W, timeout: Option<f64>, mut poll: F) -> PyResult<()>
where
    F: FnMut(Duration) -> runtime_core::error::Result<bool> + Send,
    W: Fn() -> String,
{
    let mut res = Ok(true);
    wait(py, what, timeout, |slice| {
        res = poll(slice);
        !matches!(res, Ok(false))
    })?;
    res.map(|_| ()).map_err(|e| RtErr(e).into())
}

/// Wait for `s` with the GIL released and Ctrl-C live, then raise its pending error.
pub fn sync_stream(py: Python<'_>, s: &Stream, timeout: Option<f64>) -> PyResult<()> {
    timeout_arg(timeout)?;
    let target = bindings::synchronize_target(s).map_err(RtErr)?;
    reached(py, s, target, timeout)?;
    bindings::take_error(s).map_err(RtErr)?;
    Ok(())
}

/// Wait (GIL released, Ctrl-C live, `timeout` honoured) until `s` has run everything
/// submitted so far. Does not report errors.
pub fn stream_reached(py: Python<'_>, s: &Stream, timeout: Option<f64>) -> PyResult<()> {
    reached(py, s, bindings::submitted(s), timeout)
}

fn reached(py: Python<'_>, s: &Stream, target: u64, timeout: Option<f64>) -> PyResult<()> {
    if bindings::reached(s, target) {
        return Ok(());
    }
    wait_result(
        py,
        || format!("{s:?}"),
        timeout,
        |slice| bindings::wait_for(s, target, Some(slice)),
    )
}

/// Queue `op` on `s`, then [`after_enqueue`].
pub fn submit(py: Python<'_>, s: &Stream, op: Arc<dyn Op>) -> PyResult<()> {
    if bindings::enqueue(s, op).map_err(RtErr)? {
        after_enqueue(py, s)?;
    }
    Ok(())
}

/// After a launch was queued: in synchronous mode wait for it and raise its error; otherwise
/// wait (GIL released, Ctrl-C live) only while the stream's backlog is full
/// (`bindings::backlog_target`). Queued Python kernels need the GIL, so this wait must not
/// hold it.
pub fn after_enqueue(py: Python<'_>, s: &Stream) -> PyResult<()> {
    if bindings::is_sync_mode(s) {
        return sync_stream(py, s, None);
    }
    if let Some(target) = bindings::backlog_target(s) {
        wait_result(
            py,
            || format!("{s:?}"),
            None,
            |slice| bindings::wait_for(s, target, Some(slice)),
        )?;
    }
    Ok(())
}

/// Queue `op` on `s` and wait (GIL released, Ctrl-C live) until the stream has run it, then
/// raise the stream's pending error: a copy into pageable host memory is complete when its
/// call returns (CUDA's rule; `runtime_core::stream::copy::completes_before_return`). While
/// `s` captures, the copy is only recorded: nothing runs, nothing is waited for.
pub fn submit_and_finish(py: Python<'_>, s: &Stream, op: Arc<dyn Op>) -> PyResult<()> {
    submit(py, s, op)?;
    if s.is_capturing() {
        return Ok(());
    }
    reached(py, s, bindings::submitted(s), None)?;
    bindings::take_error(s).map_err(RtErr)?;
    Ok(())
}

/// Run a copy op: queued on `stream` (asynchronous) or, with no stream, submitted by the core
/// as a blocking copy on `device`'s current stream as the calling context sees it (ordered
/// after `peer`'s too; see `runtime_core::bindings::submit_blocking_on`) and waited for here
/// with the GIL released.
pub fn submit_copy(
    py: Python<'_>,
    op: Arc<dyn Op>,
    stream: Option<Stream>,
    device: usize,
    peer: Option<usize>,
) -> PyResult<()> {
    if let Some(s) = stream {
        return submit(py, &s, op);
    }
    let r = rt::get().map_err(RtErr)?;
    let s = context::stream(py, r.device(device).map_err(RtErr)?)?;
    let ps = match peer {
        Some(p) => Some(context::stream(py, r.device(p).map_err(RtErr)?)?),
        None => None,
    };
    let s = py
        .detach(|| bindings::submit_blocking_on(&s, ps.as_ref(), op))
        .map_err(RtErr)?;
    sync_stream(py, &s, None)
}
