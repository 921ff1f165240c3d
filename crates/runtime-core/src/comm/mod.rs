//! Collectives: stream-ordered communication between the devices of this process, in the
//! mould of NCCL's single-process `ncclCommInitAll`.
//!
//! [`init_all`] makes one [`Communicator`] per device (rank `i` on `devices[i]`). A collective
//! called on rank `r` is queued on a stream of rank `r`'s device and returns at once; it runs
//! when that stream reaches it, and completes on every rank once all ranks' streams have
//! reached it, so one thread may issue every rank's calls in turn. Collectives of one
//! communicator are matched across ranks by issue order (each rank numbers its calls); the
//! ranks must agree on the collective, its dtype, its count, its operator and its root.
//!
//! How a collective runs: the op on rank `r`'s stream files its part (tensors, count, dtype)
//! under the collective's number and waits, on its engine thread, until every rank has filed
//! its part; the last to arrive checks that the parts agree. Then every rank does its share
//! of the data movement (see `reduce`: disjoint element ranges, every input read once, every
//! output written once) and waits for the others to finish, so that no rank's stream moves on
//! while a peer still reads or writes its buffers. Every rank's device has its own engine
//! threads (the devices of a communicator are distinct), so a waiting rank never holds up a
//! peer. The first wait is bounded: a rank that does not arrive within the communicator's
//! timeout fails the collective on every rank with `Timeout`; [`Communicator::abort`]
//! releases every waiting collective with an error; ranks that disagree fail it on every rank
//! with an argument error. The second wait needs no bound: once all ranks arrived, each one
//! finishes its share (panics are caught).
//!
//! Point-to-point `send`/`recv` are matched per (sender, receiver) pair in the order they run.
//! A send never waits: it copies its data aside and completes (an eager protocol), so two
//! ranks may each send before they receive without deadlocking; a receive waits (bounded by
//! the timeout) for the matching send. A count or dtype mismatch fails the receive.
//!
//! Graph capture: a collective captured into a graph takes its number when the graph's replay
//! reaches it rather than when it was issued, so each replay is a new collective; capture the
//! same sequence on every rank and launch the graphs in the same order as other collectives.
//!
//! A rank whose stream holds an unreported error skips its collective, as it skips every op
//! until the error is reported; the other ranks then fail with `Timeout`.
//!
//! Failures travel as the stream's error (a [`KernelFailure`] named after the collective whose
//! payload is the core [`Error`] — `Timeout`, an argument error or `Invalid` for an abort), so
//! a stream `synchronize` raises them.

mod reduce;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::device::Device;
use crate::error::{arg_error, DeviceError, Error, KernelFailure, Result, StreamError};
use crate::kernel::{DType, Tensor};
use crate::memory::access::{Access, AccessSet};
use crate::stream::{FnOp, OpKind, Stream};

/// Reduction operators (NCCL's `ncclRedOp_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (integers wrap on overflow).
    Sum,
    /// Product (integers wrap on overflow).
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Sum divided by the number of ranks (integer division for integers).
    Avg,
}

impl ReduceOp {
    /// Parse `"sum"`, `"prod"`, `"max"`, `"min"` or `"avg"`.
    ///
    /// # Errors
    /// An argument error naming `op` and the valid names.
    pub fn parse(s: &str) -> Result<ReduceOp> {
        Ok(match s {
            "sum" => ReduceOp::Sum,
            "prod" => ReduceOp::Prod,
            "max" => ReduceOp::Max,
            "min" => ReduceOp::Min,
            "avg" => ReduceOp::Avg,
            _ => {
                return Err(arg_error(
                    "op",
                    format!("unknown reduction {s:?}; valid: sum, prod, max, min, avg"),
                ))
            }
        })
    }

