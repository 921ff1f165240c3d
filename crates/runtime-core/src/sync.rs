//! The synchronisation primitives of the completion and event protocols: std's locks and
//! atomics normally, loom's under `cfg(loom)` so the protocols can be model-checked
//! (`RUSTFLAGS="--cfg loom" cargo test -p runtime-core --lib loom`); and [`lock`], the
//! runtime's other locks (std's, not parking_lot's: see there why).
//!
//! The mutex and condvar share one by-value API on both sides (`wait` takes and returns the
//! guard, as loom's does). `SleepMutex` / `SleepCondvar` are std's futex-based pair (for
//! locks idle threads sleep on; see there), loom's under `cfg(loom)`.
//!
//! Also what hand-offs between threads ask of the CPU and the OS: which CPU a thread is on
//! and moving a worker off its feeder's ([`current_cpu`], [`move_off_feeders_core`]), and
//! fetching a cache line before writing it ([`prefetch_for_write`]).
//!
//! And [`gate`]: a gate that closes, waiting for the threads inside (shutdown's submission
//! gate, and the Python bindings' interpreter gate).

pub mod gate;

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

/// The pause between two looks of a spinning wait: spin-loop hints, doubling from one to
/// [`Pause::MAX_HINTS`].
///
/// Not crossbeam's `Backoff::spin`, which doubles up to 64 hints: it is tuned for a hint of a
/// few cycles, where the `pause` of AMD since Zen 2 and of Intel since Skylake takes 60-140.
/// One hint is about 27 ns on the EPYC hosts this project measures on, so a wait spinning
/// with it looked every 1.7 us once warmed up, and noticed the end of what it waited for
/// about 0.85 us late on average (a launch + synchronize, or a kernel's blocks, costs a few
/// microseconds in all).
pub(crate) struct Pause(std::cell::Cell<u32>);

impl Pause {
    /// The longest pause, in hints: about 0.2 us on those hosts, a few times a cache line's
    /// trip between cores.
    pub(crate) const MAX_HINTS: u32 = 8;

    pub(crate) fn new() -> Pause {
        Pause(std::cell::Cell::new(1))
    }

    /// Pause, and make the next pause longer (up to [`Pause::MAX_HINTS`]).
    pub(crate) fn spin(&self) {
        let n = self.0.get();
        for _ in 0..n {
            std::hint::spin_loop();
        }
        self.0.set((n * 2).min(Self::MAX_HINTS));
    }

    /// Hints the next [`Pause::spin`] gives.
    #[cfg(test)]
    fn next_hints(&self) -> u32 {
        self.0.get()
    }
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

/// Ask the CPU to bring the cache lines of `size` bytes at `p` into this core's cache ready
/// to be written (x86's `prefetchw`), so that a store there later does not wait for the line
/// to leave another core. A hint: it reads and writes nothing, and any address, even one no
/// longer allocated, is fine. Nothing on other machines, or on an x86 CPU without the
/// instruction.
///
/// For a launching thread that will fill a box the worker has read (`Commands::push_owned`):
/// without the hint the store waited for the worker's copy to be invalidated, and the lock
/// released after it (a locked instruction drains the store buffer) stalled the launch until
/// then, the largest single cost of a no-op launch in `perf`.
pub(crate) fn prefetch_for_write(p: *const u8, size: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        if !has_prefetchw() {
            return;
        }
        for offset in (0..size).step_by(64) {
            let line = p.wrapping_add(offset);
            // SAFETY: `prefetchw` is a hint that does not access memory as far as the program
            // can tell: it never faults (an unmapped or invalid address is ignored), writes
            // no register, and leaves the flags and the stack alone. The CPU has the
            // instruction (`has_prefetchw`).
            unsafe {
                std::arch::asm!(
                    "prefetchw [{0}]",
                    in(reg) line,
                    options(nostack, preserves_flags, readonly)
                );
            }
        }
    }
    #[cfg(any(miri, not(target_arch = "x86_64")))]
    let _ = (p, size);
}

