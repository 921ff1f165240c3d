//! loom model checks of the completion, event, submit-gate and engine wake-up protocols
//! (`cfg(loom)` only):
//! `RUSTFLAGS="--cfg loom" cargo test -p runtime-core --lib --release loom`.
//!
//! loom runs each closure under every interleaving (bounded by `LOOM_MAX_PREEMPTIONS`) and
//! fails on a deadlock, so a lost wake-up shows up as a model that never finishes.

use loom::sync::Arc;
use loom::thread;

use crate::event::Gate;
use crate::stream::completion::Completion;

#[test]
fn loom_completion_wakes_a_sleeping_waiter() {
    loom::model(|| {
        let c = Arc::new(Completion::new());
        c.submit();
        c.submit();
        let worker = {
            let c = c.clone();
            thread::spawn(move || {
                c.complete_one();
                c.complete_one();
            })
        };
        assert!(c.wait(2, None));
        assert!(c.is_idle());
        worker.join().unwrap();
    });
}

#[test]
fn loom_two_waiters_and_a_late_submit() {
    loom::model(|| {
        let c = Arc::new(Completion::new());
        let target = c.submit();
        let waiter = {
            let c = c.clone();
            thread::spawn(move || assert!(c.wait(target, None)))
        };
        let worker = {
            let c = c.clone();
            thread::spawn(move || c.complete_one())
        };
        assert!(c.wait(target, None));
        waiter.join().unwrap();
        worker.join().unwrap();
        assert_eq!(c.completed(), 1);
    });
}

/// Sleepers for different targets: the completer wakes them only at the lowest target
/// (`wake_at`), and the one still short of its own target must lower it again before it
/// sleeps, also when a second completer's reset erased it meanwhile.
#[test]
fn loom_waiters_for_different_targets_are_each_woken() {
    loom::model(|| {
        let c = Arc::new(Completion::new());
        let first = c.submit();
        let second = c.submit();
        let near = {
            let c = c.clone();
            thread::spawn(move || assert!(c.wait(first, None)))
        };
        let completers: Vec<_> = (0..2)
            .map(|_| {
                let c = c.clone();
                thread::spawn(move || c.complete_one())
            })
            .collect();
        assert!(c.wait(second, None));
        near.join().unwrap();
        for t in completers {
            t.join().unwrap();
        }
        assert_eq!(c.completed(), 2);
    });
}

#[test]
fn loom_gate_parked_waiter_is_released_exactly_once() {
    loom::model(|| {
        let g: Arc<Gate<u32>> = Arc::new(Gate::new());
        let completer = {
            let g = g.clone();
            thread::spawn(move || g.complete(1, None))
        };
        // The waiter either sees record 1 done, or is parked and handed back by complete().
        let passed = g.park_unless_complete(1, 7, || {});
        let released = completer.join().unwrap();
        if passed {
            assert!(released.is_empty());
        } else {
            assert_eq!(released, vec![7]);
        }
    });
}

#[test]
fn loom_gate_out_of_order_records() {
    loom::model(|| {
        let g: Arc<Gate<u32>> = Arc::new(Gate::new());
        let a = {
            let g = g.clone();
            thread::spawn(move || g.complete(2, None))
        };
        let b = {
            let g = g.clone();
            thread::spawn(move || g.complete(1, None))
        };
        let parked_on_1 = !g.park_unless_complete(1, 1, || {});
        let mut released = a.join().unwrap();
        released.extend(b.join().unwrap());
        // Whoever parked on record 1 is released by exactly the completion of record 1.
        assert_eq!(released, if parked_on_1 { vec![1] } else { vec![] });
        assert_eq!(g.latest(), 2);
    });
}

#[test]
fn loom_gate_host_wait_sees_completion() {
    loom::model(|| {
        let g: Arc<Gate<u32>> = Arc::new(Gate::new());
        let completer = {
            let g = g.clone();
            thread::spawn(move || {
                g.complete(1, Some(5));
            })
        };
        assert!(g.wait_latest(1, None));
        assert_eq!(g.timestamp_if(1), Some(5));
        completer.join().unwrap();
    });
}

