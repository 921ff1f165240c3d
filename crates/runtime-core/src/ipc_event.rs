//! Interprocess events (CUDA's `cudaEventInterprocess`, `cudaIpcGetEventHandle`,
//! `cudaIpcOpenEventHandle`): processes record and wait on one event.
//!
//! An exported event ([`create`]) owns one page of the device memory file (`memory::host`);
//! its handle ([`handle`]) names the process, the file and the page. An opened event
//! ([`open`]) maps the same page. The page holds the event's one sequence of record numbers,
//! shared by every process that records it: a record made in any process takes the next
//! number there and publishes it as the latest, with the recording process named in a ring of
//! recent records; the highest completed number is published there too. So a record made by
//! an importer is seen by the exporter (torch's `test_event`, `test_event_handle_exporter`)
//! exactly as the exporter's records are seen by importers.
//!
//! Whenever an event's latest record is read (query, synchronize, a stream's `wait_event`), a
//! newer record made by another process is taken up as the local latest, and the process's
//! *watcher* thread completes it here once the page shows it completed. So every local way of
//! waiting works unchanged, stream waits included, and no runtime thread ever blocks on
//! another process. Completion is a semaphore's, as on a GPU: record `n` completing completes
//! every earlier one too.
//!
//! The watcher polls (every 100 µs while something is pending, sleeping otherwise) and checks
//! every 10 ms that the processes it waits for live (a zombie counts as dead: it runs no more
//! work). Once the watcher has found the exporter dead (it looks while a record is pending),
//! an opened event reports it (`InvalidHandle`) on every later use; when the process that made
//! a pending record died, the record is completed and waits for it report that
//! (`InvalidHandle`, on streams as their error), so nothing waits forever.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::error::{ArgError, DeviceError, Result};
use crate::event::{Event, EventInner, EventOptions, Shared};
use crate::memory::host::{shared_file, Arena, PAGE};
use crate::memory::ipc::{
    claim_event_page, is_event_page, process_alive, process_start_time, HandleFields,
};

/// Length of an event handle in bytes.
pub const EVENT_HANDLE_LEN: usize = 48;

const MAGIC: &[u8; 8] = b"RTIPCEVT";
/// Version 2: records of every process share the page's sequence.
const VERSION: u32 = 2;
/// Page layout: nonce, latest record published, highest completed record, record numbers
/// taken, then the ring of recent records (number, recording pid, its start time).
const NONCE: u64 = 0;
const RECORDED: u64 = 8;
const COMPLETED: u64 = 16;
const TICKETS: u64 = 24;
const RING: u64 = 64;
/// Records named in the ring (the recorder of an older record is found by elimination).
pub(crate) const RING_LEN: u64 = 128;
const ENTRY: u64 = 24;
const _: () = assert!(RING + RING_LEN * ENTRY <= PAGE);

fn invalid(why: impl Into<String>) -> crate::error::Error {
    DeviceError::InvalidHandle {
        what: "the IPC event handle".into(),
        why: why.into(),
    }
    .into()
}

/// A process, named so that a reused pid is not mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proc {
    pid: u32,
    start_time: u64,
}

impl Proc {
    /// This process (cached per pid, so a forked child names itself).
    fn me() -> Proc {
        static PID: AtomicU64 = AtomicU64::new(0);
        static START: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        if PID.load(Ordering::Acquire) != u64::from(pid) {
            START.store(process_start_time(pid).unwrap_or(0), Ordering::Relaxed);
            PID.store(u64::from(pid), Ordering::Release);
        }
        Proc {
            pid,
            start_time: START.load(Ordering::Relaxed),
        }
    }

    fn alive(self) -> bool {
        process_alive(self.pid, self.start_time)
    }
}

/// The shared page of one event, as mapped in this process.
struct Page {
    page: Arena,
    /// Keeps the page noted as an event page (`memory::ipc::claim_event_page`) while it lives.
    _claim: Arc<dyn std::any::Any + Send + Sync>,
}

impl Page {
    fn at(&self, offset: u64) -> &AtomicU64 {
        self.page.atomic_u64(offset)
    }

    fn recorded(&self) -> u64 {
        self.at(RECORDED).load(Ordering::SeqCst)
    }

    fn completed(&self) -> u64 {
        self.at(COMPLETED).load(Ordering::SeqCst)
    }

