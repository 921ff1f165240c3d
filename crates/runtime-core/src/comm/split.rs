//! Communicators made from other communicators or rank by rank: [`Communicator::split`]
//! (NCCL's `ncclCommSplit`) and [`init_rank`] with a [`UniqueId`] (NCCL's
//! `ncclGetUniqueId` + `ncclCommInitRank`), both finished through a [`Forming`] that the
//! caller waits on (or, for one thread issuing every rank's call, polls later: NCCL's group).
//!
//! **Split** is numbered among the communicator's collectives (every rank calls it in the
//! same place of its issue order) but is not queued on a stream: each rank's call runs the
//! collective protocol's rendezvous on a helper thread of its own, so the call itself never
//! waits. The rank whose arrival completes the rendezvous makes the new communicators: in one
//! process, one per color over the devices of that color's ranks ordered by key, then old
//! rank; spanning processes, the processes first share every rank's color and key (one
//! exchange, in collective order), and a color whose ranks span several processes gets a
//! transport of its own from [`Transport::split`](super::Transport::split). Ranks of a
//! communicator spanning processes are numbered process by process, so a new communicator
//! orders its processes by their first rank in (key, old rank) order and the ranks of each
//! process by (key, old rank): with one rank per process that is exactly key order.
//!
//! **Rank by rank:** ranks of one process join under the same [`UniqueId`] from any threads;
//! the last to join makes the communicator and hands every joiner its rank. A joiner that
//! waits past its timeout fails the whole gathering (every rank waiting in it, and later
//! joins of the id). Ranks in other processes join with `connect` (the Python package's
//! `init_mpi`), which has a transport; an id made by another process is refused.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sync::lock::{Condvar, Mutex};

use crate::device::Device;
use crate::error::{arg_error, Error, Result, StreamError};

use super::protocol::{Part, Shared};
use super::world::World;
use super::{Communicator, Kind};

/// Where a forming communicator is put: `Some` new communicator, `None` for a rank that
/// joins none (split with no color), or the error.
pub(super) struct FormCell {
    state: Mutex<Option<Result<Option<Communicator>>>>,
    cv: Condvar,
}

impl FormCell {
    fn new() -> Arc<FormCell> {
        Arc::new(FormCell {
            state: Mutex::new(None),
            cv: Condvar::new(),
        })
    }

    /// Set the outcome, unless one was set already.
    fn set(&self, outcome: Result<Option<Communicator>>) {
        let mut st = self.state.lock();
        if st.is_none() {
            *st = Some(outcome);
            self.cv.notify_all();
        }
    }

    fn is_set(&self) -> bool {
        self.state.lock().is_some()
    }
}

/// A rank's split call as its part of the collective.
pub(super) struct SplitCall {
    color: Option<u32>,
    key: i64,
    cell: Arc<FormCell>,
}

/// A communicator being made ([`Communicator::split`], [`init_rank`]): poll it, or wait.
pub struct Forming {
    cell: Arc<FormCell>,
    /// Rank by rank: the gathering to fail when this joiner's own wait times out.
    joining: Option<(u128, Option<Instant>, Duration)>,
    what: String,
    /// [`crate::generation::forks`] when it was made: in a forked child the ranks it waits
    /// for are the parent's threads, and its cell's lock may be held by one of them.
    forks: u64,
}

impl std::fmt::Debug for Forming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Forming({})", self.what)
    }
}

