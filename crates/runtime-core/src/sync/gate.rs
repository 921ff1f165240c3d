//! A gate that closes: threads enter it before a step that a shutdown must not overlap, and
//! closing it refuses new entries and waits for the threads already inside. Two users: the
//! device's submission gate (`shutdown` closes it before it drains, so the drain covers every
//! accepted command) and the Python bindings' interpreter gate (the last exit hook closes it
//! before finalising begins, so no runtime thread is attached to the interpreter then).
//!
//! One atomic word holds a "closed" bit and the number of threads inside. A thread enters
//! with one `fetch_add` (backing out if the bit was set) and leaves with a `fetch_sub`;
//! `close` sets the bit with `fetch_or` and waits until nobody is inside. All of it is
//! read-modify-writes of one location, so they are totally ordered: an entry ordered before
//! the `fetch_or` is counted and waited for (what it did inside happens before `close`
//! returns), one ordered after sees the bit. (Two flags, "open" and "in flight", checked
//! Dekker-style rely on sequentially consistent loads, which loom models only as
//! acquire/release: the loom model in `loom_tests` rejected that version, and this one needs
//! no more than acquire/release.)

use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicUsize, Ordering};

const CLOSED: usize = 1 << (usize::BITS - 1);

/// The gate (see the module). Open when made.
pub struct EntryGate {
    /// `CLOSED` bit | threads inside. On its own cache line: every launch on a device writes
    /// its submission gate, and the engines' state next to it is written by the workers.
    state: CachePadded<AtomicUsize>,
}

/// A thread inside an [`EntryGate`]; it leaves when this is dropped.
#[must_use = "the thread is inside only while it holds the guard"]
pub struct EntryGuard<'a>(&'a AtomicUsize);

impl Drop for EntryGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl Default for EntryGate {
    fn default() -> Self {
        EntryGate::new()
    }
}

impl EntryGate {
    /// An open gate with nobody inside. A `const fn`, so that a gate can be a plain
    /// `static` (no lazy initialisation, which a `fork()` could catch half done).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        EntryGate {
            state: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// An open gate with nobody inside (loom's atomics have no `const` constructor).
    #[cfg(loom)]
    pub fn new() -> Self {
        EntryGate {
            state: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// Whether new entries are accepted (a hint; entering is [`EntryGate::enter`]).
    pub fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) & CLOSED == 0
    }

    /// Enter: `None` once the gate is closed (nothing stays counted then).
    pub fn enter(&self) -> Option<EntryGuard<'_>> {
        let guard = self.enter_even_if_closed();
        guard.was_open().then_some(guard.0)
    }

    /// Enter whether or not the gate is closed, counted like any entry (a `close` still
    /// waiting when this thread enters waits for its guard too): for a step that the closer
    /// itself waits for another way (the interpreter gate's Python kernels).
    pub fn enter_even_if_closed(&self) -> Entered<'_> {
        let before = self.state.fetch_add(1, Ordering::AcqRel);
        Entered(EntryGuard(&self.state), before & CLOSED == 0)
    }

    /// Close the gate and wait for the threads inside to leave: for ever with `limit`
    /// `None`, else until `limit` has passed. Returns whether they all left. Entries after
    /// the close are refused, including those while it waits.
    ///
    /// The wait spins briefly, then yields, then sleeps a millisecond between looks: the
    /// submitters of a device are a few instructions from leaving, an interpreter callback
    /// may take as long as the user's code does.
    pub fn close(&self, limit: Option<Duration>) -> bool {
        self.state.fetch_or(CLOSED, Ordering::AcqRel);
        // A limit past the clock's range is none (no overflow panic for a huge one).
        let until = limit.and_then(|l| Instant::now().checked_add(l));
        #[cfg(not(loom))]
        let backoff = crossbeam_utils::Backoff::new();
        while self.state.load(Ordering::Acquire) & !CLOSED != 0 {
            if until.is_some_and(|u| Instant::now() >= u) {
                return false;
            }
            #[cfg(loom)]
            loom::thread::yield_now();
            #[cfg(not(loom))]
            if backoff.is_completed() {
                std::thread::sleep(Duration::from_millis(1));
            } else {
                backoff.snooze();
            }
        }
        true
    }

    /// Threads inside now (a snapshot).
    pub fn inside(&self) -> usize {
        self.state.load(Ordering::Acquire) & !CLOSED
    }

    /// In a child after `fork()`, where only the forking thread lives: count as inside just
    /// the `held_here` guards that thread holds (the others were the parent's threads', and
    /// would keep a `close` waiting for ever). The closed bit stays as it was. The caller
    /// must be the child's only thread.
    pub fn after_fork(&self, held_here: usize) {
        let closed = self.state.load(Ordering::Acquire) & CLOSED;
        self.state.store(closed | held_here, Ordering::Release);
    }
}