    /// Take the next record number for a record `by` makes: name the recorder in the ring,
    /// then publish the number as the latest.
    fn take(&self, by: Proc) -> u64 {
        let n = self.at(TICKETS).fetch_add(1, Ordering::SeqCst) + 1;
        let e = RING + (n % RING_LEN) * ENTRY;
        self.at(e + 8).store(u64::from(by.pid), Ordering::SeqCst);
        self.at(e + 16).store(by.start_time, Ordering::SeqCst);
        self.at(e).store(n, Ordering::SeqCst);
        self.at(RECORDED).fetch_max(n, Ordering::SeqCst);
        n
    }

    /// Who made record `n`, if the ring still names it.
    fn recorder(&self, n: u64) -> Option<Proc> {
        let e = RING + (n % RING_LEN) * ENTRY;
        if self.at(e).load(Ordering::SeqCst) != n {
            return None;
        }
        let p = Proc {
            pid: self.at(e + 8).load(Ordering::SeqCst) as u32,
            start_time: self.at(e + 16).load(Ordering::SeqCst),
        };
        (self.at(e).load(Ordering::SeqCst) == n).then_some(p)
    }

    /// Every process the ring names.
    fn recorders(&self) -> Vec<Proc> {
        let mut all = Vec::new();
        for i in 0..RING_LEN {
            let n = self.at(RING + i * ENTRY).load(Ordering::SeqCst);
            if let Some(p) = (n != 0).then(|| self.recorder(n)).flatten() {
                if !all.contains(&p) {
                    all.push(p);
                }
            }
        }
        all
    }
}

/// What the watcher needs of one process's side of a shared event.
struct Link {
    page: Page,
    /// The exporting process, on an importing side.
    exporter: Option<Proc>,
    /// The exporter died (importing side).
    dead: AtomicBool,
    /// The latest record abandoned because its recorder died: (number, recorder's pid, 0 if
    /// unknown).
    abandoned: crate::sync::lock::Mutex<Option<(u64, u32)>>,
}

impl Link {
    /// Whether pending record `n` is settled: completed, or abandoned because the process
    /// that would complete it died (looked at only when `check_alive`).
    fn settled(&self, n: u64, recorder: Option<Proc>, check_alive: bool) -> bool {
        self.settled_by(n, recorder, check_alive, Proc::alive)
    }

    /// [`Link::settled`] with the liveness test passed in (tests give one whose answers
    /// change between calls, as a process dying between two reads of `/proc` does).
    fn settled_by(
        &self,
        n: u64,
        recorder: Option<Proc>,
        check_alive: bool,
        alive: impl Fn(Proc) -> bool,
    ) -> bool {
        if self.page.completed() >= n {
            return true;
        }
        if !check_alive {
            return false;
        }
        let me = Proc::me();
        let gone = match recorder {
            Some(r) => r != me && !alive(r),
            // No longer named in the ring: abandoned once every other recorder it names died.
            None => self
                .page
                .recorders()
                .into_iter()
                .all(|r| r == me || !alive(r)),
        };
        // The exporter after the recorders: a process, once dead, stays dead, so an exporter
        // found dead as the recorder is found dead here too, and the event reports it on
        // every later use (checked first, it could pass as alive and then die before the
        // recorder's check, leaving the record abandoned and the event looking healthy).
        if let Some(e) = self.exporter {
            if !alive(e) {
                self.dead.store(true, Ordering::Release);
                return true;
            }
        }
        if gone {
            let mut a = self.abandoned.lock();
            if a.is_none_or(|(m, _)| m < n) {
                *a = Some((n, recorder.map_or(0, |r| r.pid)));
            }
        }
        gone
    }
}

/// One process's side of a shared event: the exporter's, or an importer's.
struct Participant {
    link: Arc<Link>,
    /// The handle (exporting side only).
    handle: Option<Vec<u8>>,
    me: std::sync::OnceLock<Weak<EventInner>>,
    /// Taking up remote records, one thread at a time.
    pulling: crate::sync::lock::Mutex<()>,
}

impl Participant {
    fn new(page: Page, exporter: Option<Proc>, handle: Option<Vec<u8>>) -> Arc<Participant> {
        Arc::new(Participant {
            link: Arc::new(Link {
                page,
                exporter,
                dead: AtomicBool::new(false),
                abandoned: crate::sync::lock::Mutex::new(None),
            }),
            handle,
            me: std::sync::OnceLock::new(),
            pulling: crate::sync::lock::Mutex::new(()),
        })
    }
}