    /// Refuse an operator the dtype has no meaning for: `max`/`min` of complex numbers
    /// (unordered) and `avg` of booleans (numpy's mean of booleans is a float). On bool,
    /// `sum`/`max` are logical or and `prod`/`min` logical and, as numpy's `add`/`multiply`.
    ///
    /// # Errors
    /// An argument error naming `op` and the dtype.
    pub fn check_dtype(self, dtype: DType) -> Result<()> {
        let refused = match self {
            ReduceOp::Max | ReduceOp::Min => dtype.is_complex(),
            ReduceOp::Avg => dtype.is_bool(),
            ReduceOp::Sum | ReduceOp::Prod => false,
        };
        if refused {
            return Err(arg_error(
                "op",
                format!("{} is not defined for dtype {}", self.name(), dtype.name()),
            ));
        }
        Ok(())
    }

    /// The operator's name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
        }
    }
}

/// Which collective, with the parameters the ranks must agree on besides dtype and count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce(ReduceOp),
    Broadcast(usize),
    Reduce(ReduceOp, usize),
    AllGather,
    ReduceScatter(ReduceOp),
    AllToAll,
    Barrier,
}

impl Kind {
    /// The same collective over booleans stored as bytes of 0 or 1: `sum` (or) becomes
    /// `max`, `prod` (and) becomes `min`; `max`/`min` stay.
    pub(crate) fn bool_as_bytes(self) -> Kind {
        let map = |op| match op {
            ReduceOp::Sum => ReduceOp::Max,
            ReduceOp::Prod => ReduceOp::Min,
            other => other,
        };
        match self {
            Kind::AllReduce(op) => Kind::AllReduce(map(op)),
            Kind::Reduce(op, root) => Kind::Reduce(map(op), root),
            Kind::ReduceScatter(op) => Kind::ReduceScatter(map(op)),
            other => other,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce(_) => "all_reduce",
            Kind::Broadcast(_) => "broadcast",
            Kind::Reduce(..) => "reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter(_) => "reduce_scatter",
            Kind::AllToAll => "all_to_all",
            Kind::Barrier => "barrier",
        }
    }

    fn describe(self) -> String {
        match self {
            Kind::AllReduce(op) | Kind::ReduceScatter(op) => {
                format!("{}(op={})", self.name(), op.name())
            }
            Kind::Broadcast(root) => format!("broadcast(root={root})"),
            Kind::Reduce(op, root) => format!("reduce(op={}, root={root})", op.name()),
            _ => format!("{}()", self.name()),
        }
    }
}

/// One rank's part of a collective.
struct Part {
    kind: Kind,
    dtype: Option<DType>,
    /// The count the ranks must agree on (NCCL's `count` argument of the call).
    count: usize,
    send: Option<Tensor>,
    recv: Option<Tensor>,
}

impl Part {
    /// The device memory this rank's part touches: its send tensor read, its recv written
    /// (one allocation in place: written). Other ranks reach these buffers only while this
    /// rank's op runs inside the collective, holding them.
    fn accesses(&self) -> AccessSet {
        let send = self.send.iter().map(|t| (t.buffer(), Access::Read));
        let recv = self.recv.iter().map(|t| (t.buffer(), Access::Write));
        AccessSet::new(send.chain(recv))
    }

    fn describe(&self) -> String {
        match self.dtype {
            Some(d) => format!("{} of {} x {}", self.kind.describe(), self.count, d.name()),
            None => self.kind.describe(),
        }
    }
}

/// A collective being matched: the parts filed so far and how far the ranks got.
struct Slot {
    parts: Vec<Option<Arc<Part>>>,
    arrived: usize,
    done: usize,
    left: usize,
    error: Option<Error>,
}

/// A point-to-point message copied aside by its sender.
struct Message {
    dtype: DType,
    count: usize,
    bytes: Vec<u8>,
}

struct State {
    aborted: Option<String>,
    slots: HashMap<u64, Slot>,
    /// Messages from `.0` to `.1`, oldest first.
    mail: HashMap<(usize, usize), VecDeque<Message>>,
}

