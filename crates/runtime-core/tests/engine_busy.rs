//! The engines' compute busy time and the utilisation measured from it
//! (`Device::compute_busy`, `Device::compute_utilization`): compute ops (kernels, host
//! functions) count, copies do not, and a window in which nothing ran reads 0. A binary of its
//! own, so that no other test's work lands on the device while it measures.

mod common;

use std::sync::Arc;
use std::time::Duration;

use runtime_core::stream::{FnOp, OpKind, Stream};

const NAP: Duration = Duration::from_millis(30);

fn op(kind: OpKind) -> Arc<dyn runtime_core::stream::Op> {
    FnOp::shared("nap", kind, || {
        std::thread::sleep(NAP);
        Ok(())
    })
}

#[test]
fn compute_ops_count_as_busy_copies_do_not_and_idle_windows_read_zero() {
    let r = common::init();
    let d = &r.devices()[1];
    let s = Stream::new(d, 0).unwrap();
    let wait = Some(Duration::from_secs(60));
    assert_eq!(d.compute_busy(), Duration::ZERO);

    // A copy-engine op, however long, is no compute work.
    s.launch(op(OpKind::Copy)).unwrap();
    s.synchronize(wait).unwrap();
    assert_eq!(d.compute_busy(), Duration::ZERO);

    d.compute_utilization(); // start a window
    for _ in 0..3 {
        s.launch(op(OpKind::Compute)).unwrap();
    }
    s.synchronize(wait).unwrap();
    let busy = d.compute_busy();
    assert!(busy >= 3 * NAP, "three naps of {NAP:?} ran, busy {busy:?}");
    let u = d.compute_utilization();
    assert!(
        (1..=100).contains(&u),
        "busy for at least 90 ms of the window: {u}%"
    );
    // Nothing ran since: the next window reads 0.
    assert_eq!(d.compute_utilization(), 0);
    assert_eq!(d.compute_busy(), busy);
}
