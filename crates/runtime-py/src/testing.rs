//! Fault-injection hooks for the test suites (private: `runtime._runtime._inject_*`).

use pyo3::prelude::*;

use crate::convert::resolve_required;

/// Make the `nth` allocation on `device` from now fail with OutOfMemoryError (0 disarms).
#[pyfunction]
pub fn _inject_alloc_failure(device: &Bound<'_, PyAny>, nth: u64) -> PyResult<()> {
    resolve_required(device, "device")?
        .memory()
        .inject_alloc_failure(nth);
    Ok(())
}

/// Register the native fault kernels `test_panic` and `test_error`.
#[pyfunction]
pub fn _register_test_kernels() {
    runtime_core::kernel::testing::register();
}

/// Make the next `n` thread starts of the runtime (engine workers, memory scrubbers, copy
/// helpers) fail as if the OS refused them (0 disarms).
#[pyfunction]
pub fn _inject_thread_spawn_failures(n: u64) {
    runtime_core::runtime::inject_thread_spawn_failures(n);
}
