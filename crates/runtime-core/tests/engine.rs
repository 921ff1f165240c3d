//! The engines' wake-up protocol (`stream::engine`): every stream pushed to an engine is
//! taken by a worker while any worker is free, however the pushes interleave with workers
//! that spin or linger.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime_core::stream::{FnOp, OpKind, Stream};

use common::init;

/// A worker that just ran a stream dry lingers on it, counted as spinning, so pushes made
/// meanwhile wake nobody. Streams pushed right then, one per worker, must all start: each
/// command here waits until every one of them runs, so a stream left queued while a worker
/// sleeps fails the round. (Before the fix the lingering worker woke a sleeper only when it
/// went back to its own stream; the second stream then waited for some unrelated push.)
#[test]
fn streams_pushed_while_a_worker_lingers_all_start() {
    let rt = init();
    let dev = rt.device(0).unwrap();
    let workers = dev.compute_info().compute_engines;
    let warm = Stream::new(dev, 0).unwrap();
    for round in 0..300 {
        warm.launch(FnOp::shared("warm", OpKind::Compute, || Ok(())))
            .unwrap();
        warm.synchronize(None).unwrap(); // its worker now lingers on `warm`
        let started = Arc::new(AtomicUsize::new(0));
        let streams: Vec<Stream> = (0..workers).map(|_| Stream::new(dev, 0).unwrap()).collect();
        for s in &streams {
            let started = started.clone();
            s.launch(FnOp::shared("meet", OpKind::Compute, move || {
                started.fetch_add(1, Ordering::SeqCst);
                let until = Instant::now() + Duration::from_secs(5);
                while started.load(Ordering::SeqCst) < workers {
                    assert!(Instant::now() < until, "a stream was left queued");
                    std::thread::yield_now();
                }
                Ok(())
            }))
            .unwrap();
        }
        for s in &streams {
            s.synchronize(Some(Duration::from_secs(10)))
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        assert_eq!(started.load(Ordering::SeqCst), workers);
    }
}
