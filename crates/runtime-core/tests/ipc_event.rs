//! Interprocess events (`ipc_event`): handles, opening in this process and in another (this
//! test binary run again as a child), records made by either side seen by the other (one
//! sequence in the shared page), and processes that die — exited, or killed and not yet
//! reaped (a zombie) — with a record pending: waits end with `InvalidHandle`, never hang.

mod common;

use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use runtime_core::error::{DeviceError, Error, StreamError};
use runtime_core::event::{Event, EventOptions};
use runtime_core::ipc_event;
use runtime_core::runtime;
use runtime_core::stream::{FnOp, Op, OpKind, Stream};

const WAIT: Duration = Duration::from_secs(60);

/// Records one process has pending at once in `record_many`: more than the page's ring names.
const MANY: usize = 300;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn is_invalid_handle(e: &Error) -> bool {
    matches!(e, Error::Device(DeviceError::InvalidHandle { .. }))
}

/// An op that holds its stream until the returned sender sends (or is dropped).
fn gate() -> (mpsc::Sender<()>, Arc<dyn Op>) {
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    let op = FnOp::shared("gate", OpKind::Compute, move || {
        let _ = rx.lock().unwrap().recv();
        Ok(())
    });
    (tx, op)
}

/// An op that logs `what` when it runs.
fn log_op(log: &Arc<Mutex<Vec<&'static str>>>, what: &'static str) -> Arc<dyn Op> {
    let log = log.clone();
    FnOp::shared("log", OpKind::Compute, move || {
        log.lock().unwrap().push(what);
        Ok(())
    })
}

fn interprocess() -> Event {
    ipc_event::create(EventOptions::without_timing()).unwrap()
}

#[test]
fn records_made_on_either_side_are_seen_by_the_other_in_one_process() {
    let rt = common::init();
    let dev = rt.device(0).unwrap();
    let exported = interprocess();
    assert!(ipc_event::is_interprocess(&exported));
    assert!(!ipc_event::is_interprocess(&Event::new()));
    let h = ipc_event::handle(&exported).unwrap();
    assert_eq!(h.len(), ipc_event::EVENT_HANDLE_LEN);
    assert_eq!(
        ipc_event::handle(&exported).unwrap(),
        h,
        "one handle per event"
    );
    let opened = ipc_event::open(&h).unwrap(); // through /proc/self
    assert!(ipc_event::is_interprocess(&opened));
    assert!(
        ipc_event::handle(&opened).is_err(),
        "an opened event hands out no handle"
    );
    assert!(opened.query().unwrap(), "never recorded: complete");

    // The exporter records behind held work: the opened event waits for it.
    let s = Stream::new(dev, 0).unwrap();
    let (release, held) = gate();
    s.launch(held).unwrap();
    s.record(&exported).unwrap();
    assert!(!opened.query().unwrap());
    let t = Stream::new(dev, 0).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    t.wait_event(&opened).unwrap();
    t.launch(log_op(&log, "after the exporter's record"))
        .unwrap();
    assert!(common::timed_out(
        opened.synchronize(Some(Duration::from_millis(20)))
    ));
    assert!(log.lock().unwrap().is_empty());
    release.send(()).unwrap();
    opened.synchronize(Some(WAIT)).unwrap();
    t.synchronize(Some(WAIT)).unwrap();
    assert_eq!(*log.lock().unwrap(), vec!["after the exporter's record"]);

    // The importer records behind held work: the exporter waits for that record.
    let (release, held) = gate();
    s.launch(held).unwrap();
    s.record(&opened).unwrap();
    assert!(
        !exported.query().unwrap(),
        "the importer's record is the latest"
    );
    assert!(common::timed_out(
        exported.synchronize(Some(Duration::from_millis(20)))
    ));
    release.send(()).unwrap();
    exported.synchronize(Some(WAIT)).unwrap();
    assert!(exported.query().unwrap() && opened.query().unwrap());
    s.synchronize(Some(WAIT)).unwrap();
}

