//! The runtime's own `fork()` handlers (`runtime::install_fork_handlers`, registered with
//! `pthread_atfork` by `init`): whoever forks, the child finds the process-wide locks
//! consistent and builds a runtime of its own, and nothing public unlocks a lock it does not
//! hold.
//!
//! Before, the handlers were safe public functions (`after_fork_in_parent`, also exported to
//! Python) that force-unlocked the kernel registry, the trace, capture and managed-memory
//! locks: called while `kernel::register` held the registry (from a user `Kernel::name`),
//! readers walked a map being rehashed (ThreadSanitizer: 9 races, a free racing a read).
//! They are private now (a `compile_fail` doctest in `runtime` says so).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime_core::error::{ArgError, KernelFailure};
use runtime_core::kernel::{self, Args, Kernel, KernelArg, RunContext};
use runtime_core::runtime;

/// A kernel whose `name` takes its time, so a fork often lands while `register` works.
struct Slow(String);

impl Kernel for Slow {
    fn name(&self) -> &str {
        std::thread::sleep(Duration::from_micros(50));
        &self.0
    }
    fn check(&self, _: &[KernelArg]) -> Result<(), ArgError> {
        Ok(())
    }
    fn run(&self, _: &Args, _: &RunContext) -> Result<(), KernelFailure> {
        Ok(())
    }
}

/// A kernel with a plain name, for registering often.
struct Fast(String);

impl Kernel for Fast {
    fn name(&self) -> &str {
        &self.0
    }
    fn check(&self, _: &[KernelArg]) -> Result<(), ArgError> {
        Ok(())
    }
    fn run(&self, _: &Args, _: &RunContext) -> Result<(), KernelFailure> {
        Ok(())
    }
}

/// Fork, run `child` in the child (its return value is the exit status), and wait up to
/// 20 s for it: a child that hangs on a lock fails the test instead of hanging it.
fn fork_and_wait(child: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only runs `child` (runtime calls, which the fork handlers made
    // usable) and then `_exit`, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(99);
        // SAFETY: ends the child at once, without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut status = 0;
        // SAFETY: waiting for our own child; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            };
        }
        if Instant::now() > deadline {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("the forked child hung");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn forks_while_kernels_are_registered_leave_the_child_a_usable_runtime() {
    let rt = common::init();
    let stop = Arc::new(AtomicBool::new(false));
    let registrar = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                kernel::register(Arc::new(Slow(format!("slow{}", i % 64))));
                i += 1;
            }
        })
    };
    // Work in flight in the parent too: engines and copy helpers hold their own locks.
    let d = rt.device(0).unwrap();
    let b = d.memory().allocate(1 << 20).unwrap();
    for round in 0..20 {
        let code = fork_and_wait(|| {
            // The registry is whole: every built-in is still found, and it takes new kernels.
            if kernel::lookup("add").is_none() {
                return 1;
            }
            kernel::register(Arc::new(Slow("child".into())));
            if kernel::lookup("child").is_none() {
                return 2;
            }
            // The parent's runtime is abandoned; a new one works.
            if b.check().is_ok() {
                return 3;
            }
            let Ok(rt) = runtime::init(&common::settings()) else {
                return 4;
            };
            let buf = rt.device(1).unwrap().memory().allocate(4096).unwrap();
            if buf.write(0, &[1, 2, 3]).is_err() {
                return 5;
            }
            // Threads of the child contend for the registry the parent's registrar was
            // waiting on at the fork: no wake-up may go to a thread that vanished in it.
            let workers: Vec<_> = (0..4)
                .map(|t| {
                    std::thread::spawn(move || {
                        for i in 0..200 {
                            kernel::register(Arc::new(Fast(format!("c{t}_{}", i % 8))));
                            assert!(kernel::lookup("add").is_some());
                        }
                    })
                })
                .collect();
            if workers.into_iter().any(|w| w.join().is_err()) {
                return 6;
            }
            0
        });
        assert_eq!(code, 0, "round {round}: the child failed with {code}");
        // The parent goes on: its locks were released by the parent handler.
        b.write(0, &[round as u8; 64]).unwrap();
        assert!(kernel::lookup("add").is_some());
    }
    stop.store(true, Ordering::Relaxed);
    registrar.join().unwrap();
}

/// Every process-wide lock of the core is held across a fork by the handlers: a `static`
/// mutex or reader-writer lock without a `ForkGuarded` companion would be left locked in a
/// child forked while another thread held it (the child would hang on it). And each is std's
/// futex lock (`StaticMutex`/`StaticRwLock`): a parking_lot lock's unlock in the child woke
/// (or handed the lock to) waiters of the parent that do not exist there, one fork in four
/// of the test above hung that way.
#[test]
fn every_process_wide_lock_is_fork_guarded() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![src];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let text: Vec<(String, String)> = files
        .iter()
        .map(|p| (p.display().to_string(), std::fs::read_to_string(p).unwrap()))
        .collect();
    let mut unguarded = Vec::new();
    for (path, code) in &text {
        for line in code.lines() {
            let l = line.trim_start();
            let Some(rest) = l
                .strip_prefix("static ")
                .or_else(|| l.strip_prefix("pub(crate) static "))
            else {
                continue;
            };
            let Some((name, ty)) = rest.split_once(':') else {
                continue;
            };
            let lock = ["Mutex<", "RwLock<"].iter().any(|m| ty.contains(m));
            if !lock || ty.contains("ForkGuarded") {
                continue;
            }
            // parking_lot's locks keep their waiters in a process-wide table that a child
            // inherits with the parent's vanished threads in it: a static lock is std's.
            if !(ty.contains("StaticMutex<") || ty.contains("StaticRwLock<")) {
                unguarded.push(format!(
                    "{path}: {} is not a StaticMutex/StaticRwLock",
                    name.trim()
                ));
            }
            let guard = format!("ForkGuarded::new(|| &{})", name.trim());
            if !text.iter().any(|(_, c)| c.contains(&guard)) {
                unguarded.push(format!("{path}: {}", name.trim()));
            }
        }
    }
    assert!(
        unguarded.is_empty(),
        "locks without fork handling: {unguarded:?}"
    );
}

