//! loom model checks of the completion and event protocols (`cfg(loom)` only):
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
    use crate::stream::gate::SubmitGate;
    use crate::sync::{AtomicUsize, Ordering};
    loom::model(|| {
        let gate = Arc::new(SubmitGate::new());
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
        gate.close();
        let seen_by_drain = pushed.load(Ordering::SeqCst);
        let admitted = submitter.join().unwrap();
        assert_eq!(seen_by_drain, usize::from(admitted));
        assert!(gate.enter().is_none());
    });
}
