//! Kernels: the `Kernel` class (native kernels from the registry, and machine code behind the
//! C ABI of `runtime/kernel.h`: `Kernel.load`, `Kernel.from_cfunc`), and launching on a
//! stream — native kernels with their arguments converted to `KernelArg`s (buffers as
//! tensors, numbers as exact integers or floats; numpy scalars as typed values for C ABI
//! kernels), Python callables and host functions as ops that attach to the interpreter when
//! they run. `block_dim` (checked here, before anything is queued) makes a launch of several
//! blocks; `get_block_idx()` / `get_block_num()` read the running block.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyComplex, PyComplexMethods, PyFloat, PyInt, PyString, PyTuple};
use runtime_core::error::KernelFailure;
use runtime_core::kernel::native::NativeKernel;
use runtime_core::kernel::{self, block, KernelArg, Scalar, Tensor};
use runtime_core::memory::access::{Access, AccessSet};
use runtime_core::stream::{FnOp, Op, OpKind, Stream};

use crate::convert::{numpy, stream_or_current, type_name};
use crate::errors::{self, RtErr};
use crate::handles::PyDeviceBuffer;
use crate::wait;

/// A Python callable (kernel or host function) as a stream op.
struct PyOp {
    name: String,
    func: Py<PyAny>,
    args: Py<PyTuple>,
    /// Convert DeviceBuffer arguments to numpy views before the call.
    views: bool,
}

impl PyOp {
    /// The stream op of a host function: it names no device memory.
    fn into_op(self) -> Arc<dyn Op> {
        let name = self.name.clone();
        FnOp::with_accesses(name, OpKind::Compute, AccessSet::default(), move || {
            self.run()
        })
    }

    /// The stream op of a kernel: `accesses` are its buffer arguments, all as written (what
    /// Python code does with a view is not known), held while it runs so that no other work
    /// touches them meanwhile; it runs as `blocks` blocks on `s`'s device (`get_block_idx()`
    /// tells them apart).
    fn into_kernel_op(self, s: &Stream, accesses: AccessSet, blocks: u32) -> Arc<dyn Op> {
        let name = self.name.clone();
        let runner = block::BlockRunner::of(s);
        let me = Arc::new(self);
        FnOp::with_accesses(name, OpKind::Compute, accesses, move || {
            let op = me.clone();
            runner.run(&me.name, blocks, Arc::new(move |_| op.run()))
        })
    }
}

impl Drop for PyOp {
    /// Release the arguments now, attached to the interpreter: dropped detached, PyO3 would
    /// only decref them at some later attach, and a device buffer among them would keep its
    /// memory held after the kernel ran (an allocation waiting for that memory would fail).
    /// Once the interpreter is finalising nothing attaches; the arguments are left to it.
    fn drop(&mut self) {
        let Some(_inside) = crate::interp::prepare() else {
            return;
        };
        Python::attach(|py| {
            drop(std::mem::replace(
                &mut self.args,
                PyTuple::empty(py).unbind(),
            ));
        });
    }
}

impl PyOp {
    fn run(&self) -> Result<(), KernelFailure> {
        let Some(_inside) = crate::interp::prepare_kernel() else {
            return Err(KernelFailure::new(
                self.name.clone(),
                "the Python interpreter is shutting down: Python kernels cannot run any more"
                    .to_string(),
            ));
        };
        Python::attach(|py| {
            let call = || -> PyResult<()> {
                let args = self.args.bind(py);
                if self.views {
                    let asarray = numpy(py)?.getattr("asarray")?;
                    let mut conv = Vec::with_capacity(args.len());
                    for a in args.iter() {
                        if a.cast::<PyDeviceBuffer>().is_ok() {
                            conv.push(asarray.call1((a,))?);
                        } else {
                            conv.push(a);
                        }
                    }
                    self.func.bind(py).call1(PyTuple::new(py, conv)?)?;
                } else {
                    self.func.bind(py).call1(args)?;
                }
                Ok(())
            };
            call().map_err(|e| {
                let ty = e
                    .get_type(py)
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default();
                let mut f = KernelFailure::new(self.name.clone(), format!("{ty}: {}", e.value(py)));
                f.payload = Some(errors::cause_payload(e));
                f
            })
        })
    }
}

