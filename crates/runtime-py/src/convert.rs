//! Argument conversion: Python objects to the values the core takes, with `TypeError` /
//! `ValueError` naming the argument. Sizes and offsets, shapes, dtypes (numpy descriptors
//! through the `numpy` crate; bfloat16 is `ml_dtypes.bfloat16`, imported here only, when
//! first named), timeouts, and the handle arguments (device, stream, event,
//! buffer); `None` for a device or stream is the current one of the calling context
//! (`context`). Depends on no domain file.

use numpy::{dtype, PyArrayDescr, PyArrayDescrMethods};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyInt, PyString};
use runtime_core::bindings;
use runtime_core::device::Device;
use runtime_core::event::Event;
use runtime_core::kernel::DType;
use runtime_core::runtime as rt;
use runtime_core::stream::Stream;

use crate::context;
use crate::errors::RtErr;
use crate::handles::{PyDevice, PyDeviceBuffer, PyEvent, PyStream};

static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The numpy module (imported once).
pub fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(NUMPY
        .get_or_try_init(py, || py.import("numpy").map(Bound::unbind))?
        .bind(py))
}

/// The name of `o`'s type, for messages.
pub fn type_name(o: &Bound<'_, PyAny>) -> String {
    o.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// `repr(o)`, for messages.
pub fn repr(o: &Bound<'_, PyAny>) -> String {
    o.repr().map(|r| r.to_string()).unwrap_or_default()
}

/// numpy's own `TypeError` / `ValueError` with the argument's name in front (the original
/// stays as `__cause__`); other exceptions pass through.
pub fn naming(py: Python<'_>, arg: &str, e: PyErr) -> PyErr {
    let text = format!("{arg}: {}", e.value(py));
    let named = if e.is_instance_of::<PyTypeError>(py) {
        PyTypeError::new_err(text)
    } else if e.is_instance_of::<PyValueError>(py) {
        PyValueError::new_err(text)
    } else if e.is_instance_of::<pyo3::exceptions::PyBufferError>(py) {
        pyo3::exceptions::PyBufferError::new_err(text)
    } else {
        return e;
    };
    named.set_cause(py, Some(e));
    named
}

/// A size, offset or count: an int (or `__index__`) in `0..2**64`, not a bool.
pub fn nonneg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<u64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{arg} must be an int, got bool"
        )));
    }
    let v: i128 = match obj.extract() {
        Ok(v) => v,
        // An int (or an object with __index__) too large even for i128: a value error.
        Err(_) if obj.call_method0("__index__").is_ok() => {
            return Err(PyValueError::new_err(format!(
                "{arg} must be >= 0 and fit in 64 bits, got {}",
                repr(obj)
            )))
        }
        Err(_) => {
            return Err(PyTypeError::new_err(format!(
                "{arg} must be an int, got {}",
                type_name(obj)
            )))
        }
    };
    u64::try_from(v).map_err(|_| {
        PyValueError::new_err(format!("{arg} must be >= 0 and fit in 64 bits, got {v}"))
    })
}

/// [`nonneg`], with `None` (or absent) as `None`.
pub fn opt_nonneg(obj: Option<&Bound<'_, PyAny>>, arg: &str) -> PyResult<Option<u64>> {
    match obj {
        Some(o) if !o.is_none() => nonneg(o, arg).map(Some),
        _ => Ok(None),
    }
}

/// A shape: an int or a sequence of ints, each >= 0.
pub fn shape_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Vec<usize>> {
    if let Ok(n) = obj.extract::<i64>() {
        if obj.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err(format!(
                "{arg} must be an int or a tuple of ints, got bool"
            )));
        }
        return usize::try_from(n).map(|n| vec![n]).map_err(|_| {
            PyValueError::new_err(format!("{arg}: dimensions must be >= 0, got {n}"))
        });
    }
    let t: Vec<i64> = obj
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("{arg} must be an int or a tuple of ints")))?;
    t.into_iter()
        .map(|n| {
            usize::try_from(n).map_err(|_| {
                PyValueError::new_err(format!("{arg}: dimensions must be >= 0, got {n}"))
            })
        })
        .collect()
}

static BFLOAT16: PyOnceLock<Py<PyArrayDescr>> = PyOnceLock::new();

