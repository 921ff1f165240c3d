//! What the host charges for a hand-off between two threads: the one-way time of a cache
//! line bouncing between two busy threads ([`cross_core_ns`]).
//!
//! Every hand-off the runtime makes (a launch seen by its worker, a block claimed by a
//! helper, a completion seen by its waiter) costs at least that much, and a launch +
//! synchronize makes a dozen or more. On a virtual machine the host's placement of the vCPUs
//! decides the figure, and it changes from one second to the next: on this project's 2-vCPU
//! VMs it reads about 30 ns while the two vCPUs share a cache and about 200 ns while they do
//! not, which is the difference between the two modes of small launches (BENCHMARKS.md).
//! The bench samples it beside its rows; the `core_to_core` example prints it over time.
//!
//! Depends on nothing else in the crate.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Round trips per burst: [`cross_core_ns`] reports the quickest burst.
const BURST: u32 = 64;

/// One value alone on its cache lines (two lines: the adjacent-line prefetcher pairs them).
#[repr(align(128))]
struct Line<T>(T);

/// The one-way time, in nanoseconds, of a cache line between the calling thread and a thread
/// started for the purpose, both spinning: `round_trips` round trips in bursts of 64, and
/// the mean of the quickest burst. A burst in which either thread lost its core to another
/// busy thread (a worker spinning after its work, a peer library's pool) takes microseconds
/// or milliseconds per round trip; the quickest burst is the one in which both had a core,
/// which is what the host's placement decides. Stops at `limit` (looking at the clock
/// between bursts and every 1024 spins of one wait). `None` when the host has a single CPU
/// (two spinning threads would only take turns on it), when the thread cannot be started,
/// or when no burst completed within `limit`. The first round trip, which waits for the
/// thread to start, is not counted.
pub fn cross_core_ns(round_trips: u32, limit: Duration) -> Option<f64> {
    if round_trips == 0 || std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return None;
    }
    // The ball: the echo thread answers odd values with the next even one.
    let ball = Arc::new(Line(AtomicU64::new(0)));
    let stop = Arc::new(Line(AtomicBool::new(false)));
    let echo = {
        let (ball, stop) = (ball.clone(), stop.clone());
        std::thread::Builder::new()
            .name("runtime-probe".into())
            .spawn(move || {
                while !stop.0.load(Ordering::Relaxed) {
                    let v = ball.0.load(Ordering::Acquire);
                    if v % 2 == 1 {
                        ball.0.store(v + 1, Ordering::Release);
                    }
                    std::hint::spin_loop();
                }
            })
            .ok()?
    };
    let deadline = Instant::now() + limit;
    // Throw the ball (`v` odd) and wait for it to come back; false at the deadline.
    let bounce = |v: u64| {
        ball.0.store(v, Ordering::Release);
        let mut spins = 0u32;
        while ball.0.load(Ordering::Acquire) != v + 1 {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && Instant::now() >= deadline {
                return false;
            }
        }
        true
    };
    let mut best: Option<f64> = None;
    if bounce(1) {
        let mut v = 3u64;
        let mut left = round_trips;
        'bursts: while left > 0 && Instant::now() < deadline {
            let n = left.min(BURST);
            let t0 = Instant::now();
            for _ in 0..n {
                if !bounce(v) {
                    break 'bursts;
                }
                v += 2;
            }
            let ns = t0.elapsed().as_nanos() as f64 / f64::from(n) / 2.0;
            best = Some(best.map_or(ns, |b| b.min(ns)));
            left -= n;
        }
    }
    stop.0.store(true, Ordering::Relaxed);
    let _ = echo.join();
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_measures_a_positive_time_or_says_it_cannot() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let got = cross_core_ns(200, Duration::from_secs(5));
        if cpus < 2 {
            assert_eq!(got, None);
        } else {
            let ns = got.expect("two CPUs: the probe measures");
            assert!(ns > 0.0 && ns.is_finite(), "{ns}");
        }
        assert_eq!(cross_core_ns(0, Duration::from_secs(1)), None);
    }

    #[test]
    fn a_probe_that_runs_out_of_time_reports_only_whole_bursts() {
        // A zero limit: no burst starts (the clock is read before each); with a short one it
        // stops within the limit and whatever it reports is a whole burst's mean.
        assert_eq!(cross_core_ns(u32::MAX, Duration::ZERO), None);
        let t0 = Instant::now();
        if let Some(ns) = cross_core_ns(u32::MAX, Duration::from_millis(20)) {
            assert!(ns > 0.0 && ns.is_finite(), "{ns}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "stopped near its limit"
        );
    }
}