fn callable_name(f: &Bound<'_, PyAny>) -> String {
    f.getattr("__qualname__")
        .or_else(|_| f.getattr("__name__"))
        .and_then(|n| n.extract::<String>())
        .unwrap_or_else(|_| type_name(f))
}

/// A native kernel: from the registry by name, or machine code behind the C ABI
/// (`Kernel.load`, `Kernel.from_cfunc`).
#[pyclass(name = "Kernel", module = "runtime", frozen)]
pub struct PyKernel {
    #[pyo3(get)]
    name: String,
    kernel: kernel::KernelRef,
    /// Behind the C ABI: numpy scalar arguments keep their dtype (a pointer to the value).
    c_abi: bool,
}

/// Keeps the Python object that owns a kernel's machine code (a numba `@cfunc`, a ctypes
/// function) alive while the kernel lives; released attached to the interpreter.
struct PyKeep(Option<Py<PyAny>>);

impl Drop for PyKeep {
    fn drop(&mut self) {
        let Some(obj) = self.0.take() else {
            return;
        };
        let Some(_inside) = crate::interp::prepare() else {
            std::mem::forget(obj); // the interpreter is finalising: leave it to it
            return;
        };
        Python::attach(|_| drop(obj));
    }
}

/// The argument indices named read-only, checked against `nargs` when given.
fn read_only_arg(
    read_only: Option<&Bound<'_, PyAny>>,
    nargs: Option<usize>,
) -> PyResult<Vec<usize>> {
    let Some(obj) = read_only else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for item in obj.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "read_only must be a sequence of argument indices, got {}",
            type_name(obj)
        ))
    })? {
        let item = item?;
        if item.is_instance_of::<PyBool>() || !item.is_instance_of::<PyInt>() {
            return Err(PyTypeError::new_err(format!(
                "read_only must hold argument indices (int), got {}",
                type_name(&item)
            )));
        }
        let i: i64 = item.extract()?;
        let ok = usize::try_from(i)
            .ok()
            .filter(|&i| nargs.is_none_or(|n| i < n));
        let Some(i) = ok else {
            return Err(PyValueError::new_err(format!(
                "read_only: argument index {i} out of range{}",
                nargs.map_or(String::new(), |n| format!(" for {n} arguments"))
            )));
        };
        out.push(i);
    }
    Ok(out)
}

fn nargs_arg(nargs: Option<&Bound<'_, PyAny>>) -> PyResult<Option<usize>> {
    match nargs {
        None => Ok(None),
        Some(n) if n.is_none() => Ok(None),
        Some(n) => {
            if n.is_instance_of::<PyBool>() || !n.is_instance_of::<PyInt>() {
                return Err(PyTypeError::new_err(format!(
                    "nargs must be an int, got {}",
                    type_name(n)
                )));
            }
            let v: i64 = n.extract()?;
            usize::try_from(v)
                .map(Some)
                .map_err(|_| PyValueError::new_err(format!("nargs must be >= 0, got {v}")))
        }
    }
}

impl PyKernel {
    fn c_abi(k: NativeKernel, read_only: Vec<usize>, nargs: Option<usize>) -> PyKernel {
        let mut k = k.with_read_only(read_only);
        if let Some(n) = nargs {
            k = k.with_nargs(n);
        }
        PyKernel {
            name: kernel::Kernel::name(&k).to_string(),
            kernel: k.into_kernel().into(),
            c_abi: true,
        }
    }
}

