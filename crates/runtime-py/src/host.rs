//! Host memory through the buffer protocol: importing a host object's bytes as a copy source or
//! destination ([`HostBuf`]), exporting a `DeviceBuffer` view to Python ([`export_view`],
//! [`release_view`]), and finding the object that owns a view's memory ([`find_owner`]).
//!
//! Imports are raw bytes (`PyBUF_C_CONTIGUOUS`): a copy moves bytes as bytes, whatever the
//! host object's element type or byte order, except Python object references (struct code
//! `O`, numpy's object dtype), which are refused: bytes written over them would be
//! dereferenced as objects (a segfault found by the argument fuzzer).

use std::ffi::{c_int, c_void, CStr};

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use runtime_core::kernel::DType;
use runtime_core::memory::access::HostTracker;
use runtime_core::memory::Buffer;
use runtime_core::stream::copy::HostMemory;

use crate::convert::type_name;
use crate::handles::PyDeviceBuffer;

/// Walk `obj`'s chain of owners (`.base` of a numpy array, `.obj` of a memoryview, at most
/// 16 steps) and return the first `found(step)` that is `Some`: the `DeviceBuffer` a host
/// view reads, or the pinned block under a numpy array. `None` where the chain ends first.
/// bytes and bytearray own their memory and end it at once: asking them for `.base` raised
/// and discarded an AttributeError (about 0.8 us) on every copy that walked from one.
pub fn find_owner<R>(
    obj: &Bound<'_, PyAny>,
    found: impl Fn(&Bound<'_, PyAny>) -> Option<R>,
) -> Option<R> {
    let py = obj.py();
    let mut cur = obj.clone();
    for _ in 0..16 {
        if let Some(r) = found(&cur) {
            return Some(r);
        }
        if cur.is_exact_instance_of::<pyo3::types::PyBytes>()
            || cur.is_exact_instance_of::<pyo3::types::PyByteArray>()
        {
            return None;
        }
        let next = if let Ok(mv) = cur.cast::<pyo3::types::PyMemoryView>() {
            mv.getattr(pyo3::intern!(py, "obj")).ok()
        } else {
            cur.getattr(pyo3::intern!(py, "base")).ok()
        };
        match next {
            Some(n) if !n.is_none() => cur = n,
            _ => return None,
        }
    }
    None
}

/// An exported host buffer (C-contiguous), released under the GIL when dropped.
pub struct HostBuf {
    view: Box<ffi::Py_buffer>,
    /// The tracker that orders copies through it: the device allocation's, when the object
    /// is a view of a `DeviceBuffer` ([`HostBuf::viewing`]).
    tracker: Option<HostTracker>,
}

// SAFETY: the exporter keeps the memory valid and in place until `PyBuffer_Release`, which
// runs under the GIL in Drop; the bytes themselves are only touched through raw copies.
unsafe impl Send for HostBuf {}
// SAFETY: as above; no interior mutability on the Rust side.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    /// This export, known to view device buffer `buf`'s memory: copies through it take turns
    /// with `buf`'s own ops, as copies of `buf` itself do.
    pub fn viewing(mut self, buf: &Buffer) -> HostBuf {
        self.tracker = Some(buf.host_tracker());
        self
    }

    /// Export `obj` (any buffer-protocol object). Non-contiguous objects are refused.
    pub fn get(obj: &Bound<'_, PyAny>, arg: &str, writable: bool) -> PyResult<HostBuf> {
        let py = obj.py();
        if obj.cast::<PyDeviceBuffer>().is_ok() {
            return Err(PyTypeError::new_err(format!("{arg} must be host memory (a numpy array, bytes, bytearray or memoryview), got a DeviceBuffer")));
        }
        // SAFETY: Py_buffer is plain data; zeroed is a valid "empty" state before export.
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        let mut export = |flags: c_int| {
            // SAFETY: valid object and a writable Py_buffer to fill; called again only after
            // a failed export, which leaves the view unfilled (nothing to release).
            unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) }
        };
        let mut rc = export(ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_FORMAT);
        // numpy exports no format for extension dtypes (ml_dtypes' bfloat16: "cannot include
        // dtype 'E' in a buffer") but gives their bytes when no format is asked for; an
        // ndarray whose dtype holds no objects is plain bytes, so take them that way.
        if rc != 0 {
            let first = PyErr::fetch(py);
            if plain_ndarray(obj) {
                rc = export(ffi::PyBUF_C_CONTIGUOUS);
                if rc != 0 {
                    drop(PyErr::take(py));
                }
            }
            if rc != 0 {
                first.restore(py); // the first error is the one to report
            }
        }
        if rc != 0 {
            let e = PyErr::fetch(py);
            // SAFETY: `obj` is a valid, live object; the check only reads its type slots.
            let supports = unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 1;
            return Err(if supports {
                PyValueError::new_err(format!("{arg} must be a C-contiguous buffer ({e})"))
            } else {
                PyTypeError::new_err(format!(
                    "{arg} must support the buffer protocol (numpy array, bytes, bytearray, memoryview), got {}",
                    type_name(obj)
                ))
            });
        }
        let hb = HostBuf {
            view,
            tracker: None,
        };
        if !hb.view.format.is_null() {
            // SAFETY: a non-null format is a NUL-terminated string owned by the export, which
            // `hb` holds.
            let format = unsafe { CStr::from_ptr(hb.view.format) };
            if holds_objects(format.to_bytes()) {
                return Err(PyTypeError::new_err(format!(
                    "{arg} holds Python object references (buffer format {:?}, e.g. numpy's object dtype): they cannot be copied as bytes",
                    format.to_string_lossy()
                )));
            }
        }
        if writable && hb.view.readonly != 0 {
            return Err(PyValueError::new_err(format!(
                "{arg} is read-only; a copy destination must be writable"
            )));
        }
        Ok(hb)
    }
}