#[test]
fn malformed_forged_and_stale_handles_are_refused() {
    let _rt = common::init();
    let ev = interprocess();
    let h = ipc_event::handle(&ev).unwrap();
    for bad in [
        &h[..47],
        &[0u8; 48][..],
        b"not an event handle at all, 48 bytes long......",
    ] {
        let e = ipc_event::open(bad).unwrap_err();
        assert!(matches!(e, Error::Arg(_)), "{e}");
        assert!(e.to_string().contains("handle"), "{e}");
    }
    let mut v = h.clone();
    v[8] ^= 0x7F; // version
    let e = ipc_event::open(&v).unwrap_err();
    assert!(e.to_string().contains("version"), "{e}");
    let mut forged = h.clone();
    forged[40] ^= 0x10; // nonce
    let e = ipc_event::open(&forged).unwrap_err();
    assert!(
        is_invalid_handle(&e) && e.to_string().contains("no such event"),
        "{e}"
    );
    let mut gone = h.clone();
    gone[12..16].copy_from_slice(&u32::MAX.to_le_bytes()); // no such process
    let e = ipc_event::open(&gone).unwrap_err();
    assert!(
        is_invalid_handle(&e) && e.to_string().contains("has exited"),
        "{e}"
    );
    let e = ipc_event::handle(&Event::new()).unwrap_err();
    assert!(e.to_string().contains("interprocess=True"), "{e}");
}

/// The child half of the cross-process tests: runs only when re-executed with the variable
/// set. It reads the parent's event handle (if any) from its first stdin line.
#[test]
fn child_process_entry() {
    let Ok(mode) = std::env::var("RUNTIME_IPC_EVENT_CHILD") else {
        return;
    };
    let rt = common::init();
    let dev = rt.device(0).unwrap();
    let s = Stream::new(dev, 0).unwrap();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let say = |what: String| {
        println!("{what}");
        std::io::stdout().flush().unwrap();
    };
    match mode.as_str() {
        // Record the parent's event behind held work; release it on "go", then exit.
        "record" | "record_and_die" => {
            let h = unhex(lines.next().unwrap().unwrap().trim());
            let ev = ipc_event::open(&h).unwrap();
            let (release, held) = gate();
            s.launch(held).unwrap();
            s.record(&ev).unwrap();
            say(format!("RECORDED {}", ev.query().unwrap()));
            lines.next().unwrap().unwrap();
            if mode == "record_and_die" {
                std::process::exit(0); // the record never completes
            }
            release.send(()).unwrap();
            s.synchronize(Some(WAIT)).unwrap();
            say(format!("DONE {}", ev.query().unwrap()));
            lines.next();
        }
        // Take up the parent's pending record on an event opened under this runtime and on
        // one opened with no runtime live (it belongs to the first runtime it is used under),
        // then fork: the forked child reports what a wait on each does; this process waits
        // on the second under a new runtime.
        "fork_after_taking_up" => {
            let h = unhex(lines.next().unwrap().unwrap().trim());
            let bound = ipc_event::open(&h).unwrap();
            drop(s);
            runtime::shutdown().unwrap();
            let unbound = ipc_event::open(&h).unwrap();
            say(format!(
                "TAKEN {} {}",
                bound.is_recorded(),
                unbound.is_recorded()
            ));
            // SAFETY: the child only makes runtime calls (the fork handlers made them usable)
            // and then `_exit`s, never returning into the test harness.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    runtime::init(&common::settings()).unwrap();
                    if !bound.query().is_err_and(|e| is_invalid_handle(&e)) {
                        return 4;
                    }
                    match unbound.synchronize(Some(Duration::from_secs(20))) {
                        Err(e) if is_invalid_handle(&e) && e.to_string().contains("fork") => 0,
                        Err(Error::Stream(StreamError::Timeout { .. })) => 1,
                        Ok(()) => 2,
                        Err(_) => 3,
                    }
                }))
                .unwrap_or(99);
                // SAFETY: ends the child at once, without running the parent's exit handlers.
                unsafe { libc::_exit(code) };
            }
            say("FORKED yes".into());
            lines.next(); // the parent's record completed
            runtime::init(&common::settings()).unwrap();
            say(format!(
                "PARENT {:?}",
                unbound.synchronize(Some(WAIT)).map_err(|e| e.to_string())
            ));
            let deadline = std::time::Instant::now() + Duration::from_secs(40);
            let code = loop {
                let mut status = 0;
                // SAFETY: waiting for our own child; `status` is a valid out pointer.
                let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                if r == pid {
                    break if libc::WIFEXITED(status) {
                        libc::WEXITSTATUS(status)
                    } else {
                        -1
                    };
                }
                if std::time::Instant::now() > deadline {
                    // SAFETY: killing and reaping our own child.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, &mut status, 0);
                    }
                    break -2;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            say(format!("GRANDCHILD {code}"));
            lines.next();
        }
        // Record the parent's event `MANY` times behind held work, all pending at once;
        // release them on "go".
        "record_many" => {
            let h = unhex(lines.next().unwrap().unwrap().trim());
            let ev = ipc_event::open(&h).unwrap();
            let (release, held) = gate();
            s.launch(held).unwrap();
            for _ in 0..MANY {
                s.record(&ev).unwrap();
            }
            say(format!("RECORDED {}", ev.query().unwrap()));
            lines.next().unwrap().unwrap();
            release.send(()).unwrap();
            s.synchronize(Some(WAIT)).unwrap();
            say(format!("DONE {}", ev.query().unwrap()));
            lines.next();
        }
        // Export an event recorded behind work that never ends; wait to be killed.
        "export_and_hang" => {
            let ev = interprocess();
            let (_release, held) = gate();
            s.launch(held).unwrap();
            s.record(&ev).unwrap();
            say(format!("HANDLE {}", hex(&ipc_event::handle(&ev).unwrap())));
            lines.next();
            std::thread::sleep(Duration::from_secs(600));
        }
        // Export a zero-filled device buffer; exit when told.
        "export_memory" => {
            let buf = dev.memory().allocate(4 << 20).unwrap();
            say(format!("MEMORY {}", hex(&buf.ipc_handle().unwrap())));
            lines.next();
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn spawn_child(mode: &str) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RUNTIME_IPC_EVENT_CHILD", mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, out)
}

