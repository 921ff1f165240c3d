//! Busy workers of one device spread over the host's cores: each engine worker notes the CPU
//! it runs its work on, and a worker that finds another busy worker of its device noted on
//! its own CPU, while a CPU it may use has none, moves there.
//!
//! Linux places a woken thread beside its waker or on the CPU it last ran on, and does not
//! move a "cache hot" thread for milliseconds even with another core idle. Two streams of
//! 256² matmuls launched from one thread so ran both workers on one core for whole samples
//! of 64 kernels (10 ms), one sample in two or three, at one stream's throughput; the other
//! samples ran at twice it. A worker moves ([`crate::sync::move_off_cpus_when_due`]) only
//! to a CPU where none of its device's busy workers is noted, so where every core already
//! runs one nobody moves; and at most once per [`SETTLE_EVERY`] while it stays awake (a move
//! is two system calls and a migration, a few microseconds), so where the OS keeps putting a
//! worker back it costs under one percent of that worker's time.
//!
//! The notes are hints, written and read with relaxed atomics: a worker may have moved since
//! it noted its CPU. Each worker notes again when it takes work and at least every
//! [`SETTLE_EVERY`] while it runs (`run_stream`), and clears its note when it goes back to
//! its engine's queue.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many workers of one device take part (the rest run where the OS puts them): the
/// notes share one cache line, so a worker reads every other one with one load of it.
pub(crate) const SLOTS: usize = 16;

/// A note that says "not busy".
const IDLE: u32 = u32::MAX;

/// How often a worker that keeps running work notes its CPU again and looks for a shared core.
pub(crate) const SETTLE_EVERY: Duration = Duration::from_millis(1);

/// The CPUs the busy workers of one device run on, one note per worker.
#[repr(align(64))]
pub(crate) struct Spread {
    cpus: [AtomicU32; SLOTS],
}

impl Spread {
    pub(crate) fn new() -> Spread {
        Spread {
            cpus: std::array::from_fn(|_| AtomicU32::new(IDLE)),
        }
    }

    /// The worker in `slot` runs work now, on CPU `cpu`: note it, and when another busy
    /// worker is noted on `cpu`, return the CPUs to avoid (every busy worker's); `None` when
    /// the core is its own.
    fn note(&self, slot: usize, cpu: u32) -> Option<[u32; SLOTS]> {
        let mine = self.cpus.get(slot)?;
        mine.store(cpu, Ordering::Relaxed);
        let mut busy = [IDLE; SLOTS];
        let mut shared = false;
        for (i, (note, out)) in self.cpus.iter().zip(busy.iter_mut()).enumerate() {
            *out = note.load(Ordering::Relaxed);
            shared |= i != slot && *out == cpu;
        }
        shared.then_some(busy)
    }

    /// The worker in `slot` is no longer busy.
    fn clear(&self, slot: usize) {
        if let Some(mine) = self.cpus.get(slot) {
            mine.store(IDLE, Ordering::Relaxed);
        }
    }
}

thread_local! {
    /// The calling worker's device spread and slot; none on other threads.
    static MINE: std::cell::RefCell<Option<(Arc<Spread>, usize)>> =
        const { std::cell::RefCell::new(None) };
}

/// Make the calling thread the worker in `slot` of `spread` (for its whole life).
pub(crate) fn join(spread: Arc<Spread>, slot: usize) {
    MINE.with(|m| *m.borrow_mut() = Some((spread, slot)));
}

/// The calling worker starts (or goes on with) work at `now`: note its CPU, and move off it
/// when another busy worker of its device runs there and a CPU it may use has none (at most
/// once per [`SETTLE_EVERY`] while it stays awake). Nothing on a thread that is not a worker.
pub(crate) fn settle(now: Instant) {
    with_mine(|spread, slot| {
        let cpu = crate::sync::current_cpu();
        if let Some(busy) = spread.note(slot, cpu) {
            if crate::sync::move_off_cpus_when_due(&busy, now, SETTLE_EVERY) {
                spread.note(slot, crate::sync::current_cpu());
            }
        }
    });
}

/// The calling worker has finished its work and goes back to its engine's queue.
pub(crate) fn leave() {
    with_mine(Spread::clear);
}

fn with_mine(f: impl FnOnce(&Spread, usize)) {
    MINE.with(|m| {
        if let Some((spread, slot)) = &*m.borrow() {
            f(spread, *slot);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_sees_another_noted_on_its_cpu_and_not_itself() {
        let s = Spread::new();
        assert!(s.note(0, 3).is_none(), "alone on CPU 3");
        assert!(s.note(1, 4).is_none(), "CPU 4 is its own");
        let busy = s.note(2, 3).expect("worker 0 is noted on CPU 3");
        assert_eq!(&busy[..3], &[3, 4, 3]);
        assert!(busy[3..].iter().all(|&c| c == IDLE));
        s.clear(0);
        assert!(s.note(2, 3).is_none(), "worker 0 left");
        assert!(
            s.note(SLOTS, 3).is_none(),
            "a slot past the notes takes no part"
        );
        s.clear(SLOTS);
    }
}