/// numpy's bfloat16 dtype: `ml_dtypes.bfloat16`, the optional dependency that gives numpy
/// the type (as JAX and torch users have it). Imported on first use; without it, a
/// `TypeError` saying how to install it (the `ImportError` as its cause).
pub fn bfloat16(py: Python<'_>) -> PyResult<Bound<'_, PyArrayDescr>> {
    let d = BFLOAT16.get_or_try_init(py, || {
        let ml = py.import("ml_dtypes").map_err(|e| {
            let err = PyTypeError::new_err(
                "dtype: bfloat16 needs the ml_dtypes package, which gives numpy its bfloat16 type: pip install ml_dtypes (or the runtime[bfloat16] extra)",
            );
            err.set_cause(py, Some(e));
            err
        })?;
        Ok::<_, PyErr>(PyArrayDescr::new(py, &ml.getattr("bfloat16")?)?.unbind())
    })?;
    Ok(d.bind(py).clone())
}

/// A user-given `dtype` argument (anything `numpy.dtype` takes, and the name `"bfloat16"`
/// with ml_dtypes installed) as a device dtype; see [`device_dtype`].
pub fn parse_dtype(py: Python<'_>, dtype: &Bound<'_, PyAny>) -> PyResult<DType> {
    if dtype.is_none() {
        return Ok(DType::F64); // as `numpy.dtype(None)`
    }
    // numpy knows the name only once ml_dtypes is imported.
    if let Ok(name) = dtype.cast::<PyString>() {
        if DType::parse(&name.to_cow()?) == Some(DType::BF16) {
            bfloat16(py)?;
            return Ok(DType::BF16);
        }
    }
    // numpy's message ("Cannot interpret '3' as a data type") does not name the argument.
    let dt = PyArrayDescr::new(py, dtype).map_err(|e| naming(py, "dtype", e))?;
    device_dtype(&dt)
}

/// Whether `dt` is ml_dtypes' bfloat16 (an extension dtype of kind 'V', item size 2, named
/// "bfloat16"; only then is ml_dtypes imported to compare, so it is already loaded).
fn is_bfloat16(dt: &Bound<'_, PyArrayDescr>) -> PyResult<bool> {
    if dt.kind() != b'V' || dt.itemsize() != 2 || dt.has_fields() || dt.has_subarray() {
        return Ok(false);
    }
    if dt.getattr("name")?.extract::<String>()? != "bfloat16" {
        return Ok(false);
    }
    Ok(bfloat16(dt.py()).is_ok_and(|b| b.is_equiv_to(dt)))
}

/// The device dtype of a numpy dtype (by numpy's kind and item size: every fixed-size number
/// type, and ml_dtypes' bfloat16). Device memory is in native byte order, so a non-native one
/// (`">f4"` on a little-endian host) is a `ValueError` rather than a silent reinterpretation
/// of the bytes.
pub fn device_dtype(dt: &Bound<'_, PyArrayDescr>) -> PyResult<DType> {
    if is_bfloat16(dt)? {
        return Ok(DType::BF16);
    }
    // Structured, subarray and other extension dtypes (kind 'V', ml_dtypes' float8 types,
    // ...) have no device counterpart even where their kind and size match one.
    let plain = !dt.has_fields() && !dt.has_subarray();
    let Some(parsed) = DType::from_kind(dt.kind() as char, dt.itemsize()).filter(|_| plain) else {
        return Err(PyTypeError::new_err(format!(
            "dtype {} is not supported; use bool, int8/16/32/64, uint8/16/32/64, float16/32/64, complex64, complex128 or bfloat16 (ml_dtypes)",
            dt.str()?
        )));
    };
    if dt.is_native_byteorder() == Some(false) {
        let name = parsed.name();
        return Err(PyValueError::new_err(format!(
            "dtype: {}{}{} is not in the host's byte order; device memory holds native {name} (use {name} and convert host data with astype)",
            dt.byteorder() as char,
            dt.kind() as char,
            dt.itemsize()
        )));
    }
    Ok(parsed)
}

/// The numpy dtype of a device dtype (bfloat16 needs ml_dtypes: [`bfloat16`]).
pub fn numpy_dtype(py: Python<'_>, d: DType) -> PyResult<Bound<'_, PyArrayDescr>> {
    use num_complex::Complex;
    Ok(match d {
        DType::Bool => dtype::<bool>(py),
        DType::I8 => dtype::<i8>(py),
        DType::I16 => dtype::<i16>(py),
        DType::I32 => dtype::<i32>(py),
        DType::I64 => dtype::<i64>(py),
        DType::U8 => dtype::<u8>(py),
        DType::U16 => dtype::<u16>(py),
        DType::U32 => dtype::<u32>(py),
        DType::U64 => dtype::<u64>(py),
        DType::F16 => dtype::<half::f16>(py),
        DType::BF16 => return bfloat16(py),
        DType::F32 => dtype::<f32>(py),
        DType::F64 => dtype::<f64>(py),
        DType::C64 => dtype::<Complex<f32>>(py),
        DType::C128 => dtype::<Complex<f64>>(py),
    })
}

/// Read a Python `timeout` argument (seconds, or None) as a float. An int beyond the float
/// range is no limit (as 1e300 is); a negative one is a `ValueError` like any other.
pub fn timeout_obj(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<f64>> {
    let Some(o) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    match o.extract::<f64>() {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.is_instance_of::<PyOverflowError>(o.py()) => {
            if o.gt(0)? {
                Ok(Some(f64::MAX))
            } else {
                Err(PyValueError::new_err(format!(
                    "timeout must be a non-negative number of seconds or None, got {}",
                    o.repr()?
                )))
            }
        }
        Err(_) => Err(PyTypeError::new_err(format!(
            "timeout must be a number of seconds or None, got {}",
            o.get_type().name()?
        ))),
    }
}

/// Convert a timeout in seconds (`None` = forever). One too large for a `Duration` is no
/// limit.
pub fn timeout_arg(timeout: Option<f64>) -> PyResult<Option<std::time::Duration>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => Ok(std::time::Duration::try_from_secs_f64(t).ok()),
        Some(t) => Err(PyValueError::new_err(format!(
            "timeout must be a non-negative number of seconds or None, got {t}"
        ))),
    }
}

/// What a device argument must be, for `TypeError` messages.
const DEVICE_KINDS: &str = "a runtime.Device, an int or a device string ('npu:0', 'npu', 'cuda:0')";

/// A device string, as `torch.device` spells one: `"npu:N"` / `"npu"` (the current device),
/// with `"cuda"` an alias of `"npu"`. `Ok(None)` is the current device. The index is decimal
/// without sign or leading zeros (torch's rule); errors say what is wrong with `s`. A string
/// that does not start with a type name (`"0"`, `""`) is `Err(None)`: not a device string at
/// all (a `TypeError`, as before device strings existed).
fn parse_device_string(s: &str) -> Result<Option<u64>, Option<String>> {
    let (kind, index) = match s.split_once(':') {
        Some((k, i)) => (k, Some(i)),
        None => (s, None),
    };
    if kind.is_empty() || !kind.bytes().all(|b| b.is_ascii_alphabetic() || b == b'_') {
        return Err(None);
    }
    if kind != "npu" && kind != "cuda" {
        return Err(Some(format!(
            "unknown device type {kind:?} (expected 'npu' or its alias 'cuda', as in 'npu:0')"
        )));
    }
    let Some(index) = index else {
        return Ok(None);
    };
    let canonical = !index.is_empty()
        && index.bytes().all(|b| b.is_ascii_digit())
        && (index == "0" || !index.starts_with('0'));
    if !canonical {
        return Err(Some(format!(
            "{index:?} is not a device index (expected a non-negative decimal integer, as in '{kind}:0')"
        )));
    }
    // More digits than any u64: out of range like any too-large index.
    Ok(Some(index.parse::<u64>().unwrap_or(u64::MAX)))
}

/// The device index a device string names (see [`parse_device_string`]), checked against the
/// installed runtime's devices so that the error names the string as given.
fn device_string_arg(obj: &Bound<'_, PyAny>, s: &str, arg: &str) -> PyResult<i64> {
    match parse_device_string(s) {
        Ok(None) => {
            rt::get().map_err(RtErr)?;
            Ok(context::device_index(obj.py())? as i64)
        }
        Ok(Some(i)) => {
            let count = rt::get().map_err(RtErr)?.devices().len();
            if i >= count as u64 {
                return Err(crate::errors::invalid_device(
                    obj.py(),
                    format!(
                        "{arg}: {s:?} names device {i}, out of range: valid devices are 0..={} ({count} devices)",
                        count.saturating_sub(1)
                    ),
                ));
            }
            Ok(i as i64)
        }
        Err(Some(why)) => Err(PyValueError::new_err(format!(
            "{arg}: bad device string {s:?}: {why}"
        ))),
        Err(None) => Err(PyTypeError::new_err(format!(
            "{arg} must be {DEVICE_KINDS}, got str {s:?}"
        ))),
    }
}

/// Read a device argument: a `Device`, an int (not a bool) or a device string (`"npu:0"`,
/// `"npu"` for the current device, `"cuda:0"` / `"cuda"` as aliases): the one place where a
/// device argument of the bindings is converted. Out-of-range ints are invalid devices (the
/// core's `InvalidDeviceError`), not type errors; so are out-of-range device strings, while a
/// malformed one (`"gpu:0"`, `"npu:x"`, `"npu:-1"`) is a `ValueError` and a string that is
/// no device string at all (`"0"`) a `TypeError`.
pub fn device_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<i64> {
    if let Ok(d) = obj.cast::<PyDevice>() {
        return Ok(d.get().index() as i64);
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return device_string_arg(obj, &s.to_cow()?, arg);
    }
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{arg} must be {DEVICE_KINDS}, got bool"
        )));
    }
    if obj.is_instance_of::<PyInt>() {
        return Ok(obj.extract::<i64>().unwrap_or(i64::MAX));
    }
    obj.extract::<i64>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{arg} must be {DEVICE_KINDS}, got {}",
            type_name(obj)
        ))
    })
}

