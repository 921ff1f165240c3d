//! DLPack export (`__dlpack__`) and import (`to_device` of a DLPack producer).
//!
//! Export: a DLPack 1.x `DLManagedTensorVersioned` capsule named
//! "dltensor_versioned" when the consumer passes `max_version >= (1, 0)`, otherwise a legacy
//! `DLManagedTensor` capsule named "dltensor". The versioned form carries flags: the memory is
//! writable, so consumers such as numpy (which marks legacy imports read-only) give writable
//! arrays that share device memory.
//!
//! The device type is `kDLCPU`: the virtual device's memory is ordinary host memory, so any
//! CPU consumer (`numpy.from_dlpack`, `torch.from_dlpack`) may read it in place. The capsule's
//! context holds a clone of the buffer, so the memory stays alive until the consumer calls the
//! deleter (or, if never consumed, until the capsule is collected).
//!
//! The DLPack structs, their allocation (one block holding the managed struct, shape and
//! strides) and the deleter that frees it and drops the context are `dlpark`'s; the context is
//! a boxed clone of the buffer. One builder ([`export`]) serves both capsule versions. The
//! capsule and its destructor are ours: the destructor deletes only a capsule that still has
//! its original name (a consumer renames it and takes over the deleter), and keeps any
//! exception pending when it runs (capsules are often collected while an error propagates).
//!
//! Import ([`host_view`]): any object with `__dlpack__` whose memory is on the CPU (a torch
//! CPU tensor, a JAX CPU array, our own buffers) becomes a read-only numpy array over the
//! producer's memory, in the producer's dtype (bfloat16 as `ml_dtypes.bfloat16`, which numpy
//! cannot import by itself before 2.5), shape and strides. The array's base object owns the
//! imported tensor, so the memory stays alive as long as the array (and any copy queued from
//! it) does, and the producer's deleter runs when it is collected. `dlpark` takes the
//! capsule (either version) and consumes it.

use std::ffi::{c_void, CStr};

use dlpark::allocation::dynamic::{Allocation, Initialized};
use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPackVersion,
};
use dlpark::python::{from_dlpack, ImportedDlpack};
use dlpark::{Managed, ManagedTensorBase};
use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
use numpy::{PyArrayDescrMethods, PyUntypedArray};
use pyo3::exceptions::{PyBufferError, PyOverflowError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use runtime_core::kernel::DType;
use runtime_core::memory::Buffer;

use crate::convert::{numpy_dtype, repr};

/// `kDLCPU`.
pub const KDL_CPU: i32 = DLDeviceType::CPU.0 as i32;

/// The DLPack version of the versioned export.
const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

/// The capsule name of each managed-tensor struct while unconsumed.
trait Named: ManagedTensorBase + 'static {
    const NAME: &'static CStr;
}

impl Named for DLManagedTensor {
    const NAME: &'static CStr = c"dltensor";
}

impl Named for DLManagedTensorVersioned {
    const NAME: &'static CStr = c"dltensor_versioned";
}

unsafe extern "C" fn capsule_destructor<M: Named>(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python, with the GIL, on our capsule. If it still has its original
    // name it was never consumed, so we own the tensor and must delete it; a consumer renames
    // it and takes over the deleter. The exception pending when Python collects the capsule
    // (if any) is set aside and put back, so nothing here can clear or replace it.
    unsafe {
        let (mut ty, mut value, mut tb) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        #[allow(deprecated)] // PyErr_GetRaisedException is 3.12+; this works on every version
        ffi::PyErr_Fetch(&mut ty, &mut value, &mut tb);
        if ffi::PyCapsule_IsValid(capsule, M::NAME.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, M::NAME.as_ptr()).cast::<M>();
            if !m.is_null() {
                M::drop_raw(m);
            }
        }
        #[allow(deprecated)]
        ffi::PyErr_Restore(ty, value, tb);
    }
}