/// Whether the CPU has `prefetchw` (CPUID 8000_0001h, ECX bit 8). A plain cache, as in
/// `engine::max_spinners` (a `OnceLock` is not safe across `fork`): 0 unknown, 1 no, 2 yes.
#[cfg(all(target_arch = "x86_64", not(miri)))]
fn has_prefetchw() -> bool {
    static HAS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    match HAS.load(std::sync::atomic::Ordering::Relaxed) {
        0 => {
            let max = std::arch::x86_64::__cpuid(0x8000_0000).eax;
            let has =
                max >= 0x8000_0001 && std::arch::x86_64::__cpuid(0x8000_0001).ecx & (1 << 8) != 0;
            HAS.store(1 + u8::from(has), std::sync::atomic::Ordering::Relaxed);
            has
        }
        v => v == 2,
    }
}

/// Move the calling thread onto a CPU it may run on that is not in `avoid`, and leave it free
/// to run anywhere it could before. Returns whether it moved: false when no CPU of `avoid` is
/// among the thread's CPUs (it is not on one), when every one of its CPUs is in `avoid`, or
/// when the OS refused. Numbers past `CPU_SETSIZE` are ignored.
///
/// For an engine worker that finds itself on the core of the thread feeding it, or of another
/// busy worker (`stream::spread`). Linux places a woken or newly started thread beside its
/// waker, and does not move either of two threads that yield to each other while they are
/// "cache hot", even with the other core idle: one process sat so, each launch handed the
/// core back and forth by `sched_yield`, for whole runs (an add of 2^16 floats + synchronize
/// at 10-15 us instead of 6). Narrowing the thread's CPU set to the others makes the kernel
/// migrate it before the call returns; widening it again does not move it back.
pub(crate) fn move_off_cpus(avoid: &[u32]) -> bool {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    let setsize = libc::CPU_SETSIZE as usize;
    // SAFETY: `cpu_set_t` is a plain bit array, for which all zeroes is the empty set. Both
    // system calls get the calling thread (pid 0), the size of the set they are given, and a
    // pointer to a live, exclusively borrowed `cpu_set_t`; `sched_getaffinity` writes at
    // most `size` bytes into it and `sched_setaffinity` only reads it. The `CPU_*` helpers
    // index the set only with numbers below `CPU_SETSIZE` (filtered here).
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size, &mut allowed) != 0 {
            return false;
        }
        let mut others = allowed;
        for &cpu in avoid {
            if let Some(cpu) = usize::try_from(cpu).ok().filter(|&c| c < setsize) {
                libc::CPU_CLR(cpu, &mut others);
            }
        }
        let left = libc::CPU_COUNT(&others);
        if left == 0 || left == libc::CPU_COUNT(&allowed) {
            return false;
        }
        if libc::sched_setaffinity(0, size, &others) != 0 {
            return false;
        }
        // Widening cannot fail where narrowing succeeded (the set was the thread's own); if
        // it did, the thread keeps the other CPUs, which still run it.
        libc::sched_setaffinity(0, size, &allowed);
    }
    true
}

/// How often a thread that stays awake moves off the core of the thread feeding it at most
/// ([`move_off_feeders_core`]): a few microseconds each time (two system calls and a
/// migration), and where the OS keeps putting the two threads together (every other core
/// busy), at most this often in vain. A thread that slept since its last move
/// ([`forget_move`]) may move at once.
pub(crate) const MOVE_OFF_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

thread_local! {
    /// When this thread last moved off its feeder's core.
    static MOVED_OFF: std::cell::Cell<Option<std::time::Instant>> =
        const { std::cell::Cell::new(None) };
}

/// A runtime thread (an engine worker lingering for its submitter's next command, a copy
/// helper running a piece of its poster's copy) found the thread that feeds it on its own
/// core: move to another ([`move_off_cpus`]), unless it did so within [`MOVE_OFF_EVERY`]
/// while awake. Returns whether it moved (it then no longer shares the core).
pub(crate) fn move_off_feeders_core(now: std::time::Instant) -> bool {
    move_off_cpus_when_due(&[current_cpu()], now, MOVE_OFF_EVERY)
}

/// [`move_off_cpus`], unless this thread moved within `every` while awake (as
/// [`move_off_feeders_core`], which it is for a set of CPUs). Returns whether it moved.
pub(crate) fn move_off_cpus_when_due(
    avoid: &[u32],
    now: std::time::Instant,
    every: std::time::Duration,
) -> bool {
    if !move_due(now, every) {
        return false;
    }
    MOVED_OFF.with(|m| m.set(Some(now)));
    move_off_cpus(avoid)
}

