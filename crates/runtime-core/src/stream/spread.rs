//! Busy workers of one device spread over the host's cores: each engine worker notes the CPU
//! it runs its work on, and a worker that finds a busy worker of its device in a lower slot
//! noted on its own CPU, while a CPU it may use has none, moves there. Of two busy workers
//! on one CPU only one moves (the one in the higher slot): when both did, they left
//! together for the same free CPU.
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
//! A host thread waiting for a stream runs blocks of the launch the stream runs (`kernel::
//! block`): for that while it is a guest of the spread ([`visit`]). It notes its CPU in a
//! slot after the workers', so that no worker moves onto it, and it moves off a CPU where a
//! busy worker is noted as a worker does (a worker on its CPU stays: the guest's slot is
//! the higher). Without that, a launch of two 5 ms blocks ran
//! both on one core, its worker's and the waiting thread's, in one timed call in five after
//! an idle moment (17-18 ms instead of 10, the other core idle): the worker noted its CPU
//! when it took the stream, but the waiter, noted nowhere, neither moved nor was avoided.
//! The guest's CPU set is left as it was: the move narrows it and widens it back.
//!
//! The notes are hints, written and read with relaxed atomics: a worker may have moved since
//! it noted its CPU. Each worker notes again when it takes work and at least every
//! [`SETTLE_EVERY`] while it runs (`run_stream`), and clears its note when it goes back to
//! its engine's queue; a guest clears its note when it leaves.

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

/// The CPUs the busy workers (and guests) of one device run on, one note per worker.
#[repr(align(64))]
pub(crate) struct Spread {
    cpus: [AtomicU32; SLOTS],
    /// The first slot no worker has: guests ([`visit`]) take the slots from here on.
    first_guest: usize,
}

impl Spread {
    /// Notes for `workers` workers (slots `0..workers`); the slots left are for guests.
    pub(crate) fn new(workers: usize) -> Spread {
        Spread {
            cpus: std::array::from_fn(|_| AtomicU32::new(IDLE)),
            first_guest: workers,
        }
    }

    /// The worker in `slot` runs work now, on CPU `cpu`: note it, and when a busy worker of
    /// a lower slot is noted on `cpu`, return the CPUs to avoid (every busy worker's);
    /// `None` when the core is its own, or it is the one that stays ([`Spread::shared`]).
    fn note(&self, slot: usize, cpu: u32) -> Option<[u32; SLOTS]> {
        let mine = self.cpus.get(slot)?;
        mine.store(cpu, Ordering::Relaxed);
        self.shared(slot, cpu)
    }

    /// When a busy thread of a lower slot than `slot` (`SLOTS` or more: none is the
    /// caller's) is noted on `cpu`: every busy thread's CPU. Of two busy threads on one
    /// CPU only the one in the higher slot moves (a guest, whose slots follow the workers',
    /// moves off a worker): when each moved off the other, both moved to the same free CPU
    /// at once, and met again there: the op's thread and the helper of a two-block launch,
    /// both on one CPU, each moved within 50 us of the other (a `perf` trace of their
    /// `sched_setaffinity` calls), and the waiting thread found both on its new core.
    fn shared(&self, slot: usize, cpu: u32) -> Option<[u32; SLOTS]> {
        let mut busy = [IDLE; SLOTS];
        let mut shared = false;
        for (i, (note, out)) in self.cpus.iter().zip(busy.iter_mut()).enumerate() {
            *out = note.load(Ordering::Relaxed);
            shared |= i < slot && *out == cpu;
        }
        shared.then_some(busy)
    }

    /// A free guest slot, taken with a note of `cpu`; `None` when every one is taken.
    fn take_guest_slot(&self, cpu: u32) -> Option<usize> {
        (self.first_guest..SLOTS).find(|&i| {
            self.cpus[i]
                .compare_exchange(IDLE, cpu, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        })
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

/// The calling thread runs work of `spread`'s device from `now` until the returned guard is
/// dropped. A worker of the device settles ([`settle`]; its note stays until it [`leave`]s).
/// Any other thread is a guest: its CPU is noted in a free guest slot (none free: not
/// noted), and when a busy thread of the device is noted on that CPU while a CPU the thread
/// may use has none, it moves there (at most once per [`SETTLE_EVERY`]), its CPU set left
/// as it was.
pub(crate) fn visit(spread: &Spread, now: Instant) -> Visit<'_> {
    if MINE.with(|m| m.borrow().is_some()) {
        settle(now);
        return Visit(spread, None);
    }
    let cpu = crate::sync::current_cpu();
    let slot = spread.take_guest_slot(cpu);
    if let Some(busy) = spread.shared(slot.unwrap_or(SLOTS), cpu) {
        if crate::sync::move_off_cpus_when_due(&busy, now, SETTLE_EVERY) {
            if let Some(i) = slot {
                spread.cpus[i].store(crate::sync::current_cpu(), Ordering::Relaxed);
            }
        }
    }
    Visit(spread, slot)
}

/// A guest's stay ([`visit`]): clears its note when dropped.
pub(crate) struct Visit<'a>(&'a Spread, Option<usize>);

impl Drop for Visit<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.1 {
            self.0.clear(slot);
        }
    }
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
        let s = Spread::new(3);
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

    #[test]
    fn of_two_busy_threads_on_one_cpu_only_the_higher_slot_moves() {
        let s = Spread::new(3);
        assert!(s.note(1, 2).is_none(), "alone on CPU 2");
        assert!(
            s.note(0, 2).is_none(),
            "worker 0 stays where worker 1 is noted"
        );
        let busy = s.note(1, 2).expect("worker 1 moves off worker 0");
        assert_eq!(&busy[..2], &[2, 2]);
        assert!(s.note(2, 2).is_some(), "worker 2 moves off both");
        let guest = s.take_guest_slot(2).expect("a guest slot");
        assert!(
            s.shared(guest, 2).is_some(),
            "the guest moves off the workers"
        );
        assert!(
            s.note(0, 2).is_none(),
            "worker 0 stays beside the guest and the other workers"
        );
    }

    #[test]
    fn guests_take_the_slots_workers_leave_and_see_every_busy_thread() {
        let s = Spread::new(SLOTS - 2);
        s.note(0, 5);
        let a = s.take_guest_slot(5).expect("two guest slots");
        let b = s.take_guest_slot(6).expect("two guest slots");
        assert_eq!((a, b), (SLOTS - 2, SLOTS - 1));
        assert!(s.take_guest_slot(7).is_none(), "every guest slot taken");
        let busy = s
            .shared(a, 5)
            .expect("worker 0 is noted on the guest's CPU 5");
        assert_eq!((busy[0], busy[a], busy[b]), (5, 5, 6));
        assert!(s.shared(b, 6).is_none(), "CPU 6 is the second guest's own");
        assert!(
            s.shared(SLOTS, 6).is_some(),
            "a guest without a slot sees the other guest"
        );
        s.clear(a);
        assert_eq!(
            s.take_guest_slot(8),
            Some(a),
            "a cleared slot is free again"
        );
    }

    #[test]
    fn a_visit_notes_a_guest_until_it_ends() {
        let s = Spread::new(1);
        {
            let _v = visit(&s, Instant::now());
            let cpu = s.cpus[1].load(Ordering::Relaxed);
            assert_ne!(cpu, IDLE, "the guest is noted");
        }
        assert!(
            s.cpus.iter().all(|c| c.load(Ordering::Relaxed) == IDLE),
            "the visit's note is cleared"
        );
    }
}
