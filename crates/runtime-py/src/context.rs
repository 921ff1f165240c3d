//! The context-local current device and current streams: `with stream:` and
//! `with runtime.Device(i):`, and the one place that answers "which device / stream is current"
//! for every call that takes `None` for them.
//!
//! What a frame is, when it is stale and how `None` resolves to a device or stream are the
//! core's (`runtime_core::device::frame`). This file is the plumbing: one
//! `contextvars.ContextVar` whose value is a [`Frame`] (the core's frame and the `Token` of
//! the `ContextVar.set` that installed it). Each thread and each asyncio task sees its own
//! value, so interleaved tasks and threads never see each other's `with`. Entering sets a new
//! frame and keeps the `Token`; leaving resets that token, so nesting restores exactly, also
//! on exceptions. A frame that replaces the innermost `with`'s (`set_device`, `stream.use()`
//! inside it) carries that `with`'s token, so the `with`'s exit still restores what was
//! current before it.

use std::sync::{Arc, OnceLock};

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use runtime_core::device::frame::{self, Frame as CoreFrame};
use runtime_core::device::Device;
use runtime_core::stream::Stream;

use crate::errors::RtErr;

static VAR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Whether any frame was ever set in this process: until the first `with`, every lookup
/// answers from the thread's state without asking the `ContextVar` (one relaxed load).
static USED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The `ContextVar` holding the current [`Frame`] (default `None`).
fn var(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    Ok(VAR
        .get_or_try_init(py, || {
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs.set_item("default", py.None())?;
            py.import("contextvars")?
                .getattr("ContextVar")?
                .call(("runtime.current",), Some(&kwargs))
                .map(Bound::unbind)
        })?
        .bind(py))
}

/// What one `with` made current: immutable once set in the context variable.
#[pyclass(name = "_ContextFrame", module = "runtime._runtime", frozen)]
pub struct Frame {
    frame: Arc<CoreFrame>,
    /// The token of the `ContextVar.set` that installed the `with`'s frame.
    token: OnceLock<Py<PyAny>>,
}

impl Frame {
    /// `frame`, answering to the `with` whose token `of` holds.
    fn answering(py: Python<'_>, frame: Arc<CoreFrame>, of: &Frame) -> Frame {
        let token = OnceLock::new();
        if let Some(t) = of.token.get() {
            let _ = token.set(t.clone_ref(py));
        }
        Frame { frame, token }
    }
}

/// The calling context's frame, if it was made under the installed runtime.
fn frame(py: Python<'_>) -> PyResult<Option<Bound<'_, Frame>>> {
    if !USED.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(None);
    }
    let v = var(py)?.call_method0(intern!(py, "get"))?;
    let Ok(f) = v.cast_into::<Frame>() else {
        return Ok(None);
    };
    Ok(f.get().frame.is_live().then_some(f))
}

/// The current device index: the innermost `with`'s, else the thread's.
pub fn device_index(py: Python<'_>) -> PyResult<usize> {
    let f = frame(py)?;
    Ok(frame::device_index(f.as_ref().map(|f| &*f.get().frame)))
}

/// The current stream on `device`: the one a `with` made current in this context, else the
/// thread's (its default stream unless set).
pub fn stream(py: Python<'_>, device: &Device) -> PyResult<Stream> {
    let f = frame(py)?;
    Ok(frame::stream(f.as_ref().map(|f| &*f.get().frame), device).map_err(RtErr)?)
}

/// Enter a `with`: make `device` current and, when given, `stream` its current stream, for
/// this context until the matching [`exit`].
pub fn enter(py: Python<'_>, device: &Device, stream: Option<&Stream>) -> PyResult<()> {
    let cur = frame(py)?;
    let entered = frame::enter(cur.as_ref().map(|f| &f.get().frame), device, stream);
    if let (Some(restore), Some(cur)) = (entered.restore, &cur) {
        // A `use()` replaced the enclosing `with`'s frame: this `with` returns to that one.
        let parent = Bound::new(py, Frame::answering(py, restore, cur.get()))?;
        var(py)?.call_method1(intern!(py, "set"), (&parent,))?;
    }
    let f = Bound::new(
        py,
        Frame {
            frame: Arc::new(entered.frame),
            token: OnceLock::new(),
        },
    )?;
    USED.store(true, std::sync::atomic::Ordering::Relaxed);
    let token = var(py)?.call_method1(intern!(py, "set"), (&f,))?;
    let _ = f.get().token.set(token.unbind());
    Ok(())
}

/// `set_device` inside a `with`: make `device` current for the rest of the innermost `with`
/// of this context and answer true. Outside any `with`, does nothing and answers false (the
/// caller sets the thread's device).
pub fn set_device(py: Python<'_>, device: &Device) -> PyResult<bool> {
    let Some(cur) = frame(py)? else {
        return Ok(false);
    };
    let cur = cur.get();
    let f = Frame::answering(py, Arc::new(cur.frame.with_device(device)), cur);
    var(py)?.call_method1(intern!(py, "set"), (f,))?;
    Ok(true)
}

/// `stream.use()` / `set_stream(stream)`: make `stream` (of `device`) current, and `device`
/// the current device: the thread's state outside any `with`, the rest of the innermost
/// `with` inside one.
pub fn use_stream(py: Python<'_>, device: &Device, stream: &Stream) -> PyResult<()> {
    let cur = frame(py)?;
    let replaced =
        frame::use_stream(cur.as_ref().map(|f| &f.get().frame), device, stream).map_err(RtErr)?;
    if let (Some(new), Some(cur)) = (replaced, &cur) {
        let f = Frame::answering(py, Arc::new(new), cur.get());
        var(py)?.call_method1(intern!(py, "set"), (f,))?;
    }
    Ok(())
}

/// Leave a `with`: restore what the context held before the matching [`enter`].
pub fn exit(py: Python<'_>) -> PyResult<()> {
    let v = var(py)?;
    let cur = v.call_method0(intern!(py, "get"))?;
    let Ok(f) = cur.cast_into::<Frame>() else {
        return Ok(());
    };
    let Some(token) = f.get().token.get() else {
        return Ok(());
    };
    let token = token.bind(py);
    match v.call_method1(intern!(py, "reset"), (token,)) {
        Ok(_) => Ok(()),
        // Left in another context than it was entered in (the token belongs to that one):
        // restore the value from before the enter here too.
        Err(e) if e.is_instance_of::<PyValueError>(py) => {
            let old = token.getattr(intern!(py, "old_value"))?;
            let missing = py
                .import("contextvars")?
                .getattr("Token")?
                .getattr("MISSING")?;
            let old = if old.is(&missing) {
                py.None().into_bound(py)
            } else {
                old
            };
            v.call_method1(intern!(py, "set"), (old,))?;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Forget the calling context's frame (at shutdown: its streams belong to the old runtime).
/// Frames of other contexts read as absent from now on (their generation is gone) and are
/// dropped when their `with` ends.
pub fn clear(py: Python<'_>) -> PyResult<()> {
    if var(py)?.call_method0(intern!(py, "get"))?.is_none() {
        return Ok(());
    }
    var(py)?.call_method1(intern!(py, "set"), (py.None(),))?;
    Ok(())
}