/// Whether this thread may move again at `now`: it never moved, or last did `every` ago, or
/// slept since ([`forget_move`]).
fn move_due(now: std::time::Instant, every: std::time::Duration) -> bool {
    MOVED_OFF
        .with(std::cell::Cell::get)
        .is_none_or(|last| now.duration_since(last) >= every)
}

/// This thread is about to sleep: where it wakes is the OS's choice anew (beside its waker,
/// as often as not), so a move made before must not keep the next one from being made at
/// once.
pub(crate) fn forget_move() {
    MOVED_OFF.with(|m| m.set(None));
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

/// A process-wide mutex (a `static` of the core): one of the runtime's std locks ([`lock`]).
/// A fork copies parking_lot's process-wide table of parked threads into the child with the
/// parent's waiters in it, and the child's unlocks then wake (or hand the lock to) threads
/// that do not exist there; std's lock keeps its whole state in the lock word.
pub(crate) type StaticMutex<T> = lock::Mutex<T>;

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
        retry_for(wait, || self.try_lock()).map(|g| Box::new(g) as Box<dyn std::any::Any>)
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
    use std::sync::PoisonError;
    use std::time::Instant;

    pub(crate) type MutexGuard<'a, T> = std::sync::MutexGuard<'a, T>;

    /// std's mutex (see [`super::lock`] for why not parking_lot's), poisoning ignored.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(std::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(t: T) -> Self {
            Mutex(std::sync::Mutex::new(t))
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }

    #[derive(Debug, Default)]
    pub(crate) struct Condvar(std::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(std::sync::Condvar::new())
        }
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
        pub(crate) fn wait<'a, T>(&self, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(g).unwrap_or_else(PoisonError::into_inner)
        }
        /// Wait until notified or `deadline`.
        pub(crate) fn wait_until<'a, T>(
            &self,
            g: MutexGuard<'a, T>,
            deadline: Instant,
        ) -> MutexGuard<'a, T> {
            let left = deadline.saturating_duration_since(Instant::now());
            self.0
                .wait_timeout(g, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0
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

/// The runtime's locks: std's futex-based mutex, condvar and rwlock behind parking_lot's API
/// (no poisoning; condvars wait on `&mut` guards), which the runtime used before.
///
/// parking_lot parks contended threads in one process-wide table whose buckets have locks of
/// their own; a `fork()` made while another thread is inside that table (parking or waking,
/// which the runtime's busy threads do all the time) copies a bucket locked by a thread that
/// does not exist in the child, and the child's own threads hang for ever the first time they
/// contend on a lock hashed to it. A test program forking a process whose four threads
/// contend on a parking_lot mutex had 6 of 300 children hang; with std's locks, none. std's
/// locks keep their state in the lock itself, so a child's fresh runtime shares nothing with
/// the parent's threads. The process-wide locks the fork handlers take across a fork
/// ([`ForkGuarded`]) are these too, held by ordinary guards and released by dropping them.
/// (The per-allocation locks of `memory::access` stay parking_lot's: they need guards that
/// own an `Arc` of their lock.)
pub(crate) mod lock {
    use std::ops::{Deref, DerefMut};
    use std::sync::PoisonError;
    use std::time::{Duration, Instant};

    /// A mutex (std's, poisoning ignored: nothing is left half-done under the runtime's locks).
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

    /// The guard of a [`Mutex`]; a [`Condvar`] waits on it by reference.
    pub(crate) struct MutexGuard<'a, T: ?Sized>(Option<std::sync::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        pub(crate) const fn new(t: T) -> Self {
            Mutex(std::sync::Mutex::new(t))
        }
    }

    impl<T: ?Sized> Mutex<T> {
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
        }

        /// The lock if it is free now.
        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(g) => Some(MutexGuard(Some(g))),
                Err(std::sync::TryLockError::Poisoned(p)) => Some(MutexGuard(Some(p.into_inner()))),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        }

        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
        }
    }

    impl<T: ?Sized> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().expect("a guard holds its lock")
        }
    }

    impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("a guard holds its lock")
        }
    }

    /// A condition variable for [`Mutex`].
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(std::sync::Condvar);

    impl Condvar {
        pub(crate) const fn new() -> Self {
            Condvar(std::sync::Condvar::new())
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }

        pub(crate) fn wait<T>(&self, g: &mut MutexGuard<'_, T>) {
            let inner = g.0.take().expect("a guard holds its lock");
            g.0 = Some(self.0.wait(inner).unwrap_or_else(PoisonError::into_inner));
        }

        /// Wait until notified or `timeout` passed; returns whether it timed out.
        pub(crate) fn wait_for<T>(&self, g: &mut MutexGuard<'_, T>, timeout: Duration) -> bool {
            let inner = g.0.take().expect("a guard holds its lock");
            let (inner, r) = self
                .0
                .wait_timeout(inner, timeout)
                .unwrap_or_else(PoisonError::into_inner);
            g.0 = Some(inner);
            r.timed_out()
        }

        /// Wait until notified or `deadline`; returns whether it timed out.
        pub(crate) fn wait_until<T>(&self, g: &mut MutexGuard<'_, T>, deadline: Instant) -> bool {
            let left = deadline.saturating_duration_since(Instant::now());
            self.wait_for(g, left)
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_prefetch_for_write_changes_nothing_whatever_the_address() {
        let mut v = vec![7u8; 256];
        prefetch_for_write(v.as_ptr(), v.len());
        v[255] = 8;
        let freed = v.as_ptr();
        drop(v);
        // A freed block, a null pointer, the top of the address space: hints only.
        prefetch_for_write(freed, 256);
        prefetch_for_write(std::ptr::null(), 4096);
        prefetch_for_write(usize::MAX as *const u8, 64);
        prefetch_for_write(std::ptr::dangling(), 0);
        let w = [1u32; 16];
        prefetch_for_write(w.as_ptr().cast(), 64);
        assert!(w.iter().all(|&x| x == 1));
    }

    #[test]
    fn a_pause_doubles_from_one_hint_up_to_its_bound() {
        let p = Pause::new();
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(p.next_hints());
            p.spin();
        }
        assert_eq!(seen, [1, 2, 4, 8, 8, 8]);
        assert_eq!(Pause::MAX_HINTS, 8);
    }

    /// The thread's CPUs, as the OS reports them.
    fn cpus() -> Vec<usize> {
        let set = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
        let line = set
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or("")
            .trim()
            .to_owned();
        line.split(',')
            .filter(|p| !p.is_empty())
            .flat_map(|p| match p.split_once('-') {
                Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect::<Vec<usize>>(),
                None => vec![p.parse().unwrap()],
            })
            .collect()
    }

    #[test]
    fn a_thread_moves_again_after_a_sleep_or_after_the_interval_while_awake() {
        let now = std::time::Instant::now();
        assert!(
            move_due(now, MOVE_OFF_EVERY),
            "a thread that never moved may move"
        );
        MOVED_OFF.with(|m| m.set(Some(now)));
        assert!(
            !move_due(now, MOVE_OFF_EVERY),
            "not again at once while awake"
        );
        assert!(!move_due(now + MOVE_OFF_EVERY / 2, MOVE_OFF_EVERY));
        assert!(
            move_due(now + MOVE_OFF_EVERY, MOVE_OFF_EVERY),
            "again once the interval passed"
        );
        forget_move();
        assert!(move_due(now, MOVE_OFF_EVERY), "at once after a sleep");
    }

    #[test]
    fn a_thread_moved_off_its_cpu_runs_elsewhere_and_keeps_all_its_cpus() {
        std::thread::spawn(|| {
            let before = cpus();
            let here = current_cpu();
            let moved = move_off_cpus(&[here]);
            assert_eq!(
                moved,
                before.len() >= 2 && before.contains(&(here as usize)),
                "moves exactly when it has another CPU (CPUs {before:?}, on {here})"
            );
            assert_eq!(
                cpus(),
                before,
                "the thread may run on every CPU it could before"
            );
            assert!(
                !move_off_cpus(&[u32::MAX]),
                "a CPU number the OS never gives"
            );
            let all: Vec<u32> = before.iter().map(|&c| c as u32).collect();
            assert!(!move_off_cpus(&all), "no CPU of its own left to move to");
            assert_eq!(cpus(), before);
            assert!(!move_off_cpus(&[libc::CPU_SETSIZE as u32]));
        })
        .join()
        .unwrap();
    }
}
