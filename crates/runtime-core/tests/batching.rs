//! Batching (`enableBatching`) changes nothing observable: 4 threads each launch 5,000 ops on
//! their own stream with events interleaved (records, cross-stream waits, event and stream
//! synchronizes, queries), once with batching on and once off; every order and every wait holds in both runs, and both give identical results.
//!
//! One test (the option is process-wide): the binary runs nothing else.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use runtime_core::config;
use runtime_core::event::Event;
use runtime_core::stream::{FnOp, OpKind, Stream};

use common::init;

const THREADS: usize = 4;
const LAUNCHES: u64 = 5_000;

/// What one run observed: each stream's log of op numbers, and every broken promise.
#[derive(Debug, PartialEq)]
struct Outcome {
    logs: Vec<Vec<u64>>,
    violations: Vec<String>,
}

/// Per thread: the latest event it recorded, with the number of ops queued before it.
type Latest = Vec<Mutex<Option<(Event, u64)>>>;

struct Log {
    ran: Mutex<Vec<u64>>,
    /// How many ops ran (read by other streams' ops and by the launching thread).
    count: AtomicU64,
}

fn run(batching: bool) -> Outcome {
    runtime_core::runtime::set_option(config::RuntimeOption::Batching, batching);
    let rt = init();
    let streams: Vec<Stream> = (0..THREADS)
        .map(|t| Stream::new(rt.device(t % 2).unwrap(), 0).unwrap())
        .collect();
    let logs: Vec<Arc<Log>> = (0..THREADS)
        .map(|_| {
            Arc::new(Log {
                ran: Mutex::new(Vec::new()),
                count: AtomicU64::new(0),
            })
        })
        .collect();
    let latest: Arc<Latest> = Arc::new((0..THREADS).map(|_| Mutex::new(None)).collect());
    let violations = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (s, logs, latest, violations) =
                (&streams[t], &logs, latest.clone(), violations.clone());
            scope.spawn(move || {
                let me = logs[t].clone();
                let fail = |what: String| violations.lock().unwrap().push(what);
                for i in 0..LAUNCHES {
                    // After waiting on another stream's event, the next op must find that
                    // stream at least as far as when the event was recorded.
                    let mut must_see = None;
                    if i % 25 == 24 {
                        let other = (t + 1) % THREADS;
                        if let Some((ev, at)) = latest[other].lock().unwrap().clone() {
                            s.wait_event(&ev).unwrap();
                            must_see = Some((logs[other].clone(), at, other));
                        }
                    }
                    let log = me.clone();
                    let v = violations.clone();
                    let op = FnOp::shared(format!("op{i}"), OpKind::Compute, move || {
                        if let Some((other, at, o)) = &must_see {
                            let seen = other.count.load(Ordering::SeqCst);
                            if seen < *at {
                                v.lock().unwrap().push(format!(
                                    "stream {t} op {i}: stream {o} at {seen}, recorded at {at}"
                                ));
                            }
                        }
                        log.ran.lock().unwrap().push(i);
                        log.count.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    });
                    s.launch(op).unwrap();
                    if i % 10 == 9 {
                        let ev = Event::new();
                        s.record(&ev).unwrap();
                        *latest[t].lock().unwrap() = Some((ev, i + 1));
                    }
                    if i % 50 == 49 {
                        let (ev, at) = latest[t].lock().unwrap().clone().unwrap();
                        ev.synchronize(None).unwrap();
                        let seen = me.count.load(Ordering::SeqCst);
                        if seen < at {
                            fail(format!("stream {t}: event of op {at} done at {seen}"));
                        }
                    }
                    if i % 37 == 0 && s.query().unwrap() {
                        let seen = me.count.load(Ordering::SeqCst);
                        if seen != i + 1 {
                            fail(format!(
                                "stream {t}: query true with {seen} of {} run",
                                i + 1
                            ));
                        }
                    }
                    if i % 1000 == 999 {
                        s.synchronize(None).unwrap();
                        let seen = me.count.load(Ordering::SeqCst);
                        if seen != i + 1 {
                            fail(format!(
                                "stream {t}: synchronize with {seen} of {} run",
                                i + 1
                            ));
                        }
                    }
                }
                s.synchronize(None).unwrap();
                assert!(s.query().unwrap());
            });
        }
    });
    for s in &streams {
        s.destroy().unwrap();
    }
    let violations = std::mem::take(&mut *violations.lock().unwrap());
    Outcome {
        logs: logs
            .iter()
            .map(|l| std::mem::take(&mut *l.ran.lock().unwrap()))
            .collect(),
        violations,
    }
}

#[test]
fn batching_on_and_off_give_identical_results() {
    let on = run(true);
    let off = run(false);
    runtime_core::runtime::set_option(config::RuntimeOption::Batching, true);
    let want: Vec<u64> = (0..LAUNCHES).collect();
    for (name, o) in [("on", &on), ("off", &off)] {
        assert!(
            o.violations.is_empty(),
            "batching {name}: {:?}",
            o.violations
        );
        for (t, log) in o.logs.iter().enumerate() {
            assert!(*log == want, "batching {name}: stream {t} ran out of order");
        }
    }
    assert_eq!(on, off);
}