/// The next line with `tag` in it (libtest prints the test's name on the same line), after it.
fn expect_line(out: &mut Lines<BufReader<ChildStdout>>, tag: &str) -> String {
    loop {
        let line = out.next().expect("child output").unwrap();
        if let Some(i) = line.find(tag) {
            return line[i + tag.len()..].trim().to_string();
        }
    }
}

fn send(child: &mut Child, line: &str) {
    writeln!(child.stdin.as_mut().unwrap(), "{line}").unwrap();
}

#[test]
fn another_processs_record_is_seen_by_the_exporter() {
    // torch's test_event_handle_exporter, in Rust.
    let rt = common::init();
    let dev = rt.device(1).unwrap();
    let ev = interprocess();
    let (mut child, mut out) = spawn_child("record");
    send(&mut child, &hex(&ipc_event::handle(&ev).unwrap()));
    assert_eq!(expect_line(&mut out, "RECORDED "), "false");
    assert!(
        !ev.query().unwrap(),
        "the child's pending record is seen here"
    );
    let s = Stream::new(dev, 0).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    s.wait_event(&ev).unwrap();
    s.launch(log_op(&log, "after the child's record")).unwrap();
    assert!(common::timed_out(
        ev.synchronize(Some(Duration::from_millis(20)))
    ));
    assert!(log.lock().unwrap().is_empty());
    send(&mut child, "go");
    ev.synchronize(Some(WAIT)).unwrap();
    s.synchronize(Some(WAIT)).unwrap();
    assert_eq!(*log.lock().unwrap(), vec!["after the child's record"]);
    assert_eq!(expect_line(&mut out, "DONE "), "true");
    send(&mut child, "bye");
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_process_dying_with_its_record_pending_fails_the_waits_not_hangs_them() {
    let rt = common::init();
    let dev = rt.device(1).unwrap();
    let ev = interprocess();
    let (mut child, mut out) = spawn_child("record_and_die");
    send(&mut child, &hex(&ipc_event::handle(&ev).unwrap()));
    assert_eq!(expect_line(&mut out, "RECORDED "), "false");
    assert!(!ev.query().unwrap());
    let s = Stream::new(dev, 0).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    s.wait_event(&ev).unwrap();
    s.launch(log_op(&log, "behind the wait")).unwrap();
    send(&mut child, "die");
    assert!(child.wait().unwrap().success());
    let e = ev.synchronize(Some(WAIT)).unwrap_err();
    assert!(
        is_invalid_handle(&e) && e.to_string().contains("exited before it completed"),
        "{e}"
    );
    // The waiting stream fails with the same error and skips the work behind the wait.
    match s.synchronize(Some(WAIT)) {
        Err(Error::Stream(StreamError::Kernel(k))) => {
            let inner = k.payload.as_ref().and_then(|p| p.downcast_ref::<Error>());
            assert!(inner.is_some_and(is_invalid_handle), "{k:?}");
        }
        other => panic!("expected the wait's failure, got {other:?}"),
    }
    assert!(log.lock().unwrap().is_empty());
    // The event works again with a newer record.
    s.record(&ev).unwrap();
    ev.synchronize(Some(WAIT)).unwrap();
    s.synchronize(Some(WAIT)).unwrap();
}

#[test]
fn an_exporter_killed_and_not_yet_reaped_is_dead() {
    let _rt = common::init();
    let (mut child, mut out) = spawn_child("export_and_hang");
    let h = unhex(&expect_line(&mut out, "HANDLE "));
    let ev = ipc_event::open(&h).unwrap();
    assert!(!ev.query().unwrap());
    child.kill().unwrap(); // SIGKILL; not reaped until `wait` below: a zombie meanwhile
    let pid = child.id();
    let zombie = (0..2000).any(|_| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next());
        if state == Some("Z") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
        false
    });
    assert!(zombie, "the child never became a zombie");
    let e = ev.synchronize(Some(WAIT)).unwrap_err();
    assert!(
        is_invalid_handle(&e) && e.to_string().contains("exited"),
        "{e}"
    );
    assert!(
        ev.query().is_err(),
        "the dead exporter's event stays invalid"
    );
    let e = ipc_event::open(&h).unwrap_err();
    assert!(e.to_string().contains("has exited"), "{e}");
    child.wait().unwrap();
}