/// The address of a C function given as a numba `@cfunc`, a ctypes function pointer or an
/// integer, and the object to keep alive for it.
fn cfunc_address(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    let refuse = || {
        PyTypeError::new_err(format!(
            "from_cfunc takes a numba @cfunc, a ctypes function pointer or an integer address, got {}",
            type_name(obj)
        ))
    };
    if obj.is_instance_of::<PyBool>() {
        return Err(refuse());
    }
    if obj.is_instance_of::<PyInt>() {
        return obj.extract::<usize>().map_err(|_| {
            PyValueError::new_err(format!(
                "address {} is not a valid address",
                crate::convert::repr(obj)
            ))
        });
    }
    // numba's CFunc: `.address` (the C wrapper) next to `.ctypes`.
    if let (Ok(addr), true) = (obj.getattr("address"), obj.hasattr("ctypes")?) {
        if addr.is_instance_of::<PyInt>() {
            return addr.extract::<usize>().map_err(|_| refuse());
        }
    }
    // A ctypes function pointer (CFUNCTYPE instance): its value as a void pointer.
    let ctypes = py.import("ctypes")?;
    let cfuncptr = ctypes.getattr("_CFuncPtr")?;
    if obj.is_instance(&cfuncptr)? {
        let p = ctypes
            .getattr("cast")?
            .call1((obj, ctypes.getattr("c_void_p")?))?
            .getattr("value")?;
        if p.is_none() {
            return Err(PyValueError::new_err("the ctypes function pointer is NULL"));
        }
        return p.extract::<usize>();
    }
    Err(refuse())
}

#[pymethods]
impl PyKernel {
    #[new]
    fn new(name: &str) -> PyResult<Self> {
        let k = kernel::find(name).map_err(RtErr)?;
        Ok(PyKernel {
            name: name.to_string(),
            kernel: k,
            c_abi: false,
        })
    }

    /// A kernel from `symbol` of the shared library at `path` (C ABI of `runtime/kernel.h`);
    /// the library stays loaded while the kernel lives.
    #[staticmethod]
    #[pyo3(signature = (path, symbol, *, nargs=None, read_only=None))]
    fn load(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        symbol: &str,
        nargs: Option<&Bound<'_, PyAny>>,
        read_only: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let path: String = py
            .import("os")?
            .getattr("fspath")?
            .call1((path,))
            .and_then(|p| p.extract())
            .map_err(|_| {
                PyTypeError::new_err(format!(
                    "path must be a str or os.PathLike, got {}",
                    type_name(path)
                ))
            })?;
        let nargs = nargs_arg(nargs)?;
        let read_only = read_only_arg(read_only, nargs)?;
        // SAFETY: loading a library and calling its symbol is the caller's contract, as with
        // ctypes (documented: the code must follow the C ABI and stay inside its buffers);
        // the call runs without the GIL, which `dlopen` does not need.
        let k = py
            .detach(|| unsafe { NativeKernel::load(&path, symbol) })
            .map_err(RtErr)?;
        Ok(PyKernel::c_abi(k, read_only, nargs))
    }

    /// A kernel from C machine code made elsewhere: a numba `@cfunc`, a ctypes function
    /// pointer, or an integer address (C ABI of `runtime/kernel.h`); the object is kept alive
    /// while the kernel lives.
    #[staticmethod]
    #[pyo3(signature = (obj, *, name=None, nargs=None, read_only=None))]
    fn from_cfunc(
        py: Python<'_>,
        obj: &Bound<'_, PyAny>,
        name: Option<String>,
        nargs: Option<&Bound<'_, PyAny>>,
        read_only: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let address = cfunc_address(py, obj)?;
        let nargs = nargs_arg(nargs)?;
        let read_only = read_only_arg(read_only, nargs)?;
        let name = name.unwrap_or_else(|| {
            obj.getattr("__name__")
                .and_then(|n| n.extract::<String>())
                .unwrap_or_else(|_| format!("cfunc@{address:#x}"))
        });
        let keep: Box<dyn std::any::Any + Send + Sync> =
            Box::new(PyKeep(Some(obj.clone().unbind())));
        // SAFETY: the caller hands us code of the C ABI (documented contract, as with ctypes);
        // `keep` holds the object that owns it for as long as the kernel lives.
        let k = unsafe { NativeKernel::from_address(name, address, Some(keep)) }.map_err(RtErr)?;
        Ok(PyKernel::c_abi(k, read_only, nargs))
    }

    fn __repr__(&self) -> String {
        if self.c_abi {
            format!("runtime.Kernel({:?}, C ABI)", self.name)
        } else {
            format!("runtime.kernels.{}", self.name)
        }
    }

