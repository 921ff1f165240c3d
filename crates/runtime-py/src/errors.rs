//! The Python exception hierarchy and the one place where core errors become Python errors.
//!
//! ```text
//! RuntimeError (builtin)
//! └── runtime.Error
//!     ├── NotInitializedError
//!     ├── InvalidDeviceError        (also ValueError)
//!     ├── OutOfMemoryError          (also MemoryError)
//!     ├── InvalidHandleError
//!     ├── KernelError               (.kernel, .stream, .block, .code; __cause__ = the kernel's exception)
//!     ├── NotReadyError
//!     ├── InvalidOperationError
//!     └── WaitTimeoutError          (also TimeoutError)
//! ```
//! Bad arguments are plain `ValueError` / `TypeError` naming the argument.

use std::sync::Arc;

use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use runtime_core::error::{ConfigError, DeviceError, Error, MemoryError, StreamError};

/// The exception classes, created once at module import.
pub struct Classes {
    pub base: Py<PyType>,
    pub not_initialized: Py<PyType>,
    pub invalid_device: Py<PyType>,
    pub out_of_memory: Py<PyType>,
    pub invalid_handle: Py<PyType>,
    pub kernel: Py<PyType>,
    pub not_ready: Py<PyType>,
    pub invalid_operation: Py<PyType>,
    pub timeout: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

fn make(
    py: Python<'_>,
    name: &str,
    doc: &str,
    bases: Vec<Bound<'_, PyAny>>,
) -> PyResult<Py<PyType>> {
    let ns = PyDict::new(py);
    ns.set_item("__module__", "runtime")?;
    ns.set_item("__doc__", doc)?;
    let ty = py
        .get_type::<PyType>()
        .call1((name, PyTuple::new(py, bases)?, ns))?;
    Ok(ty.cast_into::<PyType>()?.unbind())
}

/// Build the classes (idempotent) and add them to `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let c = CLASSES.get_or_try_init(py, || -> PyResult<Classes> {
        let base = make(py, "Error", "Base class of every error the runtime raises (a RuntimeError).", vec![py.get_type::<PyRuntimeError>().into_any()])?;
        let b = || base.bind(py).clone().into_any();
        Ok(Classes {
            not_initialized: make(py, "NotInitializedError", "A call was made before runtime.init() or after runtime.shutdown().", vec![b()])?,
            invalid_device: make(py, "InvalidDeviceError", "A device index outside the valid range (also a ValueError).", vec![b(), py.get_type::<PyValueError>().into_any()])?,
            out_of_memory: make(py, "OutOfMemoryError", "A device allocation failed; the message gives requested, free, largest free block, fragmentation and total bytes (also a MemoryError).", vec![b(), py.get_type::<PyMemoryError>().into_any()])?,
            invalid_handle: make(py, "InvalidHandleError", "A freed buffer, destroyed stream or event, or a handle from before a shutdown.", vec![b()])?,
            kernel: make(py, "KernelError", "A kernel, copy or host function failed on a stream; raised at the next synchronisation. Attributes: kernel, stream, block (the failing block of a multi-block launch, else None), code (a C ABI kernel's non-zero return, else None); __cause__ is the original exception.", vec![b()])?,
            not_ready: make(py, "NotReadyError", "The event has not completed yet (e.g. elapsed_time before synchronize).", vec![b()])?,
            invalid_operation: make(py, "InvalidOperationError", "An operation not allowed in the object's current state (e.g. end_capture without begin_capture).", vec![b()])?,
            timeout: make(py, "WaitTimeoutError", "A wait with a timeout ran out of time (also a TimeoutError).", vec![b(), py.get_type::<PyTimeoutError>().into_any()])?,
            base,
        })
    })?;
    for (name, ty) in [
        ("Error", &c.base),
        ("NotInitializedError", &c.not_initialized),
        ("InvalidDeviceError", &c.invalid_device),
        ("OutOfMemoryError", &c.out_of_memory),
        ("InvalidHandleError", &c.invalid_handle),
        ("KernelError", &c.kernel),
        ("NotReadyError", &c.not_ready),
        ("InvalidOperationError", &c.invalid_operation),
        ("WaitTimeoutError", &c.timeout),
    ] {
        m.add(name, ty.bind(py))?;
    }
    Ok(())
}

fn classes(py: Python<'_>) -> &Classes {
    CLASSES
        .get(py)
        .expect("exception classes are created at import")
}

/// The Python exception of a kernel, carried through the core as a failure's payload.
pub struct PyCause(pub PyErr);

/// A core error wrapped for `?` in binding functions.
pub struct RtErr(pub Error);

impl From<Error> for RtErr {
    fn from(e: Error) -> Self {
        RtErr(e)
    }
}

impl From<RtErr> for PyErr {
    fn from(e: RtErr) -> PyErr {
        Python::attach(|py| to_pyerr(py, e.0))
    }
}

/// Result type of binding functions that call the core.
pub type RtResult<T> = Result<T, RtErr>;

fn err_of(py: Python<'_>, ty: &Py<PyType>, msg: String) -> PyErr {
    PyErr::from_type(ty.bind(py).clone(), msg)
}

