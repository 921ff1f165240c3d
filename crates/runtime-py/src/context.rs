//! The context-local current device and current streams: `with stream:` and
//! `with runtime.Device(i):`, and the one place that answers "which device / stream is current"
//! for every call that takes `None` for them.
//!
//! The state is one `contextvars.ContextVar` whose value is an immutable [`Frame`]: the device
//! the innermost `with` made current, the streams made current per device, and the runtime
//! generation it was made under. Each thread and each asyncio task sees its own value, so
//! interleaved tasks and threads never see each other's `with`. Entering sets a new frame
//! (built from the one it replaces) and keeps the `Token`; leaving resets that token, so
//! nesting restores exactly, also on exceptions.
//!
//! Readers take the frame first and fall back to the thread's state in the core
//! (`runtime.set_device`, default device 0, default streams): inside a `with`, the `with`
//! wins. `set_device` inside a `with` changes the device for the rest of that `with` only
//! (see [`set_device`]).
//!
//! `stream.use()` / `set_stream(stream)` (CuPy, torch) outside any `with` set the thread's
//! current stream and device in the core. Inside a `with` they replace the innermost `with`'s
//! frame, remembering it as the replacement's `parent`: a nested `with` entered afterwards
//! restores that parent on exit (what the enclosing `with` made current), and the enclosing
//! `with`'s own exit restores what was current before it, as CuPy's `test_mix_use_context`
//! requires. A frame made under a runtime that has since been shut down reads as absent, as the
//! core's thread state does after a reset.

use std::sync::{Arc, OnceLock};

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use runtime_core::device::Device;
use runtime_core::runtime as rt;
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
    generation: u64,
    device: usize,
    /// The current stream per device index (devices without one use the thread's).
    streams: Arc<[(usize, Stream)]>,
    /// The token of the `ContextVar.set` that installed this frame.
    token: OnceLock<Py<PyAny>>,
    /// For a frame made by `use()` inside a `with`: the frame that `with` installed.
    parent: Option<Py<Frame>>,
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
    Ok((f.get().generation == runtime_core::generation::live()).then_some(f))
}

/// The current device index: the innermost `with`'s, else the thread's.
pub fn device_index(py: Python<'_>) -> PyResult<usize> {
    Ok(match frame(py)? {
        Some(f) => f.get().device,
        None => runtime_core::device::current_device_index(),
    })
}

/// The current stream on `device`: the one a `with` made current in this context, else the
/// thread's (its default stream unless set). A stream of this context that was destroyed
/// reads as the device's default stream.
pub fn stream(py: Python<'_>, device: &Device) -> PyResult<Stream> {
    if let Some(f) = frame(py)? {
        let found = f.get().streams.iter().find(|(i, _)| *i == device.index());
        if let Some((_, s)) = found {
            if runtime_core::bindings::stream_is_on(s, device) && !s.is_destroyed() {
                return Ok(s.clone());
            }
            return Ok(device.default_stream().map_err(RtErr)?);
        }
    }
    Ok(runtime_core::device::current_stream(device).map_err(RtErr)?)
}

/// Enter a `with`: make `device` current and, when given, `stream` its current stream, for
/// this context until the matching [`exit`].
pub fn enter(py: Python<'_>, device: &Device, stream: Option<&Stream>) -> PyResult<()> {
    let generation = runtime_core::generation::live();
    let mut prev = frame(py)?;
    if let Some(parent) = prev.as_ref().and_then(|f| f.get().parent.as_ref()) {
        // A `use()` replaced the enclosing `with`'s frame: this `with` returns to that one.
        let parent = parent.bind(py).clone();
        var(py)?.call_method1(intern!(py, "set"), (&parent,))?;
        prev = Some(parent);
    }
    let inherited = prev.as_ref().map(|f| f.get().streams.clone());
    let streams: Arc<[(usize, Stream)]> = match (stream, inherited) {
        (None, Some(s)) => s,
        (None, None) => Arc::from([]),
        (Some(s), inherited) => inherited
            .iter()
            .flat_map(|v| v.iter())
            .filter(|(i, _)| *i != device.index())
            .cloned()
            .chain([(device.index(), s.clone())])
            .collect(),
    };
    let f = Bound::new(
        py,
        Frame {
            generation,
            device: device.index(),
            streams,
            token: OnceLock::new(),
            parent: None,
        },
    )?;
    USED.store(true, std::sync::atomic::Ordering::Relaxed);
    let token = var(py)?.call_method1(intern!(py, "set"), (&f,))?;
    let _ = f.get().token.set(token.unbind());
    Ok(())
}

/// `set_device` inside a `with`: make `device` current for the rest of the innermost `with`
/// of this context (its streams stay), and answer true; the `with`'s exit restores what was
/// current before it, as torch and CuPy restore the device saved on entry. Outside any `with`,
/// does nothing and answers false (the caller sets the thread's device).
pub fn set_device(py: Python<'_>, device: &Device) -> PyResult<bool> {
    let Some(cur) = frame(py)? else {
        return Ok(false);
    };
    let cur = cur.get();
    let token = OnceLock::new();
    if let Some(t) = cur.token.get() {
        let _ = token.set(t.clone_ref(py));
    }
    let f = Frame {
        generation: cur.generation,
        device: device.index(),
        streams: cur.streams.clone(),
        // The replacement answers to the same `with`: its exit resets the entry's token.
        token,
        parent: cur.parent.as_ref().map(|p| p.clone_ref(py)),
    };
    USED.store(true, std::sync::atomic::Ordering::Relaxed);
    var(py)?.call_method1(intern!(py, "set"), (f,))?;
    Ok(true)
}

/// `stream.use()` / `set_stream(stream)`: make `stream` (of `device`) current, and `device`
/// the current device. Outside any `with` this sets the thread's state in the core; inside
/// one it replaces the innermost `with`'s frame (see the module documentation).
pub fn use_stream(py: Python<'_>, device: &Device, stream: &Stream) -> PyResult<()> {
    let Some(cur) = frame(py)? else {
        runtime_core::device::set_current_stream(device, Some(stream.clone()));
        rt::set_device(device.index()).map_err(RtErr)?;
        return Ok(());
    };
    let parent = match &cur.get().parent {
        Some(p) => p.clone_ref(py),
        None => cur.clone().unbind(),
    };
    let cur = cur.get();
    let token = OnceLock::new();
    if let Some(t) = cur.token.get() {
        let _ = token.set(t.clone_ref(py));
    }
    let streams: Arc<[(usize, Stream)]> = cur
        .streams
        .iter()
        .filter(|(i, _)| *i != device.index())
        .cloned()
        .chain([(device.index(), stream.clone())])
        .collect();
    let f = Frame {
        generation: cur.generation,
        device: device.index(),
        streams,
        token,
        parent: Some(parent),
    };
    var(py)?.call_method1(intern!(py, "set"), (f,))?;
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