    /// Launch on `stream` (the current stream when None), as `block_dim` blocks (None: the
    /// kernel chooses).
    #[pyo3(signature = (*args, stream=None, block_dim=None))]
    fn __call__(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
        block_dim: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let blocks = block_dim_arg(block_dim)?;
        let s = stream_or_current(py, stream)?;
        launch_native(py, &s, self.kernel.clone(), args, blocks, self.c_abi)
    }
}

/// `block_dim`: None, or an int in `1..=MAX_BLOCK_DIM`.
pub fn block_dim_arg(block_dim: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u32>> {
    let Some(b) = block_dim.filter(|b| !b.is_none()) else {
        return Ok(None);
    };
    let out_of_range = |_| {
        PyValueError::new_err(format!(
            "block_dim: must be between 1 and {}, got {}",
            kernel::MAX_BLOCK_DIM,
            crate::convert::repr(b)
        ))
    };
    let v: i64 = match number_kind(b.py(), b)? {
        Number::Int if b.is_instance_of::<PyInt>() => b.extract().map_err(out_of_range)?,
        Number::Int => b
            .call_method0("__index__")?
            .extract()
            .map_err(out_of_range)?,
        _ => {
            return Err(PyTypeError::new_err(format!(
                "block_dim must be an int or None, got {}",
                type_name(b)
            )))
        }
    };
    block::check_block_dim(v)
        .map(Some)
        .map_err(|e| PyValueError::new_err(format!("block_dim: {}", e.message)))
}

/// The index of the block running the calling kernel (`0..get_block_num()`).
#[pyfunction]
pub fn get_block_idx(py: Python<'_>) -> PyResult<u32> {
    current_block(py).map(|b| b.block_idx())
}

/// The number of blocks of the launch running the calling kernel.
#[pyfunction]
pub fn get_block_num(py: Python<'_>) -> PyResult<u32> {
    current_block(py).map(|b| b.block_num())
}

fn current_block(py: Python<'_>) -> PyResult<kernel::RunContext> {
    block::current().ok_or_else(|| {
        errors::invalid_operation(
            py,
            "get_block_idx() and get_block_num() are only defined inside a running kernel".into(),
        )
    })
}

/// Names of the registered native kernels.
#[pyfunction]
pub fn kernel_names() -> Vec<String> {
    kernel::names()
}

/// What kind of number a launch argument is, as `numbers` classifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Number {
    /// `numbers.Integral`: int, numpy's integers (not bools), by their exact value.
    Int,
    /// `numbers.Complex` but not `numbers.Real`: both parts count.
    Complex,
    /// Anything else (floats, numpy's bool, other objects): tried with `__float__`.
    Other,
}

static INTEGRAL: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static COMPLEX: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static REAL: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static NP_INTEGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static NP_INEXACT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static NP_COMPLEX: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `module.<name>`, imported once into `cell`.
fn class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyAny>>,
    module: &str,
    name: &str,
) -> PyResult<&'py Bound<'py, PyAny>> {
    Ok(cell
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import(module)?.getattr(name)?.unbind())
        })?
        .bind(py))
}

/// How `numbers` classifies `a` (numpy registers its scalar types there), Python's and numpy's
/// bools counting as `Other`. `native_args` asks only about what is not a Python bool, int or
/// float; `block_dim_arg` asks about everything. numpy's own scalars are told apart by their
/// base classes first: an `isinstance` against a `numbers` class runs
/// `ABCMeta.__instancecheck__` in Python, 1.5 us each on these hosts, where a check against a
/// class is a walk of the type's bases in C. The `numbers` classes decide the rest.
fn number_kind(py: Python<'_>, a: &Bound<'_, PyAny>) -> PyResult<Number> {
    if a.is_instance_of::<PyBool>() {
        return Ok(Number::Other);
    }
    if a.is_instance_of::<PyInt>() || a.is_instance(class(py, &NP_INTEGER, "numpy", "integer")?)? {
        return Ok(Number::Int);
    }
    if a.is_instance(class(py, &NP_COMPLEX, "numpy", "complexfloating")?)? {
        return Ok(Number::Complex);
    }
    if a.is_instance(class(py, &NP_INEXACT, "numpy", "inexact")?)? {
        return Ok(Number::Other);
    }
    if a.is_instance(class(py, &INTEGRAL, "numbers", "Integral")?)? {
        return Ok(Number::Int);
    }
    if a.is_instance(class(py, &COMPLEX, "numbers", "Complex")?)?
        && !a.is_instance(class(py, &REAL, "numbers", "Real")?)?
    {
        return Ok(Number::Complex);
    }
    Ok(Number::Other)
}

