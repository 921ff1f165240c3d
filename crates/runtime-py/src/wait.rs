//! Blocking waits: release the GIL, wake every 20 ms to let Ctrl-C through, honour timeouts.

use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::errors;

const SLICE: Duration = Duration::from_millis(20);

/// Convert a Python timeout in seconds (`None` = forever).
pub fn timeout_arg(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(t) => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "timeout must be a non-negative number of seconds or None, got {t}"
        ))),
    }
}

/// Call `poll(slice)` without the GIL until it returns true, checking for signals between
/// slices. On timeout raises `WaitTimeoutError` naming `what()` (built only then).
pub fn wait<F, W>(py: Python<'_>, what: W, timeout: Option<f64>, mut poll: F) -> PyResult<()>
where
    F: FnMut(Duration) -> bool + Send,
    W: Fn() -> String,
{
    let limit = timeout_arg(timeout)?;
    let deadline = limit.map(|t| Instant::now() + t);
    loop {
        let slice = match deadline {
            None => SLICE,
            Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
        };
        if py.detach(|| poll(slice)) {
            return Ok(());
        }
        py.check_signals()?;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(errors::timeout(py, &what(), timeout.unwrap_or_default()));
        }
    }
}