impl Forming {
    /// Wait at most `slice`: `Some(new communicator)` once made (`Some(None)` for a rank
    /// that joins none), `None` while it is still being made.
    ///
    /// # Errors
    /// The split's or the gathering's failure: ranks that disagree, a rank that does not come
    /// within the timeout (`Timeout`), an abort, a transport's failure, a shutdown while it
    /// was forming. Polling again after the outcome was taken fails with `Invalid`.
    /// `InvalidHandle` in a child forked while it was forming.
    pub fn poll(&mut self, slice: Duration) -> Result<Option<Option<Communicator>>> {
        if self.forks != crate::generation::forks() {
            return Err(crate::error::DeviceError::InvalidHandle {
                what: self.what.clone(),
                why: "it was being made by the parent process (this process was forked)".into(),
            }
            .into());
        }
        let until = Instant::now() + slice;
        let mut st = self.cell.state.lock();
        loop {
            if let Some(outcome) = st.take() {
                // Leave a marker: the outcome was taken.
                *st = Some(Err(StreamError::Invalid(format!(
                    "{} was already taken",
                    self.what
                ))
                .into()));
                return outcome.map(Some);
            }
            let now = Instant::now();
            if let Some((id, deadline, timeout)) = self.joining {
                if deadline.is_some_and(|d| now >= d) {
                    drop(st);
                    fail_gathering(id, &self.what, timeout);
                    st = self.cell.state.lock();
                    continue;
                }
            }
            if now >= until {
                return Ok(None);
            }
            let wake = match self.joining.and_then(|(_, d, _)| d) {
                Some(d) => d.min(until),
                None => until,
            };
            self.cell.cv.wait_until(&mut st, wake);
        }
    }

    /// Wait until the communicator is made (bounded by its timeout).
    ///
    /// # Errors
    /// As for [`Forming::poll`].
    pub fn wait(mut self) -> Result<Option<Communicator>> {
        loop {
            if let Some(c) = self.poll(Duration::from_millis(100))? {
                return Ok(c);
            }
        }
    }
}

/// A communicator that is made, or still forming, shared by threads (a Python
/// `Communicator` made inside a group): any of them may wait for it, in slices, and the
/// outcome, once one of them has it, is every caller's. No lock is held while waiting, so a
/// waiter that stops (Ctrl-C) leaves it forming for the next; in a child forked while it was
/// forming it fails with `InvalidHandle` without touching a lock a parent thread may hold.
pub struct Forthcoming {
    made: std::sync::OnceLock<Communicator>,
    state: Mutex<Making>,
    cv: Condvar,
    forks: u64,
}

/// How far a [`Forthcoming`] is.
enum Making {
    /// Made (in `made`).
    Made,
    /// Waiting for the other ranks; nobody is polling it.
    Forming(Forming),
    /// A thread is polling it (it holds the [`Forming`]).
    Polling,
    Failed(Error),
    /// Made, and this rank (a split with no color) joined none.
    JoinedNone,
}

impl Forthcoming {
    /// One made already.
    pub fn made(c: Communicator) -> Forthcoming {
        let made = std::sync::OnceLock::new();
        let _ = made.set(c);
        Forthcoming::new(made, Making::Made)
    }

    /// One to be made by `f`.
    pub fn forming(f: Forming) -> Forthcoming {
        Forthcoming::new(std::sync::OnceLock::new(), Making::Forming(f))
    }

    fn new(made: std::sync::OnceLock<Communicator>, state: Making) -> Forthcoming {
        Forthcoming {
            made,
            state: Mutex::new(state),
            cv: Condvar::new(),
            forks: crate::generation::forks(),
        }
    }

    /// The communicator, if it is made.
    pub fn get(&self) -> Option<&Communicator> {
        self.made.get()
    }

