//! Kernels: the `Kernel` class (native kernels from the registry), and launching on a stream —
//! native kernels with their arguments converted to `KernelArg`s (buffers as tensors, numbers
//! as exact integers or floats), Python callables and host functions as ops that attach to the
//! interpreter when they run.

use std::sync::Arc;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyComplex, PyComplexMethods, PyFloat, PyInt, PyString, PyTuple};
use runtime_core::error::KernelFailure;
use runtime_core::kernel::{self, KernelArg, Tensor};
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
    /// The stream op: `accesses` are the buffer arguments of a kernel, all as written (what
    /// Python code does with a view is not known), held while it runs so that no other work
    /// touches them meanwhile.
    fn into_op(self, accesses: AccessSet) -> Arc<dyn Op> {
        let name = self.name.clone();
        FnOp::with_accesses(name, OpKind::Compute, accesses, move || self.run())
    }
}

impl Drop for PyOp {
    /// Release the arguments now, attached to the interpreter: dropped detached, PyO3 would
    /// only decref them at some later attach, and a device buffer among them would keep its
    /// memory held after the kernel ran (an allocation waiting for that memory would fail).
    /// Once the interpreter is finalising nothing attaches; the arguments are left to it.
    fn drop(&mut self) {
        if !crate::interp::prepare() {
            return;
        }
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
        if !crate::interp::prepare() {
            return Err(KernelFailure::new(
                self.name.clone(),
                "the Python interpreter is shutting down: Python kernels cannot run any more"
                    .to_string(),
            ));
        }
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

/// A native kernel from the registry, by name.
#[pyclass(name = "Kernel", module = "runtime", frozen)]
pub struct PyKernel {
    #[pyo3(get)]
    name: String,
    kernel: Arc<dyn kernel::Kernel>,
}

#[pymethods]
impl PyKernel {
    #[new]
    fn new(name: &str) -> PyResult<Self> {
        let k = kernel::find(name).map_err(RtErr)?;
        Ok(PyKernel {
            name: name.to_string(),
            kernel: k,
        })
    }

    fn __repr__(&self) -> String {
        format!("runtime.kernels.{}", self.name)
    }

    /// Launch on `stream` (the current stream when None).
    #[pyo3(signature = (*args, stream=None))]
    fn __call__(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = stream_or_current(py, stream)?;
        launch_native(py, &s, self.kernel.clone(), args)
    }
}

/// Names of the registered native kernels.
#[pyfunction]
pub fn kernel_names() -> Vec<String> {
    kernel::names()
}

static INTEGRAL: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `numbers.Integral` (numpy registers its integer types there).
fn integral(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    Ok(INTEGRAL
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("numbers")?.getattr("Integral")?.unbind())
        })?
        .bind(py))
}

static COMPLEX: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static REAL: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `numbers.<name>`, imported once into `cell` (numpy registers its scalar types there: a
/// complex scalar is `Complex` but not `Real`).
fn abc<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyAny>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyAny>> {
    Ok(cell
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("numbers")?.getattr(name)?.unbind())
        })?
        .bind(py))
}

fn native_args(py: Python<'_>, args: &Bound<'_, PyTuple>) -> PyResult<Vec<KernelArg>> {
    let mut out = Vec::with_capacity(args.len());
    for (i, a) in args.iter().enumerate() {
        if let Ok(b) = a.cast::<PyDeviceBuffer>() {
            let b = b.get();
            let t =
                Tensor::new(b.buffer(py)?, b.offset, b.dtype, b.shape_usize()).map_err(RtErr)?;
            out.push(KernelArg::Tensor(t));
        } else if a.is_instance_of::<PyBool>() {
            out.push(KernelArg::Int(i64::from(a.extract::<bool>()?)));
        } else if a.is_instance_of::<PyInt>() {
            let v: i64 = a.extract().map_err(|_| {
                PyValueError::new_err(format!("args[{i}]: integer out of 64-bit range"))
            })?;
            out.push(KernelArg::Int(v));
        } else if a.is_instance_of::<PyFloat>() {
            out.push(KernelArg::Float(a.extract()?));
        } else if a.is_instance(integral(py)?)? {
            // Integers that are not Python ints (numpy.int64, numpy.uint32, ...): exact, by
            // their integer value, never through a float. (numpy.bool_ is not Integral.)
            let v: i64 = a.call_method0("__index__")?.extract().map_err(|_| {
                PyValueError::new_err(format!("args[{i}]: integer out of 64-bit range"))
            })?;
            out.push(KernelArg::Int(v));
        } else if a.is_instance_of::<PyComplex>()
            || (a.is_instance(abc(py, &COMPLEX, "Complex")?)?
                && !a.is_instance(abc(py, &REAL, "Real")?)?)
        {
            // complex, numpy.complex64/128: both parts (their `__float__` would drop one).
            let z = a
                .call_method0("__complex__")
                .and_then(|z| z.cast_into::<PyComplex>().map_err(PyErr::from))?;
            out.push(KernelArg::Complex(z.real(), z.imag()));
        } else if let Ok(v) = a.call_method0("__float__").and_then(|f| f.extract::<f64>()) {
            // numpy floats and other number-likes
            out.push(KernelArg::Float(v));
        } else {
            return Err(PyTypeError::new_err(format!(
                "args[{i}] must be a DeviceBuffer or a number for a native kernel, got {}",
                type_name(&a)
            )));
        }
    }
    Ok(out)
}

fn launch_native(
    py: Python<'_>,
    s: &Stream,
    k: Arc<dyn kernel::Kernel>,
    args: &Bound<'_, PyTuple>,
) -> PyResult<()> {
    let args = native_args(py, args)?;
    let op = kernel::prepare(s, k, args).map_err(RtErr)?;
    wait::submit(py, s, op)
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
) -> PyResult<()> {
    let args = to_tuple(py, args)?;
    if let Ok(k) = kernel.cast::<PyKernel>() {
        return launch_native(py, s, k.get().kernel.clone(), &args);
    }
    if let Ok(name) = kernel.cast::<PyString>() {
        let k = kernel::find(&name.to_cow()?).map_err(RtErr)?;
        return launch_native(py, s, k, &args);
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
    .into_op(AccessSet::new(buffers.iter().map(|b| (b, Access::Write))));
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
    .into_op(AccessSet::default());
    wait::submit(py, s, op)
}