/// An event handle forged from a memory handle (same process, descriptor and page; nonce 0,
/// what a zeroed buffer holds).
fn event_handle_over(memory_handle: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(ipc_event::EVENT_HANDLE_LEN);
    h.extend_from_slice(b"RTIPCEVT");
    h.extend_from_slice(&3u32.to_le_bytes());
    h.extend_from_slice(&memory_handle[12..28]); // pid, start time, descriptor
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&memory_handle[48..56]); // the block's offset in the file
    h.extend_from_slice(&0u64.to_le_bytes());
    h
}

/// An event page is written with atomics and a device buffer with plain copies under its
/// lock, so one process never has the two over the same bytes: an event handle naming this
/// process's own memory that is no event is refused, and so is one naming memory it imported
/// from another process, and a memory import over an event page it has open. (Before, a
/// handle forged from a buffer's own memory handle opened: records on the event wrote the
/// buffer's bytes while a kernel held it for writing, 88 bytes changing under its lock.)
#[test]
fn an_event_handle_over_device_memory_is_refused() {
    let rt = common::init();
    let mem = rt.device(0).unwrap().memory();
    let own = mem.allocate(4 << 20).unwrap();
    let e = ipc_event::open(&event_handle_over(&own.ipc_handle().unwrap())).unwrap_err();
    assert!(
        is_invalid_handle(&e) && e.to_string().contains("no event"),
        "{e}"
    );
    // Another process's memory: refused while imported here; once an event is open over it,
    // the memory import is refused.
    let (mut child, mut out) = spawn_child("export_memory");
    let handle = unhex(&expect_line(&mut out, "MEMORY "));
    let imported = mem.open_ipc_handle(&handle).unwrap();
    let e = ipc_event::open(&event_handle_over(&handle)).unwrap_err();
    assert!(
        is_invalid_handle(&e) && e.to_string().contains("overlaps device memory"),
        "{e}"
    );
    drop(imported);
    let ev = ipc_event::open(&event_handle_over(&handle)).unwrap();
    let e = mem.open_ipc_handle(&handle).unwrap_err();
    assert!(
        is_invalid_handle(&e) && e.to_string().contains("event page"),
        "{e}"
    );
    drop(ev);
    assert!(mem.open_ipc_handle(&handle).is_ok());
    send(&mut child, "done");
    assert!(child.wait().unwrap().success());
}

/// A process forked after taking up another process's pending record has no watcher for it
/// (the thread did not survive the fork), and its copy of the event's claim on the page was
/// forgotten: an event made or opened before a fork is refused in the child, as every other
/// inherited handle is, even one opened with no runtime live (which a new runtime adopts).
/// Before, the child's wait on that one timed out although the record had completed, while
/// the same wait in the parent returned.
#[test]
fn an_event_taken_up_before_a_fork_is_refused_in_the_child_not_waited_for() {
    let rt = common::init();
    let dev = rt.device(0).unwrap();
    let ev = interprocess();
    let s = Stream::new(dev, 0).unwrap();
    let (release, held) = gate();
    s.launch(held).unwrap();
    s.record(&ev).unwrap();
    let (mut child, mut out) = spawn_child("fork_after_taking_up");
    send(&mut child, &hex(&ipc_event::handle(&ev).unwrap()));
    assert_eq!(expect_line(&mut out, "TAKEN "), "true true");
    assert_eq!(expect_line(&mut out, "FORKED "), "yes");
    release.send(()).unwrap();
    ev.synchronize(Some(WAIT)).unwrap();
    send(&mut child, "completed");
    assert_eq!(expect_line(&mut out, "PARENT "), "Ok(())");
    // 0: refused, naming the fork; 1: the wait timed out (the record was never seen).
    assert_eq!(expect_line(&mut out, "GRANDCHILD "), "0");
    send(&mut child, "bye");
    assert!(child.wait().unwrap().success());
}

