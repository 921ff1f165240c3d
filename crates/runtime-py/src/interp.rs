//! Whether runtime threads may attach to the interpreter, and the Python thread state each
//! engine worker keeps.
//!
//! An engine worker gets a Python thread state at its first Python kernel and keeps it for
//! its lifetime, detached except while it runs Python code (attaching then costs tens of
//! nanoseconds). A worker that never runs Python code never touches the interpreter. Once the
//! interpreter is finalising, no runtime thread attaches again: a Python kernel fails instead
//! (its thread could not get the interpreter lock back), and a stopping worker leaves its
//! thread state to the interpreter.
//!
//! Checking for finalisation before attaching leaves a window: a thread that attached just
//! before (an interprocess event's watcher calling a completion callback, say) can have its
//! callback give up the interpreter lock (any I/O does) and ask for it back once finalising
//! has begun. CPython then ends the thread where it stands, and the thread state's release on
//! the way out aborted the process ("PyGILState_Release: thread state ... must be current").
//! So every attach from a runtime thread passes a gate ([`prepare`] returns an [`Inside`]),
//! and the last exit hook closes it ([`close`]): no runtime thread attaches from then on, and
//! those inside are waited for before finalising starts. Python kernels alone still pass
//! ([`prepare_kernel`]): from then on a launch waits for its kernel, so one launched by a later
//! exit hook runs while that hook waits for it.

use std::cell::Cell;
use std::time::Duration;

use pyo3::ffi;
use runtime_core::bindings::{EntryGate, EntryGuard};

/// Runtime threads between [`prepare`] and the drop of its [`Inside`]: one atomic word, no
/// lock (a lock held by another thread at `fork()` stays held in the child), made without
/// lazy initialisation for the same reason.
static GATE: EntryGate = EntryGate::new();

thread_local! {
    /// The [`Inside`]s this thread holds: after `fork()` the child's one thread counts just
    /// these ([`forget_inside`]).
    static HELD: Cell<usize> = const { Cell::new(0) };
}

/// A runtime thread's leave to attach to the interpreter: from [`prepare`] until dropped
/// (hold it until the thread has detached again).
#[must_use = "the thread may attach only while it holds this"]
pub struct Inside {
    _guard: EntryGuard<'static>,
}

impl Inside {
    fn new(guard: EntryGuard<'static>) -> Inside {
        HELD.with(|h| h.set(h.get() + 1));
        Inside { _guard: guard }
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        // The guard leaves the gate after this, as the field is dropped.
        HELD.with(|h| h.set(h.get().saturating_sub(1)));
    }
}

/// Enter the gate: `None` once [`close`] ran (unless `awaited`) or the interpreter is not
/// available. Either this thread sees the gate closed or `close` sees it inside and waits
/// for it (`runtime_core::bindings::EntryGate`).
fn enter(awaited: bool) -> Option<Inside> {
    let entered = GATE.enter_even_if_closed();
    let open = entered.was_open();
    let inside = Inside::new(entered.guard());
    ((awaited || open) && available()).then_some(inside)
}

/// At interpreter exit, from the last exit hook with the interpreter lock released: no
/// runtime thread attaches from now on, and the threads inside are waited for, up to
/// `limit` (a callback that never returns must not hold the exit for ever). Returns whether
/// they all left.
pub fn close(limit: Duration) -> bool {
    GATE.close(Some(limit))
}

/// In a child after `fork()`: the threads counted inside were the parent's, except for the
/// `Inside`s the forking thread (the child's one thread) holds itself.
pub fn forget_inside() {
    GATE.after_fork(HELD.with(Cell::get));
}

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

/// Before a Python call on the current thread: enter the gate, and on an engine worker make
/// sure it has the thread state it keeps (made now, detached, at its first Python kernel).
/// Returns `None`, attaching nothing, when the interpreter is not available or exiting; the
/// thread may attach while it holds the [`Inside`].
pub fn prepare() -> Option<Inside> {
    prepare_as(false)
}

/// [`prepare`] for a Python kernel, which passes the closed gate: after the runtime's exit
/// hooks every launch waits for its kernel (`enableAsync` off), so a kernel launched by a
/// later exit hook runs while that hook's thread waits, and finalising cannot begin meanwhile.
pub fn prepare_kernel() -> Option<Inside> {
    prepare_as(true)
}

fn prepare_as(awaited: bool) -> Option<Inside> {
    let inside = enter(awaited)?;
    if WORKER.with(Cell::get) && KEPT.with(Cell::get).is_none() {
        // SAFETY: the interpreter is initialised and this thread is not attached (engine
        // workers run detached); the state is released by `worker` at the thread's end.
        let g = unsafe { ffi::PyGILState_Ensure() };
        // SAFETY: attached just now; detaching keeps the thread state for the next attach.
        unsafe { ffi::PyEval_SaveThread() };
        KEPT.with(|k| k.set(Some(g)));
    }
    Some(inside)
}

/// The engine worker thread wrapper: runs the worker's body, then gives back the thread
/// state it kept, unless the interpreter is finalising (getting the lock back could end the
/// thread mid-way; the interpreter deletes the state itself).
pub fn worker(body: Box<dyn FnOnce() + Send>) {
    WORKER.with(|w| w.set(true));
    body();
    if let Some(g) = KEPT.with(Cell::take) {
        if let Some(_inside) = enter(false) {
            // SAFETY: the state made in `prepare`, detached; re-attach and release it once.
            unsafe {
                let ts = ffi::PyGILState_GetThisThreadState();
                ffi::PyEval_RestoreThread(ts);
                ffi::PyGILState_Release(g);
            }
        }
    }
}