struct Shared {
    id: u64,
    devices: Vec<Device>,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
    /// Each rank's next collective number; also taken by captured collectives when they run.
    issue: Vec<Mutex<u64>>,
    destroyed: Vec<AtomicBool>,
}

/// A collective's number, or [`RUN_TIME`]: take one when it runs (captured into a graph).
const RUN_TIME: u64 = u64::MAX;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Live communicators, so that shutdown can release their pending collectives.
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

static FORK: crate::sync::ForkGuarded<Mutex<Vec<Weak<Shared>>>> =
    crate::sync::ForkGuarded::new(|| &LIVE);

/// Around `fork()`: hold the list of live communicators (see `runtime::install_fork_handlers`).
pub(crate) fn before_fork(wait: std::time::Duration) {
    FORK.before_fork(wait);
}

/// After `fork()`: release what [`before_fork`] took (in the child also a hold of a thread
/// that vanished in the fork).
pub(crate) fn after_fork(child: bool) {
    FORK.after_fork(child);
}

/// One rank of a communicator. Cheap to clone; clones are the same rank.
#[derive(Clone)]
pub struct Communicator {
    shared: Arc<Shared>,
    rank: usize,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Communicator#{}(rank {} of {}, device {})",
            self.shared.id,
            self.rank,
            self.size(),
            self.device().index()
        )
    }
}

/// One communicator per device of `devices`, rank `i` on `devices[i]` (NCCL's
/// `ncclCommInitAll`). A collective waits at most `timeout` for the other ranks.
///
/// # Errors
/// An argument error when `devices` is empty, names a device twice, or `timeout` is zero;
/// `InvalidHandle` for a device of a runtime that was shut down.
pub fn init_all(devices: &[Device], timeout: Duration) -> Result<Vec<Communicator>> {
    if devices.is_empty() {
        return Err(arg_error("devices", "needs at least one device"));
    }
    if timeout.is_zero() {
        return Err(arg_error("timeout", "must be positive"));
    }
    for (i, d) in devices.iter().enumerate() {
        d.check_alive()?;
        if let Some(j) = devices[..i].iter().position(|e| e.index() == d.index()) {
            return Err(arg_error(
                "devices",
                format!(
                    "device {} appears twice (positions {j} and {i}); each rank needs its own device",
                    d.index()
                ),
            ));
        }
    }
    let n = devices.len();
    let shared = Arc::new(Shared {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        devices: devices.to_vec(),
        timeout,
        state: Mutex::new(State {
            aborted: None,
            slots: HashMap::new(),
            mail: HashMap::new(),
        }),
        cv: Condvar::new(),
        issue: (0..n).map(|_| Mutex::new(0)).collect(),
        destroyed: (0..n).map(|_| AtomicBool::new(false)).collect(),
    });
    {
        let mut live = LIVE.lock();
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&shared));
    }
    Ok((0..n)
        .map(|rank| Communicator {
            shared: shared.clone(),
            rank,
        })
        .collect())
}

/// Abort every live communicator (shutdown calls this first, so that no collective waiting
/// for a rank keeps the drain waiting until its timeout).
pub(crate) fn abort_all(why: &str) {
    let live: Vec<Arc<Shared>> = LIVE.lock().iter().filter_map(Weak::upgrade).collect();
    for s in live {
        s.abort(why);
    }
}

fn failure(kind: &str, e: Error) -> KernelFailure {
    let mut f = KernelFailure::new(kind, e.to_string());
    f.payload = Some(Arc::new(e));
    f
}

/// `(buffer id, device, first byte, end byte)` of a tensor.
fn extent(t: &Tensor) -> (u64, usize, u64, u64) {
    let b = t.buffer();
    (b.id(), b.device(), t.offset(), t.offset() + t.nbytes())
}

