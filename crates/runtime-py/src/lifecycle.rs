//! Lifecycle and options: `init`, `shutdown`, `is_initialized`, `set_option`, `get_option`,
//! `option_names`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};
use runtime_core::config::{self, ConfigBuilder};
use runtime_core::runtime as rt;

use crate::convert::type_name;
use crate::errors::RtErr;
use crate::{stream, wait};

/// Initialise the runtime (idempotent). Keywords: `device_count`, `memory` (bytes or a size
/// string such as "16GiB"), `profile` ("ascend910" or "host"); unset ones come from
/// RUNTIME_DEVICE_COUNT, RUNTIME_DEVICE_MEMORY, RUNTIME_DEVICE_PROFILE.
#[pyfunction]
#[pyo3(signature = (device_count=None, memory=None, profile=None))]
pub fn init(
    py: Python<'_>,
    device_count: Option<&Bound<'_, PyAny>>,
    memory: Option<&Bound<'_, PyAny>>,
    profile: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let count = match device_count {
        None => None,
        Some(o) if o.is_none() => None,
        Some(o) => {
            // The core checks the range and owns its wording, for every int of any size or
            // sign alike (as it does for RUNTIME_DEVICE_COUNT).
            if o.is_instance_of::<PyBool>() {
                return Err(PyTypeError::new_err(
                    "device_count must be an int, got bool",
                ));
            }
            let text = if let Ok(n) = o.extract::<i128>() {
                n.to_string()
            } else if o.is_instance_of::<PyInt>() {
                o.str()?.to_string() // beyond i128: out of range all the same
            } else {
                // ValueError, as this binding has always raised for a non-int count.
                return Err(PyValueError::new_err(format!(
                    "device_count must be an int, got {}",
                    type_name(o)
                )));
            };
            Some(config::parse_device_count("device_count", &text).map_err(|e| RtErr(e.into()))?)
        }
    };
    let memory = match memory {
        None => None,
        Some(o) if o.is_none() => None,
        Some(o) if o.is_instance_of::<PyString>() => Some(o.extract::<String>()?),
        Some(o) if o.is_instance_of::<PyBool>() => {
            return Err(PyTypeError::new_err(
                "memory must be an int or a size string, got bool",
            ))
        }
        Some(o) => Some(
            o.extract::<i128>()
                .map_err(|_| {
                    PyTypeError::new_err(format!(
                        "memory must be an int or a size string such as \"16GiB\", got {}",
                        type_name(o)
                    ))
                })?
                .to_string(),
        ),
    };
    let profile = match profile {
        None => None,
        Some(o) if o.is_none() => None,
        Some(o) => Some(
            o.extract::<String>()
                .map_err(|_| PyTypeError::new_err("profile must be a str"))?,
        ),
    };
    let b = ConfigBuilder {
        device_count: count,
        memory,
        profile,
    };
    // Without the GIL, in slices with Ctrl-C live: an init racing a shutdown (or following
    // an interrupted one) waits for its drain, which may run Python kernels.
    wait::wait_result(
        py,
        || "init() waiting for the previous runtime's shutdown".to_string(),
        None,
        |slice| rt::init_within(&b, Some(slice)).map(|rt| rt.is_some()),
    )
}

/// Shut the runtime down: waits for queued work, invalidates every handle. A no-op when not
/// initialised.
#[pyfunction]
pub fn shutdown(py: Python<'_>) -> PyResult<()> {
    // In slices with Ctrl-C live: interrupted, the runtime stays closing (refusing new work,
    // finishing the queued work), and the next shutdown() or init() finishes the shutdown.
    wait::wait_result(
        py,
        || "shutdown() draining the queued work".to_string(),
        None,
        |slice| rt::shutdown_within(Some(slice)),
    )?;
    stream::clear_thread_state();
    Ok(())
}

/// Register the process-life hooks: at interpreter exit, and after `os.fork()` in the
/// child (the core's own `fork()` handlers do the rest, for every fork).
pub fn register_process_hooks(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let at_exit = wrap_pyfunction!(_at_exit, m)?;
    m.add_function(at_exit.clone())?;
    // Registered at the extension's import, before the package registers `shutdown`: atexit
    // runs this one after it.
    py.import("atexit")?.call_method1("register", (at_exit,))?;
    let child = wrap_pyfunction!(_forget_thread_state, m)?;
    let kw = PyDict::new(py);
    kw.set_item("after_in_child", child)?;
    py.import("os")?
        .call_method("register_at_fork", (), Some(&kw))?;
    Ok(())
}

/// At interpreter exit, after the package's `shutdown`: shut down a runtime that was
/// initialised meanwhile, and from now on make every submission wait for its work
/// (`enableAsync` off), so that a runtime initialised by a later exit handler has no work
/// running or queued when the interpreter finalises: its engine threads could not take the
/// interpreter lock back then.
#[pyfunction]
pub fn _at_exit(py: Python<'_>) -> PyResult<()> {
    shutdown(py)?;
    rt::set_option("enableAsync", false).map_err(RtErr)?;
    Ok(())
}

/// `os.register_at_fork(after_in_child=...)`: the bindings' per-thread state (current
/// streams) belongs to the parent's runtime, which the core abandoned in its own fork
/// handler; it touches no lock.
#[pyfunction]
fn _forget_thread_state() {
    stream::clear_thread_state();
}

/// Whether the runtime is initialised.
#[pyfunction]
pub fn is_initialized() -> bool {
    rt::is_initialized()
}

/// Set a runtime option: "enableMemoryReuse", "enablePipelining" or "enableAsync" (bool).
#[pyfunction]
pub fn set_option(name: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
    let name: String = name
        .extract()
        .map_err(|_| PyTypeError::new_err("name must be a str"))?;
    // Validate the name first so a bad name wins over a bad value.
    rt::get_option(&name).map_err(RtErr)?;
    let value = value.cast::<PyBool>().map_err(|_| {
        PyTypeError::new_err(format!(
            "value for option {name:?} must be a bool, got {}",
            type_name(value)
        ))
    })?;
    rt::set_option(&name, value.is_true()).map_err(RtErr)?;
    Ok(())
}

/// Read a runtime option.
#[pyfunction]
pub fn get_option(name: &Bound<'_, PyAny>) -> PyResult<bool> {
    let name: String = name
        .extract()
        .map_err(|_| PyTypeError::new_err("name must be a str"))?;
    Ok(rt::get_option(&name).map_err(RtErr)?)
}

/// The valid option names.
#[pyfunction]
pub fn option_names() -> Vec<&'static str> {
    rt::OPTION_NAMES.to_vec()
}