impl Shared for Participant {
    fn take_record(&self) -> u64 {
        self.link.page.take(Proc::me())
    }

    fn completed(&self, latest: u64) {
        self.link
            .page
            .at(COMPLETED)
            .fetch_max(latest, Ordering::SeqCst);
    }

    fn pull(&self, event: &EventInner) {
        let page = &self.link.page;
        let remote = page.recorded();
        if remote <= event.latest_taken() {
            return;
        }
        let guard = self.pulling.lock();
        if remote <= event.latest_taken() {
            return;
        }
        event.note_remote_record(remote);
        drop(guard);
        if page.completed() >= remote {
            // Done there already: done here.
            event.complete_mirrored(remote);
            return;
        }
        if let Some(me) = self.me.get() {
            watch(Pending {
                event: me.clone(),
                link: self.link.clone(),
                remote,
                recorder: page.recorder(remote),
            });
        }
    }

    fn check(&self) -> Result<()> {
        match self.link.exporter {
            Some(e) if self.link.dead.load(Ordering::Acquire) => Err(invalid(format!(
                "the exporting process (pid {}) exited before its record completed",
                e.pid
            ))),
            _ => Ok(()),
        }
    }

    fn abandoned(&self, latest: u64) -> Option<crate::error::Error> {
        let a = *self.link.abandoned.lock();
        match a {
            Some((n, pid)) if n == latest => Some(invalid(if pid == 0 {
                format!("the process that made record {n} exited before it completed")
            } else {
                format!("the process that made record {n} (pid {pid}) exited before it completed")
            })),
            _ => None,
        }
    }

    fn handle(&self) -> Option<Vec<u8>> {
        self.handle.clone()
    }
}

/// A new event with `options` whose records another process can wait on (and make).
///
/// # Errors
/// `InvalidHandle` when the shared page cannot be made.
pub fn create(options: EventOptions) -> Result<Event> {
    let file = shared_file().map_err(|e| invalid(format!("no device memory file: {e}")))?;
    let page = Arena::map(PAGE).ok_or_else(|| invalid("cannot map a page for the event"))?;
    let (_, offset) = page
        .file_range()
        .expect("a fresh arena is in the memory file");
    let claim: Arc<dyn std::any::Any + Send + Sync> = Arc::new(());
    // A fresh arena: nothing of this process's memory table can be over it.
    claim_event_page(file.nonce(), offset, &claim).map_err(invalid)?;
    let nonce = crate::memory::host::random_u64() | 1;
    page.atomic_u64(NONCE).store(nonce, Ordering::SeqCst);
    let me = Proc::me();
    let mut h = Vec::with_capacity(EVENT_HANDLE_LEN);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&me.pid.to_le_bytes());
    h.extend_from_slice(&me.start_time.to_le_bytes());
    h.extend_from_slice(&file.fd().to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&offset.to_le_bytes());
    h.extend_from_slice(&nonce.to_le_bytes());
    debug_assert_eq!(h.len(), EVENT_HANDLE_LEN);
    Ok(attach(
        Event::with_options(options),
        Participant::new(
            Page {
                page,
                _claim: claim,
            },
            None,
            Some(h),
        ),
    ))
}

