//! Fork a process whose runtime is busy and count the children that hang (RELIABILITY.md,
//! issue 22, "forked children hang now and then").
//!
//! Eight threads of the parent launch small ops on four shared streams and synchronise them,
//! so its threads contend on locks and park and wake all the time; the parent forks `N`
//! times (default 200), and each child builds its own runtime, does the same with three
//! threads for 60 ms and synchronises. A child that has not exited
//! after 15 s is counted as hung and killed.
//!
//! `cargo run --release -p runtime-core --example fork_stress -- 800`

use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime_core::config::ConfigBuilder;
use runtime_core::runtime;
use runtime_core::stream::{FnOp, OpKind, Stream};

fn config() -> ConfigBuilder {
    ConfigBuilder {
        device_count: Some(2),
        memory: Some(runtime_core::Bytes::mib(64)),
        profile: None,
    }
}

/// Launch no-op commands round the streams, synchronising every third, until `until`.
fn busy(streams: Arc<Vec<Stream>>, k: usize, until: Option<Instant>) {
    let mut i = 0usize;
    while until.is_none_or(|u| Instant::now() < u) {
        let s = &streams[(i + k) % streams.len()];
        let _ = s.launch(FnOp::shared("noop", OpKind::Compute, || Ok(())));
        if i.is_multiple_of(3) {
            let _ = s.synchronize(Some(Duration::from_secs(20)));
        }
        i += 1;
    }
}

fn streams(rt: &runtime::Runtime, n: usize) -> Arc<Vec<Stream>> {
    Arc::new(
        (0..n)
            .map(|i| Stream::new(rt.device(i % 2).unwrap(), 0).unwrap())
            .collect(),
    )
}

/// The child (the runtime's own fork handlers abandoned the parent's runtime): its own
/// runtime, three busy threads for 60 ms, then a synchronisation.
fn child() -> ! {
    let rt = runtime::init(&config()).unwrap();
    let ss = streams(&rt, 3);
    let until = Instant::now() + Duration::from_millis(60);
    let threads: Vec<_> = (0..3)
        .map(|k| {
            let ss = ss.clone();
            std::thread::spawn(move || busy(ss, k, Some(until)))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let ok = ss
        .iter()
        .all(|s| s.synchronize(Some(Duration::from_secs(20))).is_ok());
    // SAFETY: ends the child at once, running no destructor of state inherited from the parent.
    unsafe { libc::_exit(if ok { 0 } else { 3 }) }
}

fn main() {
    let forks: usize = std::env::args()
        .nth(1)
        .map_or(200, |s| s.parse().expect("the number of forks"));
    let rt = runtime::init(&config()).unwrap();
    let ss = streams(&rt, 4);
    for k in 0..8 {
        let ss = ss.clone();
        std::thread::spawn(move || busy(ss, k, None));
    }
    let (mut hung, mut failed) = (0, 0);
    for i in 0..forks {
        // SAFETY: the runtime's `pthread_atfork` handlers (installed by `init`) make the
        // child consistent; the child then only uses a fresh runtime of its own, as the
        // Python bindings' children do.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            child();
        }
        let start = Instant::now();
        loop {
            let mut status = 0;
            // SAFETY: waits for our own child; `status` is a valid out-pointer.
            if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                if status != 0 {
                    failed += 1;
                    eprintln!("fork {i}: the child failed (status {status})");
                }
                break;
            }
            if start.elapsed() > Duration::from_secs(15) {
                hung += 1;
                eprintln!("fork {i}: the child hung");
                // SAFETY: kills and reaps our own child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    println!("forks {forks} hung {hung} failed {failed}");
    // SAFETY: ends the process without joining the busy threads.
    unsafe { libc::_exit(i32::from(hung + failed > 0)) }
}