static GENERIC: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// A numpy scalar (`numpy.generic`) as a typed value, or None for anything else.
fn typed_scalar(py: Python<'_>, a: &Bound<'_, PyAny>) -> PyResult<Option<Scalar>> {
    let generic = GENERIC
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(numpy(py)?.getattr("generic")?.unbind())
        })?
        .bind(py);
    if !a.is_instance(generic)? {
        return Ok(None);
    }
    let dtype = crate::convert::parse_dtype(py, &a.getattr("dtype")?)?;
    let bytes: Vec<u8> = a.call_method0("tobytes")?.extract()?;
    Scalar::from_bytes(dtype, &bytes)
        .map(Some)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

fn native_args(py: Python<'_>, args: &Bound<'_, PyTuple>, c_abi: bool) -> PyResult<Vec<KernelArg>> {
    let mut out = Vec::with_capacity(args.len());
    for (i, a) in args.iter().enumerate() {
        if let Ok(b) = a.cast::<PyDeviceBuffer>() {
            let b = b.get();
            b.require_c_contiguous(format_args!("args[{i}]"), "native kernels")?;
            let t =
                Tensor::new(b.buffer(py)?, b.offset, b.dtype, b.layout().shape()).map_err(RtErr)?;
            out.push(KernelArg::Tensor(t));
        } else if let Some(v) = c_abi.then(|| typed_scalar(py, &a)).transpose()?.flatten() {
            // A C ABI kernel gets a pointer to a value of the scalar's own dtype.
            out.push(KernelArg::Typed(v));
        } else if a.is_instance_of::<PyBool>() {
            out.push(KernelArg::Int(i64::from(a.extract::<bool>()?)));
        } else if a.is_instance_of::<PyInt>() {
            let v: i64 = a.extract().map_err(|_| {
                PyValueError::new_err(format!("args[{i}]: integer out of 64-bit range"))
            })?;
            out.push(KernelArg::Int(v));
        } else if a.is_instance_of::<PyFloat>() {
            out.push(KernelArg::Float(a.extract()?));
        } else {
            out.push(number_arg(py, &a, i)?);
        }
    }
    Ok(out)
}

/// Launch argument `i`, `a`, when it is neither a DeviceBuffer nor a Python bool, int or
/// float: an integer by its exact value (numpy.int64, numpy.uint32, ...; never through a
/// float), a complex number by both parts (complex, numpy.complex64/128: their `__float__`
/// would drop one), any other number through `__float__` (numpy floats, numpy.bool_).
fn number_arg(py: Python<'_>, a: &Bound<'_, PyAny>, i: usize) -> PyResult<KernelArg> {
    let kind = if a.is_instance_of::<PyComplex>() {
        Number::Complex
    } else {
        number_kind(py, a)?
    };
    match kind {
        Number::Int => {
            let v: i64 = a.call_method0("__index__")?.extract().map_err(|_| {
                PyValueError::new_err(format!("args[{i}]: integer out of 64-bit range"))
            })?;
            Ok(KernelArg::Int(v))
        }
        Number::Complex => {
            let z = a
                .call_method0("__complex__")
                .and_then(|z| z.cast_into::<PyComplex>().map_err(PyErr::from))?;
            Ok(KernelArg::Complex(z.real(), z.imag()))
        }
        Number::Other => match a.call_method0("__float__").and_then(|f| f.extract::<f64>()) {
            Ok(v) => Ok(KernelArg::Float(v)),
            Err(_) => Err(PyTypeError::new_err(format!(
                "args[{i}] must be a DeviceBuffer or a number for a native kernel, got {}",
                type_name(a)
            ))),
        },
    }
}

