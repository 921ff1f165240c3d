//! Completion tracking of a stream: two counters and a sleeping-waiter protocol.
//!
//! `submit` bumps `submitted` before a command is queued; the runner bumps `completed` after
//! it ran. A waiter for `target` spins briefly, then lowers `wake_at` to its target (under
//! the lock) and sleeps on the condvar; a completer notifies (under the lock) only once
//! `completed` reaches `wake_at`, the lowest target anyone sleeps for, and resets it, and the
//! waiters it woke that still have to wait lower it again before they sleep. Both sides use
//! sequentially consistent operations, so either the completer sees the waiter's target or
//! the waiter sees the new count: no wake-up is lost (checked by the loom models in
//! `loom_tests`). Idle streams are answered from the counters alone.
//!
//! It also keeps where the last submitter and the last runner ran (CPU numbers): a spinning
//! waiter, or a worker lingering for the next command, yields its core when the thread it
//! waits for ran on that very core last, and spins otherwise (see [`Completion::spin`]).

#[cfg(not(loom))]
use std::time::Duration;
use std::time::Instant;

use crate::sync::{current_cpu, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering};

/// A spinning waiter whose stream's runner is on another core yields once every this many
/// looks: about every 6 us with [`crate::sync::Pause`]'s pauses (about as often as it did
/// with crossbeam's longer ones; every 8th look was a system call every 1.5 us).
#[cfg(not(loom))]
const YIELD_EVERY: u32 = 32;

pub(crate) struct Completion {
    /// Written by submitters, on a cache line of its own: the runner writes `completed` (and
    /// `waiters`) after every command, and sharing one line made every launch pull it back
    /// and forth between the submitter's core and the runner's.
    submit: super::command::CacheLine<Submitted>,
    completed: AtomicU64,
    /// Threads asleep (or about to sleep) in [`Completion::wait_helping`].
    waiters: AtomicUsize,
    /// The lowest target a sleeping waiter waits for (`u64::MAX`: none). A completer wakes
    /// the sleepers once `completed` reaches it, not after every command: a thread asleep in
    /// `synchronize` behind a backlog of thousands of small commands cost the runner a
    /// futex wake-up per command (and itself a wake-up and a sleep), 0.4 system calls per
    /// launch of a three-buffer `add` in a launch loop.
    wake_at: AtomicU64,
    /// Waiters spinning now (before they sleep): they can run blocks of a launch meanwhile.
    spinning: std::sync::atomic::AtomicU32,
    lock: Mutex<()>,
    cv: Condvar,
    /// CPU of the engine worker running the stream, as it last noted it; a hint, never ordered.
    runner_cpu: std::sync::atomic::AtomicU32,
}

/// The submitters' side of [`Completion`].
struct Submitted {
    submitted: AtomicU64,
    /// CPU of the thread that submitted last (`u32::MAX`: none yet); a hint, never ordered.
    submitter_cpu: std::sync::atomic::AtomicU32,
}

impl Completion {
    pub(crate) fn new() -> Self {
        Completion {
            submit: super::command::CacheLine(Submitted {
                submitted: AtomicU64::new(0),
                submitter_cpu: std::sync::atomic::AtomicU32::new(u32::MAX),
            }),
            completed: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            wake_at: AtomicU64::new(u64::MAX),
            spinning: std::sync::atomic::AtomicU32::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            runner_cpu: std::sync::atomic::AtomicU32::new(u32::MAX),
        }
    }