fn overlaps(a: &Tensor, b: &Tensor) -> bool {
    let (ia, da, sa, ea) = extent(a);
    let (ib, db, sb, eb) = extent(b);
    ia == ib && da == db && sa < eb && sb < ea
}

/// Whether `t` is exactly elements `[start, start + t.len())` of `whole`.
fn is_block_of(t: &Tensor, whole: &Tensor, start: usize) -> bool {
    let (it, dt, st, _) = extent(t);
    let (iw, dw, sw, _) = extent(whole);
    it == iw && dt == dw && st == sw + (start * whole.dtype().size()) as u64
}

impl Shared {
    fn size(&self) -> usize {
        self.devices.len()
    }

    fn abort(&self, why: &str) {
        let mut st = self.state.lock();
        if st.aborted.is_none() {
            st.aborted = Some(why.to_string());
        }
        let err = self.aborted_error(why);
        for slot in st.slots.values_mut() {
            if slot.arrived < self.size() && slot.error.is_none() {
                slot.error = Some(err.clone());
            }
        }
        self.cv.notify_all();
    }

    fn aborted_error(&self, why: &str) -> Error {
        StreamError::Invalid(format!("Communicator#{} was aborted ({why})", self.id)).into()
    }

    /// A rank's next collective number.
    fn take_seq(&self, rank: usize) -> u64 {
        let mut next = self.issue[rank].lock();
        let seq = *next;
        *next += 1;
        seq
    }

    /// Check that the filed parts agree; the error names every rank's call.
    fn check_match(&self, seq: u64, parts: &[Option<Arc<Part>>]) -> Result<()> {
        let all: Vec<&Arc<Part>> = parts.iter().flatten().collect();
        let first = all[0];
        let agree = all
            .iter()
            .all(|p| p.kind == first.kind && p.dtype == first.dtype && p.count == first.count);
        if agree {
            return Ok(());
        }
        let calls: Vec<String> = all
            .iter()
            .enumerate()
            .map(|(r, p)| format!("rank {r}: {}", p.describe()))
            .collect();
        Err(arg_error(
            format!("collective #{seq} of Communicator#{}", self.id),
            format!(
                "the ranks issued different collectives ({})",
                calls.join("; ")
            ),
        ))
    }

