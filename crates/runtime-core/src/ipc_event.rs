//! Interprocess events (CUDA's `cudaEventInterprocess`, `cudaIpcGetEventHandle`,
//! `cudaIpcOpenEventHandle`): another process waits on this process's records.
//!
//! An exported event ([`create`]) owns one page of the device memory file (`memory::host`)
//! holding a random nonce, its latest record number and its highest completed record number;
//! the event publishes both as they change (the `event::Shared` hooks). Its handle
//! ([`handle`]) names the process, the file and the page.
//!
//! An opened event ([`open`]) is a local event that mirrors the exporter's records: whenever
//! its latest record is read (query, synchronize, a stream's `wait_event`), a new remote record
//! takes a local record number, and the process's *watcher* thread completes that local
//! record once the page shows the remote one completed. So every local way of waiting works
//! unchanged, stream waits included, and no runtime thread ever blocks on another process.
//! The watcher polls (every 100 µs while something is pending, sleeping otherwise) and checks
//! every 10 ms that the exporter still lives: when it has died, pending records are completed
//! and the event reports the death (`InvalidHandle`) on every later query or wait, so nothing
//! waits forever. Records made on the opened event in this process stay local.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::error::{ArgError, DeviceError, Result};
use crate::event::{Event, EventInner, EventOptions, Shared};
use crate::memory::host::{shared_file, Arena, PAGE};
use crate::memory::ipc::{process_start_time, HandleFields};

/// Length of an event handle in bytes.
pub const EVENT_HANDLE_LEN: usize = 48;

const MAGIC: &[u8; 8] = b"RTIPCEVT";
const VERSION: u32 = 1;
/// Page layout: nonce, latest record, highest completed record.
const NONCE: u64 = 0;
const RECORDED: u64 = 8;
const COMPLETED: u64 = 16;

fn invalid(why: impl Into<String>) -> crate::error::Error {
    DeviceError::InvalidHandle {
        what: "the IPC event handle".into(),
        why: why.into(),
    }
    .into()
}

/// The exporting side: the page and the handle.
struct Exported {
    page: Arena,
    handle: Vec<u8>,
}

impl Shared for Exported {
    fn recorded(&self, id: u64) {
        self.page
            .atomic_u64(RECORDED)
            .fetch_max(id, Ordering::SeqCst);
    }

    fn completed(&self, latest: u64) {
        self.page
            .atomic_u64(COMPLETED)
            .fetch_max(latest, Ordering::SeqCst);
    }

    fn pull(&self, _event: &EventInner) {}

    fn check(&self) -> Result<()> {
        Ok(())
    }

    fn handle(&self) -> Option<Vec<u8>> {
        Some(self.handle.clone())
    }
}

/// A new event with `options` whose records another process can wait on.
///
/// # Errors
/// `InvalidHandle` when the shared page cannot be made.
pub fn create(options: EventOptions) -> Result<Event> {
    let file = shared_file().map_err(|e| invalid(format!("no device memory file: {e}")))?;
    let page = Arena::map(PAGE).ok_or_else(|| invalid("cannot map a page for the event"))?;
    let (_, offset) = page
        .file_range()
        .expect("a fresh arena is in the memory file");
    let nonce = crate::memory::host::random_u64() | 1;
    page.atomic_u64(NONCE).store(nonce, Ordering::SeqCst);
    let pid = std::process::id();
    let mut h = Vec::with_capacity(EVENT_HANDLE_LEN);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&pid.to_le_bytes());
    h.extend_from_slice(&process_start_time(pid).unwrap_or(0).to_le_bytes());
    h.extend_from_slice(&file.fd().to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&offset.to_le_bytes());
    h.extend_from_slice(&nonce.to_le_bytes());
    debug_assert_eq!(h.len(), EVENT_HANDLE_LEN);
    let ev = Event::with_options(options);
    let shared: Arc<dyn Shared> = Arc::new(Exported { page, handle: h });
    let _ = ev.0.shared.set(shared);
    Ok(ev)
}

