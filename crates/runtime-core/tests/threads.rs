//! Many threads launching on their own streams and on one shared stream; stream handles
//! created and dropped while other threads synchronise.
//!
//! All tests share one runtime (same settings, never shut down).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::Duration;

use runtime_core::event::{Event, EventOptions};
use runtime_core::runtime::{self};
use runtime_core::stream::{self, FnOp, OpKind, Stream};

use common::init;

/// Run `f` on another thread; fail (instead of hanging) if it takes longer than `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("no progress in {limit:?}: deadlock?"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the worker thread panicked"),
    }
}

const THREADS: usize = 8;
const OPS: usize = 1000;

#[test]
fn eight_threads_launch_on_own_and_shared_streams() {
    within(Duration::from_secs(60), || {
        let rt = init();
        let shared = Stream::new(rt.device(0).unwrap(), 0).unwrap();
        let own_counts: Arc<Vec<AtomicUsize>> =
            Arc::new((0..THREADS).map(|_| AtomicUsize::new(0)).collect());
        let shared_counts: Arc<Vec<AtomicUsize>> =
            Arc::new((0..THREADS).map(|_| AtomicUsize::new(0)).collect());
        let total = Arc::new(AtomicUsize::new(0));
        let out_of_order = Arc::new(AtomicBool::new(false));
        let barrier = Arc::new(Barrier::new(THREADS));

        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (rt, shared, barrier) = (rt.clone(), shared.clone(), barrier.clone());
                let (own_counts, shared_counts, total, out_of_order) = (
                    own_counts.clone(),
                    shared_counts.clone(),
                    total.clone(),
                    out_of_order.clone(),
                );
                std::thread::spawn(move || {
                    let own = Stream::new(rt.device(t % 2).unwrap(), -((t % 4) as i32)).unwrap();
                    barrier.wait();
                    for i in 0..OPS {
                        // Each op checks that it runs right after its predecessor on the same
                        // stream (per thread: program order on both streams).
                        let (c, ooo) = (own_counts.clone(), out_of_order.clone());
                        own.launch(FnOp::shared("own", OpKind::Compute, move || {
                            if c[t].fetch_add(1, Ordering::SeqCst) != i {
                                ooo.store(true, Ordering::SeqCst);
                            }
                            Ok(())
                        }))
                        .unwrap();
                        let (c, ooo, total) =
                            (shared_counts.clone(), out_of_order.clone(), total.clone());
                        shared
                            .launch(FnOp::shared("shared", OpKind::Compute, move || {
                                if c[t].fetch_add(1, Ordering::SeqCst) != i {
                                    ooo.store(true, Ordering::SeqCst);
                                }
                                total.fetch_add(1, Ordering::SeqCst);
                                Ok(())
                            }))
                            .unwrap();
                        if i % 250 == 0 {
                            // Sometimes synchronise in the middle, from this thread.
                            own.synchronize(None).unwrap();
                        }
                    }
                    own.synchronize(None).unwrap();
                    assert_eq!(own_counts[t].load(Ordering::SeqCst), OPS);
                    let (submitted, completed) = own.counters();
                    assert_eq!((submitted, completed), (OPS as u64, OPS as u64));
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        shared.synchronize(None).unwrap();
        runtime::synchronize_all(None).unwrap();
        assert!(
            !out_of_order.load(Ordering::SeqCst),
            "an op ran out of order"
        );
        for t in 0..THREADS {
            assert_eq!(
                own_counts[t].load(Ordering::SeqCst),
                OPS,
                "own stream of {t}"
            );
            assert_eq!(
                shared_counts[t].load(Ordering::SeqCst),
                OPS,
                "shared, thread {t}"
            );
        }
        assert_eq!(total.load(Ordering::SeqCst), THREADS * OPS);
        assert_eq!(
            shared.counters(),
            ((THREADS * OPS) as u64, (THREADS * OPS) as u64)
        );
    });
}

#[test]
fn threads_record_and_wait_across_streams() {
    within(Duration::from_secs(60), || {
        let rt = init();
        // A chain: thread t waits on thread t-1's event before each of its steps, so the
        // shared counter sees the steps of round r in thread order.
        let n = 4;
        let rounds = 200;
        let streams: Vec<Stream> = (0..n)
            .map(|t| Stream::new(rt.device(t % 2).unwrap(), 0).unwrap())
            .collect();
        let counter = Arc::new(AtomicU64::new(0));
        let bad = Arc::new(AtomicBool::new(false));
        for r in 0..rounds {
            let mut prev: Option<Event> = None;
            for (t, s) in streams.iter().enumerate() {
                if let Some(e) = &prev {
                    s.wait_event(e).unwrap();
                }
                let (c, bad) = (counter.clone(), bad.clone());
                let want = (r * n + t) as u64;
                s.launch(FnOp::shared("chain", OpKind::Compute, move || {
                    if c.fetch_add(1, Ordering::SeqCst) != want {
                        bad.store(true, Ordering::SeqCst);
                    }
                    Ok(())
                }))
                .unwrap();
                let e = Event::with_options(EventOptions::without_timing());
                s.record(&e).unwrap();
                prev = Some(e);
            }
            // The next round's first step waits for this round's last one.
            streams[0].wait_event(prev.as_ref().unwrap()).unwrap();
        }
        for s in &streams {
            s.synchronize(None).unwrap();
        }
        assert_eq!(counter.load(Ordering::SeqCst), (rounds * n) as u64);
        assert!(!bad.load(Ordering::SeqCst), "a step ran out of chain order");
    });
}

/// Threads that create and drop streams while others synchronise whole devices: dropping the
/// last handle of a stream must not deadlock with a registry scan.
#[test]
fn dropping_streams_while_others_synchronize() {
    within(Duration::from_secs(60), || {
        let rt = init();
        let droppers = 3;
        let finished = Arc::new(AtomicUsize::new(0));
        let mut handles = Vec::new();
        for t in 0..droppers {
            let (rt, finished) = (rt.clone(), finished.clone());
            handles.push(std::thread::spawn(move || {
                let dev = rt.device(1).unwrap();
                for _ in 0..800 {
                    let streams: Vec<Stream> =
                        (0..64).map(|_| Stream::new(dev, 0).unwrap()).collect();
                    if t == 0 {
                        streams[0]
                            .launch(FnOp::shared("x", OpKind::Compute, || Ok(())))
                            .unwrap();
                    }
                    drop(streams);
                }
                finished.fetch_add(1, Ordering::SeqCst);
            }));
        }
        let syncer = {
            let (rt, finished) = (rt.clone(), finished.clone());
            std::thread::spawn(move || {
                // Device 0 has none of the dropped streams: its scans skip (and drop) them.
                while finished.load(Ordering::SeqCst) < droppers {
                    rt.device(0).unwrap().synchronize(None).unwrap();
                }
            })
        };
        for h in handles {
            h.join().unwrap();
        }
        syncer.join().unwrap();
    });
}

/// Back-pressure: behind a blocked command, `launch` stops at `MAX_QUEUED` pending commands
/// and resumes when the backlog drains; every launch runs, in order.
#[test]
fn launch_waits_while_the_backlog_is_full() {
    let rt = init();
    let s = Stream::new(rt.device(1).unwrap(), 0).unwrap();
    let open = Arc::new(AtomicBool::new(false));
    let gate = open.clone();
    s.launch(FnOp::shared("gate", OpKind::Compute, move || {
        while !gate.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }))
    .unwrap();
    let total = 2 * stream::MAX_QUEUED as usize + 100;
    let launched = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    let launcher = {
        let (s, launched, ran) = (s.clone(), launched.clone(), ran.clone());
        std::thread::spawn(move || {
            for i in 0..total {
                let ran = ran.clone();
                s.launch(FnOp::shared("count", OpKind::Compute, move || {
                    // in order: the i-th command sees i commands before it
                    assert_eq!(ran.fetch_add(1, Ordering::SeqCst), i);
                    Ok(())
                }))
                .unwrap();
                launched.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // The launcher fills the backlog and then waits: it cannot get past MAX_QUEUED launches
    // while the gate is closed, however long we look.
    while s.pending() <= stream::MAX_QUEUED {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(s.pending(), stream::MAX_QUEUED + 1);
    // 1,024 launches are queued; the last of them is waiting in `launch` for room.
    assert_eq!(
        launched.load(Ordering::SeqCst),
        stream::MAX_QUEUED as usize - 1
    );
    assert!(runtime_core::bindings::backlog_target(&s).is_some());
    open.store(true, Ordering::SeqCst);
    within(Duration::from_secs(60), move || launcher.join().unwrap());
    s.synchronize(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), total);
    assert_eq!(s.pending(), 0);
    assert!(runtime_core::bindings::backlog_target(&s).is_none());
}
