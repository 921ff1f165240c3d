//! The submission gate of a device: how `shutdown` refuses new work without losing work that
//! was accepted just before.
//!
//! One atomic word holds a "closed" bit and the number of submitters inside. A submitter
//! enters with one `fetch_add` (backing out if the bit was set), pushes its command and
//! leaves with a `fetch_sub`. `close` sets the bit with `fetch_or` and waits until nobody is
//! inside. All of it is read-modify-writes of one location, so they are totally ordered:
//! a submitter ordered before the `fetch_or` is counted and waited for (its push happens
//! before `close` returns), one ordered after sees the bit. The drain that follows `close`
//! therefore covers every accepted command. (Two flags, "open" and "in flight", checked
//! Dekker-style rely on sequentially consistent loads, which loom models only as
//! acquire/release: the loom model in `loom_tests` rejected that version, and this one
//! needs no more than acquire/release.)

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicUsize, Ordering};

const CLOSED: usize = 1 << (usize::BITS - 1);

pub(crate) struct SubmitGate {
    /// `CLOSED` bit | submitters inside. On its own cache line: every launch on the device
    /// writes it, and the engines' state next to it is written by the workers.
    state: CachePadded<AtomicUsize>,
}

/// A submission in progress; it leaves the gate when dropped.
pub(crate) struct GateGuard<'a>(&'a AtomicUsize);

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl SubmitGate {
    pub(crate) fn new() -> Self {
        SubmitGate {
            state: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// Whether new work is accepted (a hint; submissions use [`SubmitGate::enter`]).
    pub(crate) fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) & CLOSED == 0
    }

    /// Enter to submit: `None` once the gate is closed.
    pub(crate) fn enter(&self) -> Option<GateGuard<'_>> {
        let before = self.state.fetch_add(1, Ordering::AcqRel);
        let guard = GateGuard(&self.state);
        (before & CLOSED == 0).then_some(guard)
    }

    /// Close the gate and wait for the submitters already inside (each is a few instructions
    /// from leaving: nothing blocks between `enter` and the guard's drop).
    pub(crate) fn close(&self) {
        self.state.fetch_or(CLOSED, Ordering::AcqRel);
        #[cfg(not(loom))]
        let backoff = crossbeam_utils::Backoff::new();
        while self.state.load(Ordering::Acquire) & !CLOSED != 0 {
            #[cfg(loom)]
            loom::thread::yield_now();
            #[cfg(not(loom))]
            backoff.snooze();
        }
    }
}
