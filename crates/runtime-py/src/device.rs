//! Lifecycle, options, devices and their property records.

use std::cell::RefCell;

use pyo3::exceptions::{PyKeyError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString};
use runtime_core::config::ConfigBuilder;
use runtime_core::device::Device;
use runtime_core::runtime as rt;

use crate::errors::RtResult;
use crate::wait;

/// Defines an immutable record class: getters, `repr`, `==`, `to_dict()`, and `keys()` +
/// `__getitem__` so that `dict(record)` works.
macro_rules! record {
    ($(#[$doc:meta])* $name:ident, $pyname:literal { $($(#[$fdoc:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[pyclass(name = $pyname, module = "runtime", frozen, eq, get_all)]
        #[derive(Clone, PartialEq)]
        pub struct $name { $($(#[$fdoc])* pub $field: $ty),* }

        #[pymethods]
        impl $name {
            fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                let d = PyDict::new(py);
                $(d.set_item(stringify!($field), self.$field.clone())?;)*
                Ok(d)
            }
            fn keys(&self) -> Vec<&'static str> {
                vec![$(stringify!($field)),*]
            }
            fn __getitem__<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
                self.to_dict(py)?.get_item(key)?.ok_or_else(|| PyKeyError::new_err(key.to_string()))
            }
            fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
                let d = self.to_dict(py)?;
                let mut parts = Vec::new();
                for (k, v) in d.iter() {
                    parts.push(format!("{}={}", k, v.repr()?));
                }
                Ok(format!("{}({})", $pyname, parts.join(", ")))
            }
        }
    };
}

record!(
    /// What a device reports about itself.
    DeviceProperties, "DeviceProperties" {
        index: usize, name: String, total_memory: u64, clock_rate: u64, cores: u32,
        fpeak: f64, memory_bandwidth: f64, profile: String,
    }
);

record!(
    /// Memory of one device in bytes: `used` (live allocations) + `cached` + `free` == `total`;
    /// `reserved` = `used` + `cached`; `peak` is the highest `used` since the last reset.
    MemoryInfo, "MemoryInfo" {
        device: usize, total: u64, used: u64, free: u64, reserved: u64, cached: u64, peak: u64,
    }
);

record!(
    /// Compute capability of one device.
    ComputeInfo, "ComputeInfo" {
        device: usize, fpeak: f64, cores: u32, clock_rate: u64, compute_engines: usize,
    }
);

/// Read a device argument: a `Device` or an int (not a bool).
pub fn device_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<i64> {
    if let Ok(d) = obj.cast::<PyDevice>() {
        return Ok(d.get().index as i64);
    }
    if obj.is_instance_of::<PyBool>() || obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{arg} must be a runtime.Device or an int, got {}",
            obj.get_type().name()?
        )));
    }
    if obj.is_instance_of::<pyo3::types::PyInt>() {
        // Out-of-range integers are invalid devices, not type errors.
        return Ok(obj.extract::<i64>().unwrap_or(i64::MAX));
    }
    obj.extract::<i64>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{arg} must be a runtime.Device or an int, got {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })
}

