//! The synchronisation primitives of the completion and event protocols: `parking_lot` and
//! std atomics normally, loom's under `cfg(loom)` so the protocols can be model-checked
//! (`RUSTFLAGS="--cfg loom" cargo test -p runtime-core --lib loom`).
//!
//! The mutex and condvar share one by-value API on both sides (`wait` takes and returns the
//! guard, as loom's does).

std::thread_local! {
    static RUNTIME_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is one of the runtime's engine workers (it runs kernels and
/// host functions): blocking waits there must not need the thread itself.
pub(crate) fn on_runtime_thread() -> bool {
    RUNTIME_THREAD.with(std::cell::Cell::get)
}

/// Mark the calling thread as an engine worker (for its whole life).
pub(crate) fn mark_runtime_thread() {
    RUNTIME_THREAD.with(|w| w.set(true));
}

/// Run `f` as a runtime thread (a host thread running blocks of a launch while it waits for
/// their stream): waits inside follow the rules for runtime threads. Restored after, also
/// when `f` unwinds.
pub(crate) fn as_runtime_thread<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            RUNTIME_THREAD.with(|w| w.set(self.0));
        }
    }
    let _restore = Restore(RUNTIME_THREAD.with(|w| w.replace(true)));
    f()
}

/// The CPU the calling thread runs on (a hint: it may move at once), or `u32::MAX` when the
/// OS does not say. Spinning waits use it to tell whether the thread they wait for shares
/// their core, where spinning would only keep it off (glibc reads it from the thread's
/// `rseq` area: a few nanoseconds, no system call).
pub(crate) fn current_cpu() -> u32 {
    // SAFETY: `sched_getcpu` takes no arguments and touches no memory of ours; it returns a
    // CPU number or -1.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).unwrap_or(u32::MAX)
}

/// Thread starts still to fail on purpose (the `testing` feature's `inject_spawn_failures`).
static SPAWN_FAILURES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Make the next `n` thread starts of the runtime fail as if the OS refused them (0 disarms).
#[cfg(feature = "testing")]
pub(crate) fn inject_spawn_failures(n: u64) {
    SPAWN_FAILURES.store(n, std::sync::atomic::Ordering::SeqCst);
}

/// Start a named runtime thread (engine worker, scrubber, copy helper). A refusal is returned,
/// never a panic, so that every caller can fail cleanly or do the work inline.
pub(crate) fn spawn_thread<F>(name: String, f: F) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    use std::sync::atomic::Ordering as O;
    if SPAWN_FAILURES
        .fetch_update(O::SeqCst, O::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "thread creation refused (injected failure)",
        ));
    }
    std::thread::Builder::new().name(name).spawn(f)
}

/// A process-wide lock the `fork()` handlers take around the fork (see
/// `runtime::install_fork_handlers`): [`ForkGuarded::before_fork`] takes it (waiting at most
/// a bound) and remembers whether it did; [`ForkGuarded::after_fork`] releases exactly that
/// in the parent, and in the child also a hold of a thread that vanished in the fork.
pub(crate) struct ForkGuarded<T: 'static> {
    lock: fn() -> &'static T,
    held: std::sync::atomic::AtomicBool,
}

/// The locks [`ForkGuarded`] handles: parking_lot's mutex and reader-writer lock.
pub(crate) trait ForkLock {
    /// Take the lock (exclusively) within `wait` and forget the guard; whether it was taken.
    fn take_for(&self, wait: std::time::Duration) -> bool;
    /// Release a hold whose guard was forgotten.
    ///
    /// # Safety
    /// The lock is held (exclusively, or shared by threads that no longer exist) and no guard
    /// of it is alive.
    unsafe fn release(&self);
    /// Whether it is held at all.
    fn is_held(&self) -> bool;
}

impl<T> ForkLock for parking_lot::Mutex<T> {
    fn take_for(&self, wait: std::time::Duration) -> bool {
        self.try_lock_for(wait).map(std::mem::forget).is_some()
    }
    unsafe fn release(&self) {
        // SAFETY: the caller's contract.
        unsafe { self.force_unlock() }
    }
    fn is_held(&self) -> bool {
        self.is_locked()
    }
}

impl<T> ForkLock for parking_lot::RwLock<T> {
    fn take_for(&self, wait: std::time::Duration) -> bool {
        self.try_write_for(wait).map(std::mem::forget).is_some()
    }
    unsafe fn release(&self) {
        if self.is_locked_exclusive() {
            // SAFETY: the caller's contract.
            unsafe { self.force_unlock_write() };
        }
        while self.is_locked() {
            // SAFETY: the caller's contract (readers that vanished in the fork).
            unsafe { self.force_unlock_read() };
        }
    }
    fn is_held(&self) -> bool {
        self.is_locked()
    }
}

impl<T: ForkLock> ForkGuarded<T> {
    pub(crate) const fn new(lock: fn() -> &'static T) -> Self {
        ForkGuarded {
            lock,
            held: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Prepare handler: take the lock within `wait`.
    pub(crate) fn before_fork(&self, wait: std::time::Duration) {
        let took = (self.lock)().take_for(wait);
        self.held.store(took, std::sync::atomic::Ordering::SeqCst);
    }

    /// Parent or child handler.
    pub(crate) fn after_fork(&self, child: bool) {
        let mine = self.held.swap(false, std::sync::atomic::Ordering::SeqCst);
        let lock = (self.lock)();
        if mine || (child && lock.is_held()) {
            // SAFETY: in the parent, the prepare handler took the lock on this thread (the
            // one that forked) and forgot its guard. In the child, the calling thread is the
            // only one: whoever holds the lock is that hold of the prepare handler or a
            // thread that did not survive the fork, and no guard of it is alive here.
            unsafe { lock.release() };
        }
    }
}

/// After `fork()`, in the child: the calling thread is the only one, and it is no engine
/// worker even if the parent's forking thread was.
pub(crate) fn after_fork_in_child() {
    RUNTIME_THREAD.with(|w| w.set(false));
}

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[cfg(not(loom))]
mod imp {
    use std::time::Instant;

    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(t: T) -> Self {
            Mutex(parking_lot::Mutex::new(t))
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
    }

    #[derive(Debug, Default)]
    pub(crate) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(parking_lot::Condvar::new())
        }
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
        pub(crate) fn wait<'a, T>(&self, mut g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(&mut g);
            g
        }
        /// Wait until notified or `deadline`.
        pub(crate) fn wait_until<'a, T>(
            &self,
            mut g: MutexGuard<'a, T>,
            deadline: Instant,
        ) -> MutexGuard<'a, T> {
            self.0.wait_until(&mut g, deadline);
            g
        }
    }
}

#[cfg(loom)]
mod imp {
    use std::time::Instant;

    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(t: T) -> Self {
            Mutex(loom::sync::Mutex::new(t))
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().expect("loom mutex poisoned")
        }
    }

    #[derive(Debug)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
        pub(crate) fn wait<'a, T>(&self, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(g).expect("loom mutex poisoned")
        }
        /// loom has no clock: a timed wait is modelled as a plain wait.
        pub(crate) fn wait_until<'a, T>(
            &self,
            g: MutexGuard<'a, T>,
            _deadline: Instant,
        ) -> MutexGuard<'a, T> {
            self.wait(g)
        }
    }
}

pub(crate) use imp::{Condvar, Mutex};