/// Whether `event` was made by [`create`] or [`open`].
pub fn is_interprocess(event: &Event) -> bool {
    event.0.shared.get().is_some()
}

/// The handle of an event made by [`create`]; another process opens it with [`open`].
///
/// # Errors
/// `InvalidHandle` for a destroyed or stale event; an argument error for an event that was not
/// made interprocess.
pub fn handle(event: &Event) -> Result<Vec<u8>> {
    event.check()?;
    event
        .0
        .shared
        .get()
        .and_then(|s| s.handle())
        .ok_or_else(|| {
            ArgError::new(
                "event",
                format!(
                    "{event:?} was not created with interprocess=True; only such events have a \
                 handle"
                ),
            )
            .into()
        })
}

/// The opening side: the exporter's page mapped here, and the local records mirroring its.
struct Opened {
    remote: Arc<Remote>,
    /// The latest remote record mirrored, and the local record number it got.
    mirrored: parking_lot::Mutex<(u64, u64)>,
    me: std::sync::OnceLock<Weak<EventInner>>,
}

/// The exporter's page and process, as the watcher sees them.
struct Remote {
    page: Arena,
    pid: u32,
    start_time: u64,
    dead: AtomicBool,
}

impl Remote {
    fn remote_recorded(&self) -> u64 {
        self.page.atomic_u64(RECORDED).load(Ordering::SeqCst)
    }

    fn remote_completed(&self) -> u64 {
        self.page.atomic_u64(COMPLETED).load(Ordering::SeqCst)
    }

    fn exporter_alive(&self) -> bool {
        process_start_time(self.pid) == Some(self.start_time)
    }
}

impl Shared for Opened {
    fn recorded(&self, _id: u64) {}

    fn completed(&self, _latest: u64) {}

    fn pull(&self, event: &EventInner) {
        let remote = self.remote.remote_recorded();
        let mut m = self.mirrored.lock();
        if remote <= m.0 {
            return;
        }
        if self.remote.remote_completed() >= remote {
            // Already done there: nothing to wait for here.
            m.0 = remote;
            return;
        }
        let local = event.next_record();
        *m = (remote, local);
        drop(m);
        if let Some(me) = self.me.get() {
            watch(me.clone(), self.remote.clone(), remote, local);
        }
    }

    fn check(&self) -> Result<()> {
        if self.remote.dead.load(Ordering::Acquire) {
            Err(invalid(format!(
                "the exporting process (pid {}) exited before its record completed",
                self.remote.pid
            )))
        } else {
            Ok(())
        }
    }

    fn handle(&self) -> Option<Vec<u8>> {
        None
    }
}

