//! The synchronisation primitives of the completion and event protocols: `parking_lot` and
//! std atomics normally, loom's under `cfg(loom)` so the protocols can be model-checked
//! (`RUSTFLAGS="--cfg loom" cargo test -p runtime-core --lib loom`).
//!
//! The mutex and condvar share one by-value API on both sides (`wait` takes and returns the
//! guard, as loom's does). `SleepMutex` / `SleepCondvar` are std's futex-based pair (for
//! locks idle threads sleep on; see there), loom's under `cfg(loom)`.

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

    pub(crate) type SleepGuard<'a, T> = std::sync::MutexGuard<'a, T>;

    /// std's futex-based mutex, for locks that idle threads sleep on: parking_lot keeps one
    /// process-wide table of parked threads, which a `fork()` can copy locked by a thread
    /// that does not exist in the child. Poisoning is ignored (nothing is left half-done
    /// under these locks).
    #[derive(Debug, Default)]
    pub(crate) struct SleepMutex<T>(std::sync::Mutex<T>);

    impl<T> SleepMutex<T> {
        pub(crate) fn new(t: T) -> Self {
            SleepMutex(std::sync::Mutex::new(t))
        }
        pub(crate) fn lock(&self) -> SleepGuard<'_, T> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }

    /// std's condvar, paired with [`SleepMutex`].
    #[derive(Debug, Default)]
    pub(crate) struct SleepCondvar(std::sync::Condvar);

    impl SleepCondvar {
        pub(crate) fn new() -> Self {
            SleepCondvar(std::sync::Condvar::new())
        }
        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
        pub(crate) fn wait<'a, T>(&self, g: SleepGuard<'a, T>) -> SleepGuard<'a, T> {
            self.0
                .wait(g)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }
    }

    pub(crate) type SleepGuard<'a, T> = MutexGuard<'a, T>;
    pub(crate) type SleepMutex<T> = Mutex<T>;
    pub(crate) type SleepCondvar = Condvar;
}

pub(crate) use imp::{Condvar, Mutex, SleepCondvar, SleepMutex};
