//! Scoped current device and streams: what a scope (a `with stream:` or `with Device(i):`
//! block of the Python package, an asynchronous task) makes current, above the calling
//! thread's state ([`super::current_device_index`], [`super::current_stream`]).
//!
//! A [`Frame`] is immutable: the device the innermost scope made current, the stream it made
//! current per device, and the runtime generation it was made under. A binding keeps the
//! innermost frame of each scope where its language keeps scoped values (Python: one
//! `ContextVar`, set on entry and reset by its token on exit, so nesting restores exactly)
//! and passes it to [`device_index`] and [`stream`], which answer "which device / stream is
//! current" for every call that is given none. A frame made under a runtime that has since
//! been shut down is stale and reads as absent, as the thread's state does after a reset.
//!
//! Inside a scope, [`Frame::with_device`] (`set_device`) changes the device for the rest of
//! that scope, and [`use_stream`] (CuPy's `stream.use()`, torch's `set_stream`) replaces the
//! scope's frame by one that remembers the scope's own as its parent: a scope entered
//! afterwards builds on, and returns to, that parent, and the enclosing scope's exit restores
//! what was current before it (CuPy's `test_mix_use_context`). Outside any scope
//! [`use_stream`] sets the calling thread's state.

use std::sync::Arc;

use super::{current_device_index, current_stream, set_current_device_index, Device};
use crate::error::Result;
use crate::stream::Stream;

/// What one scope made current (see the module documentation).
#[derive(Debug, Clone)]
pub struct Frame {
    generation: u64,
    device: usize,
    /// The current stream per device index (devices without one use the thread's).
    streams: Arc<[(usize, Stream)]>,
    /// For a frame made by [`use_stream`] inside a scope: the frame that scope installed.
    parent: Option<Arc<Frame>>,
}

/// What entering a scope installs ([`enter`]).
#[derive(Debug)]
pub struct Entered {
    /// The frame of the new scope.
    pub frame: Frame,
    /// When the current frame was made by [`use_stream`] inside its scope: that scope's own
    /// frame, which the binding installs again first, so that leaving the new scope returns
    /// to it (not to the replacement).
    pub restore: Option<Arc<Frame>>,
}

impl Frame {
    /// Whether the frame was made under the installed runtime: a stale frame (from before a
    /// `shutdown`) reads as absent everywhere in this module.
    pub fn is_live(&self) -> bool {
        self.generation == crate::generation::live()
    }

    /// The device the scope made current.
    pub fn device_index(&self) -> usize {
        self.device
    }

    /// The frame with `device` current for the rest of its scope, its streams unchanged
    /// (`set_device` inside a `with`: the scope's exit restores what was current before it,
    /// as torch and CuPy restore the device saved on entry).
    pub fn with_device(&self, device: &Device) -> Frame {
        Frame {
            device: device.index(),
            ..self.clone()
        }
    }

    /// This frame's streams with `stream` current on `device`.
    fn streams_with(&self, device: &Device, stream: &Stream) -> Arc<[(usize, Stream)]> {
        self.streams
            .iter()
            .filter(|(i, _)| *i != device.index())
            .cloned()
            .chain([(device.index(), stream.clone())])
            .collect()
    }
}

/// `frame` if it is live.
fn live(frame: Option<&Frame>) -> Option<&Frame> {
    frame.filter(|f| f.is_live())
}

/// The current device index: the innermost scope's (`frame`, when live), else the calling
/// thread's.
pub fn device_index(frame: Option<&Frame>) -> usize {
    live(frame).map_or_else(current_device_index, |f| f.device)
}

/// The current stream on `device`: the one the innermost scope (`frame`, when live) made
/// current on it, else the calling thread's (its default stream unless set). A scope's stream
/// that was destroyed, or that belongs to another runtime, reads as the device's default
/// stream.
///
/// # Errors
/// `InvalidHandle` when `device` belongs to a runtime that was shut down.
pub fn stream(frame: Option<&Frame>, device: &Device) -> Result<Stream> {
    if let Some(f) = live(frame) {
        if let Some((_, s)) = f.streams.iter().find(|(i, _)| *i == device.index()) {
            if Arc::ptr_eq(s.executor(), device.executor()) && !s.is_destroyed() {
                return Ok(s.clone());
            }
            return device.default_stream();
        }
    }
    current_stream(device)
}

/// Enter a scope that makes `device` current and, when given, `stream` its current stream,
/// inside the scope whose frame is `current` (none, or stale: outside any scope). The new
/// frame keeps the streams the enclosing scope made current on other devices.
pub fn enter(current: Option<&Arc<Frame>>, device: &Device, stream: Option<&Stream>) -> Entered {
    let current = current.filter(|f| f.is_live());
    // A `use_stream` replaced the enclosing scope's frame: this scope builds on, and returns
    // to, the scope's own.
    let restore = current.and_then(|f| f.parent.clone());
    let base = restore.as_deref().or(current.map(|f| &**f));
    let streams: Arc<[(usize, Stream)]> = match (stream, base) {
        (None, Some(b)) => b.streams.clone(),
        (None, None) => Arc::from([]),
        (Some(s), Some(b)) => b.streams_with(device, s),
        (Some(s), None) => Arc::from([(device.index(), s.clone())]),
    };
    Entered {
        frame: Frame {
            generation: crate::generation::live(),
            device: device.index(),
            streams,
            parent: None,
        },
        restore,
    }
}

/// Make `stream` (of `device`) current, and `device` the current device (CuPy's
/// `stream.use()`, torch's `set_stream`). Outside any scope (`current` none or stale) this
/// sets the calling thread's state and returns `None`; inside one it returns the frame that
/// replaces the scope's for the rest of it (remembering the scope's own as its parent, see
/// the module documentation).
///
/// # Errors
/// `InvalidHandle` when `device` belongs to a runtime that was shut down (nothing changes).
pub fn use_stream(
    current: Option<&Arc<Frame>>,
    device: &Device,
    stream: &Stream,
) -> Result<Option<Frame>> {
    let Some(cur) = current.filter(|f| f.is_live()) else {
        device.check_alive()?;
        super::set_current_stream(device, Some(stream.clone()));
        set_current_device_index(device.index());
        return Ok(None);
    };
    let parent = cur.parent.clone().unwrap_or_else(|| cur.clone());
    Ok(Some(Frame {
        generation: cur.generation,
        device: device.index(),
        streams: cur.streams_with(device, stream),
        parent: Some(parent),
    }))
}
