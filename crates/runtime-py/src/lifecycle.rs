//! Lifecycle and options: `init`, `shutdown`, `is_initialized`, `set_option`, `get_option`,
//! `option_names`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};
use runtime_core::config::{self, parse_size, ConfigBuilder, RuntimeOption};
use runtime_core::runtime as rt;

use crate::convert::type_name;
use crate::errors::RtErr;
use crate::wait;

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
    // Sizes as text (a str, or an int's digits) go through the core's one size parser, so a
    // bad size reads as it would from RUNTIME_DEVICE_MEMORY (with the argument's name).
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
    let memory = match memory.map(|text| parse_size("memory", &text)) {
        Some(Ok(bytes)) => Some(bytes),
        Some(Err(e)) => {
            // The core checks the count and the profile (given, or from the environment)
            // before the memory: their errors are reported first, as for a bad
            // RUNTIME_DEVICE_MEMORY.
            ConfigBuilder {
                device_count: count,
                memory: Some(runtime_core::Bytes(config::MIN_DEVICE_MEMORY)),
                profile,
            }
            .build()
            .map_err(|e| RtErr(e.into()))?;
            return Err(RtErr(e.into()).into());
        }
        None => None,
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
        |slice| runtime_core::bindings::init_within(&b, Some(slice)).map(|rt| rt.is_some()),
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
        |slice| runtime_core::bindings::shutdown_within(Some(slice)),
    )?;
    clear_thread_state();
    Ok(())
}

/// Register the process-life hooks: at interpreter exit, and after `os.fork()` in the
/// child (the core's own `fork()` handlers do the rest, for every fork).
pub fn register_process_hooks(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(_shutdown_at_exit, m)?)?;
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

/// At interpreter exit, after the package's `shutdown`: the core's exit policy
/// (`runtime::at_exit`: shut down a runtime initialised meanwhile, then `enableAsync` off, so
/// that a runtime initialised by a later exit handler has no work running or queued when the
/// interpreter finalises, when its engine threads could not take the interpreter lock), in
/// GIL-released slices as `shutdown` waits.
#[pyfunction]
pub fn _at_exit(py: Python<'_>) -> PyResult<()> {
    let drained = wait::wait_result(
        py,
        || "shutdown() draining the queued work".to_string(),
        None,
        |slice| runtime_core::bindings::at_exit_within(Some(slice)),
    );
    match drained {
        // As `_shutdown_at_exit`: Ctrl-C here ends the process.
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py) => {
            let _ = end_on_ctrl_c(py);
        }
        other => other?,
    }
    clear_thread_state();
    // The last hook before finalising: runtime threads attach no more, and those attached
    // now (a completion callback, say) are waited for (`interp`), for a while.
    let limit = std::time::Duration::from_secs(5);
    if !py.detach(|| crate::interp::close(limit)) {
        let msg = format!(
            "runtime: a thread of the runtime was still running Python code {} s into \
             interpreter exit (a completion callback or allocator hook that does not return); \
             exiting without waiting for it\n",
            limit.as_secs()
        );
        let _ = py
            .import("sys")?
            .getattr("stderr")?
            .call_method1("write", (msg,));
    }
    Ok(())
}

/// The package's `atexit` shutdown (and the first half of `_at_exit`): `shutdown()`, except
/// that Ctrl-C while it waits for queued work (a kernel that never ends) ends the process
/// instead of raising into `atexit` and waiting again in the next exit hook: one line on
/// stderr says the work still queued or running is abandoned, the standard streams are
/// flushed, and the process ends as CPython ends on an unhandled Ctrl-C (killed by SIGINT).
/// The interpreter is not finalised: a Python kernel still running could not be (CPython
/// would end its thread mid-kernel, aborting the process), and nothing more is waited for.
#[pyfunction]
pub fn _shutdown_at_exit(py: Python<'_>) -> PyResult<()> {
    match shutdown(py) {
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py) => {
            let _ = end_on_ctrl_c(py);
            Ok(())
        }
        other => other,
    }
}

/// Say why, flush, and die of SIGINT with its default action (`os._exit(130)` if it is
/// blocked).
fn end_on_ctrl_c(py: Python<'_>) -> PyResult<()> {
    let sys = py.import("sys")?;
    let msg = "runtime: interrupted while waiting for queued work at exit; the work still \
               queued or running is abandoned\n";
    let err = sys.getattr("stderr")?;
    let _ = err.call_method1("write", (msg,));
    for stream in ["stdout", "stderr"] {
        if let Ok(s) = sys.getattr(stream) {
            let _ = s.call_method0("flush");
        }
    }
    let signal = py.import("signal")?;
    let sigint = signal.getattr("SIGINT")?;
    signal.call_method1("signal", (&sigint, signal.getattr("SIG_DFL")?))?;
    let os = py.import("os")?;
    os.call_method1("kill", (os.call_method0("getpid")?, &sigint))?;
    os.call_method1("_exit", (130,))?;
    Ok(())
}

/// Forget the calling thread's state in the bindings, which belongs to the runtime going
/// away (at shutdown) or to the parent's (after a fork): its `with` streams
/// (`context::clear`) and what its open group holds (`comm::forget_group`). Only drops
/// references early.
fn clear_thread_state() {
    Python::attach(|py| {
        // A failure here leaves a frame that reads as absent.
        let _ = crate::context::clear(py);
    });
    crate::comm::forget_group();
}

/// `os.register_at_fork(after_in_child=...)`: the bindings' per-thread state (current
/// streams, an open group) belongs to the parent's runtime, which the core abandoned in its
/// own fork handler; it touches no lock.
#[pyfunction]
fn _forget_thread_state() {
    clear_thread_state();
    crate::interp::forget_inside();
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
    let option: RuntimeOption = name.parse().map_err(RtErr)?;
    let value = value.cast::<PyBool>().map_err(|_| {
        PyTypeError::new_err(format!(
            "value for option {name:?} must be a bool, got {}",
            type_name(value)
        ))
    })?;
    rt::set_option(option, value.is_true());
    Ok(())
}

/// Read a runtime option.
#[pyfunction]
pub fn get_option(name: &Bound<'_, PyAny>) -> PyResult<bool> {
    let name: String = name
        .extract()
        .map_err(|_| PyTypeError::new_err("name must be a str"))?;
    let option: RuntimeOption = name.parse().map_err(RtErr)?;
    Ok(rt::get_option(option))
}

/// The valid option names.
#[pyfunction]
pub fn option_names() -> Vec<&'static str> {
    RuntimeOption::ALL.iter().map(|o| o.name()).collect()
}