/// Read the consumer's `__dlpack__` keywords: whether it takes the versioned export, or an
/// error (`BufferError` for an export this memory cannot give, `TypeError` / `ValueError`
/// naming a malformed argument).
pub fn request(
    py: Python<'_>,
    max_version: Option<&Bound<'_, PyAny>>,
    dl_device: Option<&Bound<'_, PyAny>>,
    copy: Option<bool>,
) -> PyResult<bool> {
    // Out-of-range device ints are a ValueError, anything else a TypeError, both naming the
    // argument (a plain `(i32, i32)` extraction would raise OverflowError).
    let dl_device: Option<(i64, i64)> = match dl_device {
        Some(v) if !v.is_none() => Some(v.extract::<(i64, i64)>().map_err(|e| {
            let r = repr(v);
            if e.is_instance_of::<PyOverflowError>(py) {
                PyValueError::new_err(format!("dl_device: {r} is out of range"))
            } else {
                PyTypeError::new_err(format!(
                    "dl_device must be a (device_type, device_id) tuple of ints or None, got {r}"
                ))
            }
        })?),
        _ => None,
    };
    let max_version: Option<(u32, u32)> = match max_version {
        Some(v) if !v.is_none() => Some(v.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "max_version must be a (major, minor) tuple of ints or None, got {}",
                repr(v)
            ))
        })?),
        _ => None,
    };
    if let Some((t, id)) = dl_device {
        if t != i64::from(KDL_CPU) {
            return Err(PyBufferError::new_err(format!(
                "DeviceBuffer memory is host memory (kDLCPU = 1); cannot export to device type {t}"
            )));
        }
        // `__dlpack_device__` says (kDLCPU, 0).
        if id != 0 {
            return Err(PyBufferError::new_err(format!(
                "dl_device: DeviceBuffer memory is exported as (kDLCPU = 1, device id 0); cannot export to device id {id}"
            )));
        }
    }
    if copy == Some(true) {
        return Err(PyBufferError::new_err(
            "copy=True is not supported: export shares memory; use copy_to_host() for a copy",
        ));
    }
    Ok(max_version.is_some_and(|(major, _)| major >= VERSION.major))
}

/// Export `shape` elements of `dtype` at byte `offset` of `buffer`, `strides` elements apart
/// along each axis (DLPack counts strides in elements), as a DLPack capsule.
/// With `versioned`, a DLPack 1.x capsule ("dltensor_versioned", writable); otherwise a
/// legacy one ("dltensor").
pub fn export(
    py: Python<'_>,
    buffer: Buffer,
    offset: u64,
    dtype: DType,
    shape: &[usize],
    strides: &[i64],
    versioned: bool,
) -> PyResult<Py<PyAny>> {
    if versioned {
        let mut t = tensor::<DLManagedTensorVersioned>(buffer, offset, dtype, shape, strides)?;
        t.set_version(VERSION).map_err(buffer_error)?; // flags stay 0: writable, not a copy
                                                       // SAFETY: every field is set (`tensor`).
        capsule(py, unsafe { t.finish() })
    } else {
        let t = tensor::<DLManagedTensor>(buffer, offset, dtype, shape, strides)?;
        // SAFETY: every field is set (`tensor`).
        capsule(py, unsafe { t.finish() })
    }
}

fn buffer_error(e: impl std::fmt::Display) -> PyErr {
    PyBufferError::new_err(e.to_string())
}

/// The managed tensor of the export: shape and strides (elements) in the struct's own
/// allocation, the buffer clone as its context.
fn tensor<M: ManagedTensorBase>(
    buffer: Buffer,
    offset: u64,
    dtype: DType,
    shape: &[usize],
    strides_in: &[i64],
) -> PyResult<Initialized<M>> {
    let ndim = shape.len();
    debug_assert_eq!(strides_in.len(), ndim);
    let mut alloc = Allocation::<M>::allocate(2 * ndim).map_err(buffer_error)?;
    let (dims, strides) = alloc.extra_mut().split_at_mut(ndim);
    for i in 0..ndim {
        dims[i] = shape[i] as i64;
        strides[i] = strides_in[i];
    }
    let data = buffer.as_ptr().cast::<c_void>();
    let mut t = alloc
        .initialize(Box::new(buffer), ndim)
        .map_err(buffer_error)?;
    let extra = t.extra_mut().as_mut_ptr();
    t.tensor_mut().shape = extra;
    // SAFETY: the allocation holds `2 * ndim` values: the shape, then the strides.
    t.tensor_mut().strides = unsafe { extra.add(ndim) };
    t.set_data(data)
        .set_device(DLDevice::CPU)
        .set_dtype(dl_dtype(dtype))
        .set_byte_offset(offset);
    Ok(t)
}