fn launch_native(
    py: Python<'_>,
    s: &Stream,
    k: kernel::KernelRef,
    args: &Bound<'_, PyTuple>,
    blocks: Option<u32>,
    c_abi: bool,
) -> PyResult<()> {
    let args = native_args(py, args, c_abi)?;
    if kernel::enqueue_blocks(s, k, args, blocks).map_err(RtErr)? {
        wait::after_enqueue(py, s)?;
    }
    Ok(())
}

fn to_tuple<'py>(
    py: Python<'py>,
    args: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    match args {
        None => Ok(PyTuple::empty(py)),
        Some(a) if a.is_none() => Ok(PyTuple::empty(py)),
        Some(a) => {
            if let Ok(t) = a.cast::<PyTuple>() {
                return Ok(t.clone());
            }
            if a.is_instance_of::<PyString>() {
                return Err(PyTypeError::new_err(
                    "args must be a tuple or list of arguments, got str",
                ));
            }
            let items: Vec<Bound<'py, PyAny>> = a
                .try_iter()
                .map_err(|_| {
                    PyTypeError::new_err(format!(
                        "args must be a tuple or list of arguments, got {}",
                        type_name(a)
                    ))
                })?
                .collect::<PyResult<_>>()?;
            PyTuple::new(py, items)
        }
    }
}

/// Queue `kernel` with `args` on `s`: a native kernel (`runtime.kernels.fill` or its name) or
/// any Python callable (runs on the stream's executor; DeviceBuffer arguments arrive as numpy
/// views sharing device memory).
pub fn launch_kernel(
    py: Python<'_>,
    s: &Stream,
    kernel: &Bound<'_, PyAny>,
    args: Option<&Bound<'_, PyAny>>,
    block_dim: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let blocks = block_dim_arg(block_dim)?;
    let args = to_tuple(py, args)?;
    if let Ok(k) = kernel.cast::<PyKernel>() {
        let k = k.get();
        return launch_native(py, s, k.kernel.clone(), &args, blocks, k.c_abi);
    }
    if let Ok(name) = kernel.cast::<PyString>() {
        let k = kernel::find(&name.to_cow()?).map_err(RtErr)?;
        return launch_native(py, s, k, &args, blocks, false);
    }
    if !kernel.is_callable() {
        return Err(PyTypeError::new_err(format!(
            "kernel must be a callable, a runtime.kernels kernel or a kernel name, got {}",
            type_name(kernel)
        )));
    }
    s.check().map_err(RtErr)?;
    // Views keep the memory of every buffer argument alive until the kernel has run.
    let mut held = Vec::with_capacity(args.len());
    let mut buffers = Vec::new();
    for a in args.iter() {
        if let Ok(b) = a.cast::<PyDeviceBuffer>() {
            buffers.push(b.get().buffer(py)?);
            held.push(Bound::new(py, b.get().share(py)?)?.into_any());
        } else {
            held.push(a);
        }
    }
    let op = PyOp {
        name: callable_name(kernel),
        func: kernel.clone().unbind(),
        args: PyTuple::new(py, held)?.unbind(),
        views: true,
    }
    .into_kernel_op(
        s,
        AccessSet::new(buffers.iter().map(|b| (b, Access::Write))),
        blocks.unwrap_or(1),
    );
    wait::submit(py, s, op)
}

/// Queue a host function `func(*args)` on `s`, run in stream order on the executor.
pub fn launch_host_func(
    py: Python<'_>,
    s: &Stream,
    func: &Bound<'_, PyAny>,
    args: &Bound<'_, PyTuple>,
) -> PyResult<()> {
    if !func.is_callable() {
        return Err(PyTypeError::new_err(format!(
            "func must be callable, got {}",
            type_name(func)
        )));
    }
    let op = PyOp {
        name: callable_name(func),
        func: func.clone().unbind(),
        args: args.clone().unbind(),
        views: false,
    }
    .into_op();
    wait::submit(py, s, op)
}