/// A required device argument: like [`resolve`] but `None` is a `TypeError` (it is not "the
/// current device" where the signature says `Device | int`).
pub fn resolve_required(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<Device> {
    // Fix: `device_malloc(None, n)` and `Device(None)` used to take None as the current device.
    if obj.is_none() {
        return Err(PyTypeError::new_err(format!(
            "{arg} must be a runtime.Device or an int, got None"
        )));
    }
    resolve(Some(obj), arg)
}

/// Resolve an optional device argument (`None` = the thread's current device).
pub fn resolve(obj: Option<&Bound<'_, PyAny>>, arg: &str) -> PyResult<Device> {
    let r = rt::get().map_err(crate::errors::RtErr)?;
    let idx = match obj {
        Some(o) if !o.is_none() => device_arg(o, arg)?,
        _ => runtime_core::device::current_device_index() as i64,
    };
    Ok(r.device(idx).map_err(crate::errors::RtErr)?.clone())
}

thread_local! {
    static DEVICE_STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// A virtual device. `with runtime.Device(1):` makes it the thread's current device.
#[pyclass(name = "Device", module = "runtime", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash)]
pub struct PyDevice {
    #[pyo3(get)]
    index: usize,
}

impl PyDevice {
    pub fn from_index(index: usize) -> Self {
        PyDevice { index }
    }
}

#[pymethods]
impl PyDevice {
    #[new]
    fn new(index: &Bound<'_, PyAny>) -> PyResult<Self> {
        let d = resolve_required(index, "index")?;
        Ok(PyDevice { index: d.index() })
    }

    /// Properties of this device.
    fn get_properties(&self) -> PyResult<DeviceProperties> {
        get_device_properties_impl(self.index as i64)
    }

    /// Memory usage of this device.
    fn get_memory_info(&self) -> PyResult<MemoryInfo> {
        memory_info_impl(self.index as i64)
    }

    /// Wait for every stream of this device (GIL released, Ctrl-C works).
    #[pyo3(signature = (timeout=None))]
    fn synchronize(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let timeout = wait::timeout_obj(timeout)?; // Fix: see `wait::timeout_obj`
        let d = resolve_index(self.index as i64)?;
        let mut res = Ok(true);
        wait::wait(
            py,
            || format!("Device({})", self.index),
            timeout,
            |slice| {
                res = d.synchronize(Some(slice));
                !matches!(res, Ok(false))
            },
        )?;
        res.map(|_| ()).map_err(|e| crate::errors::RtErr(e).into())
    }

    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let prev = runtime_core::device::current_device_index();
        rt::set_device(slf.get().index as i64).map_err(crate::errors::RtErr)?;
        DEVICE_STACK.with(|s| s.borrow_mut().push(prev));
        Ok(slf)
    }

    fn __exit__(
        &self,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) {
        if let Some(prev) = DEVICE_STACK.with(|s| s.borrow_mut().pop()) {
            let _ = rt::set_device(prev as i64);
        }
    }

    fn __repr__(&self) -> String {
        format!("runtime.Device({})", self.index)
    }

    fn __int__(&self) -> usize {
        self.index
    }

    fn __index__(&self) -> usize {
        self.index
    }
}

fn resolve_index(i: i64) -> PyResult<Device> {
    let r = rt::get().map_err(crate::errors::RtErr)?;
    Ok(r.device(i).map_err(crate::errors::RtErr)?.clone())
}

fn get_device_properties_impl(i: i64) -> PyResult<DeviceProperties> {
    let d = resolve_index(i)?;
    let p = d.properties();
    Ok(DeviceProperties {
        index: p.index,
        name: p.name.clone(),
        total_memory: p.total_memory,
        clock_rate: p.clock_rate,
        cores: p.cores,
        fpeak: p.fpeak,
        memory_bandwidth: p.memory_bandwidth,
        profile: p.profile.clone(),
    })
}

fn memory_info_impl(i: i64) -> PyResult<MemoryInfo> {
    let d = resolve_index(i)?;
    let s = d.memory().stats();
    Ok(MemoryInfo {
        device: d.index(),
        total: s.total,
        used: s.allocated,
        free: s.free,
        reserved: s.reserved,
        cached: s.cached,
        peak: s.peak_allocated,
    })
}

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
                pyo3::exceptions::PyValueError::new_err(format!(
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
                        o.get_type()
                            .name()
                            .map(|n| n.to_string())
                            .unwrap_or_default()
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
    py.detach(|| rt::init(&b)).map_err(crate::errors::RtErr)?;
    Ok(())
}

/// Shut the runtime down: waits for queued work, invalidates every handle. A no-op when not
/// initialised.
#[pyfunction]
pub fn shutdown(py: Python<'_>) {
    crate::stream::clear_thread_state();
    py.detach(rt::shutdown);
}

/// Whether the runtime is initialised.
#[pyfunction]
pub fn is_initialized() -> bool {
    rt::is_initialized()
}

/// Number of devices.
#[pyfunction]
pub fn get_device_count() -> RtResult<usize> {
    Ok(rt::get()?.devices().len())
}

/// All devices.
#[pyfunction]
pub fn get_available_devices() -> RtResult<Vec<PyDevice>> {
    Ok(rt::get()?
        .devices()
        .iter()
        .map(|d| PyDevice { index: d.index() })
        .collect())
}

/// Properties of device `device` (a Device or an int).
#[pyfunction]
pub fn get_device_properties(device: &Bound<'_, PyAny>) -> PyResult<DeviceProperties> {
    get_device_properties_impl(device_arg(device, "device")?)
}

/// Memory usage of device `device`.
#[pyfunction]
pub fn get_device_memory_info(device: &Bound<'_, PyAny>) -> PyResult<MemoryInfo> {
    memory_info_impl(device_arg(device, "device")?)
}

/// Compute capability of device `device`.
#[pyfunction]
pub fn get_device_compute_info(device: &Bound<'_, PyAny>) -> PyResult<ComputeInfo> {
    let d = resolve_index(device_arg(device, "device")?)?;
    let c = d.compute_info();
    Ok(ComputeInfo {
        device: d.index(),
        fpeak: c.fpeak,
        cores: c.cores,
        clock_rate: c.clock_rate,
        compute_engines: c.compute_engines,
    })
}

/// Make `device` the calling thread's current device.
#[pyfunction]
pub fn set_device(device: &Bound<'_, PyAny>) -> PyResult<()> {
    rt::set_device(device_arg(device, "device")?).map_err(crate::errors::RtErr)?;
    Ok(())
}

/// The calling thread's current device index (default 0).
#[pyfunction]
pub fn get_device() -> RtResult<usize> {
    rt::get()?;
    Ok(runtime_core::device::current_device_index())
}

/// Set a runtime option: "enableMemoryReuse", "enablePipelining" or "enableAsync" (bool).
#[pyfunction]
pub fn set_option(name: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
    let name: String = name
        .extract()
        .map_err(|_| PyTypeError::new_err("name must be a str"))?;
    // Validate the name first so a bad name wins over a bad value.
    rt::get_option(&name).map_err(crate::errors::RtErr)?;
    let value = value.cast::<PyBool>().map_err(|_| {
        PyTypeError::new_err(format!(
            "value for option {name:?} must be a bool, got {}",
            value
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    rt::set_option(&name, value.is_true()).map_err(crate::errors::RtErr)?;
    Ok(())
}

/// Read a runtime option.
#[pyfunction]
pub fn get_option(name: &Bound<'_, PyAny>) -> PyResult<bool> {
    let name: String = name
        .extract()
        .map_err(|_| PyTypeError::new_err("name must be a str"))?;
    Ok(rt::get_option(&name).map_err(crate::errors::RtErr)?)
}

/// The valid option names.
#[pyfunction]
pub fn option_names() -> Vec<&'static str> {
    rt::OPTION_NAMES.to_vec()
}
