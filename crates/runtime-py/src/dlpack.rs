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

use std::ffi::{c_void, CStr};

use pyo3::ffi;
use pyo3::prelude::*;
use runtime_core::kernel::DType;
use runtime_core::memory::Buffer;

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

struct Ctx {
    managed: DLManagedTensor,
    _shape: Vec<i64>,
    _buffer: Buffer,
}

struct CtxVersioned {
    managed: DLManagedTensorVersioned,
    _shape: Vec<i64>,
    _buffer: Buffer,
}

const NAME: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";

unsafe extern "C" fn deleter(m: *mut DLManagedTensor) {
    // SAFETY: `manager_ctx` is the `Box<Ctx>` leaked in `export`; the deleter runs once.
    unsafe { drop(Box::from_raw((*m).manager_ctx.cast::<Ctx>())) }
}

unsafe extern "C" fn deleter_versioned(m: *mut DLManagedTensorVersioned) {
    // SAFETY: `manager_ctx` is the `Box<CtxVersioned>` leaked in `export`; runs once.
    unsafe { drop(Box::from_raw((*m).manager_ctx.cast::<CtxVersioned>())) }
}

unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with our capsule; if it still has its original name it was
    // never consumed, so we own the tensor and must delete it.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()).cast::<DLManagedTensor>();
            if !m.is_null() {
                if let Some(d) = (*m).deleter {
                    d(m);
                }
            }
        } else {
            ffi::PyErr_Clear();
        }
    }
}

unsafe extern "C" fn capsule_destructor_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: as `capsule_destructor`, for the versioned capsule name and struct.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME_VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, NAME_VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if !m.is_null() {
                if let Some(d) = (*m).deleter {
                    d(m);
                }
            }
        } else {
            ffi::PyErr_Clear();
        }
    }
}

/// Whether a consumer's `max_version` (a `(major, minor)` tuple, or None) accepts the
/// versioned export.
pub fn wants_versioned(max_version: Option<(u32, u32)>) -> bool {
    max_version.is_some_and(|(major, _)| major >= DLPACK_MAJOR)
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
    let data = buffer.as_ptr().cast::<c_void>();
    if versioned {
        let mut ctx = Box::new(CtxVersioned {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion {
                    major: DLPACK_MAJOR,
                    minor: DLPACK_MINOR,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(deleter_versioned),
                flags: 0, // writable, not a copy
                dl_tensor: DLTensor {
                    data,
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
                    shape: shape.as_mut_ptr(),
                    strides: std::ptr::null_mut(),
                    byte_offset: offset,
                },
            },
            _shape: shape,
            _buffer: buffer,
        });
        let ctx_ptr: *mut CtxVersioned = &mut *ctx;
        ctx.managed.manager_ctx = ctx_ptr.cast();
        let raw = Box::into_raw(ctx);
        // SAFETY: `raw` points to a live CtxVersioned (see the legacy branch below).
        let managed: *mut DLManagedTensorVersioned =
            unsafe { std::ptr::addr_of_mut!((*raw).managed) };
        // SAFETY: valid pointer, static name, destructor defined above.
        let cap = unsafe {
            ffi::PyCapsule_New(
                managed.cast(),
                NAME_VERSIONED.as_ptr(),
                Some(capsule_destructor_versioned),
            )
        };
        if cap.is_null() {
            // SAFETY: the capsule was not created, so we still own the context.
            unsafe { drop(Box::from_raw(raw)) };
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `cap` is a new, owned reference.
        return Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind());
    }
    let mut ctx = Box::new(Ctx {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data,
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
                shape: shape.as_mut_ptr(),
                strides: std::ptr::null_mut(),
                byte_offset: offset,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter),
        },
        _shape: shape,
        _buffer: buffer,
    });
    let ctx_ptr: *mut Ctx = &mut *ctx;
    ctx.managed.manager_ctx = ctx_ptr.cast();
    let raw = Box::into_raw(ctx);
    // SAFETY: `raw` points to a live Ctx whose first field is the DLManagedTensor (repr(C)
    // struct, field at offset 0 of a Box allocation is addressable directly).
    let managed: *mut DLManagedTensor = unsafe { std::ptr::addr_of_mut!((*raw).managed) };
    // SAFETY: valid pointer, static name, destructor defined above.
    let cap =
        unsafe { ffi::PyCapsule_New(managed.cast(), NAME.as_ptr(), Some(capsule_destructor)) };
    if cap.is_null() {
        // SAFETY: the capsule was not created, so we still own the context.
        unsafe { drop(Box::from_raw(raw)) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `cap` is a new, owned reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}
