//! The runtime's clock: one monotonic time base shared by every device (event timestamps,
//! trace records, allocation records) and the deadlines of timed waits.
//!
//! The bottom layer: it depends on nothing else in the crate.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Nanoseconds on the runtime's monotonic clock (shared by all devices).
pub fn now_ns() -> u64 {
    EPOCH.elapsed().as_nanos() as u64
}

/// The deadline `timeout` from now; `None` (no limit) when there is no timeout or it reaches
/// past what `Instant` can represent.
pub(crate) fn deadline_after(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}

/// Time left until `deadline` (zero once passed); `None` for no deadline.
pub(crate) fn time_left(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_is_monotonic_and_huge_timeouts_mean_no_deadline() {
        let (a, b) = (now_ns(), now_ns());
        assert!(b >= a);
        assert_eq!(deadline_after(Some(Duration::MAX)), None);
        assert_eq!(deadline_after(None), None);
        let d = deadline_after(Some(Duration::from_secs(60)));
        assert!(time_left(d).unwrap() <= Duration::from_secs(60));
    }
}
