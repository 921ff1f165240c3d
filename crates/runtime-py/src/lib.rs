//! `runtime._runtime`: thin PyO3 bindings over `runtime-core`. They convert arguments,
//! release the GIL around every wait, and map errors in one place ([`errors`]); behaviour
//! lives in the core.

// Layers (each uses only those above it):
//   interp                      whether threads may attach; engine workers' thread states
//   errors                      error classes and the core-to-Python mapping
//   handles                     the handle classes' data and the runtime-generation check
//   context                     the context-local current device and streams (`with`)
//   convert                     argument conversion
//   wait                        GIL-released waits and submission
//   host, dlpack                buffer-protocol import/export, DLPack capsules
//   copy                        the one copy path (memcpy_*, memset)
//   buffer, memory, stats       the DeviceBuffer class, allocation, allocator statistics
//   async_pool                  MemoryAsyncPool (stream-ordered allocation's pool)
//   ipc                         inter-process buffers and events (handles, ipc_open, pickling)
//   device, event, kernel       Device and records, Event, Kernel and launches
//   stream                      Stream, Graph and the stream functions
//   comm                        Communicator, comm_init_all, comm_connect, groups (runtime.comm)
//   lifecycle                   init, shutdown, options
//   acl                         the pyACL face's native calls (runtime-acl's Rust API)
mod acl;
mod async_pool;
mod buffer;
mod comm;
mod context;
mod convert;
mod copy;
mod defer;
mod device;
mod dlpack;
mod errors;
mod event;
mod handles;
mod host;
mod interp;
mod ipc;
mod kernel;
mod lifecycle;
mod managed;
mod memory;
mod pinned;
mod pool;
mod probe;
mod stats;
mod stream;
mod testing;
mod trace;
mod views;
mod wait;

use std::sync::Arc;

use pyo3::prelude::*;

/// This extension's ACL implementation, for a `libascendcl.so` loaded into the same process:
/// the library looks this symbol up and calls into the extension's runtime instead of
/// starting its own (one runtime per process; see `runtime-acl`'s `dispatch` module).
#[no_mangle]
pub extern "C" fn runtime_acl_provider_v1() -> *const ascendcl::capi::Table {
    ascendcl::provider_table()
}