/// An entry made whether or not the gate was open ([`EntryGate::enter_even_if_closed`]).
pub struct Entered<'a>(EntryGuard<'a>, bool);

impl<'a> Entered<'a> {
    /// Whether the gate was open when the thread entered.
    pub fn was_open(&self) -> bool {
        self.1
    }

    /// The guard: the thread is inside until it is dropped.
    pub fn guard(self) -> EntryGuard<'a> {
        self.0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn an_open_gate_counts_each_entry_until_its_guard_drops() {
        let gate = EntryGate::new();
        assert!(gate.is_open());
        let a = gate.enter().expect("open");
        let b = gate.enter().expect("open");
        assert_eq!(gate.inside(), 2);
        drop(a);
        assert_eq!(gate.inside(), 1);
        drop(b);
        assert_eq!(gate.inside(), 0);
    }

    #[test]
    fn a_closed_gate_refuses_entries_and_counts_nothing_for_them() {
        let gate = EntryGate::new();
        assert!(gate.close(None));
        assert!(!gate.is_open());
        assert!(gate.enter().is_none());
        assert_eq!(gate.inside(), 0);
    }

    #[test]
    fn an_entry_even_if_closed_is_counted_and_says_the_gate_was_closed() {
        let gate = EntryGate::new();
        assert!(gate.close(None));
        let e = gate.enter_even_if_closed();
        assert!(!e.was_open());
        assert_eq!(gate.inside(), 1);
        drop(e.guard());
        assert_eq!(gate.inside(), 0);
        let open = EntryGate::new();
        assert!(open.enter_even_if_closed().was_open());
    }

    #[test]
    fn close_waits_for_a_thread_inside_and_gives_up_at_its_limit() {
        let gate = EntryGate::new();
        let guard = gate.enter().expect("open");
        // Nobody leaves: the close gives up once its limit has passed.
        let t0 = Instant::now();
        assert!(!gate.close(Some(Duration::from_millis(30))));
        assert!(t0.elapsed() >= Duration::from_millis(30));
        assert!(
            gate.enter().is_none(),
            "closed even though the wait gave up"
        );
        // The thread inside leaves while a second close waits: that close returns true (its
        // limit past the clock's range waits as none would, without overflowing).
        std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                drop(guard);
            });
            assert!(gate.close(Some(Duration::MAX)));
        });
        assert_eq!(gate.inside(), 0);
    }

    #[test]
    fn after_fork_counts_only_the_forking_threads_guards_and_keeps_the_closed_bit() {
        let gate = EntryGate::new();
        let mine = gate.enter().expect("open");
        // Guards of threads that do not exist in a child: never dropped there.
        std::mem::forget(gate.enter().expect("open"));
        std::mem::forget(gate.enter().expect("open"));
        gate.after_fork(1);
        assert_eq!(gate.inside(), 1);
        drop(mine);
        assert_eq!(gate.inside(), 0);
        assert!(gate.close(Some(Duration::ZERO)));

        let closed = EntryGate::new();
        assert!(closed.close(None));
        std::mem::forget(closed.enter_even_if_closed());
        closed.after_fork(0);
        assert_eq!(closed.inside(), 0);
        assert!(!closed.is_open());
    }
}
