//! DLPack export (`__dlpack__`): a DLPack 1.x `DLManagedTensorVersioned` capsule named
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

use std::ffi::{c_void, CStr};

use dlpark::allocation::dynamic::{Allocation, Initialized};
use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPackVersion,
};
use dlpark::{Managed, ManagedTensorBase};
use pyo3::exceptions::{PyBufferError, PyOverflowError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use runtime_core::kernel::DType;
use runtime_core::memory::Buffer;

use crate::convert::repr;

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