/// Defer scopes belong to the process that opened them: a child forked while a scope is
/// open (on another thread, or on the forking thread itself) starts with none, frees at once
/// what it lets go of, and closing the forking thread's scope there changes nothing.
#[test]
fn a_forked_child_starts_with_no_defer_scope_open() {
    use runtime_core::memory::defer;
    let rt = common::init();
    let mem = rt.device(1).unwrap().memory().clone();
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    let (close_tx, close_rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        let scope = defer::enter();
        opened_tx.send(()).unwrap();
        close_rx.recv().unwrap();
        drop(scope);
    });
    opened_rx.recv().unwrap();
    // Held for the other thread's scope.
    defer::release(mem.allocate(4096).unwrap());
    let code = fork_and_wait(|| {
        if defer::state() != (0, 0) {
            return 1;
        }
        let Ok(rt) = runtime::init(&common::settings()) else {
            return 2;
        };
        let mem = rt.device(1).unwrap().memory().clone();
        let base = mem.stats().allocated;
        defer::release(mem.allocate(4096).unwrap());
        if mem.stats().allocated != base {
            return 3;
        }
        // A scope of the child's own still holds until it closes.
        let scope = defer::enter();
        defer::release(mem.allocate(4096).unwrap());
        if defer::state() != (1, 1) || mem.stats().allocated == base {
            return 4;
        }
        drop(scope);
        if defer::state() != (0, 0) || mem.stats().allocated != base {
            return 5;
        }
        0
    });
    assert_eq!(
        code, 0,
        "other thread's scope: the child failed with {code}"
    );

    // The forking thread inside a scope: its guard lives on in the child.
    let mine = defer::enter();
    let code = fork_and_wait(move || {
        if defer::state() != (0, 0) {
            return 1;
        }
        drop(mine);
        if defer::state() != (0, 0) {
            return 2;
        }
        let Ok(rt) = runtime::init(&common::settings()) else {
            return 3;
        };
        let mem = rt.device(1).unwrap().memory().clone();
        let base = mem.stats().allocated;
        defer::release(mem.allocate(4096).unwrap());
        if mem.stats().allocated != base {
            return 4;
        }
        let scope = defer::enter();
        if defer::state() != (1, 0) {
            return 5;
        }
        drop(scope);
        if defer::state() != (0, 0) {
            return 6;
        }
        0
    });
    assert_eq!(
        code, 0,
        "forking thread's scope: the child failed with {code}"
    );
    close_tx.send(()).unwrap();
    other.join().unwrap();
}

/// The pinned cache and its statistics start over in a forked child, as after `shutdown`:
/// the parent's blocks (live or cached) are neither counted nor handed out there.
#[test]
fn a_forked_child_starts_with_an_empty_pinned_cache_and_statistics() {
    use runtime_core::memory::pinned::{self, HostMemoryStats};
    common::init();
    let live = pinned::allocate(1 << 20).unwrap();
    drop(pinned::allocate(4 << 20).unwrap()); // cached in the parent
    let parent = pinned::stats();
    assert!(parent.allocated_bytes >= 1 << 20 && parent.reserved_bytes >= 5 << 20);
    let code = fork_and_wait(move || {
        if pinned::stats() != HostMemoryStats::default() {
            return 1;
        }
        let b = pinned::allocate(4 << 20).unwrap();
        let s = pinned::stats();
        if s.cache_hits != 0 || s.num_host_alloc != 1 || s.allocated_bytes != 4 << 20 {
            return 2;
        }
        if s.reserved_bytes != 4 << 20 || s.locked_bytes != if b.is_locked() { 4 << 20 } else { 0 }
        {
            return 3;
        }
        // The parent's live block goes in the child without touching the child's counts.
        drop(live);
        if pinned::stats() != s {
            return 4;
        }
        0
    });
    assert_eq!(code, 0, "the child failed with {code}");
}

/// Tracing belongs to the process that started it: a forked child starts with tracing off
/// and an empty log, and the parent's records stay the parent's.
#[test]
fn a_forked_child_starts_with_tracing_off_and_an_empty_log() {
    use runtime_core::trace;
    let rt = common::init();
    let mem = rt.device(1).unwrap().memory().clone();
    trace::start();
    drop(mem.allocate(4096).unwrap());
    let code = fork_and_wait(|| {
        if trace::enabled() {
            return 1;
        }
        if !trace::stop().is_empty() {
            return 2;
        }
        0
    });
    let parent = trace::stop();
    assert_eq!(code, 0, "the child failed with {code}");
    assert!(
        parent
            .iter()
            .any(|r| matches!(r.phase, trace::Phase::Alloc { bytes: 4096, .. })),
        "the parent keeps its records: {parent:?}"
    );
}
