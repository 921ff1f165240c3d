//! `runtime._runtime`: thin PyO3 bindings over `runtime-core`. They convert arguments,
//! release the GIL around every wait, and map errors in one place ([`errors`]); behaviour
//! lives in the core.

mod device;
mod dlpack;
mod errors;
mod memory;
mod stream;
mod testing;
mod trace;
mod wait;

use std::sync::Arc;

use pyo3::prelude::*;

#[pymodule]
fn _runtime(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    // Each engine worker attaches once and keeps its Python thread state for its lifetime,
    // detached except while it runs Python code.
    runtime_core::stream::engine::set_thread_wrapper(Arc::new(|body| {
        Python::attach(|py| py.detach(body));
    }));
    // Commands a stream holds before a launch waits for room (back-pressure).
    m.add("MAX_QUEUED", runtime_core::stream::MAX_QUEUED)?;
    m.add_class::<device::PyDevice>()?;
    m.add_class::<device::DeviceProperties>()?;
    m.add_class::<device::MemoryInfo>()?;
    m.add_class::<device::ComputeInfo>()?;
    m.add_class::<memory::PyDeviceBuffer>()?;
    m.add_class::<stream::PyStream>()?;
    m.add_class::<stream::PyEvent>()?;
    m.add_class::<stream::PyGraph>()?;
    m.add_class::<stream::PyKernel>()?;
    m.add_function(wrap_pyfunction!(device::init, m)?)?;
    m.add_function(wrap_pyfunction!(device::shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(device::is_initialized, m)?)?;
    m.add_function(wrap_pyfunction!(device::get_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(device::get_available_devices, m)?)?;
    m.add_function(wrap_pyfunction!(device::get_device_properties, m)?)?;
    m.add_function(wrap_pyfunction!(device::get_device_memory_info, m)?)?;
    m.add_function(wrap_pyfunction!(device::get_device_compute_info, m)?)?;
    m.add_function(wrap_pyfunction!(device::set_device, m)?)?;
    m.add_function(wrap_pyfunction!(device::get_device, m)?)?;
    m.add_function(wrap_pyfunction!(device::set_option, m)?)?;
    m.add_function(wrap_pyfunction!(device::get_option, m)?)?;
    m.add_function(wrap_pyfunction!(device::option_names, m)?)?;
    m.add_function(wrap_pyfunction!(memory::device_malloc, m)?)?;
    m.add_function(wrap_pyfunction!(memory::device_free, m)?)?;
    m.add_function(wrap_pyfunction!(memory::memcpy_host_to_device, m)?)?;
    m.add_function(wrap_pyfunction!(memory::memcpy_device_to_host, m)?)?;
    m.add_function(wrap_pyfunction!(memory::memcpy_d2d, m)?)?;
    m.add_function(wrap_pyfunction!(memory::memset, m)?)?;
    m.add_function(wrap_pyfunction!(memory::empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(memory::memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(memory::reset_peak_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(memory::empty, m)?)?;
    m.add_function(wrap_pyfunction!(memory::to_device, m)?)?;
    m.add_function(wrap_pyfunction!(stream::stream_synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(stream::current_stream, m)?)?;
    m.add_function(wrap_pyfunction!(stream::default_stream, m)?)?;
    m.add_function(wrap_pyfunction!(stream::stream_priority_range, m)?)?;
    m.add_function(wrap_pyfunction!(stream::kernel_names, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_start, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_stop, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_enabled, m)?)?;
    m.add_function(wrap_pyfunction!(testing::_inject_alloc_failure, m)?)?;
    m.add_function(wrap_pyfunction!(testing::_register_test_kernels, m)?)?;
    Ok(())
}