#[pymodule]
fn _runtime(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    // An engine worker keeps one Python thread state from its first Python kernel on.
    runtime_core::bindings::set_thread_wrapper(Arc::new(interp::worker));
    lifecycle::register_process_hooks(m)?;
    // Commands a stream holds before a launch waits for room (back-pressure).
    m.add("MAX_QUEUED", runtime_core::stream::MAX_QUEUED)?;
    m.add_class::<handles::PyDevice>()?;
    m.add_class::<device::DeviceProperties>()?;
    m.add_class::<device::MemoryInfo>()?;
    m.add_class::<device::ComputeInfo>()?;
    m.add_class::<handles::PyDeviceBuffer>()?;
    m.add_class::<handles::PyStream>()?;
    m.add_class::<handles::PyEvent>()?;
    m.add_class::<event::PyCompletion>()?;
    m.add_class::<stream::PyGraph>()?;
    m.add_class::<kernel::PyKernel>()?;
    m.add_class::<comm::PyCommunicator>()?;
    m.add_function(wrap_pyfunction!(comm::comm_init_all, m)?)?;
    m.add_function(wrap_pyfunction!(comm::comm_connect, m)?)?;
    m.add_function(wrap_pyfunction!(comm::comm_get_unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(comm::comm_group_start, m)?)?;
    m.add_function(wrap_pyfunction!(comm::comm_group_end, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::init, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::is_initialized, m)?)?;
    m.add_function(wrap_pyfunction!(device::get_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(device::get_available_devices, m)?)?;
    m.add_function(wrap_pyfunction!(device::get_device_properties, m)?)?;
    m.add_function(wrap_pyfunction!(device::get_device_memory_info, m)?)?;
    m.add_function(wrap_pyfunction!(device::get_device_compute_info, m)?)?;
    m.add_function(wrap_pyfunction!(device::set_device, m)?)?;
    m.add_function(wrap_pyfunction!(device::get_device, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::set_option, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::get_option, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::option_names, m)?)?;
    m.add_function(wrap_pyfunction!(memory::device_malloc, m)?)?;
    m.add_function(wrap_pyfunction!(memory::device_free, m)?)?;
    m.add_function(wrap_pyfunction!(memory::malloc_async, m)?)?;
    m.add_function(wrap_pyfunction!(memory::free_async, m)?)?;
    m.add_class::<async_pool::PyMemoryAsyncPool>()?;
    m.add_class::<pool::PyMemoryPool>()?;
    m.add_function(wrap_pyfunction!(pool::get_default_memory_pool, m)?)?;
    m.add_function(wrap_pyfunction!(pool::set_allocator, m)?)?;
    m.add_function(wrap_pyfunction!(pool::get_allocator, m)?)?;
    m.add_function(wrap_pyfunction!(copy::memcpy_host_to_device, m)?)?;
    m.add_function(wrap_pyfunction!(copy::memcpy_device_to_host, m)?)?;
    m.add_function(wrap_pyfunction!(copy::memcpy_d2d, m)?)?;
    m.add_function(wrap_pyfunction!(copy::memset, m)?)?;
    m.add_function(wrap_pyfunction!(stats::empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(stats::memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(stats::reset_peak_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(memory::empty, m)?)?;
    m.add_function(wrap_pyfunction!(memory::to_device, m)?)?;
    m.add_function(wrap_pyfunction!(ipc::ipc_open, m)?)?;
    m.add_function(wrap_pyfunction!(stream::stream_synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(stream::current_stream, m)?)?;
    m.add_function(wrap_pyfunction!(stream::default_stream, m)?)?;
    m.add_function(wrap_pyfunction!(stream::stream_priority_range, m)?)?;
    m.add_class::<stream::AutoSynchronize>()?;
    m.add_class::<defer::DeferCleanup>()?;
    m.add_function(wrap_pyfunction!(defer::_defer_state, m)?)?;
    m.add_function(wrap_pyfunction!(probe::_cross_core_ns, m)?)?;
    m.add_function(wrap_pyfunction!(stream::set_stream, m)?)?;
    m.add_function(wrap_pyfunction!(stream::is_current_stream_capturing, m)?)?;
    m.add_function(wrap_pyfunction!(defer::defer_cleanup, m)?)?;
    m.add_function(wrap_pyfunction!(kernel::kernel_names, m)?)?;
    m.add_function(wrap_pyfunction!(kernel::get_block_idx, m)?)?;
    m.add_function(wrap_pyfunction!(kernel::get_block_num, m)?)?;
    m.add("MAX_BLOCK_DIM", runtime_core::kernel::MAX_BLOCK_DIM)?;
    m.add_function(wrap_pyfunction!(trace::trace_start, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_stop, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_enabled, m)?)?;
    // Memory fraction, pinned and managed memory, 2-D copies.
    m.add_class::<pinned::PyPinnedMemory>()?;
    m.add_class::<pinned::PyPinnedMemoryPointer>()?;
    m.add_function(wrap_pyfunction!(stats::set_per_process_memory_fraction, m)?)?;
    m.add_function(wrap_pyfunction!(stats::get_per_process_memory_fraction, m)?)?;
    m.add_function(wrap_pyfunction!(pinned::_malloc_host, m)?)?;
    m.add_function(wrap_pyfunction!(pinned::free_host, m)?)?;
    m.add_function(wrap_pyfunction!(pinned::host_register, m)?)?;
    m.add_function(wrap_pyfunction!(pinned::host_unregister, m)?)?;
    m.add_function(wrap_pyfunction!(pinned::host_is_registered, m)?)?;
    m.add_function(wrap_pyfunction!(pinned::host_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(pinned::host_empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(managed::malloc_managed, m)?)?;
    m.add_function(wrap_pyfunction!(managed::prefetch, m)?)?;
    m.add_function(wrap_pyfunction!(managed::mem_advise, m)?)?;
    m.add_function(wrap_pyfunction!(managed::mem_range_attributes, m)?)?;
    m.add_function(wrap_pyfunction!(copy::memcpy_2d, m)?)?;
    m.add_function(wrap_pyfunction!(testing::_inject_alloc_failure, m)?)?;
    m.add_function(wrap_pyfunction!(testing::_register_test_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(testing::_inject_thread_spawn_failures, m)?)?;
    acl::register(m)?;
    Ok(())
}
