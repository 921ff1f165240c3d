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
//!
//! Who made a record: a ring entry (one word: the number and a slot of the page's table of
//! recording processes) names it until a record `RING_LEN` later takes the entry; an entry is
//! never set back to an older record. A record the ring no longer names is abandoned once
//! every other process of the table that took it or a later number died (a later record
//! completing completes it too). Any process that maps the memory file can write the page: a
//! latest record that no take can have left (beyond the numbers taken, over an older ring
//! entry, named by a slot that took no such number, or taken by no process of the table) is
//! not taken up, and the event reports its page inconsistent (`InvalidHandle`) on every later
//! use, so no wait (and no stream a shutdown drains) waits for a number no process took. An
//! event made or opened before a `fork()` is refused in the child, as every inherited handle
//! is: the child has no watcher for the records it took up, and no claim on the page.

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
/// Version 3: ring entries name a slot of the page's table of recording processes.
const VERSION: u32 = 3;
/// Page layout: nonce, latest record published, highest completed record, record numbers
/// taken, the highest record taken by a process that found no free slot in the table; then
/// the ring of recent records (one word each: the number and the slot of its recorder), then
/// the table of processes that recorded (pid and state, start time, highest record taken).
const NONCE: u64 = 0;
const RECORDED: u64 = 8;
const COMPLETED: u64 = 16;
const TICKETS: u64 = 24;
const UNNAMED: u64 = 32;
const RING: u64 = 64;
/// Records named in the ring (an older record's entry holds a later one; its recorder is then
/// one of the table's processes that took a number at least as high).
pub(crate) const RING_LEN: u64 = 128;
const PROCS: u64 = RING + RING_LEN * 8;
const PROC: u64 = 24;
/// Processes in the table (a dead one's slot is taken over when no slot is free).
const PROC_SLOTS: u64 = (PAGE - PROCS) / PROC;
/// A ring entry: the record number in its low bits, 1 + its recorder's slot (0: none) above.
const NUMBER_BITS: u32 = 56;
const NUMBER: u64 = (1 << NUMBER_BITS) - 1;
/// A table slot's state word: the pid in its low half, the state above (0: free).
const READY: u64 = 1 << 32;
const CLAIMING: u64 = 2 << 32;
const _: () = assert!(PROC_SLOTS >= 64 && PROC_SLOTS < (1 << (64 - NUMBER_BITS)) - 1);
/// The stores of one take (see [`Page::take_steps`]).
const TAKE_STEPS: usize = 5;

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
    /// This process's slot in the page's table: its pid above, 1 + the slot below (0: none
    /// found yet).
    slot: AtomicU64,
    /// Keeps the page noted as an event page (`memory::ipc::claim_event_page`) while it lives.
    _claim: Arc<dyn std::any::Any + Send + Sync>,
}

impl Page {
    fn new(page: Arena, claim: Arc<dyn std::any::Any + Send + Sync>) -> Page {
        Page {
            page,
            slot: AtomicU64::new(0),
            _claim: claim,
        }
    }

    fn at(&self, offset: u64) -> &AtomicU64 {
        self.page.atomic_u64(offset)
    }

    fn recorded(&self) -> u64 {
        self.at(RECORDED).load(Ordering::SeqCst)
    }

    fn completed(&self) -> u64 {
        self.at(COMPLETED).load(Ordering::SeqCst)
    }

    fn entry(&self, n: u64) -> &AtomicU64 {
        self.at(RING + (n % RING_LEN) * 8)
    }

    /// Slot `i` of the table: its state word, its process's start time, its highest record.
    fn state(&self, i: u64) -> &AtomicU64 {
        self.at(PROCS + i * PROC)
    }

    fn start_time(&self, i: u64) -> &AtomicU64 {
        self.at(PROCS + i * PROC + 8)
    }

    fn taken(&self, i: u64) -> &AtomicU64 {
        self.at(PROCS + i * PROC + 16)
    }

    /// The process holding slot `i`, if one holds it (not while one takes it over).
    fn owner(&self, i: u64) -> Option<Proc> {
        let s = self.state(i).load(Ordering::SeqCst);
        if s & !0xFFFF_FFFF != READY {
            return None;
        }
        let start_time = self.start_time(i).load(Ordering::SeqCst);
        (self.state(i).load(Ordering::SeqCst) == s).then_some(Proc {
            pid: s as u32,
            start_time,
        })
    }