/// The device at index `i` of the installed runtime.
pub fn device_at(i: i64) -> PyResult<Device> {
    let r = rt::get().map_err(RtErr)?;
    Ok(bindings::device(&r, i).map_err(RtErr)?.clone())
}

/// An optional device argument (`None` = the current device: the innermost `with`'s, else
/// the thread's).
pub fn resolve(py: Python<'_>, obj: Option<&Bound<'_, PyAny>>, arg: &str) -> PyResult<Device> {
    let r = rt::get().map_err(RtErr)?;
    let d = match obj {
        Some(o) if !o.is_none() => bindings::device(&r, device_arg(o, arg)?),
        _ => r.device(context::device_index(py)?),
    };
    Ok(d.map_err(RtErr)?.clone())
}

/// A required device argument: like [`resolve`] but `None` is a `TypeError` (it is not "the
/// current device" where the signature says `Device | int`).
pub fn resolve_required(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Device> {
    if obj.is_none() {
        return Err(PyTypeError::new_err(format!(
            "{arg} must be {DEVICE_KINDS}, got None"
        )));
    }
    resolve(obj.py(), Some(obj), arg)
}

/// The `stream=` argument of a copy: a Stream, or None (the copy is then blocking).
pub fn stream_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Stream>> {
    match obj {
        Some(o) if !o.is_none() => {
            let s = o.cast::<PyStream>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "stream must be a runtime.Stream or None, got {} (pass byte counts as count=...)",
                    type_name(o)
                ))
            })?;
            Ok(Some(s.get().inner().clone()))
        }
        _ => Ok(None),
    }
}