/// Whether `obj` is a numpy array whose dtype holds no Python objects (`dtype.hasobject`).
fn plain_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    use numpy::PyUntypedArrayMethods;
    obj.cast::<numpy::PyUntypedArray>().is_ok_and(|a| {
        a.dtype()
            .getattr("hasobject")
            .and_then(|h| h.extract::<bool>())
            .is_ok_and(|h| !h)
    })
}

/// Whether a struct-module format string has an object field (`O`), field names (`:name:`)
/// aside.
fn holds_objects(format: &[u8]) -> bool {
    let mut in_name = false;
    format.iter().any(|&c| {
        if c == b':' {
            in_name = !in_name;
        }
        !in_name && c == b'O'
    })
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        let Some(_inside) = crate::interp::prepare() else {
            return; // the interpreter is going away: the exporter is left to it
        };
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released once.
        Python::attach(|_| unsafe { ffi::PyBuffer_Release(&mut *self.view) });
    }
}

// SAFETY: `buf` is valid for `len` bytes while the export is held (until Drop). A view of a
// device buffer names that allocation's tracker, and pinned and registered memory are found
// by address; otherwise two ops on one pageable array are the Python program's to order,
// numpy's rule for arrays that threads share.
unsafe impl HostMemory for HostBuf {
    fn as_ptr(&self) -> *const u8 {
        self.view.buf as *const u8
    }
    fn as_mut_ptr(&self) -> Option<*mut u8> {
        (self.view.readonly == 0).then_some(self.view.buf.cast::<u8>())
    }
    fn len(&self) -> usize {
        self.view.len as usize
    }
    fn tracker(&self) -> Option<&HostTracker> {
        self.tracker.as_ref()
    }
}

/// The buffer-protocol format of a dtype (native byte order; struct-module codes, `Zf` / `Zd`
/// for complex as PEP 3118 and numpy write them). bfloat16 has none, as for numpy's own
/// bfloat16 arrays.
fn c_format(d: DType) -> Option<&'static CStr> {
    Some(match d {
        DType::Bool => c"?",
        DType::I8 => c"b",
        DType::I16 => c"h",
        DType::I32 => c"i",
        DType::I64 => c"q",
        DType::U8 => c"B",
        DType::U16 => c"H",
        DType::U32 => c"I",
        DType::U64 => c"Q",
        DType::F16 => c"e",
        DType::F32 => c"f",
        DType::F64 => c"d",
        DType::C64 => c"Zf",
        DType::C128 => c"Zd",
        DType::BF16 => return None,
    })
}