/// Tie `p` to `ev` (its `shared` hooks) and return `ev`.
fn attach(ev: Event, p: Arc<Participant>) -> Event {
    let _ = p.me.set(Arc::downgrade(&ev.0));
    let shared: Arc<dyn Shared> = p;
    let _ = ev.0.shared.set(shared);
    ev
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

/// Open an event handle made by [`handle`] (in another process of the same user, or this one).
/// Records made on the opened event are seen by the exporter and every other importer.
///
/// # Errors
/// An argument error for bytes that are not an event handle; `InvalidHandle` when the
/// exporting process has exited (or is a zombie) or the handle does not match its event.
pub fn open(handle: &[u8]) -> Result<Event> {
    let f = HandleFields::check(handle, EVENT_HANDLE_LEN, MAGIC, VERSION, "event", "Event")?;
    let (u32_at, u64_at) = (|i| f.u32_at(i), |i| f.u64_at(i));
    let (pid, start_time, fd) = (u32_at(12), u64_at(16), u32_at(24));
    let (offset, nonce) = (u64_at(32), u64_at(40));
    let exporter = Proc { pid, start_time };
    if !exporter.alive() {
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
    let file_nonce = name
        .strip_prefix("/memfd:runtime-mem-")
        .and_then(|rest| rest.get(..16))
        .and_then(|hex| u64::from_str_radix(hex, 16).ok());
    let Some(file_nonce) = file_nonce.filter(|_| offset.is_multiple_of(PAGE)) else {
        return Err(invalid(format!(
            "descriptor {fd} of process {pid} is not runtime memory (forged or stale handle)"
        )));
    };
    // The page is read and written with atomics from here on: it must be an event page and
    // nothing else of this process's memory (a device buffer copied under its lock).
    if crate::memory::host::own_file_nonce() == Some(file_nonce)
        && !is_event_page(file_nonce, offset)
    {
        return Err(invalid(format!(
            "it names memory of this process at offset {offset} that is no event (forged or \
             stale handle)"
        )));
    }
    let claim: Arc<dyn std::any::Any + Send + Sync> = Arc::new(());
    claim_event_page(file_nonce, offset, &claim)
        .map_err(|why| invalid(format!("{why} (forged handle)")))?;
    let page = Arena::map_file(&file, offset, PAGE)
        .map_err(|e| invalid(format!("cannot map the event page: {e}")))?;
    if page.atomic_u64(NONCE).load(Ordering::SeqCst) != nonce {
        return Err(invalid(format!(
            "process {pid} has no such event any more (stale or forged handle)"
        )));
    }
    Ok(attach(
        Event::with_options(EventOptions::without_timing()),
        Participant::new(
            Page {
                page,
                _claim: claim,
            },
            Some(exporter),
            None,
        ),
    ))
}

/// A local record waiting for another process's record.
struct Pending {
    event: Weak<EventInner>,
    link: Arc<Link>,
    remote: u64,
    recorder: Option<Proc>,
}

struct Watcher {
    pending: std::sync::Mutex<Vec<Pending>>,
    cv: std::sync::Condvar,
}

/// The watcher of this process (with the fork count it was started under: a forked child
/// starts its own).
static WATCHER: WatcherSlot = crate::sync::StaticMutex::new(None);

type WatcherSlot = crate::sync::StaticMutex<Option<(u64, Arc<Watcher>)>>;

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

fn watch(p: Pending) {
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
                    drop(slot);
                    // No thread: complete at once, so nothing waits forever (the record is
                    // then not ordered after the remote one).
                    if let Some(ev) = p.event.upgrade() {
                        ev.complete_mirrored(p.remote);
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
        .push(p);
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
            let settled = p.link.settled(p.remote, p.recorder, check_alive);
            if settled {
                done.push((ev, p.remote));
            }
            !settled
        });
        drop(pending);
        // Completed outside the list's lock (completion wakes streams and runs callbacks).
        for (ev, remote) in done {
            ev.complete_mirrored(remote);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// The importer's side of an event exported by `exporter`, with nothing completed.
    fn imported_from(exporter: Proc) -> Link {
        Link {
            page: Page {
                page: Arena::map(PAGE).expect("a page of the memory file"),
                _claim: Arc::new(()),
            },
            exporter: Some(exporter),
            dead: AtomicBool::new(false),
            abandoned: crate::sync::lock::Mutex::new(None),
        }
    }

    /// The exporter made the pending record and dies while the watcher looks: after the
    /// liveness read numbered `dies_at` (each read after it answers dead). Whenever the
    /// look settles the record, the exporter's death is what the event reports afterwards,
    /// not an abandoned record on an event that looks healthy (the test_ipc.py case
    /// `test_an_exporter_dying_before_its_record_completes_fails_the_wait` failed so once).
    #[test]
    fn an_exporter_dying_during_the_watchers_look_is_reported_whichever_read_sees_it() {
        let exporter = Proc {
            pid: u32::MAX - 7,
            start_time: 1,
        };
        for dies_at in 0..4 {
            let link = imported_from(exporter);
            let reads = Cell::new(0);
            let alive = |_| {
                reads.set(reads.get() + 1);
                reads.get() <= dies_at
            };
            let settled = link.settled_by(1, Some(exporter), true, alive);
            let dead = link.dead.load(Ordering::Acquire);
            assert_eq!(settled, dead, "dies at read {dies_at}");
            assert_eq!(settled, dies_at < 2, "dies at read {dies_at}");
        }
    }
}
