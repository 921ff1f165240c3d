//! `defer_cleanup()` (numba): a context manager over the core's defer scope
//! (`runtime_core::memory::defer`); `DeviceBuffer` handles release their memory through it.

use pyo3::prelude::*;
use runtime_core::memory::defer::{self, DeferGuard};

/// What `defer_cleanup()` returns: while its `with` block runs, device memory let go of
/// (handles dropped or passed to `device_free`) stays allocated; it is freed when the
/// outermost such block ends.
#[pyclass(name = "_DeferCleanup", module = "runtime._runtime", frozen)]
pub struct DeferCleanup {
    guards: parking_lot::Mutex<Vec<DeferGuard>>,
}

#[pymethods]
impl DeferCleanup {
    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf.get().guards.lock().push(defer::enter());
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) {
        let guard = self.guards.lock().pop();
        // Closing the outermost scope frees the held blocks: without the GIL.
        py.detach(|| drop(guard));
    }
}

/// Defer deallocations while the returned context manager's block runs (numba's
/// `cuda.defer_cleanup()`).
#[pyfunction]
pub fn defer_cleanup() -> DeferCleanup {
    DeferCleanup {
        guards: parking_lot::Mutex::new(Vec::new()),
    }
}

/// `(open scopes, buffers held)`: for tests.
#[pyfunction]
pub fn _defer_state() -> (usize, usize) {
    defer::state()
}
