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
//! One builder ([`export`]) serves both capsule versions through the [`Managed`] trait; the
//! capsule destructor keeps any exception pending when it runs (capsules are often collected
//! while an error propagates).

use std::ffi::{c_void, CStr};

use pyo3::exceptions::{PyBufferError, PyOverflowError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use runtime_core::kernel::DType;
use runtime_core::memory::Buffer;

use crate::convert::repr;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// `kDLCPU`.
pub const KDL_CPU: i32 = 1;

/// The DLPack version of the versioned export.
const DLPACK_MAJOR: u32 = 1;
const DLPACK_MINOR: u32 = 0;

/// The two managed-tensor structs, for the one builder and the one destructor.
trait Managed: Sized + 'static {
    /// The capsule name while unconsumed.
    const NAME: &'static CStr;
    /// The struct around `tensor`, with the deleter for a `Ctx<Self>` (context set later).
    fn wrap(tensor: DLTensor) -> Self;
    fn ctx(&self) -> *mut c_void;
    fn set_ctx(&mut self, ctx: *mut c_void);
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)>;
}

impl Managed for DLManagedTensor {
    const NAME: &'static CStr = c"dltensor";
    fn wrap(dl_tensor: DLTensor) -> Self {
        DLManagedTensor {
            dl_tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter::<Self>),
        }
    }
    fn ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
    fn set_ctx(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
}

impl Managed for DLManagedTensorVersioned {
    const NAME: &'static CStr = c"dltensor_versioned";
    fn wrap(dl_tensor: DLTensor) -> Self {
        DLManagedTensorVersioned {
            version: DLPackVersion {
                major: DLPACK_MAJOR,
                minor: DLPACK_MINOR,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter::<Self>),
            flags: 0, // writable, not a copy
            dl_tensor,
        }
    }
    fn ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
    fn set_ctx(&mut self, ctx: *mut c_void) {
        self.manager_ctx = ctx;
    }
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
        self.deleter
    }
}

/// What a capsule owns: the managed struct (pointed to by the capsule), the shape array it
/// points to, and the buffer clone that keeps the memory alive.
struct Ctx<M> {
    managed: M,
    _shape: Vec<i64>,
    _buffer: Buffer,
}

unsafe extern "C" fn deleter<M: Managed>(m: *mut M) {
    // SAFETY: `manager_ctx` is the `Box<Ctx<M>>` leaked in `export`; the deleter runs once.
    unsafe { drop(Box::from_raw((*m).ctx().cast::<Ctx<M>>())) }
}

unsafe extern "C" fn capsule_destructor<M: Managed>(capsule: *mut ffi::PyObject) {
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
                if let Some(d) = (*m).deleter() {
                    d(m);
                }
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
    Ok(max_version.is_some_and(|(major, _)| major >= DLPACK_MAJOR))
}

/// Export `shape` elements of `dtype` at byte `offset` of `buffer` as a DLPack capsule.
/// With `versioned`, a DLPack 1.x capsule ("dltensor_versioned", writable); otherwise a
/// legacy one ("dltensor").
pub fn export(
    py: Python<'_>,
    buffer: Buffer,
    offset: u64,
    dtype: DType,
    shape: &[usize],
    versioned: bool,
) -> PyResult<Py<PyAny>> {
    let (code, bits) = match dtype {
        DType::F32 => (2, 32),
        DType::F64 => (2, 64),
        DType::I32 => (0, 32),
        DType::I64 => (0, 64),
        DType::U8 => (1, 8),
    };
    let mut shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let tensor = DLTensor {
        data: buffer.as_ptr().cast::<c_void>(),
        device: DLDevice {
            device_type: KDL_CPU,
            device_id: 0,
        },
        ndim: shape.len() as i32,
        dtype: DLDataType {
            code,
            bits,
            lanes: 1,
        },
        // The Vec's heap array does not move when the Vec moves into the context.
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: offset,
    };
    if versioned {
        capsule::<DLManagedTensorVersioned>(py, tensor, shape, buffer)
    } else {
        capsule::<DLManagedTensor>(py, tensor, shape, buffer)
    }
}

fn capsule<M: Managed>(
    py: Python<'_>,
    tensor: DLTensor,
    shape: Vec<i64>,
    buffer: Buffer,
) -> PyResult<Py<PyAny>> {
    let raw = Box::into_raw(Box::new(Ctx {
        managed: M::wrap(tensor),
        _shape: shape,
        _buffer: buffer,
    }));
    // SAFETY: `raw` points to a live Ctx<M> (just leaked); the managed struct is a field of it,
    // so its address is stable until the deleter frees the context.
    let managed: *mut M = unsafe {
        (*raw).managed.set_ctx(raw.cast());
        std::ptr::addr_of_mut!((*raw).managed)
    };
    // SAFETY: valid pointer, static name, destructor defined above.
    let cap = unsafe {
        ffi::PyCapsule_New(
            managed.cast(),
            M::NAME.as_ptr(),
            Some(capsule_destructor::<M>),
        )
    };
    if cap.is_null() {
        // SAFETY: the capsule was not created, so we still own the context.
        unsafe { drop(Box::from_raw(raw)) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `cap` is a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}