/// Map a core error to its Python exception.
pub fn to_pyerr(py: Python<'_>, e: Error) -> PyErr {
    let c = classes(py);
    let msg = e.to_string();
    match e {
        Error::Arg(_)
        | Error::Config(
            ConfigError::BadSize { .. }
            | ConfigError::OutOfRange { .. }
            | ConfigError::UnknownProfile { .. }
            | ConfigError::BadInteger { .. },
        ) => PyValueError::new_err(msg),
        Error::Config(ConfigError::Reserve { .. }) => err_of(py, &c.out_of_memory, msg),
        Error::Device(DeviceError::NotInitialized) => err_of(py, &c.not_initialized, msg),
        Error::Device(DeviceError::InvalidDevice { .. }) => err_of(py, &c.invalid_device, msg),
        Error::Device(DeviceError::InvalidHandle { .. }) => err_of(py, &c.invalid_handle, msg),
        Error::Memory(
            MemoryError::OutOfMemory { .. }
            | MemoryError::OverFraction { .. }
            | MemoryError::HostAlloc { .. },
        ) => err_of(py, &c.out_of_memory, msg),
        Error::Memory(MemoryError::OutOfBounds { .. } | MemoryError::HostViewOverlap { .. }) => {
            PyValueError::new_err(msg)
        }
        Error::Memory(MemoryError::Corrupt { .. })
        | Error::Device(DeviceError::ThreadSpawn { .. }) => err_of(py, &c.base, msg),
        Error::Stream(StreamError::Timeout { .. }) => err_of(py, &c.timeout, msg),
        Error::Stream(StreamError::NotReady { .. }) => err_of(py, &c.not_ready, msg),
        Error::Stream(
            StreamError::Invalid(_)
            | StreamError::Capturing { .. }
            | StreamError::NotPermitted { .. },
        ) => err_of(py, &c.invalid_operation, msg),
        Error::Stream(StreamError::Multiple(errors)) => several(py, errors),
        Error::Stream(StreamError::Kernel(k)) => {
            // A failure that carries a core error (a collective's timeout, mismatch or abort)
            // raises as that error.
            if let Some(inner) = k.payload.as_ref().and_then(|p| p.downcast_ref::<Error>()) {
                return to_pyerr(py, inner.clone());
            }
            let err = err_of(py, &c.kernel, msg);
            let v = err.value(py);
            let _ = v.setattr("kernel", &k.kernel);
            let _ = v.setattr("stream", k.stream);
            let _ = v.setattr("block", k.block);
            let _ = v.setattr("code", k.code);
            if let Some(cause) = k.payload.as_ref().and_then(|p| p.downcast_ref::<PyCause>()) {
                err.set_cause(py, Some(cause.0.clone_ref(py)));
            }
            err
        }
    }
}

/// Several streams failed before one barrier: the first error, carrying all of them (itself
/// included) in its `errors` attribute and the others' messages as notes (PEP 678), so that
/// `except runtime.KernelError` still catches it and nothing is lost.
fn several(py: Python<'_>, errors: Vec<Error>) -> PyErr {
    let all: Vec<PyErr> = errors.into_iter().map(|e| to_pyerr(py, e)).collect();
    let Some(first) = all.first().map(|e| e.clone_ref(py)) else {
        return err_of(py, &classes(py).base, "no error".into());
    };
    let v = first.value(py);
    for other in &all[1..] {
        let note = format!("also failed: {}", other.value(py));
        let _ = v.call_method1("add_note", (note,));
    }
    let objects: Vec<Bound<'_, PyAny>> =
        all.iter().map(|e| e.value(py).clone().into_any()).collect();
    let _ = v.setattr("errors", objects);
    first
}

/// A kernel failure payload holding the Python exception.
pub fn cause_payload(e: PyErr) -> Arc<dyn std::any::Any + Send + Sync> {
    Arc::new(PyCause(e))
}

/// `InvalidHandleError` for a freed or dead Python-side handle.
pub fn invalid_handle(py: Python<'_>, what: String, why: &str) -> PyErr {
    err_of(
        py,
        &classes(py).invalid_handle,
        format!("{what} is no longer valid: {why}"),
    )
}

/// `InvalidDeviceError` with a message of the bindings' own (one naming the argument as
/// given, e.g. a device string).
pub fn invalid_device(py: Python<'_>, msg: String) -> PyErr {
    err_of(py, &classes(py).invalid_device, msg)
}

/// Warn `DeprecationWarning` for a pool's `free_all_free` (CuPy's message), for both pools.
pub fn deprecated_free_all_free(py: Python<'_>) -> PyResult<()> {
    PyErr::warn(
        py,
        &py.get_type::<pyo3::exceptions::PyDeprecationWarning>(),
        c"free_all_free is deprecated. Use free_all_blocks instead.",
        1,
    )
}

/// `InvalidOperationError`.
pub fn invalid_operation(py: Python<'_>, msg: String) -> PyErr {
    err_of(py, &classes(py).invalid_operation, msg)
}

/// `WaitTimeoutError`.
pub fn timeout(py: Python<'_>, what: &str, seconds: f64) -> PyErr {
    err_of(
        py,
        &classes(py).timeout,
        format!("{what} did not complete within {seconds} s"),
    )
}