/// Open an event handle made by [`handle`] (in another process of the same user, or this one).
///
/// # Errors
/// An argument error for bytes that are not an event handle; `InvalidHandle` when the
/// exporting process has exited or the handle does not match its event.
pub fn open(handle: &[u8]) -> Result<Event> {
    let f = HandleFields::check(handle, EVENT_HANDLE_LEN, MAGIC, VERSION, "event", "Event")?;
    let (u32_at, u64_at) = (|i| f.u32_at(i), |i| f.u64_at(i));
    let (pid, start_time, fd) = (u32_at(12), u64_at(16), u32_at(24));
    let (offset, nonce) = (u64_at(32), u64_at(40));
    if process_start_time(pid) != Some(start_time) {
        return Err(invalid(format!(
            "the exporting process (pid {pid}) has exited"
        )));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .map_err(|e| invalid(format!("cannot open the event of process {pid}: {e}")))?;
    use std::os::fd::AsRawFd;
    let name = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.starts_with("/memfd:runtime-mem-") || !offset.is_multiple_of(PAGE) {
        return Err(invalid(format!(
            "descriptor {fd} of process {pid} is not runtime memory (forged or stale handle)"
        )));
    }
    let page = Arena::map_file(&file, offset, PAGE)
        .map_err(|e| invalid(format!("cannot map the event page: {e}")))?;
    if page.atomic_u64(NONCE).load(Ordering::SeqCst) != nonce {
        return Err(invalid(format!(
            "process {pid} has no such event any more (stale or forged handle)"
        )));
    }
    let opened = Arc::new(Opened {
        remote: Arc::new(Remote {
            page,
            pid,
            start_time,
            dead: AtomicBool::new(false),
        }),
        mirrored: parking_lot::Mutex::new((0, 0)),
        me: std::sync::OnceLock::new(),
    });
    let ev = Event::with_options(EventOptions::without_timing());
    let _ = opened.me.set(Arc::downgrade(&ev.0));
    let shared: Arc<dyn Shared> = opened;
    let _ = ev.0.shared.set(shared);
    Ok(ev)
}

/// A local record waiting for a remote one.
struct Pending {
    event: Weak<EventInner>,
    remote_page: Arc<Remote>,
    remote: u64,
    local: u64,
}

struct Watcher {
    pending: std::sync::Mutex<Vec<Pending>>,
    cv: std::sync::Condvar,
}

/// The watcher of this process (with the fork count it was started under: a forked child
/// starts its own).
static WATCHER: WatcherSlot = parking_lot::const_mutex(None);

type WatcherSlot = parking_lot::Mutex<Option<(u64, Arc<Watcher>)>>;

static WATCHER_FORK: crate::sync::ForkGuarded<WatcherSlot> =
    crate::sync::ForkGuarded::new(|| &WATCHER);

/// Around `fork()`: hold the watcher's slot (see `runtime::install_fork_handlers`).
pub(crate) fn before_fork(wait: std::time::Duration) {
    WATCHER_FORK.before_fork(wait);
}

/// After `fork()`: release what [`before_fork`] took (in the child also a hold of a thread
/// that vanished in the fork).
pub(crate) fn after_fork(child: bool) {
    WATCHER_FORK.after_fork(child);
}

fn watch(event: Weak<EventInner>, remote_page: Arc<Remote>, remote: u64, local: u64) {
    let forks = crate::generation::forks();
    let w = {
        let mut slot = WATCHER.lock();
        match slot.as_ref() {
            Some((f, w)) if *f == forks => w.clone(),
            _ => {
                let w = Arc::new(Watcher {
                    pending: std::sync::Mutex::new(Vec::new()),
                    cv: std::sync::Condvar::new(),
                });
                let w2 = w.clone();
                if crate::sync::spawn_thread("runtime-ipc-events".into(), move || watch_loop(&w2))
                    .is_err()
                {
                    // No thread: complete at once, so nothing waits forever (the record is
                    // then not ordered after the remote one).
                    if let Some(ev) = event.upgrade() {
                        ev.complete(local);
                    }
                    return;
                }
                *slot = Some((forks, w.clone()));
                w
            }
        }
    };
    w.pending
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(Pending {
            event,
            remote_page,
            remote,
            local,
        });
    w.cv.notify_one();
}

fn watch_loop(w: &Watcher) {
    let mut last_alive_check = Instant::now();
    loop {
        let mut pending = w
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while pending.is_empty() {
            pending =
                w.cv.wait(pending)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        let check_alive = last_alive_check.elapsed() >= Duration::from_millis(10);
        if check_alive {
            last_alive_check = Instant::now();
        }
        let mut done = Vec::new();
        pending.retain(|p| {
            let Some(ev) = p.event.upgrade() else {
                return false;
            };
            let finished = remote_done(&p.remote_page, p.remote, check_alive);
            if finished {
                done.push((ev, p.local));
            }
            !finished
        });
        drop(pending);
        // Completed outside the list's lock (completion wakes streams).
        for (ev, local) in done {
            ev.complete(local);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Whether remote record `remote` completed, or its exporter died (then marked dead).
fn remote_done(o: &Remote, remote: u64, check_alive: bool) -> bool {
    if o.remote_completed() >= remote {
        return true;
    }
    if check_alive && !o.exporter_alive() {
        o.dead.store(true, Ordering::Release);
        return true;
    }
    false
}