    /// The slot of `me` in the table: found, or a free one taken, or a dead process's taken
    /// over (its highest record stays: a later record of `me` is higher anyway). `None` when
    /// every slot is held by a live process.
    fn slot_of(&self, me: Proc) -> Option<u64> {
        let cached = self.slot.load(Ordering::Relaxed);
        if cached >> 32 == u64::from(me.pid) && cached & 0xFFFF_FFFF != 0 {
            return Some((cached & 0xFFFF_FFFF) - 1);
        }
        let held = READY | u64::from(me.pid);
        let take = |i: u64, from: u64| {
            let claiming = CLAIMING | u64::from(me.pid);
            if self
                .state(i)
                .compare_exchange(from, claiming, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                return false;
            }
            self.start_time(i).store(me.start_time, Ordering::SeqCst);
            self.state(i).store(held, Ordering::SeqCst);
            true
        };
        let found = (0..PROC_SLOTS)
            .find(|&i| self.owner(i) == Some(me))
            .or_else(|| (0..PROC_SLOTS).find(|&i| take(i, 0)))
            .or_else(|| {
                (0..PROC_SLOTS).find(|&i| {
                    let s = self.state(i).load(Ordering::SeqCst);
                    self.owner(i).is_some_and(|p| !p.alive()) && take(i, s)
                })
            })?;
        self.slot
            .store((u64::from(me.pid) << 32) | (found + 1), Ordering::Relaxed);
        Some(found)
    }

    /// Take the next record number for a record `by` makes: note it as `by`'s highest, name
    /// `by` in the ring, then publish the number as the latest.
    fn take(&self, by: Proc) -> u64 {
        self.take_steps(by, TAKE_STEPS)
    }

    /// The first `steps` of the [`TAKE_STEPS`] stores of [`Page::take`] (tests stop a take
    /// part way, as a process killed or paused there does).
    fn take_steps(&self, by: Proc, steps: usize) -> u64 {
        let slot = if steps > 0 { self.slot_of(by) } else { None };
        if steps < 2 {
            return 0;
        }
        let n = self.at(TICKETS).fetch_add(1, Ordering::SeqCst) + 1;
        if steps > 2 {
            let highest = slot.map_or(self.at(UNNAMED), |i| self.taken(i));
            highest.fetch_max(n, Ordering::SeqCst);
        }
        if steps > 3 {
            // Never over a later record's entry: a take delayed past RING_LEN later ones.
            let entry = (slot.map_or(0, |i| i + 1) << NUMBER_BITS) | (n & NUMBER);
            let _ = self
                .entry(n)
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |e| {
                    (e & NUMBER < n).then_some(entry)
                });
        }
        if steps > 4 {
            self.at(RECORDED).fetch_max(n, Ordering::SeqCst);
        }
        n
    }

    /// Who made record `n`, the latest published: `Ok(Some)` the process the ring names,
    /// `Ok(None)` when the ring no longer names it (a later record took its entry, its
    /// recorder found no slot, or a dead recorder's slot is being taken over). Read before
    /// the tickets counter, which no take publishes a record or an entry ahead of.
    ///
    /// # Errors
    /// Why the page cannot be what takes made of it, for the caller's message.
    fn maker(&self, n: u64) -> std::result::Result<Option<Proc>, String> {
        let e = self.entry(n).load(Ordering::SeqCst);
        let (number, who) = (e & NUMBER, e >> NUMBER_BITS);
        let tickets = self.at(TICKETS).load(Ordering::SeqCst);
        let i = n % RING_LEN;
        if number > n && number % RING_LEN == i && number <= tickets {
            return Ok(None);
        }
        if number != n {
            return Err(format!(
                "ring entry {i} holds record {number}, not record {n} or a later one of that \
                 entry (record numbers taken: {tickets})"
            ));
        }
        if who == 0 {
            return Ok(None);
        }
        let slot = who - 1;
        if slot >= PROC_SLOTS || self.state(slot).load(Ordering::SeqCst) == 0 {
            return Err(format!(
                "ring entry {i} names record {n} as made by process slot {slot}, which no \
                 process took"
            ));
        }
        let highest = self.taken(slot).load(Ordering::SeqCst);
        if highest < n {
            return Err(format!(
                "ring entry {i} names record {n} as made by process slot {slot}, whose highest \
                 record is {highest}"
            ));
        }
        Ok(self.owner(slot))
    }

    /// The latest record published and who made it (see [`Page::maker`]); `(0, None)` when
    /// none was.
    ///
    /// # Errors
    /// Why the page cannot be what takes made of it: a number beyond those taken, or one no
    /// process of the table took.
    fn latest(&self) -> std::result::Result<(u64, Option<Proc>), String> {
        let mut tries = 0;
        loop {
            let n = self.recorded();
            if n == 0 {
                return Ok((0, None));
            }
            let completed = self.completed();
            let maker = self.maker(n);
            let tickets = self.at(TICKETS).load(Ordering::SeqCst);
            if n > tickets || completed > tickets {
                return Err(format!(
                    "record {} is published as the {}, but only {tickets} record numbers were \
                     taken",
                    n.max(completed),
                    if n > tickets {
                        "latest"
                    } else {
                        "highest completed"
                    }
                ));
            }
            if let Some(p) = maker? {
                return Ok((n, Some(p)));
            }
            tries += 1;
            if self.recorded() != n && tries < 8 {
                continue; // a later record took its entry and is published: take that up
            }
            let took = (0..PROC_SLOTS).any(|i| self.taken(i).load(Ordering::SeqCst) >= n)
                || self.at(UNNAMED).load(Ordering::SeqCst) >= n;
            if !took {
                return Err(format!(
                    "record {n} is published as the latest, but no process that recorded took \
                     it"
                ));
            }
            return Ok((n, None));
        }
    }

    /// The processes of the table that took record `n` or a later one.
    fn takers_from(&self, n: u64) -> impl Iterator<Item = Proc> + '_ {
        (0..PROC_SLOTS)
            .filter(move |&i| self.taken(i).load(Ordering::SeqCst) >= n)
            .filter_map(|i| self.owner(i))
    }
}

