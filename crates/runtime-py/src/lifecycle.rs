//! Lifecycle and options: `init`, `shutdown`, `is_initialized`, `set_option`, `get_option`,
//! `option_names`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyString};
use runtime_core::config::ConfigBuilder;
use runtime_core::runtime as rt;

use crate::convert::type_name;
use crate::errors::RtErr;
use crate::stream;

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
            if o.is_instance_of::<PyBool>() {
                return Err(PyTypeError::new_err(
                    "device_count must be an int, got bool",
                ));
            }
            Some(o.extract::<u64>().map_err(|_| {
                PyValueError::new_err(format!(
                    "device_count must be a positive int, got {}",
                    o.repr().map(|r| r.to_string()).unwrap_or_default()
                ))
            })?)
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
    // Without the GIL: an init racing a shutdown waits for its drain, which may run Python
    // kernels.
    py.detach(|| rt::init(&b)).map_err(RtErr)?;
    Ok(())
}

/// Shut the runtime down: waits for queued work, invalidates every handle. A no-op when not
/// initialised.
#[pyfunction]
pub fn shutdown(py: Python<'_>) -> PyResult<()> {
    py.detach(rt::shutdown).map_err(RtErr)?;
    stream::clear_thread_state();
    Ok(())
}

/// Whether the runtime is initialised.
#[pyfunction]
pub fn is_initialized() -> bool {
    rt::is_initialized()
}

/// Number of devices.
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
