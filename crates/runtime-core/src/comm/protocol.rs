//! The protocol every communicator runs, in-process or spanning processes: sequence numbers,
//! the rendezvous of a collective's parts in its slot, the agreement check, the timeout and
//! abort, the order of the steps across processes, and the point-to-point mailboxes.
//!
//! A collective's op files its rank's [`Part`] under the collective's number and waits until
//! every local rank has filed; the last to arrive checks that the parts agree and is the
//! collective's *leader*. Failure (mismatch, timeout, abort) is decided under the lock before
//! "all arrived" can be seen, so either every local rank runs the collective or every one
//! fails. Then, in a communicator of this process only, every rank does its share of the data
//! movement (`reduce`) and waits for the others; in one spanning processes the leader alone
//! runs the collective's step across processes (`world`) while the others wait for its
//! outcome. A communicator spanning processes that fails in any way is aborted: its peers'
//! calls can no longer be matched.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::sync::lock::{Condvar, Mutex};

use crate::clock::deadline_after;
use crate::device::Device;
use crate::error::{arg_error, Error, KernelFailure, Result, StreamError};
use crate::kernel::{DType, Tensor};
use crate::memory::access::{Access, AccessSet};

use super::reduce;
use super::world::World;
use super::{Kind, ReduceOp};

/// One rank's part of a collective.
pub(super) struct Part {
    pub(super) kind: Kind,
    pub(super) dtype: Option<DType>,
    /// The count the ranks must agree on (NCCL's `count` argument of the call).
    pub(super) count: usize,
    pub(super) send: Option<Tensor>,
    pub(super) recv: Option<Tensor>,
    /// Element counts per rank: `all_gatherv` and `reduce_scatterv` (the same on every
    /// rank), `all_to_allv` (what this rank sends to each rank).
    pub(super) counts: Vec<usize>,
    /// `all_to_allv`: what this rank receives from each rank.
    pub(super) recv_counts: Vec<usize>,
    /// `all_reduce_coalesced`: the (send, recv) pairs after the first (`send`, `recv`).
    pub(super) more: Vec<(Tensor, Tensor)>,
    /// `split`: this rank's color and key, and where its new communicator goes.
    pub(super) split: Option<super::split::SplitCall>,
}

impl Part {
    /// A part with no per-rank counts, pairs or split.
    pub(super) fn new(
        kind: Kind,
        dtype: Option<DType>,
        count: usize,
        send: Option<Tensor>,
        recv: Option<Tensor>,
    ) -> Part {
        Part {
            kind,
            dtype,
            count,
            send,
            recv,
            counts: Vec::new(),
            recv_counts: Vec::new(),
            more: Vec::new(),
            split: None,
        }
    }

    /// The device memory this rank's part touches: its send tensors read, its recv tensors
    /// written (one allocation in place: written). Other local ranks (or the leader) reach
    /// these buffers only while this rank's op runs inside the collective, holding them.
    pub(super) fn accesses(&self) -> AccessSet {
        let send = self.send.iter().map(|t| (t.buffer(), Access::Read));
        let recv = self.recv.iter().map(|t| (t.buffer(), Access::Write));
        let more_send = self.more.iter().map(|(s, _)| (s.buffer(), Access::Read));
        let more_recv = self.more.iter().map(|(_, r)| (r.buffer(), Access::Write));
        AccessSet::new(send.chain(recv).chain(more_send).chain(more_recv))
    }

    /// This rank's `premul_sum` factor, if the collective is one.
    pub(super) fn factor(&self) -> Option<f64> {
        self.kind.op().and_then(ReduceOp::factor)
    }

    /// `all_reduce_coalesced`: pair `i` (0 is `send`, `recv`).
    pub(super) fn pair(&self, i: usize) -> (&Tensor, &Tensor) {
        if i == 0 {
            (
                self.send.as_ref().expect("checked at issue"),
                self.recv.as_ref().expect("checked at issue"),
            )
        } else {
            let (s, r) = &self.more[i - 1];
            (s, r)
        }
    }

    /// `all_reduce_coalesced`: the length of every pair.
    pub(super) fn coalesced_lens(&self) -> Vec<usize> {
        (0..=self.more.len())
            .map(|i| self.pair(i).0.len())
            .collect()
    }