/// The DLPack type of a device dtype: bool is `kDLBool` (8 bits), complex `kDLComplex` with
/// the bits of the whole number (64, 128), bfloat16 `kDLBfloat` (16 bits), as numpy, torch
/// and JAX export them.
pub fn dl_dtype(dtype: DType) -> DLDataType {
    if dtype == DType::BF16 {
        return DLDataType::scalar(DLDataTypeCode::BFLOAT, 16);
    }
    let code = match dtype.kind() {
        'b' => DLDataTypeCode::BOOL,
        'i' => DLDataTypeCode::INT,
        'u' => DLDataTypeCode::UINT,
        'f' => DLDataTypeCode::FLOAT,
        _ => DLDataTypeCode::COMPLEX,
    };
    DLDataType::scalar(code, (8 * dtype.size()) as u8)
}

/// A capsule named `M::NAME` owning `managed` until a consumer renames it.
fn capsule<M: Named>(py: Python<'_>, managed: Managed<M>) -> PyResult<Py<PyAny>> {
    let raw = managed.into_raw();
    // SAFETY: valid pointer, static name, destructor defined above.
    let cap =
        unsafe { ffi::PyCapsule_New(raw.cast(), M::NAME.as_ptr(), Some(capsule_destructor::<M>)) };
    if cap.is_null() {
        // SAFETY: the capsule was not created, so we still own the tensor.
        unsafe { M::drop_raw(raw) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `cap` is a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}

// --------------------------------------------------------------------------- import

/// The device dtype of a DLPack type (the inverse of [`dl_dtype`]); `None` for a type the
/// device has no counterpart for (vector lanes, float8, opaque handles, ...).
pub fn from_dl_dtype(t: DLDataType) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| dl_dtype(d) == t)
}

/// Keeps an imported DLPack tensor alive as the base object of the numpy arrays over its
/// memory; the producer's deleter runs when the last of them is collected.
#[pyclass(name = "_DLPackImport", module = "runtime._runtime", frozen)]
pub struct Imported {
    _tensor: ImportedDlpack,
}