    /// Wait at most `slice` for the outcome: `Some(Some(communicator))` once made,
    /// `Some(None)` for a rank that joined none, `None` while it is still forming. Threads
    /// may call it at once: one polls the [`Forming`], the others wait for its outcome.
    ///
    /// # Errors
    /// The [`Forming::poll`] failure, to every caller from then on; `InvalidHandle` in a
    /// child forked while it was forming.
    pub fn poll(&self, slice: Duration) -> Result<Option<Option<&Communicator>>> {
        if let Some(c) = self.made.get() {
            return Ok(Some(Some(c)));
        }
        if self.forks != crate::generation::forks() {
            return Err(self.forked_away());
        }
        let until = Instant::now() + slice;
        let mut st = self.state.lock();
        let mut f = loop {
            match std::mem::replace(&mut *st, Making::Polling) {
                Making::Forming(f) => break f,
                Making::Polling => {
                    if Instant::now() >= until {
                        return Ok(None);
                    }
                    self.cv.wait_until(&mut st, until);
                }
                other => {
                    *st = other;
                    return self.outcome(&st);
                }
            }
        };
        drop(st);
        // A panic here would leave it `Polling` for ever: the other waiters would never end.
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f.poll(slice)))
            .unwrap_or_else(|p| {
                Err(StreamError::Invalid(format!(
                    "{f:?} panicked: {}",
                    super::protocol::panic_message(p.as_ref())
                ))
                .into())
            });
        let mut st = self.state.lock();
        *st = match polled {
            Ok(None) => Making::Forming(f),
            Ok(Some(Some(c))) => {
                let _ = self.made.set(c);
                Making::Made
            }
            Ok(Some(None)) => Making::JoinedNone,
            Err(e) => Making::Failed(e),
        };
        self.cv.notify_all();
        self.outcome(&st)
    }

    /// The outcome as [`Forthcoming::poll`] gives it, from a state other than `Polling`.
    fn outcome(&self, st: &Making) -> Result<Option<Option<&Communicator>>> {
        match st {
            Making::Made => Ok(Some(self.made.get())),
            Making::JoinedNone => Ok(Some(None)),
            Making::Failed(e) => Err(e.clone()),
            Making::Forming(_) | Making::Polling => Ok(None),
        }
    }

    fn forked_away(&self) -> Error {
        crate::error::DeviceError::InvalidHandle {
            what: "a forming communicator".into(),
            why: "it was being made by the parent process (this process was forked)".into(),
        }
        .into()
    }
}

impl std::fmt::Debug for Forthcoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(c) = self.made.get() {
            return write!(f, "{c:?}");
        }
        if self.forks != crate::generation::forks() {
            return write!(f, "Communicator(forming in the parent process)");
        }
        match &*self.state.lock() {
            Making::Forming(fm) => write!(f, "Communicator(forming: {fm:?})"),
            Making::Failed(e) => write!(f, "Communicator(failed: {e})"),
            Making::JoinedNone => write!(f, "Communicator(this rank joined none)"),
            Making::Made | Making::Polling => write!(f, "Communicator(forming)"),
        }
    }
}

impl Communicator {
    /// Split the communicator (NCCL's `ncclCommSplit`): every rank calls it, in the same
    /// place of its collective order, with a `color` (`None`: this rank joins no new
    /// communicator) and a `key`; the ranks of one color form a new communicator, ranked by
    /// key, then old rank (spanning processes: grouped by process, see the module
    /// documentation), with this communicator's timeout. Returns at once; the
    /// [`Forming`] gives the new communicator once every rank has called split.
    ///
    /// # Errors
    /// `InvalidHandle` (destroyed), the abort error; a thread that could not be started.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Forming> {
        self.check()?;
        let cell = FormCell::new();
        let mut part = Part::new(Kind::Split, None, 0, None, None);
        part.split = Some(SplitCall {
            color,
            key,
            cell: cell.clone(),
        });
        let (shared, local) = (self.shared.clone(), self.local);
        let seq = shared.take_seq(local);
        let what = format!(
            "split of Communicator#{} on rank {}",
            shared.id,
            self.rank()
        );
        let out = cell.clone();
        let name = format!("runtime-comm-split-{}", shared.id);
        crate::sync::spawn_thread(name, move || {
            let r = shared.run(local, seq, Arc::new(part));
            match r {
                Err(e) => out.set(Err(e)),
                Ok(()) => out.set(Err(StreamError::Invalid(format!(
                    "split #{seq} of Communicator#{} failed on another rank",
                    shared.id
                ))
                .into())),
            }
        })
        .map_err(|e| {
            Error::from(StreamError::Invalid(format!(
                "split: could not start its thread: {e}"
            )))
        })?;
        Ok(Forming {
            cell,
            joining: None,
            what,
            forks: crate::generation::forks(),
        })
    }
}

/// The rank order of a new communicator: `members` as (key, old rank), sorted.
fn ordered(mut members: Vec<(i64, usize)>) -> Vec<(i64, usize)> {
    members.sort_unstable();
    members
}

