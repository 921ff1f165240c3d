//! `fork()`: ACL's process-wide locks are taken by a `pthread_atfork` prepare handler, so that
//! no other thread is inside one when the process is copied, and released in both processes
//! afterwards. In the child, ACL starts over uninitialised: the runtime-core child handler (run
//! before this one) abandons the parent's runtime, so every handle and allocation ACL held
//! belongs to it; they are forgotten (leaked, as the core leaks the runtime), and `aclInit`
//! in the child starts a runtime of its own.
//!
//! The locks are `parking_lot` mutexes (no reader-writer locks: releasing one in a child whose
//! parked threads vanished could leave it handed to a vanished writer, which a release as
//! reader cannot undo).
//!
//! The handlers are installed at the first `aclInit`, after the core's (which the runtime
//! installs when it starts): prepare handlers run in reverse order of installation, so ACL's
//! locks, which are taken before the core's in every call, are taken first here too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Longest the prepare handler waits for one lock: a thread that holds one only does
/// bookkeeping under it, or waits for streams (`aclFinalize`, `aclrtResetDevice`); if it is not
/// free by then the fork goes ahead without it and the child repairs it.
const WAIT: Duration = Duration::from_secs(2);

/// The locks [`Guarded`] handles.
pub(crate) trait ForkLock {
    /// Take the lock exclusively within `wait`, forgetting the guard; whether it was taken.
    fn take_for(&self, wait: Duration) -> bool;
    /// Release a hold whose guard was forgotten.
    ///
    /// # Safety
    /// The lock is held (by a forgotten guard of this thread, or by threads that no longer
    /// exist) and no guard of it is alive.
    unsafe fn release(&self);
    /// Whether it is held at all.
    fn is_held(&self) -> bool;
}

impl<T> ForkLock for parking_lot::Mutex<T> {
    fn take_for(&self, wait: Duration) -> bool {
        self.try_lock_for(wait).map(std::mem::forget).is_some()
    }
    unsafe fn release(&self) {
        // An unlock with threads parked on the lock may hand it to one of them (parking_lot's
        // eventual fairness); in a child those threads no longer exist, so release again until
        // no parked one is left (each hand-off takes one off the queue).
        while self.is_locked() {
            // SAFETY: the caller's contract; after a hand-off the holder is a vanished thread.
            unsafe { self.force_unlock() }
        }
    }
    fn is_held(&self) -> bool {
        self.is_locked()
    }
}

/// A process-wide lock as the fork handlers take and release it.
pub(crate) struct Guarded<L: 'static> {
    lock: fn() -> &'static L,
    held: AtomicBool,
}

impl<L: ForkLock> Guarded<L> {
    pub(crate) const fn new(lock: fn() -> &'static L) -> Self {
        Guarded {
            lock,
            held: AtomicBool::new(false),
        }
    }

    /// Prepare handler: take the lock within [`WAIT`].
    pub(crate) fn before_fork(&self) {
        let took = (self.lock)().take_for(WAIT);
        self.held.store(took, Ordering::SeqCst);
    }

    /// Parent or child handler.
    pub(crate) fn after_fork(&self, child: bool) {
        let mine = self.held.swap(false, Ordering::SeqCst);
        let lock = (self.lock)();
        if mine || (child && lock.is_held()) {
            // SAFETY: in the parent, the prepare handler took the lock on this thread (the one
            // that forked) and forgot its guard. In the child the calling thread is the only
            // one: the holder is that forgotten guard or a thread that did not survive the
            // fork, and no guard of it is alive here.
            unsafe { lock.release() };
        }
    }
}

extern "C" fn prepare() {
    crate::lifecycle::before_fork();
    crate::state::before_fork();
    crate::memory::before_fork();
    crate::report::before_fork();
}

extern "C" fn parent() {
    crate::report::after_fork(false);
    crate::memory::after_fork(false);
    crate::state::after_fork(false);
    crate::lifecycle::after_fork(false);
}

extern "C" fn child() {
    crate::report::after_fork(true);
    crate::memory::after_fork(true);
    crate::state::after_fork(true);
    crate::lifecycle::after_fork(true);
    crate::report::forget_in_child();
    crate::memory::forget_in_child();
    crate::state::forget_in_child();
    crate::lifecycle::forget_in_child();
}

/// Install the handlers (once per process).
pub(crate) fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the three handlers are `extern "C"` functions without arguments that live
        // for the whole program; pthread_atfork only stores them. It fails only when the C
        // library is out of memory; forks then go unhandled, as before the first aclInit.
        let _ = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}
