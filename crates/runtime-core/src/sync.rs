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

/// A process-wide mutex (a `static` of the core): std's futex mutex, whose state is the lock
/// word alone. parking_lot's locks are not used for these: parking_lot queues waiters in a
/// process-wide table, so a child forked while threads waited on a lock inherits their
/// entries, and its unlocks then wake (or hand the lock to) threads that do not exist there:
/// the child's own waiters sleep for ever. Poisoning is ignored (as parking_lot has none): a
/// panic under these locks leaves bookkeeping whole.
#[derive(Debug, Default)]
pub(crate) struct StaticMutex<T>(std::sync::Mutex<T>);

impl<T> StaticMutex<T> {
    pub(crate) const fn new(t: T) -> Self {
        StaticMutex(std::sync::Mutex::new(t))
    }
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A process-wide reader-writer lock (a `static` of the core); see [`StaticMutex`].
#[derive(Debug, Default)]
pub(crate) struct StaticRwLock<T>(std::sync::RwLock<T>);

impl<T> StaticRwLock<T> {
    pub(crate) const fn new(t: T) -> Self {
        StaticRwLock(std::sync::RwLock::new(t))
    }
    pub(crate) fn read(&self) -> std::sync::RwLockReadGuard<'_, T> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    pub(crate) fn write(&self) -> std::sync::RwLockWriteGuard<'_, T> {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The locks [`ForkGuarded`] handles: the process-wide [`StaticMutex`] and [`StaticRwLock`].
pub(crate) trait ForkLock: Sync + 'static {
    /// Take the lock exclusively within `wait`; its guard, boxed, if it was taken.
    fn take_for(&'static self, wait: std::time::Duration) -> Option<Box<dyn std::any::Any>>;
}

/// Try `take` until it succeeds or `wait` has passed (std's locks have no timed lock).
fn retry_for<G>(wait: std::time::Duration, mut take: impl FnMut() -> Option<G>) -> Option<G> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        if let Some(g) = take() {
            return Some(g);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

impl<T: Send + 'static> ForkLock for StaticMutex<T> {
    fn take_for(&'static self, wait: std::time::Duration) -> Option<Box<dyn std::any::Any>> {
        retry_for(wait, || match self.0.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        })
        .map(|g| Box::new(g) as Box<dyn std::any::Any>)
    }
}

impl<T: Send + Sync + 'static> ForkLock for StaticRwLock<T> {
    fn take_for(&'static self, wait: std::time::Duration) -> Option<Box<dyn std::any::Any>> {
        retry_for(wait, || match self.0.try_write() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        })
        .map(|g| Box::new(g) as Box<dyn std::any::Any>)
    }
}

std::thread_local! {
    /// The guards the prepare handler took, in the order it took them (`None` for a lock it
    /// could not take in time). The handlers of one fork all run on the forking thread.
    static FORK_HOLDS: std::cell::RefCell<Vec<Option<Box<dyn std::any::Any>>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// A process-wide lock the `fork()` handlers take around the fork (see
/// `runtime::install_fork_handlers`): [`ForkGuarded::before_fork`] takes it (waiting at most
/// a bound) and keeps its guard; [`ForkGuarded::after_fork`] drops that guard, in the parent
/// and in the child alike (the handlers release in the reverse order of taking). Nothing is
/// force-unlocked: a guard is an ordinary guard, and std's unlock copes with waiters that
/// vanished in the fork. A lock the prepare handler could not take in time (another thread
/// held it past the bound) stays held in the child by a thread that does not exist there.
pub(crate) struct ForkGuarded<T: 'static> {
    lock: fn() -> &'static T,
}

impl<T: ForkLock> ForkGuarded<T> {
    pub(crate) const fn new(lock: fn() -> &'static T) -> Self {
        ForkGuarded { lock }
    }

    /// Prepare handler: take the lock within `wait`.
    pub(crate) fn before_fork(&self, wait: std::time::Duration) {
        let guard = (self.lock)().take_for(wait);
        FORK_HOLDS.with(|h| h.borrow_mut().push(guard));
    }

    /// Parent or child handler: release what [`ForkGuarded::before_fork`] took (the last
    /// hold not yet released: handlers release in the reverse order of taking).
    pub(crate) fn after_fork(&self, _child: bool) {
        let guard = FORK_HOLDS.with(|h| h.borrow_mut().pop());
        drop(guard);
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