/// A read-only numpy array over the memory of `obj`'s DLPack export, or `None` when `obj` is
/// a numpy array (numpy's own path serves it) or its memory is not on the CPU (`kDLCPU`).
/// Errors name the argument `arg`: a dtype the device has no counterpart for is a
/// `TypeError` naming the DLPack code, bits and lanes; bfloat16 without ml_dtypes is the
/// `TypeError` that says to install it.
pub fn host_view<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    arg: &str,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if obj.is_instance_of::<PyUntypedArray>() || !obj.hasattr("__dlpack__")? {
        return Ok(None);
    }
    // The standard protocol, asked in Python (not a producer's C exchange table), so that the
    // producer's own export checks apply (torch refuses a tensor that requires grad or has
    // its conjugate bit set).
    let capsule = if obj.hasattr("__dlpack_device__")? {
        let (device_type, _): (i64, i64) = obj.call_method0("__dlpack_device__")?.extract()?;
        if device_type != i64::from(KDL_CPU) {
            // Memory elsewhere: numpy's path gives its own error, as before.
            return Ok(None);
        }
        let kw = PyDict::new(py);
        kw.set_item("max_version", (VERSION.major, VERSION.minor))?;
        match obj.call_method("__dlpack__", (), Some(&kw)) {
            Ok(c) => c,
            // A producer older than DLPack 1.0 takes no `max_version`: ask again without
            // it, as the Array API tells consumers to (the first error stands if that fails).
            Err(e) if e.is_instance_of::<PyTypeError>(py) => obj
                .call_method0("__dlpack__")
                .map_err(|_| crate::convert::naming(py, arg, e))?,
            // The producer's own refusal (torch: a tensor that requires grad), named.
            Err(e) => return Err(crate::convert::naming(py, arg, e)),
        }
    } else {
        obj.call_method0("__dlpack__")
            .map_err(|e| crate::convert::naming(py, arg, e))?
    };
    // dlpark takes either capsule version and renames it (consumed exactly once).
    let imported = from_dlpack(capsule.as_borrowed(), None, None)
        .map_err(|e| crate::convert::naming(py, arg, e))?;
    let t = imported
        .validate()
        .map_err(|e| PyValueError::new_err(format!("{arg}: invalid DLPack tensor: {e}")))?;
    if t.device().device_type != DLDeviceType::CPU {
        return Err(PyBufferError::new_err(format!(
            "{arg}: DLPack memory on device type {} (id {}) is not host memory (kDLCPU = 1)",
            t.device().device_type.0,
            t.device().device_id
        )));
    }
    let dl = t.dtype();
    let dtype = from_dl_dtype(dl).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "{arg}: DLPack dtype (code {}, {} bits, {} lanes) is not supported; use bool, int8/16/32/64, uint8/16/32/64, float16/32/64, complex64, complex128 or bfloat16",
            dl.code.0, dl.bits, dl.lanes
        ))
    })?;
    let descr = numpy_dtype(py, dtype).map_err(|e| {
        if dtype == DType::BF16 {
            let err = PyTypeError::new_err(format!(
                "{arg}: a bfloat16 DLPack tensor needs the ml_dtypes package, which gives numpy its bfloat16 type: pip install ml_dtypes (or the runtime[bfloat16] extra)"
            ));
            err.set_cause(py, Some(e));
            err
        } else {
            e
        }
    })?;
    let item = dtype.size() as i64;
    let to_intp = |v: i64| {
        npy_intp::try_from(v)
            .map_err(|_| PyValueError::new_err(format!("{arg}: DLPack extent {v} is out of range")))
    };
    let mut dims = t
        .shape()
        .iter()
        .map(|&n| to_intp(n))
        .collect::<PyResult<Vec<_>>>()?;
    let mut strides = t
        .strides_or_compact()
        .map_err(|e| PyValueError::new_err(format!("{arg}: invalid DLPack strides: {e}")))?
        .iter()
        .map(|&s| {
            s.checked_mul(item)
                .ok_or_else(|| {
                    PyValueError::new_err(format!("{arg}: DLPack stride {s} is out of range"))
                })
                .and_then(to_intp)
        })
        .collect::<PyResult<Vec<_>>>()?;
    let empty = t.num_elements() == 0;
    let data = if empty {
        std::ptr::null_mut()
    } else {
        // SAFETY: the producer's contract: for a non-empty tensor, `data + byte_offset` lies in
        // its allocation, which stays alive until the deleter runs (owned by `Imported`).
        unsafe { t.offset_bytes_ptr() }
            .map_err(|e| PyValueError::new_err(format!("{arg}: invalid DLPack data pointer: {e}")))?
            .cast_mut()
            .cast::<c_void>()
    };
    let ndim = dims.len() as std::ffi::c_int;
    let keeper = Bound::new(py, Imported { _tensor: imported })?;
    // SAFETY: `descr` is a valid dtype whose reference the call steals (`into_dtype_ptr` adds
    // one); `dims` and `strides` hold `ndim` values each and are only read during the call.
    // With data NULL (an empty tensor) numpy allocates its own (empty) block; otherwise the
    // array views the producer's memory, read-only (flags 0), which the producer promises
    // covers every element the shape and strides reach, as numpy's own DLPack import
    // assumes.
    let raw = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            descr.into_dtype_ptr(),
            ndim,
            dims.as_mut_ptr(),
            if empty {
                std::ptr::null_mut()
            } else {
                strides.as_mut_ptr()
            },
            data,
            0,
            std::ptr::null_mut(),
        )
    };
    if raw.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new, owned reference to an array.
    let array = unsafe { Bound::from_owned_ptr(py, raw) };
    if !empty {
        // SAFETY: `array` is the array just made; SetBaseObject steals the reference that
        // `into_ptr` hands it, on success and on failure alike.
        let rc = unsafe {
            PY_ARRAY_API.PyArray_SetBaseObject(py, raw.cast(), keeper.into_any().into_ptr())
        };
        if rc != 0 {
            return Err(PyErr::fetch(py));
        }
    }
    Ok(Some(array))
}
