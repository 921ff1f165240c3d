//! How long one cache line takes to travel between two busy threads, sampled over time: the
//! floor under every cross-thread hand-off the runtime makes (a launch seen by a worker, a
//! completion seen by a waiter). On a 2-vCPU virtual machine the two threads sit on the two
//! vCPUs, and where the host puts those decides the figure; a run whose samples jump between
//! two levels explains launch timings that jump between two modes.
//!
//! Run with `cargo run --release -p runtime-core --example core_to_core [samples]`: one line
//! of one-way nanoseconds per 100,000 round trips ([`runtime_core::probe::cross_core_ns`]),
//! 50 ms apart.

use std::time::Duration;

use runtime_core::probe::cross_core_ns;

/// Round trips per sample.
const TRIPS: u32 = 100_000;

fn main() {
    let samples: usize = std::env::args()
        .nth(1)
        .map_or(20, |a| a.parse().expect("samples: a whole number"));
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        match cross_core_ns(TRIPS, Duration::from_secs(10)) {
            Some(ns) => out.push(format!("{ns:.0}")),
            None => {
                println!("this host has one CPU (or refused a thread): nothing to measure");
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("one-way ns per sample: {}", out.join(" "));
}