/// A communicator of one process, split by the rank that completed the rendezvous: one new
/// communicator per color.
pub(super) fn split_here(shared: &Shared, parts: &[Arc<Part>]) {
    let call = |l: usize| parts[l].split.as_ref().expect("a split's part");
    let mut colors: BTreeMap<u32, Vec<(i64, usize)>> = BTreeMap::new();
    for l in 0..parts.len() {
        match call(l).color {
            Some(c) => colors.entry(c).or_default().push((call(l).key, l)),
            None => call(l).cell.set(Ok(None)),
        }
    }
    for members in colors.into_values() {
        let members = ordered(members);
        let devices: Vec<Device> = members
            .iter()
            .map(|&(_, l)| shared.devices[l].clone())
            .collect();
        let sub = Shared::new(devices, shared.timeout, None);
        for (i, &(_, l)) in members.iter().enumerate() {
            call(l).cell.set(Ok(Some(Communicator {
                shared: sub.clone(),
                local: i,
            })));
        }
    }
}

/// A communicator spanning processes, split by its leader in collective order: every
/// rank's (color, key) shared across the processes, then one new communicator per color of
/// this process's ranks (a transport of its own where the color spans processes).
pub(super) fn split_across(
    w: &World,
    sh: &Shared,
    what: &str,
    parts: &[Arc<Part>],
    deadline: Option<Instant>,
) -> Result<()> {
    let call = |l: usize| parts[l].split.as_ref().expect("a split's part");
    let mine: Vec<u64> = (0..parts.len())
        .flat_map(|l| {
            let c = call(l);
            [c.color.map_or(u64::MAX, u64::from), c.key as u64]
        })
        .collect();
    let table = w.table(sh, what, deadline, &mine, 2)?;
    let color_of = |r: usize| u32::try_from(table[2 * r]).ok();
    let key_of = |r: usize| table[2 * r + 1] as i64;
    let first = w.first_rank();
    let mut local_colors: Vec<u32> = (0..parts.len()).filter_map(|l| call(l).color).collect();
    local_colors.sort_unstable();
    local_colors.dedup();
    let mut made: Vec<Option<Communicator>> = vec![None; parts.len()];
    for color in local_colors {
        let members = ordered(
            (0..w.size)
                .filter(|&r| color_of(r) == Some(color))
                .map(|r| (key_of(r), r))
                .collect(),
        );
        // Processes in order of their first member; each process's members in order.
        let mut procs: Vec<usize> = Vec::new();
        let mut by_proc: HashMap<usize, Vec<usize>> = HashMap::new();
        for &(_, r) in &members {
            let (q, _) = w.locate(r);
            if !by_proc.contains_key(&q) {
                procs.push(q);
            }
            by_proc.entry(q).or_default().push(r);
        }
        let here: Vec<usize> = by_proc[&w.process].iter().map(|&r| r - first).collect();
        let devices: Vec<Device> = here.iter().map(|&l| sh.devices[l].clone()).collect();
        let world = if procs.len() == 1 {
            None
        } else {
            let t = w
                .transport
                .split(&procs, u64::from(color))
                .map_err(|e| e.into_error(what))?;
            let counts = procs.iter().map(|q| by_proc[q].len()).collect();
            let pos = procs
                .iter()
                .position(|&q| q == w.process)
                .expect("this process has ranks of the color");
            Some(World::new(t, pos, counts))
        };
        let sub = Shared::new(devices, sh.timeout, world);
        for (i, &l) in here.iter().enumerate() {
            made[l] = Some(Communicator {
                shared: sub.clone(),
                local: i,
            });
        }
    }
    for (l, c) in made.into_iter().enumerate() {
        call(l).cell.set(Ok(c));
    }
    Ok(())
}

// --- rank by rank -------------------------------------------------------------------------

/// What ranks exchange to find each other (NCCL's `ncclUniqueId`, 128 bytes): made by
/// [`unique_id`] and passed to every rank's [`init_rank`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; 128]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({:032x})", self.key())
    }
}