/// An optional stream argument: a Stream, or None for the current stream of the current
/// device (both as the calling context sees them).
pub fn stream_or_current(py: Python<'_>, obj: Option<&Bound<'_, PyAny>>) -> PyResult<Stream> {
    match obj {
        Some(o) if !o.is_none() => Ok(o
            .cast::<PyStream>()
            .map_err(|_| {
                PyTypeError::new_err(format!(
                    "stream must be a runtime.Stream or None, got {}",
                    type_name(o)
                ))
            })?
            .get()
            .inner()
            .clone()),
        _ => {
            let d = resolve(py, None, "device")?;
            context::stream(py, &d)
        }
    }
}

/// An event argument of the installed runtime.
pub fn event_arg(obj: &Bound<'_, PyAny>) -> PyResult<Event> {
    Ok(obj
        .cast::<PyEvent>()
        .map_err(|_| {
            PyTypeError::new_err(format!(
                "event must be a runtime.Event, got {}",
                type_name(obj)
            ))
        })?
        .get()
        .raw()
        .clone())
}

/// A `DeviceBuffer` argument.
pub fn buffer_arg<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    arg: &str,
) -> PyResult<&'a Bound<'py, PyDeviceBuffer>> {
    obj.cast::<PyDeviceBuffer>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{arg} must be a runtime.DeviceBuffer, got {}",
            type_name(obj)
        ))
    })
}