    /// The elements of each rank's block, for the collectives made of one block per rank
    /// laid end to end (`all_gather(v)`, `reduce_scatter(v)`) among `n` ranks.
    pub(super) fn block_counts(&self, n: usize) -> Vec<usize> {
        match self.kind {
            Kind::AllGatherV | Kind::ReduceScatterV(_) => self.counts.clone(),
            _ => vec![self.count; n],
        }
    }

    fn describe(&self) -> String {
        let mut d = match self.dtype {
            Some(d) => format!("{} of {} x {}", self.kind.describe(), self.count, d.name()),
            None => self.kind.describe(),
        };
        match self.kind {
            Kind::AllGatherV | Kind::ReduceScatterV(_) => {
                d += &format!(" with counts {:?}", self.counts);
            }
            Kind::AllReduceCoalesced(_) => d += &format!(" as {:?}", self.coalesced_lens()),
            _ => {}
        }
        d
    }
}

/// A collective being matched: the parts filed so far and how far the ranks got.
struct Slot {
    parts: Vec<Option<Arc<Part>>>,
    arrived: usize,
    done: usize,
    left: usize,
    error: Option<Error>,
    /// The local rank whose arrival completed the slot (it runs the step across processes).
    leader: Option<usize>,
    /// The leader's outcome, in a communicator spanning processes.
    outcome: Option<Result<()>>,
}

/// A point-to-point message copied aside by its sender.
pub(super) struct Message {
    pub(super) dtype: DType,
    pub(super) count: usize,
    pub(super) bytes: Vec<u8>,
}

pub(super) struct State {
    aborted: Option<String>,
    slots: HashMap<u64, Slot>,
    /// Messages between local ranks, from `.0` to `.1`, oldest first.
    mail: HashMap<(usize, usize), VecDeque<Message>>,
    /// Spanning processes: the number of the next collective whose step may start (steps
    /// run in number order, the order every process makes them in).
    next_step: u64,
}