/// What the watcher needs of one process's side of a shared event.
struct Link {
    page: Page,
    /// The exporting process, on an importing side.
    exporter: Option<Proc>,
    /// The exporter died (importing side).
    dead: AtomicBool,
    /// Why the page is no longer what takes made of it (a process wrote it other than through
    /// the runtime): the event reports it on every later use.
    broken: std::sync::OnceLock<String>,
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
            // No longer named in the ring: made by a process of the table that took it or a
            // later record (a later one completing completes it too): abandoned once every
            // such process but this one died (this one's later record may wait for it).
            None => self.page.takers_from(n).all(|r| r == me || !alive(r)),
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
    /// The process it was made in: a child of a `fork()` has no watcher for the records it
    /// took up, and no claim on its page (`memory::ipc::after_fork`), so it refuses the event.
    made_in: u32,
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
                broken: std::sync::OnceLock::new(),
                abandoned: crate::sync::lock::Mutex::new(None),
            }),
            made_in: std::process::id(),
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
        if page.recorded() <= event.latest_taken()
            || self.link.broken.get().is_some()
            || std::process::id() != self.made_in
        {
            return;
        }
        let guard = self.pulling.lock();
        let (remote, recorder) = match page.latest() {
            Ok(latest) => latest,
            Err(why) => {
                // Not taken up: no wait waits for a number no process took.
                let _ = self.link.broken.set(why);
                return;
            }
        };
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
                recorder,
            });
        }
    }

    fn check(&self) -> Result<()> {
        if std::process::id() != self.made_in {
            return Err(invalid(format!(
                "it was {} in process {} before a fork(); a forked child opens the handle again",
                if self.handle.is_some() {
                    "made"
                } else {
                    "opened"
                },
                self.made_in
            )));
        }
        if let Some(why) = self.link.broken.get() {
            return Err(invalid(format!(
                "the event's shared page was written other than by the runtime: {why}"
            )));
        }
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
        Participant::new(Page::new(page, claim), None, Some(h)),
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
        Participant::new(Page::new(page, claim), Some(exporter), None),
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

/// The watcher of this process (with the pid it was started in: a forked child starts its
/// own, also after a fork the runtime's handlers did not see, made before the first `init`).
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
    let pid = u64::from(std::process::id());
    let w = {
        let mut slot = WATCHER.lock();
        match slot.as_ref() {
            Some((p, w)) if *p == pid => w.clone(),
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
                *slot = Some((pid, w.clone()));
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
            page: Page::new(
                Arena::map(PAGE).expect("a page of the memory file"),
                Arc::new(()),
            ),
            exporter: Some(exporter),
            dead: AtomicBool::new(false),
            broken: std::sync::OnceLock::new(),
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

    /// Record `n` is pending, made by a live process; `RING_LEN` records later another process
    /// takes a number whose ring entry is `n`'s and dies (or only pauses) part way through its
    /// take. Whatever part of the take it did, a look at who made `n` (what a process pulling
    /// `n` does) must not name that other process, and `n` must not be found abandoned.
    #[test]
    fn a_take_cut_short_over_a_pending_records_ring_entry_leaves_it_to_its_maker() {
        let exporter = Proc::me();
        let maker = Proc {
            pid: u32::MAX - 3,
            start_time: 1,
        };
        let killed = Proc {
            pid: u32::MAX - 5,
            start_time: 1,
        };
        let alive = |p: Proc| p != killed;
        for steps in 0..=TAKE_STEPS {
            let link = imported_from(exporter);
            let n = link.page.take(maker);
            for _ in 1..RING_LEN {
                link.page.take(exporter);
            }
            link.page.take_steps(killed, steps);
            let who = link.page.maker(n).unwrap();
            assert_ne!(who, Some(killed), "after {steps} steps");
            assert!(
                !link.settled_by(n, who, true, alive),
                "after {steps} steps: record {n} found abandoned; its maker lives"
            );
        }
    }
}
