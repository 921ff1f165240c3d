//! `fork()`: ACL's process-wide locks are taken by a `pthread_atfork` prepare handler, so that
//! no other thread is inside one when the process is copied, and released in both processes
//! afterwards. In the child, ACL starts over uninitialised: the runtime-core child handler (run
//! before this one) abandons the parent's runtime, so every handle and allocation ACL held
//! belongs to it; they are forgotten (leaked, as the core leaks the runtime), and `aclInit`
//! in the child starts a runtime of its own.
//!
//! The process-wide locks are std's futex mutexes ([`Mutex`]), held across the fork by
//! ordinary guards and released by dropping them. parking_lot's are not used for them: its
//! process-wide table of parked threads reaches the child with the parent's waiters in it, so
//! an unlock there handed the lock to a thread that does not exist (C1 in RELIABILITY.md), and
//! releasing "until free" in the parent would release another thread's hold.
//!
//! The handlers are installed at the first `aclInit`, after the core's (which the runtime
//! installs when it starts): prepare handlers run in reverse order of installation, so ACL's
//! locks, which are taken before the core's in every call, are taken first here too.

use std::any::Any;
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// Longest the prepare handler waits for one lock: a thread that holds one only does
/// bookkeeping under it, or waits for streams (`aclFinalize`, `aclrtResetDevice`); if it is not
/// free by then the fork goes ahead without it (in the child it stays held by a thread that
/// does not exist there).
const WAIT: Duration = Duration::from_secs(2);

/// A process-wide mutex of the C library: std's (whose whole state is the lock word, so a
/// child's unlock wakes no vanished thread), poisoning ignored (nothing is left half-done
/// under these locks).
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    pub(crate) const fn new(t: T) -> Self {
        Mutex(std::sync::Mutex::new(t))
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The lock if it comes free within `wait`.
    fn lock_within(&self, wait: Duration) -> Option<std::sync::MutexGuard<'_, T>> {
        let deadline = Instant::now() + wait;
        loop {
            match self.0.try_lock() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() >= deadline => {
                    return None
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
    }
}

std::thread_local! {
    /// The guards the prepare handler took, in order (`None` for a lock not taken in time);
    /// the handlers of one fork all run on the forking thread.
    static HOLDS: RefCell<Vec<Option<Box<dyn Any>>>> = const { RefCell::new(Vec::new()) };
}

/// A process-wide lock as the fork handlers take and release it.
pub(crate) struct Guarded<T: 'static> {
    lock: fn() -> &'static Mutex<T>,
}

impl<T: Send + 'static> Guarded<T> {
    pub(crate) const fn new(lock: fn() -> &'static Mutex<T>) -> Self {
        Guarded { lock }
    }

    /// Prepare handler: take the lock within [`WAIT`] and keep its guard.
    pub(crate) fn before_fork(&self) {
        let guard = (self.lock)()
            .lock_within(WAIT)
            .map(|g| Box::new(g) as Box<dyn Any>);
        HOLDS.with(|h| h.borrow_mut().push(guard));
    }

    /// Parent or child handler: drop the guard [`Guarded::before_fork`] took (the last one
    /// not yet dropped: the handlers release in the reverse order of taking).
    pub(crate) fn after_fork(&self, _child: bool) {
        drop(HOLDS.with(|h| h.borrow_mut().pop()));
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
