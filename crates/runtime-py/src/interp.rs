//! Whether runtime threads may attach to the interpreter, and the Python thread state each
//! engine worker keeps.
//!
//! An engine worker gets a Python thread state at its first Python kernel and keeps it for
//! its lifetime, detached except while it runs Python code (attaching then costs tens of
//! nanoseconds). A worker that never runs Python code never touches the interpreter. Once the
//! interpreter is finalising, no runtime thread attaches again: a Python kernel fails instead
//! (its thread could not get the interpreter lock back), and a stopping worker leaves its
//! thread state to the interpreter.

use std::cell::Cell;

use pyo3::ffi;

/// `Py_IsFinalizing` (public since 3.13; `_Py_IsFinalizing` before), looked up once.
fn finalizing() -> bool {
    type IsFinalizing = unsafe extern "C" fn() -> std::os::raw::c_int;
    static F: std::sync::OnceLock<Option<IsFinalizing>> = std::sync::OnceLock::new();
    let f = F.get_or_init(|| {
        for name in [c"Py_IsFinalizing", c"_Py_IsFinalizing"] {
            // SAFETY: dlsym on the already loaded interpreter (RTLD_DEFAULT) with a valid
            // C string; the symbol, when found, has this signature in every CPython.
            let p = unsafe { dlsym(std::ptr::null_mut(), name.as_ptr()) };
            if !p.is_null() {
                // SAFETY: as above.
                return Some(unsafe {
                    std::mem::transmute::<*mut std::ffi::c_void, IsFinalizing>(p)
                });
            }
        }
        None
    });
    // SAFETY: a CPython API function that may be called without the interpreter lock.
    f.is_some_and(|f| unsafe { f() } != 0)
}

extern "C" {
    fn dlsym(
        handle: *mut std::ffi::c_void,
        symbol: *const std::os::raw::c_char,
    ) -> *mut std::ffi::c_void;
}

/// Whether a runtime thread may attach to the interpreter now: it is initialised and not
/// finalising.
pub fn available() -> bool {
    // SAFETY: may be called at any time.
    (unsafe { ffi::Py_IsInitialized() } != 0) && !finalizing()
}

thread_local! {
    /// On an engine worker: whether it runs under [`worker`], and the thread state it keeps.
    static WORKER: Cell<bool> = const { Cell::new(false) };
    static KEPT: Cell<Option<ffi::PyGILState_STATE>> = const { Cell::new(None) };
}

/// Before a Python call on the current thread: on an engine worker, make sure it has the
/// thread state it keeps (made now, detached, at its first Python kernel). Returns false,
/// attaching nothing, when the interpreter is not available.
pub fn prepare() -> bool {
    if !available() {
        return false;
    }
    if WORKER.with(Cell::get) && KEPT.with(Cell::get).is_none() {
        // SAFETY: the interpreter is initialised and this thread is not attached (engine
        // workers run detached); the state is released by `worker` at the thread's end.
        let g = unsafe { ffi::PyGILState_Ensure() };
        // SAFETY: attached just now; detaching keeps the thread state for the next attach.
        unsafe { ffi::PyEval_SaveThread() };
        KEPT.with(|k| k.set(Some(g)));
    }
    true
}

/// The engine worker thread wrapper: runs the worker's body, then gives back the thread
/// state it kept, unless the interpreter is finalising (getting the lock back could end the
/// thread mid-way; the interpreter deletes the state itself).
pub fn worker(body: Box<dyn FnOnce() + Send>) {
    WORKER.with(|w| w.set(true));
    body();
    if let Some(g) = KEPT.with(Cell::take) {
        if available() {
            // SAFETY: the state made in `prepare`, detached; re-attach and release it once.
            unsafe {
                let ts = ffi::PyGILState_GetThisThreadState();
                ffi::PyEval_RestoreThread(ts);
                ffi::PyGILState_Release(g);
            }
        }
    }
}
