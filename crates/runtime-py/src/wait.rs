//! Blocking waits: release the GIL, wake every 20 ms to let Ctrl-C through, honour timeouts.

use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::errors;

const SLICE: Duration = Duration::from_millis(20);

/// Read a Python `timeout` argument (seconds, or None) as a float.
// Fix: with `timeout: Option<f64>` in the signatures, PyO3's float conversion raised
// OverflowError for ints beyond the float range (`synchronize(timeout=2**2000)`); such a
// timeout is no limit (as 1e300 is), and a negative one is a ValueError like any other.
pub fn timeout_obj(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<f64>> {
    let Some(o) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    match o.extract::<f64>() {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(o.py()) => {
            if o.gt(0)? {
                Ok(Some(f64::MAX))
            } else {
                Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "timeout must be a non-negative number of seconds or None, got {}",
                    o.repr()?
                )))
            }
        }
        Err(_) => Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "timeout must be a number of seconds or None, got {}",
            o.get_type().name()?
        ))),
    }
}

/// Convert a Python timeout in seconds (`None` = forever).
pub fn timeout_arg(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        // Fix: `Duration::from_secs_f64` panics above ~1.8e19 s (PanicException escaped to
        // Python for e.g. `synchronize(timeout=1e300)`); a timeout that large is no limit.
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Duration::try_from_secs_f64(t).ok()),
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
    // Fix: `Instant + Duration` panics on overflow; a deadline past the clock's range is none.
    let deadline = runtime_core::clock::deadline_after(limit);
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
