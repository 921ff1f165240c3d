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
use runtime_core::stream::{FnOp, Op, OpKind, Stream};

const WAIT: Duration = Duration::from_secs(60);

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
    h.extend_from_slice(&2u32.to_le_bytes());
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