    /// Note the CPU of the engine worker running the stream, on that worker: when it begins
    /// running it, and when it resumes after lingering (it may have moved meanwhile).
    pub(crate) fn note_runner(&self) {
        self.runner_cpu
            .store(current_cpu(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the last submitter ran on the calling thread's core: a worker lingering for
    /// its next command must then yield, or the submitter cannot run to send it.
    pub(crate) fn submitter_shares_core(&self) -> bool {
        self.submit
            .submitter_cpu
            .load(std::sync::atomic::Ordering::Relaxed)
            == current_cpu()
    }

    /// Whether a thread waits for this stream now (spinning or asleep).
    pub(crate) fn awaited(&self) -> bool {
        self.spinning.load(std::sync::atomic::Ordering::Relaxed) > 0
            || self.waiters.load(Ordering::Relaxed) > 0
    }

    /// Count one more submitted command; returns the new total.
    pub(crate) fn submit(&self) -> u64 {
        self.submit
            .submitter_cpu
            .store(current_cpu(), std::sync::atomic::Ordering::Relaxed);
        self.submit.submitted.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub(crate) fn submitted(&self) -> u64 {
        self.submit.submitted.load(Ordering::SeqCst)
    }

    pub(crate) fn completed(&self) -> u64 {
        self.completed.load(Ordering::SeqCst)
    }

    pub(crate) fn reached(&self, target: u64) -> bool {
        self.completed() >= target
    }

    /// Whether a waiter is spinning for this stream now (and so may run blocks of its
    /// launch: see `Stream::wait_for`).
    pub(crate) fn waiter_spinning(&self) -> bool {
        self.spinning.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Whether everything submitted has completed.
    pub(crate) fn is_idle(&self) -> bool {
        self.completed() >= self.submitted()
    }

    /// Count one completed command and wake the sleeping waiters once it reaches the lowest
    /// target one of them waits for.
    pub(crate) fn complete_one(&self) {
        let completed = self.completed.fetch_add(1, Ordering::SeqCst) + 1;
        // A read-modify-write, not a load: it reads the latest `wake_at` in modification
        // order and synchronises with the waiter's update, so the protocol is correct with
        // acquire/release alone (which is also all that loom models of SeqCst).
        if self.wake_at.fetch_add(0, Ordering::SeqCst) <= completed {
            let _g = self.lock.lock();
            // Every sleeper wakes and, unless its target is reached, lowers `wake_at` again
            // (under this lock, so after this reset): a target another completer's reset
            // erased meanwhile is set again by its waiter, which that reset's notify woke.
            self.wake_at.store(u64::MAX, Ordering::SeqCst);
            self.cv.notify_all();
        }
    }

    /// Wait until `completed >= target` or `deadline`; false on timeout.
    #[cfg(loom)]
    pub(crate) fn wait(&self, target: u64, deadline: Option<Instant>) -> bool {
        self.wait_helping(target, deadline, &|| false)
    }

    /// [`Completion::wait`], calling `help()` while it spins and before it sleeps: work the
    /// waiter can do for the stream meanwhile (the blocks of its running launch); `help`
    /// returns whether it did some.
    pub(crate) fn wait_helping(
        &self,
        target: u64,
        deadline: Option<Instant>,
        help: &dyn Fn() -> bool,
    ) -> bool {
        if self.reached(target) {
            return true;
        }
        #[cfg(not(loom))]
        loop {
            self.spinning
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let done = self.spin(target, Duration::from_micros(50), help);
            self.spinning
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            if done {
                return true;
            }
            // A launch that began while this thread was counted spinning posted no request
            // for it (`kernel::block`): one more look at the stream's offer, now that it is
            // no longer counted. Either that launch saw the count fall and asked a worker
            // instead, or this look sees its offer (both sequentially consistent), so no
            // block is left waiting for a helper that went to sleep.
            if !help() {
                break;
            }
        }
        #[cfg(loom)]
        let _ = help;
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut g = self.lock.lock();
        let ok = loop {
            // Before the check, under the lock: a completer that counts `target` after the
            // check sees it here, and notifies only once this thread waits on the condvar.
            self.wake_at.fetch_min(target, Ordering::SeqCst);
            if self.reached(target) {
                break true;
            }
            match deadline {
                None => g = self.cv.wait(g),
                Some(d) => {
                    if Instant::now() >= d {
                        break false;
                    }
                    g = self.cv.wait_until(g, d);
                }
            }
        };
        drop(g);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        ok
    }

    /// Spin for up to `limit`: most waits on a running stream end within microseconds, much
    /// sooner than a sleep and wake-up round trip. While the stream's runner last ran on
    /// this core, yield every turn: on two cores with a third busy thread (a BLAS or OpenMP
    /// thread spinning after its call) the runner can be queued behind this very waiter, and
    /// a graph replay + synchronize measured 4 us yielding every 8th turn against 2.4 us
    /// yielding every other turn. Otherwise yield only every [`YIELD_EVERY`]th turn: each
    /// yield can hand the core to an unrelated busy thread for a whole time slice
    /// (`Backoff::snooze`, which yields on every turn, measured a no-op launch + synchronize
    /// 2-3x slower on a loaded machine), and costs a system call when there is none.
    #[cfg(not(loom))]
    fn spin(&self, target: u64, limit: Duration, help: &dyn Fn() -> bool) -> bool {
        let mut until = Instant::now() + limit;
        let pause = crate::sync::Pause::new();
        let mut n = 0u32;
        while Instant::now() < until {
            if self.reached(target) {
                return true;
            }
            if help() {
                // The launch this thread helped is about done: spin on for its end.
                until = Instant::now() + limit;
                continue;
            }
            n += 1;
            if n.is_multiple_of(YIELD_EVERY)
                || self.runner_cpu.load(std::sync::atomic::Ordering::Relaxed) == current_cpu()
            {
                std::thread::yield_now();
            } else {
                pause.spin();
            }
        }
        false
    }
}