    /// Run rank `rank`'s side of collective `seq`: file `part`, wait for every rank, do this
    /// rank's share, wait until every rank has done its share.
    fn run(&self, rank: usize, seq: u64, part: Arc<Part>) -> Result<()> {
        let n = self.size();
        let deadline = Instant::now() + self.timeout;
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
        });
        slot.parts[rank] = Some(part);
        slot.arrived += 1;
        if slot.arrived == n && slot.error.is_none() {
            if let Err(e) = self.check_match(seq, &slot.parts) {
                slot.error = Some(e);
            }
        }
        self.cv.notify_all();
        // Wait for every rank. The error is decided under the lock before "all arrived" can
        // be seen, so either every rank works or every rank fails.
        let parts = loop {
            let slot = st
                .slots
                .get_mut(&seq)
                .expect("slot stays until every rank left");
            if let Some(e) = slot.error.clone() {
                slot.parts[rank] = None;
                self.leave(&mut st, seq);
                return Err(e);
            }
            if slot.arrived == n {
                break slot.parts.clone();
            }
            if Instant::now() >= deadline {
                let missing: Vec<usize> = (0..n).filter(|&q| slot.parts[q].is_none()).collect();
                let err: Error = StreamError::Timeout {
                    what: format!(
                        "{} #{seq} of Communicator#{} (rank {rank} of {n}, waiting for ranks {missing:?})",
                        slot.parts[rank].as_ref().map_or("collective", |p| p.kind.name()),
                        self.id
                    ),
                    timeout_ms: self.timeout.as_secs_f64() * 1e3,
                }
                .into();
                slot.error = Some(err);
                self.cv.notify_all();
                continue;
            }
            self.cv.wait_until(&mut st, deadline);
        };
        drop(st);
        let parts: Vec<Arc<Part>> = parts.into_iter().flatten().collect();
        let sends: Vec<Option<Tensor>> = parts.iter().map(|p| p.send.clone()).collect();
        let recvs: Vec<Option<Tensor>> = parts.iter().map(|p| p.recv.clone()).collect();
        let share = reduce::Share {
            kind: parts[0].kind,
            rank,
            size: n,
            sends: &sends,
            recvs: &recvs,
        };
        let worked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if let Some(dtype) = parts[0].dtype {
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
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            StreamError::Invalid(format!("collective #{seq} failed on rank {rank}: {msg}")).into()
        })
    }

    /// A rank is done with collective `seq`; the last one removes it.
    fn leave(&self, st: &mut State, seq: u64) {
        let n = self.size();
        if let Some(slot) = st.slots.get_mut(&seq) {
            slot.left += 1;
            if slot.left == n {
                st.slots.remove(&seq);
            }
        }
    }

    fn post(&self, from: usize, to: usize, msg: Message) -> Result<()> {
        let mut st = self.state.lock();
        if let Some(why) = st.aborted.clone() {
            return Err(self.aborted_error(&why));
        }
        st.mail.entry((from, to)).or_default().push_back(msg);
        self.cv.notify_all();
        Ok(())
    }

    fn take(&self, from: usize, to: usize) -> Result<Message> {
        let deadline = Instant::now() + self.timeout;
        let mut st = self.state.lock();
        loop {
            if let Some(why) = st.aborted.clone() {
                return Err(self.aborted_error(&why));
            }
            if let Some(m) = st.mail.get_mut(&(from, to)).and_then(VecDeque::pop_front) {
                return Ok(m);
            }
            if Instant::now() >= deadline {
                return Err(StreamError::Timeout {
                    what: format!(
                        "recv on rank {to} of Communicator#{} from rank {from}",
                        self.id
                    ),
                    timeout_ms: self.timeout.as_secs_f64() * 1e3,
                }
                .into());
            }
            self.cv.wait_until(&mut st, deadline);
        }
    }
}