/// Writes `value` over the 8 bytes at `at` of the page of the event `handle` names, as any
/// process that maps the memory file can.
fn scribble(handle: &[u8], at: u64, value: u64) {
    use std::os::unix::fs::FileExt;
    let u32_at = |i: usize| u32::from_le_bytes(handle[i..i + 4].try_into().unwrap());
    let offset = u64::from_le_bytes(handle[32..40].try_into().unwrap());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{}/fd/{}", u32_at(12), u32_at(24)))
        .unwrap();
    file.write_at(&value.to_le_bytes(), offset + at).unwrap();
}

/// A process with the page open writes a record number nobody took as the latest (alone,
/// and with the tickets counter raised to match). It is no record: a wait must not wait for
/// it (before, it waited while any process named in the page lived: here the child that
/// recorded before, so it timed out), and no stream queues a wait on it, which a shutdown's
/// drain would wait for. The event reports its page inconsistent (`InvalidHandle`).
#[test]
fn a_record_number_no_process_took_is_refused_not_waited_for() {
    let _rt = common::init();
    const GARBAGE: u64 = 1 << 40;
    for words in [&[(8, GARBAGE)][..], &[(24, GARBAGE), (8, GARBAGE)][..]] {
        let ev = interprocess();
        let h = ipc_event::handle(&ev).unwrap();
        let (mut child, mut out) = spawn_child("record");
        send(&mut child, &hex(&h));
        assert_eq!(expect_line(&mut out, "RECORDED "), "false");
        send(&mut child, "go");
        assert_eq!(expect_line(&mut out, "DONE "), "true");
        ev.synchronize(Some(WAIT)).unwrap(); // the child lives on, named in the page
        for &(at, value) in words {
            scribble(&h, at, value);
        }
        let e = ev.synchronize(Some(Duration::from_secs(20))).unwrap_err();
        assert!(
            is_invalid_handle(&e) && e.to_string().contains(&GARBAGE.to_string()),
            "{words:?}: {e}"
        );
        let s = Stream::new(common::init().device(0).unwrap(), 0).unwrap();
        let e = s.wait_event(&ev).unwrap_err();
        assert!(is_invalid_handle(&e), "{words:?}: {e}");
        s.synchronize(Some(WAIT)).unwrap();
        assert!(
            ev.query().is_err(),
            "{words:?}: the page stays inconsistent"
        );
        send(&mut child, "bye");
        assert!(child.wait().unwrap().success());
    }
}

/// More records pending at once than the page's ring names (its slots are reused while the
/// first records are pending), made by a child while this process reads the event's latest
/// record all along: none is reported abandoned, and all complete once released.
#[test]
fn more_records_in_flight_than_the_ring_names_complete_without_error() {
    let rt = common::init();
    let ev = interprocess();
    let (mut child, mut out) = spawn_child("record_many");
    send(&mut child, &hex(&ipc_event::handle(&ev).unwrap()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (ev, stop) = (ev.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                ev.query().unwrap();
                reads += 1;
            }
            reads
        })
    };
    assert_eq!(expect_line(&mut out, "RECORDED "), "false");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    assert!(!ev.query().unwrap());
    let s = Stream::new(rt.device(1).unwrap(), 0).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    s.wait_event(&ev).unwrap();
    s.launch(log_op(&log, "after the child's records")).unwrap();
    send(&mut child, "go");
    ev.synchronize(Some(WAIT)).unwrap();
    s.synchronize(Some(WAIT)).unwrap();
    assert_eq!(*log.lock().unwrap(), vec!["after the child's records"]);
    assert_eq!(expect_line(&mut out, "DONE "), "true");
    send(&mut child, "bye");
    assert!(child.wait().unwrap().success());
}
