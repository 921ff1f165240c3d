//! Timeline tracing: start and stop the core's trace log and hand the records to Python.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use runtime_core::trace::{self, Phase};

/// Start recording a timeline (clears any previous records).
#[pyfunction]
pub fn trace_start() {
    trace::start();
}

/// Stop recording and return the records as dicts (times in ns of the runtime clock).
#[pyfunction]
pub fn trace_stop(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    let records = trace::stop();
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        let d = PyDict::new(py);
        d.set_item("name", r.name)?;
        d.set_item("device", r.device)?;
        d.set_item("stream", r.stream)?;
        d.set_item("ts_ns", r.ts_ns)?;
        match r.phase {
            Phase::Enqueue => d.set_item("phase", "enqueue")?,
            Phase::Record => d.set_item("phase", "record")?,
            Phase::Run { end_ns, engine } => {
                d.set_item("phase", "run")?;
                d.set_item("end_ns", end_ns)?;
                d.set_item("engine", engine)?;
            }
            Phase::Alloc { bytes, allocated } => {
                d.set_item("phase", "alloc")?;
                d.set_item("bytes", bytes)?;
                d.set_item("allocated", allocated)?;
            }
            Phase::Advise { bytes } => {
                d.set_item("phase", "advise")?;
                d.set_item("bytes", bytes)?;
            }
            Phase::Free { bytes, allocated } => {
                d.set_item("phase", "free")?;
                d.set_item("bytes", bytes)?;
                d.set_item("allocated", allocated)?;
            }
        }
        out.push(d);
    }
    Ok(out)
}

/// Whether a trace is being recorded.
#[pyfunction]
pub fn trace_enabled() -> bool {
    trace::enabled()
}