impl Communicator {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.shared.size()
    }

    /// This rank's device.
    pub fn device(&self) -> &Device {
        &self.shared.devices[self.rank]
    }

    /// The communicator's timeout.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Whether [`Communicator::abort`] was called on any rank (or the runtime shut down).
    pub fn is_aborted(&self) -> bool {
        self.shared.state.lock().aborted.is_some()
    }

    /// Release every pending collective and receive of the communicator (all ranks) with an
    /// error; later calls fail. Collectives whose ranks have all arrived finish normally.
    pub fn abort(&self) {
        self.shared.abort(&format!("abort() on rank {}", self.rank));
    }

    /// Retire this rank's handle: later calls on it fail with `InvalidHandle`. Collectives
    /// already queued still run.
    pub fn destroy(&self) {
        self.shared.destroyed[self.rank].store(true, Ordering::SeqCst);
    }

    fn check(&self) -> Result<()> {
        if self.shared.destroyed[self.rank].load(Ordering::SeqCst) {
            return Err(DeviceError::InvalidHandle {
                what: format!("{self:?}"),
                why: "it was destroyed".into(),
            }
            .into());
        }
        if let Some(why) = self.shared.state.lock().aborted.clone() {
            return Err(self.shared.aborted_error(&why));
        }
        self.device().check_alive()
    }

    fn check_stream(&self, stream: &Stream) -> Result<()> {
        stream.check()?;
        if stream.device_index() != self.device().index() {
            return Err(arg_error(
                "stream",
                format!(
                    "{stream:?} is on device {}, but rank {} of this communicator is on device {}",
                    stream.device_index(),
                    self.rank,
                    self.device().index()
                ),
            ));
        }
        Ok(())
    }

    fn check_tensor(&self, arg: &str, t: &Tensor) -> Result<()> {
        t.buffer().check()?;
        if t.buffer().device() != self.device().index() {
            return Err(arg_error(
                arg,
                format!(
                    "is on device {}, but rank {} of this communicator is on device {}",
                    t.buffer().device(),
                    self.rank,
                    self.device().index()
                ),
            ));
        }
        Ok(())
    }

    fn check_pair(&self, send: &Tensor, recv: &Tensor) -> Result<()> {
        self.check_tensor("send", send)?;
        self.check_tensor("recv", recv)?;
        if send.dtype() != recv.dtype() {
            return Err(arg_error(
                "recv",
                format!(
                    "dtype {} differs from send's {}",
                    recv.dtype().name(),
                    send.dtype().name()
                ),
            ));
        }
        Ok(())
    }

    fn check_root(&self, root: usize) -> Result<()> {
        if root >= self.size() {
            return Err(arg_error(
                "root",
                format!(
                    "{root} is not a rank of this communicator (0..{})",
                    self.size()
                ),
            ));
        }
        Ok(())
    }

    /// Queue this rank's part of a collective on `stream`, numbered in issue order.
    fn issue(&self, stream: &Stream, part: Part) -> Result<()> {
        self.check()?;
        self.check_stream(stream)?;
        let name = part.kind.name();
        let uses = part.accesses();
        let part = Arc::new(part);
        let shared = self.shared.clone();
        let rank = self.rank;
        let mut next = self.shared.issue[rank].lock();
        let seq = Arc::new(AtomicU64::new(*next));
        let cell = seq.clone();
        let op = FnOp::with_accesses(name, OpKind::Compute, uses, move || {
            let seq = match cell.load(Ordering::SeqCst) {
                RUN_TIME => shared.take_seq(rank),
                k => k,
            };
            shared
                .run(rank, seq, part.clone())
                .map_err(|e| failure(name, e))
        });
        if stream.enqueue(op)? {
            *next += 1;
        } else {
            // Captured: each replay takes its number when it runs.
            seq.store(RUN_TIME, Ordering::SeqCst);
        }
        Ok(())
    }

    /// `recv[i] = op(send_0[i], ..., send_{n-1}[i])` on every rank (`ncclAllReduce`). `send`
    /// and `recv` have the same dtype and length, and are the same elements (in place) or
    /// disjoint.
    ///
    /// # Errors
    /// Argument errors (dtype, length, overlap, device) at once, changing nothing; the
    /// collective's own failures through `stream`.
    pub fn all_reduce(
        &self,
        send: &Tensor,
        recv: &Tensor,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        op.check_dtype(send.dtype())?;
        self.check_pair(send, recv)?;
        self.same_len("recv", recv, send.len())?;
        self.in_place_or_disjoint(send, recv, 0)?;
        self.issue(
            stream,
            Part {
                kind: Kind::AllReduce(op),
                dtype: Some(send.dtype()),
                count: send.len(),
                send: Some(send.clone()),
                recv: Some(recv.clone()),
            },
        )
    }

    /// Copy root's `buf` into every other rank's `buf` (`ncclBroadcast` in place).
    ///
    /// # Errors
    /// As for [`Communicator::all_reduce`]; `root` out of range.
    pub fn broadcast(&self, buf: &Tensor, root: usize, stream: &Stream) -> Result<()> {
        self.check_tensor("buf", buf)?;
        self.check_root(root)?;
        self.issue(
            stream,
            Part {
                kind: Kind::Broadcast(root),
                dtype: Some(buf.dtype()),
                count: buf.len(),
                send: None,
                recv: Some(buf.clone()),
            },
        )
    }

    /// `recv = op(send_0, ..., send_{n-1})` on rank `root` only (`ncclReduce`); `recv` is
    /// needed on the root and ignored elsewhere.
    ///
    /// # Errors
    /// As for [`Communicator::all_reduce`]; `root` out of range; no `recv` on the root.
    pub fn reduce(
        &self,
        send: &Tensor,
        recv: Option<&Tensor>,
        root: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.check_tensor("send", send)?;
        op.check_dtype(send.dtype())?;
        self.check_root(root)?;
        let recv = if self.rank == root {
            let recv = recv.ok_or_else(|| {
                arg_error(
                    "recv",
                    format!("is needed on the root (rank {root}) to hold the result"),
                )
            })?;
            self.check_pair(send, recv)?;
            self.same_len("recv", recv, send.len())?;
            self.in_place_or_disjoint(send, recv, 0)?;
            Some(recv.clone())
        } else {
            None
        };
        self.issue(
            stream,
            Part {
                kind: Kind::Reduce(op, root),
                dtype: Some(send.dtype()),
                count: send.len(),
                send: Some(send.clone()),
                recv,
            },
        )
    }

    /// `recv = concat(send_0, ..., send_{n-1})` on every rank (`ncclAllGather`): `recv` holds
    /// `size × send.len()` elements; `send` may be block `rank` of `recv` (in place).
    ///
    /// # Errors
    /// As for [`Communicator::all_reduce`].
    pub fn all_gather(&self, send: &Tensor, recv: &Tensor, stream: &Stream) -> Result<()> {
        self.check_pair(send, recv)?;
        self.same_len("recv", recv, send.len() * self.size())?;
        self.in_place_or_disjoint(send, recv, self.rank * send.len())?;
        self.issue(
            stream,
            Part {
                kind: Kind::AllGather,
                dtype: Some(send.dtype()),
                count: send.len(),
                send: Some(send.clone()),
                recv: Some(recv.clone()),
            },
        )
    }

    /// `recv = block rank of op(send_0, ..., send_{n-1})` (`ncclReduceScatter`): `send` holds
    /// `size × recv.len()` elements; `recv` may be block `rank` of `send` (in place).
    ///
    /// # Errors
    /// As for [`Communicator::all_reduce`].
    pub fn reduce_scatter(
        &self,
        send: &Tensor,
        recv: &Tensor,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        op.check_dtype(send.dtype())?;
        self.check_pair(send, recv)?;
        self.same_len("send", send, recv.len() * self.size())?;
        self.in_place_or_disjoint(recv, send, self.rank * recv.len())?;
        self.issue(
            stream,
            Part {
                kind: Kind::ReduceScatter(op),
                dtype: Some(send.dtype()),
                count: recv.len(),
                send: Some(send.clone()),
                recv: Some(recv.clone()),
            },
        )
    }

    /// Block `q` of this rank's `send` goes to block `rank` of rank `q`'s `recv`
    /// (`ncclAlltoAll`). `send` and `recv` have the same length, a multiple of the rank
    /// count, and must not overlap.
    ///
    /// # Errors
    /// As for [`Communicator::all_reduce`]; a length not divisible by the rank count.
    pub fn all_to_all(&self, send: &Tensor, recv: &Tensor, stream: &Stream) -> Result<()> {
        self.check_pair(send, recv)?;
        self.same_len("recv", recv, send.len())?;
        if !send.len().is_multiple_of(self.size()) {
            return Err(arg_error(
                "send",
                format!(
                    "{} elements do not split into {} equal blocks (one per rank)",
                    send.len(),
                    self.size()
                ),
            ));
        }
        if overlaps(send, recv) {
            return Err(arg_error(
                "recv",
                "overlaps send; all_to_all cannot run in place",
            ));
        }
        self.issue(
            stream,
            Part {
                kind: Kind::AllToAll,
                dtype: Some(send.dtype()),
                count: send.len(),
                send: Some(send.clone()),
                recv: Some(recv.clone()),
            },
        )
    }

    /// Complete on every rank's stream only once every rank's stream has reached it.
    ///
    /// # Errors
    /// As for [`Communicator::all_reduce`].
    pub fn barrier(&self, stream: &Stream) -> Result<()> {
        self.issue(
            stream,
            Part {
                kind: Kind::Barrier,
                dtype: None,
                count: 0,
                send: None,
                recv: None,
            },
        )
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.size() {
            return Err(arg_error(
                "peer",
                format!(
                    "{peer} is not a rank of this communicator (0..{})",
                    self.size()
                ),
            ));
        }
        Ok(())
    }

    /// The argument checks `send` and `recv` share: a live communicator, the rank's stream,
    /// the buffer, and a peer that is a rank.
    fn check_p2p(&self, buf: &Tensor, peer: usize, stream: &Stream) -> Result<()> {
        self.check()?;
        self.check_stream(stream)?;
        self.check_tensor("buf", buf)?;
        self.check_peer(peer)
    }

    /// Send `buf` to rank `peer` (`ncclSend`); matched with `peer`'s `recv` from this rank in
    /// the order they run. Completes once the data is copied aside.
    ///
    /// # Errors
    /// As for [`Communicator::all_reduce`]; `peer` out of range.
    pub fn send(&self, buf: &Tensor, peer: usize, stream: &Stream) -> Result<()> {
        self.check_p2p(buf, peer, stream)?;
        let (shared, rank, t) = (self.shared.clone(), self.rank, buf.clone());
        let uses = buf.buffer().access(Access::Read);
        let op = FnOp::with_accesses("send", OpKind::Compute, uses, move || {
            let bytes = reduce::stage(&t).map_err(|e| failure("send", e))?;
            let msg = Message {
                dtype: t.dtype(),
                count: t.len(),
                bytes,
            };
            shared.post(rank, peer, msg).map_err(|e| failure("send", e))
        });
        stream.enqueue(op)?;
        Ok(())
    }

    /// Receive into `buf` from rank `peer` (`ncclRecv`).
    ///
    /// # Errors
    /// As for [`Communicator::send`]. Through `stream`: `Timeout` when no send arrives in
    /// time, an argument error when the send's dtype or count differ.
    pub fn recv(&self, buf: &Tensor, peer: usize, stream: &Stream) -> Result<()> {
        self.check_p2p(buf, peer, stream)?;
        let (shared, rank, t) = (self.shared.clone(), self.rank, buf.clone());
        let uses = buf.buffer().access(Access::Write);
        let op = FnOp::with_accesses("recv", OpKind::Compute, uses, move || {
            let msg = shared.take(peer, rank).map_err(|e| failure("recv", e))?;
            if msg.dtype != t.dtype() || msg.count != t.len() {
                return Err(failure(
                    "recv",
                    arg_error(
                        "buf",
                        format!(
                            "rank {rank} expects {} x {} from rank {peer}, which sent {} x {}",
                            t.len(),
                            t.dtype().name(),
                            msg.count,
                            msg.dtype.name()
                        ),
                    ),
                ));
            }
            reduce::unstage(&t, &msg.bytes).map_err(|e| failure("recv", e))
        });
        stream.enqueue(op)?;
        Ok(())
    }

    fn same_len(&self, arg: &str, t: &Tensor, want: usize) -> Result<()> {
        if t.len() != want {
            return Err(arg_error(
                arg,
                format!("has {} elements; {want} expected", t.len()),
            ));
        }
        Ok(())
    }

    /// `part` must be exactly elements `[start, ..)` of `whole` (in place) or not overlap it.
    fn in_place_or_disjoint(&self, part: &Tensor, whole: &Tensor, start: usize) -> Result<()> {
        if overlaps(part, whole) && !is_block_of(part, whole, start) {
            return Err(arg_error(
                "recv",
                format!(
                    "send and recv partly overlap; in place they must coincide (block at element {start})"
                ),
            ));
        }
        Ok(())
    }
}
