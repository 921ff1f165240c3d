//! The `legacyDefaultStream` option: the default stream and blocking streams synchronise
//! with each other; non-blocking streams never do. One test function: the option is
//! process-wide.

mod common;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use runtime_core::device::Device;
use runtime_core::runtime;
use runtime_core::stream::{FnOp, Op, OpKind, Stream};

const WAIT: Duration = Duration::from_secs(10);

/// An op that holds its stream until the returned opener is called (10 s at most).
fn gate() -> (Arc<dyn Op>, impl Fn()) {
    let g = Arc::new((Mutex::new(false), Condvar::new()));
    let g2 = g.clone();
    let op = FnOp::shared("gate", OpKind::Compute, move || {
        let (lock, cv) = &*g2;
        let open = lock.lock().unwrap();
        let _ = cv.wait_timeout_while(open, WAIT, |o| !*o).unwrap();
        Ok(())
    });
    let open = move || {
        *g.0.lock().unwrap() = true;
        g.1.notify_all();
    };
    (op, open)
}

fn log_op(log: &Arc<Mutex<Vec<&'static str>>>, what: &'static str) -> Arc<dyn Op> {
    let log = log.clone();
    FnOp::shared("log", OpKind::Compute, move || {
        log.lock().unwrap().push(what);
        Ok(())
    })
}

fn check(dev: &Device, legacy: bool) {
    runtime::set_option(
        runtime_core::config::RuntimeOption::LegacyDefaultStream,
        legacy,
    );
    let d = dev.default_stream().unwrap();
    let blocking = Stream::new(dev, 0).unwrap();
    let nb = Stream::new_non_blocking(dev, 0).unwrap();
    assert!(nb.is_non_blocking() && !blocking.is_non_blocking() && !d.is_non_blocking());

    // default held; the blocking stream waits for it only under the option.
    let (g, open) = gate();
    let log = Arc::new(Mutex::new(Vec::new()));
    d.launch(g).unwrap();
    d.launch(log_op(&log, "default")).unwrap();
    blocking.launch(log_op(&log, "blocking")).unwrap();
    nb.launch(log_op(&log, "non-blocking")).unwrap();
    nb.synchronize(Some(WAIT)).unwrap(); // never held by the default stream
    if legacy {
        assert!(common::timed_out(
            blocking.synchronize(Some(Duration::from_millis(20)))
        ));
    } else {
        blocking.synchronize(Some(WAIT)).unwrap();
    }
    open();
    d.synchronize(Some(WAIT)).unwrap();
    blocking.synchronize(Some(WAIT)).unwrap();
    let got = log.lock().unwrap().clone();
    if legacy {
        assert_eq!(got, vec!["non-blocking", "default", "blocking"]);
    } else {
        assert_eq!(got.last(), Some(&"default"));
    }

    // blocking stream held; the default stream waits for it only under the option.
    let (g, open) = gate();
    let log = Arc::new(Mutex::new(Vec::new()));
    blocking.launch(g).unwrap();
    blocking.launch(log_op(&log, "blocking")).unwrap();
    d.launch(log_op(&log, "default")).unwrap();
    if legacy {
        assert!(!d.query().unwrap());
    } else {
        d.synchronize(Some(WAIT)).unwrap();
    }
    open();
    blocking.synchronize(Some(WAIT)).unwrap();
    d.synchronize(Some(WAIT)).unwrap();
    let got = log.lock().unwrap().clone();
    if legacy {
        assert_eq!(got, vec!["blocking", "default"]);
    } else {
        assert_eq!(got, vec!["default", "blocking"]);
    }
}

#[test]
fn legacy_default_stream() {
    let rt = common::init();
    let dev = rt.device(0).unwrap();
    check(dev, false);
    check(dev, true);
    runtime::set_option(
        runtime_core::config::RuntimeOption::LegacyDefaultStream,
        false,
    );
}