/// The device's submission gate: a submitter that got in has pushed before `close` returns,
/// and one that did not get in pushed nothing — the drain after `close` misses no command.
#[test]
fn loom_submit_gate_close_waits_for_admitted_submitters() {
    use crate::sync::gate::EntryGate;
    use crate::sync::{AtomicUsize, Ordering};
    loom::model(|| {
        let gate = Arc::new(EntryGate::new());
        let pushed = Arc::new(AtomicUsize::new(0));
        let submitter = {
            let (gate, pushed) = (gate.clone(), pushed.clone());
            thread::spawn(move || match gate.enter() {
                Some(_guard) => {
                    pushed.fetch_add(1, Ordering::SeqCst);
                    true
                }
                None => false,
            })
        };
        assert!(gate.close(None));
        let seen_by_drain = pushed.load(Ordering::SeqCst);
        let admitted = submitter.join().unwrap();
        assert_eq!(seen_by_drain, usize::from(admitted));
        assert!(gate.enter().is_none());
    });
}

/// The engines' wake-up protocol (`stream::engine::Idle`), with a mutex-guarded queue in
/// place of the ready queues.
mod engine_wakeups {
    use std::collections::VecDeque;

    use loom::sync::Arc;
    use loom::thread;

    use crate::stream::engine::{linger_on, Idle};
    use crate::sync::Mutex;

    struct Engine {
        idle: Idle,
        queue: Mutex<VecDeque<u32>>,
    }

    impl Engine {
        fn new() -> Arc<Engine> {
            Arc::new(Engine {
                idle: Idle::new(),
                queue: Mutex::new(VecDeque::new()),
            })
        }
        fn push(&self, s: u32) {
            self.queue.lock().push_back(s);
            self.idle.wake_one();
        }
        fn try_pop(&self) -> Option<u32> {
            self.queue.lock().pop_front()
        }
        fn waiting(&self) -> bool {
            !self.queue.lock().is_empty()
        }
    }

    /// The lost wake-up of RELIABILITY.md item 29: a worker lingers on its stream (nothing
    /// arrives); a launcher pushes two streams meanwhile, each push seeing it spin and waking
    /// nobody; the worker then takes one of them. The other must reach the sleeping worker:
    /// loom fails the model as a deadlock if the sleeper is left asleep with work queued.
    #[test]
    fn loom_engine_linger_leaves_no_pushed_stream_behind() {
        loom::model(|| {
            let e = Engine::new();
            let sleeper = {
                let e = e.clone();
                thread::spawn(move || e.idle.sleep_pop(|| e.try_pop()))
            };
            let lingerer = {
                let e = e.clone();
                thread::spawn(move || {
                    let mut looks = 0;
                    let arrived = linger_on(
                        &e.idle,
                        || false,
                        || e.waiting(),
                        || {
                            looks += 1;
                            looks > 1
                        },
                        || thread::yield_now(),
                    );
                    assert!(!arrived);
                    // On to one waiting stream, if any (the rest is the sleeper's).
                    e.try_pop()
                })
            };
            e.push(1);
            e.push(2);
            let a = lingerer.join().unwrap();
            let b = sleeper.join().unwrap();
            // Both streams ran, each once: one may go to either worker; the sleeper always
            // gets one, and the lingerer takes the other or leaves it for a later worker.
            let mut ran: Vec<u32> = a.into_iter().chain([b]).collect();
            ran.extend(e.try_pop());
            ran.sort_unstable();
            assert_eq!(ran, vec![1, 2]);
        });
    }

    /// A spinning worker takes one stream and leaves another behind: the sleeper is woken
    /// for it.
    #[test]
    fn loom_engine_spinner_wakes_a_sleeper_for_work_it_leaves() {
        loom::model(|| {
            let e = Engine::new();
            let sleeper = {
                let e = e.clone();
                thread::spawn(move || e.idle.sleep_pop(|| e.try_pop()))
            };
            let spinner = {
                let e = e.clone();
                thread::spawn(move || {
                    let found = e.idle.spin(|| e.try_pop(), || false);
                    let found = found.or_else(|| e.try_pop());
                    if found.is_some() && e.waiting() {
                        e.idle.wake_one();
                    }
                    found
                })
            };
            e.push(1);
            e.push(2);
            let a = spinner.join().unwrap();
            let b = sleeper.join().unwrap();
            let mut ran: Vec<u32> = a.into_iter().chain([b]).collect();
            ran.extend(e.try_pop());
            ran.sort_unstable();
            assert_eq!(ran, vec![1, 2]);
        });
    }
}