/// Fill `view` for the buffer-protocol export of `slf` (`__getbuffer__`). The view keeps a
/// clone of the core buffer in `internal` (released by [`release_view`]) and a reference to
/// `slf` in `obj`.
///
/// # Safety
/// `view` is the `Py_buffer` Python passed to `__getbuffer__`.
pub unsafe fn export_view(
    slf: Bound<'_, PyDeviceBuffer>,
    view: *mut ffi::Py_buffer,
    flags: c_int,
) -> PyResult<()> {
    let py = slf.py();
    let me = slf.get();
    let buffer: Buffer = me.buffer(py)?;
    if view.is_null() {
        return Err(PyBufferError::new_err("view is null"));
    }
    let format = c_format(me.dtype);
    let want_format = flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT;
    if want_format && format.is_none() {
        return Err(PyBufferError::new_err(format!(
            "a {0} DeviceBuffer has no buffer-protocol format (nor have numpy's {0} arrays); use numpy.asarray(buf), copy_to_host() or buf.view(\"uint16\")",
            me.dtype.name()
        )));
    }
    // A consumer that takes no strides, or asks for a contiguity, reads the memory in that
    // order: a view in another layout is refused rather than read wrongly.
    let layout = me.layout();
    let (c, f) = (layout.is_c_contiguous(), layout.is_f_contiguous());
    let with_strides = flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES;
    let refused = if flags & ffi::PyBUF_C_CONTIGUOUS == ffi::PyBUF_C_CONTIGUOUS {
        (!c).then_some("C-contiguous")
    } else if flags & ffi::PyBUF_F_CONTIGUOUS == ffi::PyBUF_F_CONTIGUOUS {
        (!f).then_some("F-contiguous")
    } else if flags & ffi::PyBUF_ANY_CONTIGUOUS == ffi::PyBUF_ANY_CONTIGUOUS {
        (!c && !f).then_some("contiguous")
    } else {
        (!with_strides && !c).then_some("C-contiguous (no strides requested)")
    };
    if let Some(what) = refused {
        return Err(PyBufferError::new_err(format!(
            "a {what} buffer was requested, but this DeviceBuffer view has shape {:?} and strides {:?}",
            me.shape, me.strides
        )));
    }
    // What the consumer relies on: `len` is the elements' bytes, the product of the shape and
    // the item size (CPython allocates `len` bytes and copies every element into them). The
    // layout guarantees it (`Layout::new` refuses element bytes past `isize::MAX`); checked
    // again here, where trusting it would be a write past an allocation.
    let elements = me.shape.iter().try_fold(me.dtype.size() as u64, |acc, &d| {
        u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    });
    if elements != Some(me.nbytes) || me.nbytes > isize::MAX as u64 {
        return Err(PyBufferError::new_err(format!(
            "this DeviceBuffer view (shape {:?}, {} bytes per element) has more bytes than a buffer can hold",
            me.shape,
            me.dtype.size()
        )));
    }
    let ptr = buffer.as_ptr() as usize + me.offset as usize;
    let keep = Box::into_raw(Box::new(buffer));
    // SAFETY: `view` is the non-null Py_buffer Python passed in; the pointers stored in it
    // (shape, strides, format) point into this object or static data, and the object is
    // kept alive by `obj` for the life of the view; `internal` keeps the memory alive. What
    // the consumer reads and writes through it lies within that memory: `len` is the
    // product of the shape and the item size (checked just above), and every element the
    // shape and strides reach from `buf` lies within the buffer (the view's layout was
    // checked against its allocation when the view was made, `Layout::check_fits`, and
    // views never change their layout).
    unsafe {
        (*view).buf = ptr as *mut c_void;
        (*view).len = me.nbytes as isize;
        (*view).readonly = 0;
        (*view).itemsize = me.dtype.size() as isize;
        (*view).format = match format {
            Some(f) if want_format => f.as_ptr().cast_mut(),
            _ => std::ptr::null_mut(),
        };
        (*view).ndim = me.shape.len() as c_int;
        (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
            me.shape.as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
            me.strides.as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = keep.cast();
        (*view).obj = slf.into_any().into_ptr();
    }
    Ok(())
}

/// Release what [`export_view`] stored in `view` (`__releasebuffer__`).
///
/// # Safety
/// `view` is a `Py_buffer` filled by [`export_view`].
pub unsafe fn release_view(view: *mut ffi::Py_buffer) {
    // SAFETY: `internal` is the Box<Buffer> leaked in `export_view`; released once.
    unsafe {
        let keep = (*view).internal.cast::<Buffer>();
        if !keep.is_null() {
            drop(Box::from_raw(keep));
            (*view).internal = std::ptr::null_mut();
        }
    }
}
