//! How long one cache line takes to travel between two busy threads, sampled over time: the
//! floor under every cross-thread hand-off the runtime makes (a launch seen by a worker, a
//! completion seen by a waiter). On a 2-vCPU virtual machine the two threads sit on the two
//! vCPUs, and where the host puts those decides the figure; a run whose samples jump between
//! two levels explains launch timings that jump between two modes.
//!
//! Run with `cargo run --release -p runtime-core --example core_to_core [samples]`: one line
//! of one-way nanoseconds per 100,000 round trips, 50 ms apart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Round trips per sample.
const TRIPS: u64 = 100_000;

fn main() {
    let samples: usize = std::env::args()
        .nth(1)
        .map_or(20, |a| a.parse().expect("samples: a whole number"));
    // The ball: odd values are the echo thread's to answer, even ones the main thread's; 0
    // tells the echo thread to stop. Its own cache line (the atomic alone in a 64-byte box).
    #[repr(align(64))]
    struct Line(AtomicU64);
    let ball = Arc::new(Line(AtomicU64::new(2)));
    let echo = {
        let ball = ball.clone();
        std::thread::spawn(move || loop {
            let v = ball.0.load(Ordering::Acquire);
            if v == 0 {
                return;
            }
            if v % 2 == 1 {
                ball.0.store(v + 1, Ordering::Release);
            }
            std::hint::spin_loop();
        })
    };
    let mut v = 2;
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t0 = Instant::now();
        for _ in 0..TRIPS {
            ball.0.store(v + 1, Ordering::Release);
            while ball.0.load(Ordering::Acquire) != v + 2 {
                std::hint::spin_loop();
            }
            v += 2;
        }
        let ns = t0.elapsed().as_nanos() / u128::from(TRIPS) / 2;
        out.push(ns.to_string());
        std::thread::sleep(Duration::from_millis(50));
    }
    ball.0.store(0, Ordering::Release);
    echo.join().expect("the echo thread does not panic");
    println!("one-way ns per sample: {}", out.join(" "));
}