/// What the ranks of one communicator in this process share.
pub(super) struct Shared {
    pub(super) id: u64,
    /// The devices of this process's ranks (local rank `l` on `devices[l]`).
    pub(super) devices: Vec<Device>,
    pub(super) timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
    /// Each local rank's next collective number: taken when a direct call is issued, and by
    /// a captured collective when its graph is launched (`Stream::enqueue_bound`).
    issue: Vec<Mutex<u64>>,
    pub(super) destroyed: Vec<AtomicBool>,
    /// Whether `aborted` is set (read without the lock by the steps' polling).
    aborted_flag: AtomicBool,
    /// The processes this communicator spans, when it spans several.
    pub(super) world: Option<World>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Live communicators, so that shutdown can release their pending collectives.
static LIVE: crate::sync::StaticMutex<Vec<Weak<Shared>>> =
    crate::sync::StaticMutex::new(Vec::new());

static FORK: crate::sync::ForkGuarded<crate::sync::StaticMutex<Vec<Weak<Shared>>>> =
    crate::sync::ForkGuarded::new(|| &LIVE);

/// Around `fork()`: hold the list of live communicators (see `runtime::install_fork_handlers`).
pub(crate) fn before_fork(wait: Duration) {
    FORK.before_fork(wait);
}

/// After `fork()`: release what [`before_fork`] took (in the child also a hold of a thread
/// that vanished in the fork).
pub(crate) fn after_fork(child: bool) {
    FORK.after_fork(child);
}

/// Abort every live communicator (shutdown calls this first, so that no collective waiting
/// for a rank keeps the drain waiting until its timeout).
pub(crate) fn abort_all(why: &str) {
    let live: Vec<Arc<Shared>> = LIVE.lock().iter().filter_map(Weak::upgrade).collect();
    for s in live {
        s.abort(why);
    }
}

/// The failure a collective's op reports: named after the collective, its payload the core
/// error (the bindings raise that error's own class).
pub(super) fn failure(kind: &str, e: Error) -> KernelFailure {
    let mut f = KernelFailure::new(kind, e.to_string());
    f.payload = Some(Arc::new(e));
    f
}

/// The message of a caught panic.
pub(super) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// Ranks as a short list: `[2, 3]`, or `2..=9` for a long run.
pub(super) fn rank_list(ranks: &[usize]) -> String {
    let run = ranks.len() > 3 && ranks.windows(2).all(|w| w[1] == w[0] + 1);
    if run {
        format!("{}..={}", ranks[0], ranks[ranks.len() - 1])
    } else {
        format!("{ranks:?}")
    }
}

impl Shared {
    pub(super) fn new(devices: Vec<Device>, timeout: Duration, world: Option<World>) -> Arc<Self> {
        let n = devices.len();
        let shared = Arc::new(Shared {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            devices,
            timeout,
            state: Mutex::new(State {
                aborted: None,
                slots: HashMap::new(),
                mail: HashMap::new(),
                next_step: 0,
            }),
            cv: Condvar::new(),
            issue: (0..n).map(|_| Mutex::new(0)).collect(),
            destroyed: (0..n).map(|_| AtomicBool::new(false)).collect(),
            aborted_flag: AtomicBool::new(false),
            world,
        });
        let mut live = LIVE.lock();
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&shared));
        drop(live);
        shared
    }

    /// Ranks of this process.
    pub(super) fn local_size(&self) -> usize {
        self.devices.len()
    }

    /// Ranks of the whole communicator.
    pub(super) fn size(&self) -> usize {
        self.world.as_ref().map_or(self.local_size(), |w| w.size)
    }

    /// The global rank of local rank `local`.
    pub(super) fn global(&self, local: usize) -> usize {
        self.world.as_ref().map_or(0, |w| w.first_rank()) + local
    }

    /// The local rank of global rank `rank`, when it is in this process.
    pub(super) fn local_of(&self, rank: usize) -> Option<usize> {
        let first = self.global(0);
        (first..first + self.local_size())
            .contains(&rank)
            .then(|| rank - first)
    }

    /// The deadline of a wait that starts now (none when the timeout is beyond the clock).
    pub(super) fn deadline(&self) -> Option<Instant> {
        deadline_after(Some(self.timeout))
    }

    pub(super) fn abort(&self, why: &str) {
        let mut st = self.state.lock();
        if st.aborted.is_none() {
            st.aborted = Some(why.to_string());
        }
        self.aborted_flag.store(true, Ordering::SeqCst);
        let err = self.aborted_error(why);
        let n = self.local_size();
        for slot in st.slots.values_mut() {
            if slot.arrived < n && slot.error.is_none() {
                slot.error = Some(err.clone());
            }
        }
        self.cv.notify_all();
    }

    pub(super) fn aborted_error(&self, why: &str) -> Error {
        StreamError::Invalid(format!("Communicator#{} was aborted ({why})", self.id)).into()
    }

    /// The abort error, if the communicator was aborted.
    pub(super) fn abort_reason(&self) -> Option<Error> {
        if !self.aborted_flag.load(Ordering::SeqCst) {
            return None;
        }
        let why = self.state.lock().aborted.clone()?;
        Some(self.aborted_error(&why))
    }

    pub(super) fn is_aborted(&self) -> bool {
        self.aborted_flag.load(Ordering::SeqCst)
    }

    /// Local rank `local`'s next collective number.
    pub(super) fn take_seq(&self, local: usize) -> u64 {
        let mut next = self.issue[local].lock();
        let seq = *next;
        *next += 1;
        seq
    }

    /// Check that the filed parts agree; the error names every rank's call.
    fn check_match(&self, seq: u64, parts: &[Option<Arc<Part>>]) -> Result<()> {
        let all: Vec<(usize, &Arc<Part>)> = parts
            .iter()
            .enumerate()
            .filter_map(|(l, p)| p.as_ref().map(|p| (l, p)))
            .collect();
        let first = all[0].1;
        let same_shape = |p: &Part| match p.kind {
            Kind::AllGatherV | Kind::ReduceScatterV(_) => p.counts == first.counts,
            Kind::AllReduceCoalesced(_) => p.coalesced_lens() == first.coalesced_lens(),
            _ => true,
        };
        let agree = all.iter().all(|(_, p)| {
            p.kind.agreed() == first.kind.agreed()
                && p.dtype == first.dtype
                && p.count == first.count
                && same_shape(p)
        });
        if !agree {
            let calls: Vec<String> = all
                .iter()
                .map(|(l, p)| format!("rank {}: {}", self.global(*l), p.describe()))
                .collect();
            return Err(arg_error(
                format!("collective #{seq} of Communicator#{}", self.id),
                format!(
                    "the ranks issued different collectives ({})",
                    calls.join("; ")
                ),
            ));
        }
        if first.kind == Kind::AllToAllV {
            // What rank a sends to rank b is what b receives from a (for the ranks here;
            // across processes the step checks the rest).
            for &(l, p) in &all {
                for &(m, q) in &all {
                    let (a, b) = (self.global(l), self.global(m));
                    if p.counts[b] != q.recv_counts[a] {
                        return Err(arg_error(
                            format!("collective #{seq} of Communicator#{}", self.id),
                            format!(
                                "all_to_allv counts disagree: rank {a} sends {} elements to rank {b}, which expects {} from it",
                                p.counts[b], q.recv_counts[a]
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Run local rank `local`'s side of collective `seq`: file `part`, wait for every local
    /// rank, then do this rank's share (in-process) or run or await the step across
    /// processes (spanning processes).
    pub(super) fn run(&self, local: usize, seq: u64, part: Arc<Part>) -> Result<()> {
        let n = self.local_size();
        let deadline = self.deadline();
        let mut st = self.state.lock();
        if let Some(why) = st.aborted.clone() {
            return Err(self.aborted_error(&why));
        }
        let slot = st.slots.entry(seq).or_insert_with(|| Slot {
            parts: vec![None; n],
            arrived: 0,
            done: 0,
            left: 0,
            error: None,
            leader: None,
            outcome: None,
        });
        slot.parts[local] = Some(part);
        slot.arrived += 1;
        if slot.arrived == n {
            slot.leader = Some(local);
            if slot.error.is_none() {
                if let Err(e) = self.check_match(seq, &slot.parts) {
                    slot.error = Some(e);
                }
            }
        }
        self.cv.notify_all();
        // Wait for every local rank. The error is decided under the lock before "all
        // arrived" can be seen, so either every rank works or every rank fails.
        let (parts, leader) = loop {
            let slot = st
                .slots
                .get_mut(&seq)
                .expect("slot stays until every rank left");
            if let Some(e) = slot.error.clone() {
                slot.parts[local] = None;
                self.leave(&mut st, seq);
                drop(st);
                if self.world.is_some() {
                    // The peer processes cannot match this collective any more.
                    self.abort(&format!("collective #{seq} failed: {e}"));
                }
                return Err(e);
            }
            if slot.arrived == n {
                break (slot.parts.clone(), slot.leader == Some(local));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let missing: Vec<usize> = (0..n)
                    .filter(|&q| slot.parts[q].is_none())
                    .map(|q| self.global(q))
                    .collect();
                let whose = match &self.world {
                    Some(w) => format!(", process {} of {}", w.process, w.counts.len()),
                    None => String::new(),
                };
                let err: Error = StreamError::Timeout {
                    what: format!(
                        "{} #{seq} of Communicator#{} (rank {} of {}{whose}, waiting for ranks {} of this process)",
                        slot.parts[local].as_ref().map_or("collective", |p| p.kind.name()),
                        self.id,
                        self.global(local),
                        self.size(),
                        rank_list(&missing),
                    ),
                    timeout_ms: self.timeout.as_secs_f64() * 1e3,
                }
                .into();
                slot.error = Some(err);
                self.cv.notify_all();
                continue;
            }
            match deadline {
                Some(d) => {
                    self.cv.wait_until(&mut st, d);
                }
                None => self.cv.wait(&mut st),
            }
        };
        drop(st);
        let parts: Vec<Arc<Part>> = parts.into_iter().flatten().collect();
        match &self.world {
            None => self.run_shares(local, seq, parts, leader),
            Some(w) => self.run_step(w, seq, parts, leader, deadline),
        }
    }

    /// In-process: this rank's share of the data movement (the leader's, for a split: the
    /// new communicators), then wait for every share.
    fn run_shares(
        &self,
        local: usize,
        seq: u64,
        parts: Vec<Arc<Part>>,
        leader: bool,
    ) -> Result<()> {
        let n = self.local_size();
        let share = reduce::Share {
            kind: parts[0].kind,
            rank: local,
            size: n,
            parts: &parts,
        };
        let worked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if parts[0].kind == Kind::Split {
                if leader {
                    super::split::split_here(self, &parts);
                }
            } else if let Some(dtype) = parts[0].dtype {
                reduce::run(dtype, &share);
            }
        }));
        drop(parts);
        let mut st = self.state.lock();
        let slot = st
            .slots
            .get_mut(&seq)
            .expect("slot stays until every rank left");
        slot.done += 1;
        if slot.done == n {
            slot.parts.iter_mut().for_each(|p| *p = None);
            self.cv.notify_all();
        }
        // Every rank arrived, so every rank finishes its share: this wait ends.
        while st.slots.get(&seq).is_some_and(|s| s.done < n) {
            self.cv.wait(&mut st);
        }
        self.leave(&mut st, seq);
        drop(st);
        worked.map_err(|p| {
            StreamError::Invalid(format!(
                "collective #{seq} failed on rank {}: {}",
                self.global(local),
                panic_message(p.as_ref())
            ))
            .into()
        })
    }

    /// Spanning processes: the leader runs the step (in number order), the others wait for
    /// its outcome. The leader's step is bounded by the deadline (its waits for the peer
    /// processes poll it), so the others' wait needs none.
    fn run_step(
        &self,
        w: &World,
        seq: u64,
        parts: Vec<Arc<Part>>,
        leader: bool,
        deadline: Option<Instant>,
    ) -> Result<()> {
        if leader {
            let outcome = self.lead_step(w, seq, &parts, deadline);
            drop(parts);
            if let Err(e) = &outcome {
                self.abort(&format!("collective #{seq} failed: {e}"));
            }
            let mut st = self.state.lock();
            if let Some(slot) = st.slots.get_mut(&seq) {
                slot.parts.iter_mut().for_each(|p| *p = None);
                slot.outcome = Some(outcome.clone());
            }
            self.cv.notify_all();
            self.leave(&mut st, seq);
            return outcome;
        }
        drop(parts);
        let mut st = self.state.lock();
        let outcome = loop {
            match st.slots.get(&seq).and_then(|s| s.outcome.clone()) {
                Some(o) => break o,
                None => self.cv.wait(&mut st),
            }
        };
        self.leave(&mut st, seq);
        outcome
    }

    /// The leader's step: wait for the previous number's step, run this one (panics caught),
    /// let the next one start.
    fn lead_step(
        &self,
        w: &World,
        seq: u64,
        parts: &[Arc<Part>],
        deadline: Option<Instant>,
    ) -> Result<()> {
        {
            let mut st = self.state.lock();
            while st.next_step != seq {
                if let Some(why) = st.aborted.clone() {
                    return Err(self.aborted_error(&why));
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(StreamError::Timeout {
                        what: format!(
                            "{} #{seq} of Communicator#{} waiting for collective #{} of process {} to finish first",
                            parts[0].kind.name(),
                            self.id,
                            st.next_step,
                            w.process
                        ),
                        timeout_ms: self.timeout.as_secs_f64() * 1e3,
                    }
                    .into());
                }
                match deadline {
                    Some(d) => {
                        self.cv.wait_until(&mut st, d);
                    }
                    None => self.cv.wait(&mut st),
                }
            }
        }
        let what = format!(
            "{} #{seq} of Communicator#{}",
            parts[0].kind.describe(),
            self.id
        );
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            w.collective(self, &what, parts, deadline)
        }))
        .unwrap_or_else(|p| {
            Err(StreamError::Invalid(format!(
                "{what} failed in process {}: {}",
                w.process,
                panic_message(p.as_ref())
            ))
            .into())
        });
        let mut st = self.state.lock();
        st.next_step = seq + 1;
        self.cv.notify_all();
        outcome
    }

    /// A rank is done with collective `seq`; the last one removes it.
    fn leave(&self, st: &mut State, seq: u64) {
        let n = self.local_size();
        if let Some(slot) = st.slots.get_mut(&seq) {
            slot.left += 1;
            if slot.left == n {
                st.slots.remove(&seq);
            }
        }
    }

    pub(super) fn post(&self, from: usize, to: usize, msg: Message) -> Result<()> {
        let mut st = self.state.lock();
        if let Some(why) = st.aborted.clone() {
            return Err(self.aborted_error(&why));
        }
        st.mail.entry((from, to)).or_default().push_back(msg);
        self.cv.notify_all();
        Ok(())
    }

    pub(super) fn take(&self, from: usize, to: usize) -> Result<Message> {
        let deadline = self.deadline();
        let mut st = self.state.lock();
        loop {
            if let Some(why) = st.aborted.clone() {
                return Err(self.aborted_error(&why));
            }
            if let Some(m) = st.mail.get_mut(&(from, to)).and_then(VecDeque::pop_front) {
                return Ok(m);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(StreamError::Timeout {
                    what: format!(
                        "recv on rank {} of Communicator#{} from rank {}",
                        self.global(to),
                        self.id,
                        self.global(from)
                    ),
                    timeout_ms: self.timeout.as_secs_f64() * 1e3,
                }
                .into());
            }
            match deadline {
                Some(d) => {
                    self.cv.wait_until(&mut st, d);
                }
                None => self.cv.wait(&mut st),
            }
        }
    }
}
