//! Where the memory of a queued operation is given back: on the thread that queued it.
//!
//! A launch allocates its op on the launching thread, and the worker that runs it drops it.
//! Freed by the worker, every op crossed threads in the allocator: glibc's per-thread cache
//! holds only a few blocks of a size, so a launcher in a loop and the worker took turns at
//! the launcher's arena lock (perf: `__lll_lock_wake_private`, a futex call every few
//! launches, about a tenth of a launch loop's time).
//!
//! So the submitting thread keeps a weak handle on each op it queues. The worker's drop still
//! runs the op's destructor at once (its buffers, kernel and Python objects are let go when
//! it has run, as before); only the allocation stays, until the submitting thread, at a later
//! submission, drops the weak handle of an op that has run, and the block goes back to the
//! cache it came from. A thread that stops submitting keeps at most [`KEEP`] such emptied
//! allocations (freed when the thread exits); past that, the oldest handle is let go, and its
//! op is freed by whoever drops it last, as it was without this module.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::{Arc, Weak};

use super::command::Op;

/// Weak handles a thread keeps at most.
const KEEP: usize = 1024;

/// Weak handles a thread holds before it looks for ops that have run: glibc's per-thread
/// cache keeps 7 blocks of a size, so the blocks given back at one look are all taken again
/// from that cache by the next launches, while they are still in this core's cache. (At 64
/// per look, 57 of each burst went to the arena's bins, through `_int_free`, and launches
/// took them back through `_int_malloc`: 0.23 against 0.20 us per launch in a loop.)
const SWEEP: usize = 7;

thread_local! {
    /// Ops this thread queued whose allocation it has not given back yet, oldest first.
    static QUEUED: RefCell<VecDeque<Weak<dyn Op>>> = const { RefCell::new(VecDeque::new()) };
}

/// Note that this thread queues `op`; give back the allocations of earlier ops that have run
/// and been dropped. Dropping a weak handle runs no destructor (the op's ran when its last
/// strong handle went), so nothing else runs here.
pub(crate) fn note(op: &Arc<dyn Op>) {
    // During thread exit the slot may be gone: the op is then freed as it would be anyway.
    let _ = QUEUED.try_with(|q| {
        let Ok(mut q) = q.try_borrow_mut() else {
            return;
        };
        // Looked at in bursts, not at every launch: each look reads a count the worker wrote
        // last, and a burst of independent reads overlaps its cache misses.
        if q.len() >= SWEEP {
            while q.front().is_some_and(|w| w.strong_count() == 0) {
                q.pop_front();
            }
            if q.len() >= KEEP {
                q.pop_front();
            }
        }
        q.push_back(Arc::downgrade(op));
    });
}

/// Allocations this thread still holds (for tests).
#[cfg(test)]
fn held() -> usize {
    QUEUED.with(|q| q.borrow().len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::{FnOp, OpKind};

    #[test]
    fn ops_that_ran_are_given_back_at_the_next_note_and_the_list_stays_bounded() {
        for _ in 0..SWEEP {
            let done = FnOp::shared("a", OpKind::Compute, || Ok(()));
            note(&done);
            drop(done); // the worker's drop: the op's destructor runs, the weak handle stays
        }
        assert_eq!(held(), SWEEP);
        let live = FnOp::shared("b", OpKind::Compute, || Ok(()));
        note(&live);
        assert_eq!(held(), 1, "the dropped ops' allocations were given back");
        for _ in 0..KEEP + 10 {
            note(&live);
        }
        assert!(held() <= KEEP);
        assert_eq!(
            Arc::strong_count(&live),
            1,
            "weak handles never keep an op alive"
        );
    }
}
