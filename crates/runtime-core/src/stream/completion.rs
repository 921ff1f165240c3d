//! Completion tracking of a stream: two counters and a sleeping-waiter protocol.
//!
//! `submit` bumps `submitted` before a command is queued; the runner bumps `completed` after
//! it ran. A waiter for `target` spins briefly, then announces itself in `waiters` and sleeps
//! on the condvar; a completer notifies (under the lock) only when `waiters` is non-zero.
//! Both sides use sequentially consistent operations, so either the completer sees the
//! waiter or the waiter sees the new count: no wake-up is lost (checked by the loom model in
//! `loom_tests`). Idle streams are answered from the counters alone.

#[cfg(not(loom))]
use std::time::Duration;
use std::time::Instant;

use crate::sync::{AtomicU64, AtomicUsize, Condvar, Mutex, Ordering};

pub(crate) struct Completion {
    submitted: AtomicU64,
    completed: AtomicU64,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Completion {
    pub(crate) fn new() -> Self {
        Completion {
            submitted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Count one more submitted command; returns the new total.
    pub(crate) fn submit(&self) -> u64 {
        self.submitted.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub(crate) fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::SeqCst)
    }

    pub(crate) fn completed(&self) -> u64 {
        self.completed.load(Ordering::SeqCst)
    }

    pub(crate) fn reached(&self, target: u64) -> bool {
        self.completed() >= target
    }

    /// Whether everything submitted has completed.
    pub(crate) fn is_idle(&self) -> bool {
        self.completed() >= self.submitted()
    }

    /// Count one completed command and wake sleeping waiters, if any.
    pub(crate) fn complete_one(&self) {
        self.completed.fetch_add(1, Ordering::SeqCst);
        // A read-modify-write, not a load: it reads the latest `waiters` in modification
        // order and synchronises with the waiter's increment, so the protocol is correct with
        // acquire/release alone (which is also all that loom models of SeqCst).
        if self.waiters.fetch_add(0, Ordering::SeqCst) > 0 {
            let _g = self.lock.lock();
            self.cv.notify_all();
        }
    }

    /// Wait until `completed >= target` or `deadline`; false on timeout.
    pub(crate) fn wait(&self, target: u64, deadline: Option<Instant>) -> bool {
        if self.reached(target) {
            return true;
        }
        #[cfg(not(loom))]
        if self.spin(target, Duration::from_micros(50)) {
            return true;
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut g = self.lock.lock();
        let ok = loop {
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

    /// Spin (yielding every 8th turn) for up to `limit`: most waits on a running stream end
    /// within microseconds, much sooner than a sleep and wake-up round trip. (Not
    /// `Backoff::snooze`, which yields on every turn after a few: on a loaded 2-core machine
    /// each yield can hand the core away for a whole time slice, and a no-op launch +
    /// synchronize measured 2-3x slower with it.)
    #[cfg(not(loom))]
    fn spin(&self, target: u64, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        let backoff = crossbeam_utils::Backoff::new();
        let mut n = 0u32;
        while Instant::now() < until {
            if self.reached(target) {
                return true;
            }
            n += 1;
            if n.is_multiple_of(8) {
                std::thread::yield_now();
            } else {
                backoff.spin();
            }
        }
        false
    }
}