const MAGIC: &[u8; 8] = b"rtcommid";

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A new id, never made before in this process (NCCL's `ncclGetUniqueId`).
pub fn unique_id() -> UniqueId {
    let mut b = [0u8; 128];
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    b[12..20].copy_from_slice(&NEXT_ID.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    b[20..28].copy_from_slice(&crate::clock::now_ns().to_le_bytes());
    UniqueId(b)
}

impl UniqueId {
    /// The id from 128 bytes.
    ///
    /// # Errors
    /// An argument error naming `comm_id` when the bytes are not an id this runtime made.
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let b: [u8; 128] = bytes.try_into().map_err(|_| {
            arg_error(
                "comm_id",
                format!("{} bytes; a unique id has 128", bytes.len()),
            )
        })?;
        if &b[..8] != MAGIC {
            return Err(arg_error("comm_id", "is not an id from get_unique_id()"));
        }
        Ok(UniqueId(b))
    }

    /// The process that made it.
    pub fn pid(&self) -> u32 {
        u32::from_le_bytes(self.0[8..12].try_into().expect("4 bytes"))
    }

    fn key(&self) -> u128 {
        u128::from_le_bytes(self.0[8..24].try_into().expect("16 bytes"))
    }
}

/// Ranks that joined one id so far.
struct Gathering {
    n: usize,
    timeout: Duration,
    joined: Vec<Option<(Device, Arc<FormCell>)>>,
    /// Set once the gathering failed: later joins get it.
    failed: Option<Error>,
}

static JOINS: crate::sync::StaticMutex<Option<HashMap<u128, Gathering>>> =
    crate::sync::StaticMutex::new(None);

static FORK: crate::sync::ForkGuarded<crate::sync::StaticMutex<Option<HashMap<u128, Gathering>>>> =
    crate::sync::ForkGuarded::new(|| &JOINS);

/// Around `fork()`: hold the table of gatherings.
pub(super) fn before_fork(wait: Duration) {
    FORK.before_fork(wait);
}

/// After `fork()`: release what [`before_fork`] took.
pub(super) fn after_fork(child: bool) {
    FORK.after_fork(child);
}

/// Join the communicator of `nranks` ranks named by `id` as rank `rank`, on `device` (NCCL's
/// `ncclCommInitRank`); ranks of this process may join from any threads. Returns at once;
/// the [`Forming`] gives the communicator once every rank has joined, or fails once this
/// rank has waited `timeout` (then every rank of the gathering fails, and so do later joins
/// of `id`).
///
/// # Errors
/// Argument errors: `nranks` of 0 or different from the other joiners', `rank` out of range
/// or taken, `device` already another rank's, a zero `timeout`, an id made by another
/// process; `InvalidHandle` for a device of a runtime that was shut down; the gathering's
/// failure.
pub fn init_rank(
    nranks: usize,
    id: &UniqueId,
    rank: usize,
    device: &Device,
    timeout: Duration,
) -> Result<Forming> {
    if nranks == 0 {
        return Err(arg_error(
            "nranks",
            "a communicator needs at least one rank",
        ));
    }
    if rank >= nranks {
        return Err(arg_error(
            "rank",
            format!(
                "{rank} is not a rank of a communicator of {nranks} ranks (0 to {})",
                nranks - 1
            ),
        ));
    }
    if timeout.is_zero() {
        return Err(arg_error("timeout", "must be positive"));
    }
    if id.pid() != std::process::id() {
        return Err(arg_error(
            "comm_id",
            format!(
                "was made by process {}; ranks in other processes join with init_mpi (a transport), not by id",
                id.pid()
            ),
        ));
    }
    let key = id.key();
    let cell = FormCell::new();
    let what = format!("rank {rank} of {nranks} joining {id:?}");
    let mut joins = JOINS.lock();
    // Under the lock: shutdown closes the devices, then fails the gatherings under it.
    device.check_alive()?;
    let table = joins.get_or_insert_with(HashMap::new);
    let g = table.entry(key).or_insert_with(|| Gathering {
        n: nranks,
        timeout,
        joined: vec![None; nranks],
        failed: None,
    });
    if let Some(e) = &g.failed {
        return Err(e.clone());
    }
    if g.n != nranks {
        return Err(arg_error(
            "nranks",
            format!(
                "{nranks}, but the ranks that joined {id:?} before passed {}",
                g.n
            ),
        ));
    }
    if g.joined[rank].is_some() {
        return Err(arg_error(
            "rank",
            format!("rank {rank} of {id:?} has joined already"),
        ));
    }
    if let Some(q) = g
        .joined
        .iter()
        .position(|j| j.as_ref().is_some_and(|(d, _)| d.index() == device.index()))
    {
        return Err(arg_error(
            "device",
            format!(
                "device {} is rank {q}'s already; each rank needs its own device",
                device.index()
            ),
        ));
    }
    g.joined[rank] = Some((device.clone(), cell.clone()));
    if g.joined.iter().all(Option::is_some) {
        let g = table.remove(&key).expect("just filled");
        drop(joins);
        let (devices, cells): (Vec<Device>, Vec<Arc<FormCell>>) = g
            .joined
            .into_iter()
            .map(|j| j.expect("every rank joined"))
            .unzip();
        let shared = Shared::new(devices, g.timeout, None);
        for (local, c) in cells.into_iter().enumerate() {
            c.set(Ok(Some(Communicator {
                shared: shared.clone(),
                local,
            })));
        }
    }
    Ok(Forming {
        cell,
        joining: Some((key, crate::clock::deadline_after(Some(timeout)), timeout)),
        what,
        forks: crate::generation::forks(),
    })
}

/// At shutdown, once the devices are closed: fail every gathering still waiting for ranks,
/// and later joins of its id. Its ranks' devices belong to the runtime going away: left in
/// place, a rank joining after the next `init` completed it, and the communicator held a
/// device of each runtime. A join checks its device under the same lock, so none slips in
/// between.
pub(crate) fn fail_all_gatherings(why: &str) {
    let mut joins = JOINS.lock();
    let mut cells = Vec::new();
    for (key, g) in joins.iter_mut().flat_map(|t| t.iter_mut()) {
        if g.failed.is_some() {
            continue;
        }
        let err: Error =
            StreamError::Invalid(format!("joining UniqueId({key:032x}) failed: {why}")).into();
        g.failed = Some(err.clone());
        // Only the marker stays: the ranks' slots go (one per rank, as many as the joiners
        // asked for).
        let joined = std::mem::take(&mut g.joined);
        cells.extend(joined.into_iter().flatten().map(|(_, c)| (c, err.clone())));
    }
    drop(joins);
    for (c, err) in cells {
        if !c.is_set() {
            c.set(Err(err));
        }
    }
}

/// A joiner of gathering `key` waited past its timeout: fail every rank waiting in it, and
/// later joins.
fn fail_gathering(key: u128, what: &str, timeout: Duration) {
    let mut joins = JOINS.lock();
    let Some(g) = joins.as_mut().and_then(|t| t.get_mut(&key)) else {
        return; // complete meanwhile: the cells are set
    };
    if g.failed.is_some() {
        return; // failed meanwhile (another joiner's timeout, a shutdown): the cells are set
    }
    let missing: Vec<usize> = (0..g.n).filter(|&r| g.joined[r].is_none()).collect();
    let err: Error = StreamError::Timeout {
        what: format!("{what}: ranks {missing:?} did not join"),
        timeout_ms: timeout.as_secs_f64() * 1e3,
    }
    .into();
    g.failed = Some(err.clone());
    // Only the marker stays (see `fail_all_gatherings`).
    let cells: Vec<Arc<FormCell>> = std::mem::take(&mut g.joined)
        .into_iter()
        .flatten()
        .map(|(_, c)| c)
        .collect();
    drop(joins);
    for c in cells {
        if !c.is_set() {
            c.set(Err(err.clone()));
        }
    }
}
