//! Collectives: stream-ordered communication between devices, in the mould of NCCL: between
//! the devices of this process ([`init_all`], NCCL's single-process `ncclCommInitAll`), or
//! between devices of several processes ([`connect`], over a [`Transport`] that moves bytes
//! between the processes: MPI through mpi4py in the Python package).
//!
//! A collective called on rank `r` is queued on a stream of rank `r`'s device and returns at
//! once; it runs when that stream reaches it, and completes on every rank once all ranks'
//! streams have reached it, so one thread may issue every rank's calls in turn. Collectives
//! of one communicator are matched across ranks by issue order: each rank numbers its calls
//! when they are issued, and a collective captured into a graph takes its number when the
//! graph is launched (each launch is a new collective), so the same program numbers the same
//! way on every rank whatever the ranks' speeds. The ranks must agree on the collective, its
//! dtype, its count, its operator and its root.
//!
//! How a collective runs (`protocol`): the op on rank `r`'s stream files its part (tensors,
//! count, dtype) under the collective's number and waits, on its engine thread, until every
//! rank of its process has filed its part; the last to arrive checks that the parts agree. In
//! a communicator of one process every rank then does its share of the data movement (see
//! `reduce`: disjoint element ranges, every input read once, every output written once) and
//! waits for the others, so that no rank's stream moves on while a peer still reads or writes
//! its buffers. In a communicator spanning processes the last local rank to arrive runs the
//! collective's step (`world`): local reduction, one exchange across processes through the
//! transport, copies to the local outputs. The first wait is bounded: a rank that does not
//! arrive within the communicator's timeout fails the collective with `Timeout`, and so does a
//! process that does not take part in an exchange; [`Communicator::abort`] releases every
//! waiting collective with an error; ranks that disagree fail it with an argument error. A
//! communicator spanning processes is aborted by any failure (its peers cannot match later
//! calls).
//!
//! Point-to-point `send`/`recv` are matched per (sender, receiver) pair in the order they run.
//! Between ranks of one process a send never waits: it copies its data aside and completes (an
//! eager protocol), so two ranks may each send before they receive without deadlocking; a
//! receive waits (bounded by the timeout) for the matching send. A rank may send to itself.
//! Between processes, send and receive are one exchange each (as NCCL, a send may wait for its
//! receive). A count or dtype mismatch fails the receive.
//!
//! A rank whose stream holds an unreported error skips its collective, as it skips every op
//! until the error is reported; the other ranks then fail with `Timeout`.
//!
//! Failures travel as the stream's error (a `KernelFailure` named after the collective whose
//! payload is the core `Error` — `Timeout`, an argument error, `Invalid` for an abort, or
//! the transport's failure), so a stream `synchronize` raises them.

mod protocol;
mod reduce;
mod split;
mod world;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::device::Device;
use crate::error::{arg_error, DeviceError, Error, Result};
use crate::kernel::{DType, Tensor};
use crate::memory::access::{Access, AccessSet};
use crate::stream::graph::LaunchBound;
use crate::stream::{FnOp, Op, OpKind, Stream};

pub(crate) use protocol::abort_all;
use protocol::{failure, Message, Part, Shared};
pub(crate) use split::fail_all_gatherings;
pub use split::{init_rank, unique_id, Forming, Forthcoming, UniqueId};
pub use world::{connect, Connecting, Exchange, Pending, Region, Transport, TransportError};

/// Around `fork()`: hold the communicators' process-wide locks (see
/// `runtime::install_fork_handlers`).
pub(crate) fn before_fork(wait: Duration) {
    protocol::before_fork(wait);
    split::before_fork(wait);
}

/// After `fork()`: release what [`before_fork`] took.
pub(crate) fn after_fork(child: bool) {
    split::after_fork(child);
    protocol::after_fork(child);
}

/// A `premul_sum` factor: compared and hashed by its bits, so that [`ReduceOp`] stays `Eq`.
#[derive(Debug, Clone, Copy)]
pub struct Factor(f64);

impl Factor {
    /// The factor `f` (any finite number; integral for integer dtypes).
    pub fn new(f: f64) -> Factor {
        Factor(f)
    }

    /// Its value.
    pub fn value(self) -> f64 {
        self.0
    }
}

impl PartialEq for Factor {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Factor {}

impl std::hash::Hash for Factor {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

/// Reduction operators (NCCL's `ncclRedOp_t`, with torch's bitwise ones).
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
    /// Bitwise and (integers; logical and of booleans): torch's `ReduceOp.BAND`.
    BAnd,
    /// Bitwise or (integers; logical or of booleans): torch's `ReduceOp.BOR`.
    BOr,
    /// Bitwise exclusive or (integers; logical xor of booleans): torch's `ReduceOp.BXOR`.
    BXor,
    /// Sum of each rank's input multiplied by that rank's factor first (NCCL's
    /// `ncclRedOpCreatePreMulSum`, torch's `_make_nccl_premul_sum`). Ranks may pass different
    /// factors; they agree on the operator only.
    PreMulSum(Factor),
}

impl ReduceOp {
    /// Parse `"sum"`, `"prod"`, `"max"`, `"min"`, `"avg"`, `"band"`, `"bor"` or `"bxor"`
    /// (`premul_sum` takes a factor: [`ReduceOp::premul_sum`]).
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
            "band" => ReduceOp::BAnd,
            "bor" => ReduceOp::BOr,
            "bxor" => ReduceOp::BXor,
            "premul_sum" => {
                return Err(arg_error(
                    "op",
                    "premul_sum needs a factor: pass (\"premul_sum\", factor)",
                ))
            }
            _ => {
                return Err(arg_error(
                    "op",
                    format!(
                        "unknown reduction {s:?}; valid: sum, prod, max, min, avg, band, bor, bxor, (\"premul_sum\", factor)"
                    ),
                ))
            }
        })
    }

    /// `premul_sum` with this rank's `factor`.
    ///
    /// # Errors
    /// An argument error naming `factor` when it is not finite.
    pub fn premul_sum(factor: f64) -> Result<ReduceOp> {
        if !factor.is_finite() {
            return Err(arg_error(
                "factor",
                format!("{factor} is not a finite number"),
            ));
        }
        Ok(ReduceOp::PreMulSum(Factor(factor)))
    }

    /// Refuse an operator the dtype has no meaning for: `max`/`min` of complex numbers
    /// (unordered), `avg` and `premul_sum` of booleans (numpy's mean of booleans is a float),
    /// the bitwise operators on floats and complex numbers, and a `premul_sum` factor that is
    /// not an integer in the dtype's range for an integer dtype. On bool, `sum`/`max` are
    /// logical or and `prod`/`min` logical and, as numpy's `add`/`multiply`.
    ///
    /// # Errors
    /// An argument error naming `op` (or `factor`) and the dtype.
    pub fn check_dtype(self, dtype: DType) -> Result<()> {
        let refused = match self {
            ReduceOp::Max | ReduceOp::Min => dtype.is_complex(),
            ReduceOp::Avg | ReduceOp::PreMulSum(_) => dtype.is_bool(),
            ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => dtype.is_inexact(),
            ReduceOp::Sum | ReduceOp::Prod => false,
        };
        if refused {
            return Err(arg_error(
                "op",
                format!("{} is not defined for dtype {}", self.name(), dtype.name()),
            ));
        }
        if let (ReduceOp::PreMulSum(f), Some((lo, hi))) = (self, dtype.int_range()) {
            let v = f.value();
            if v.fract() != 0.0 || v < lo as f64 || v > hi as f64 {
                return Err(arg_error(
                    "factor",
                    format!(
                        "{v} is not a value of dtype {} (premul_sum multiplies in the dtype)",
                        dtype.name()
                    ),
                ));
            }
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
            ReduceOp::BAnd => "band",
            ReduceOp::BOr => "bor",
            ReduceOp::BXor => "bxor",
            ReduceOp::PreMulSum(_) => "premul_sum",
        }
    }

    /// This rank's `premul_sum` factor.
    pub fn factor(self) -> Option<f64> {
        match self {
            ReduceOp::PreMulSum(f) => Some(f.value()),
            _ => None,
        }
    }

    /// The operator the ranks must agree on (a `premul_sum` factor is each rank's own).
    fn agreed(self) -> ReduceOp {
        match self {
            ReduceOp::PreMulSum(_) => ReduceOp::PreMulSum(Factor(1.0)),
            other => other,
        }
    }
}

/// Which collective, with the parameters the ranks must agree on besides dtype and count.
/// Roots are global ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce(ReduceOp),
    /// A list of buffers in one call; the lengths are in the parts.
    AllReduceCoalesced(ReduceOp),
    Broadcast(usize),
    Reduce(ReduceOp, usize),
    AllGather,
    /// Per-rank counts in the parts (the same on every rank).
    AllGatherV,
    ReduceScatter(ReduceOp),
    /// Per-rank counts in the parts (the same on every rank).
    ReduceScatterV(ReduceOp),
    AllToAll,
    /// Each rank's send and receive counts in its part.
    AllToAllV,
    Gather(usize),
    Scatter(usize),
    Barrier,
    /// `split(color, key)`: a host call numbered among the collectives.
    Split,
}

impl Kind {
    /// The same collective over booleans stored as bytes of 0 or 1: `sum` (or) becomes
    /// `max`, `prod` (and) becomes `min`; `max`/`min` and the bitwise operators stay.
    pub(crate) fn bool_as_bytes(self) -> Kind {
        let map = |op| match op {
            ReduceOp::Sum => ReduceOp::Max,
            ReduceOp::Prod => ReduceOp::Min,
            other => other,
        };
        match self {
            Kind::AllReduce(op) => Kind::AllReduce(map(op)),
            Kind::AllReduceCoalesced(op) => Kind::AllReduceCoalesced(map(op)),
            Kind::Reduce(op, root) => Kind::Reduce(map(op), root),
            Kind::ReduceScatter(op) => Kind::ReduceScatter(map(op)),
            Kind::ReduceScatterV(op) => Kind::ReduceScatterV(map(op)),
            other => other,
        }
    }

    /// The kind the ranks must agree on (each rank's `premul_sum` factor is its own).
    fn agreed(self) -> Kind {
        match self {
            Kind::AllReduce(op) => Kind::AllReduce(op.agreed()),
            Kind::AllReduceCoalesced(op) => Kind::AllReduceCoalesced(op.agreed()),
            Kind::Reduce(op, root) => Kind::Reduce(op.agreed(), root),
            Kind::ReduceScatter(op) => Kind::ReduceScatter(op.agreed()),
            Kind::ReduceScatterV(op) => Kind::ReduceScatterV(op.agreed()),
            other => other,
        }
    }

    /// The reduction operator, for the collectives that reduce.
    fn op(self) -> Option<ReduceOp> {
        match self {
            Kind::AllReduce(op)
            | Kind::AllReduceCoalesced(op)
            | Kind::Reduce(op, _)
            | Kind::ReduceScatter(op)
            | Kind::ReduceScatterV(op) => Some(op),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce(_) => "all_reduce",
            Kind::AllReduceCoalesced(_) => "all_reduce_coalesced",
            Kind::Broadcast(_) => "broadcast",
            Kind::Reduce(..) => "reduce",
            Kind::AllGather => "all_gather",
            Kind::AllGatherV => "all_gatherv",
            Kind::ReduceScatter(_) => "reduce_scatter",
            Kind::ReduceScatterV(_) => "reduce_scatterv",
            Kind::AllToAll => "all_to_all",
            Kind::AllToAllV => "all_to_allv",
            Kind::Gather(_) => "gather",
            Kind::Scatter(_) => "scatter",
            Kind::Barrier => "barrier",
            Kind::Split => "split",
        }
    }

    fn describe(self) -> String {
        match self {
            Kind::AllReduce(op)
            | Kind::AllReduceCoalesced(op)
            | Kind::ReduceScatter(op)
            | Kind::ReduceScatterV(op) => {
                format!("{}(op={})", self.name(), op.name())
            }
            Kind::Broadcast(root) | Kind::Gather(root) | Kind::Scatter(root) => {
                format!("{}(root={root})", self.name())
            }
            Kind::Reduce(op, root) => format!("reduce(op={}, root={root})", op.name()),
            _ => format!("{}()", self.name()),
        }
    }
}

/// One rank of a communicator. Cheap to clone; clones are the same rank.
#[derive(Clone)]
pub struct Communicator {
    shared: Arc<Shared>,
    /// The rank's index among this process's ranks.
    local: usize,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Communicator#{}(rank {} of {}, device {}",
            self.shared.id,
            self.rank(),
            self.size(),
            self.device().index()
        )?;
        if let Some(w) = &self.shared.world {
            write!(f, ", process {} of {}", w.process, w.counts.len())?;
        }
        write!(f, ")")
    }
}

/// The checks [`init_all`] and [`connect`] share: at least one device, each once and alive, a
/// positive timeout.
fn check_devices(devices: &[Device], timeout: Duration) -> Result<()> {
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
    Ok(())
}

/// One communicator per device of `devices`, rank `i` on `devices[i]` (NCCL's
/// `ncclCommInitAll`). A collective waits at most `timeout` for the other ranks.
///
/// # Errors
/// An argument error when `devices` is empty, names a device twice, or `timeout` is zero;
/// `InvalidHandle` for a device of a runtime that was shut down.
pub fn init_all(devices: &[Device], timeout: Duration) -> Result<Vec<Communicator>> {
    check_devices(devices, timeout)?;
    let shared = Shared::new(devices.to_vec(), timeout, None);
    Ok((0..devices.len())
        .map(|local| Communicator {
            shared: shared.clone(),
            local,
        })
        .collect())
}

/// Whether two tensors share a byte of memory (judged on the memory, whichever allocations
/// and views name it: see [`crate::memory::MemorySpan`]).
fn overlaps(a: &Tensor, b: &Tensor) -> bool {
    a.span().overlaps(&b.span())
}

/// Whether `t` is exactly the memory of elements `[start, start + t.len())` of `whole`.
fn is_block_of(t: &Tensor, whole: &Tensor, start: usize) -> bool {
    let (st, sw) = (t.span(), whole.span());
    st.file != 0
        && st.file == sw.file
        && st.start == sw.start + (start * whole.dtype().size()) as u64
}

/// A collective's op, bound to its number when queued or, captured, at each graph launch.
struct Collective {
    shared: Arc<Shared>,
    local: usize,
    part: Arc<Part>,
    uses: AccessSet,
}

impl Collective {
    fn op(&self, seq: u64) -> Arc<dyn Op> {
        let (shared, local, part) = (self.shared.clone(), self.local, self.part.clone());
        let name = part.kind.name();
        FnOp::with_accesses(name, OpKind::Compute, self.uses.clone(), move || {
            shared
                .run(local, seq, part.clone())
                .map_err(|e| failure(name, e))
        })
    }
}

impl LaunchBound for Collective {
    fn bind(&self) -> Arc<dyn Op> {
        self.op(self.shared.take_seq(self.local))
    }

    fn name(&self) -> &str {
        self.part.kind.name()
    }

    fn accesses(&self) -> &AccessSet {
        &self.uses
    }
}

impl Communicator {
    /// This rank (across every process the communicator spans).
    pub fn rank(&self) -> usize {
        self.shared.global(self.local)
    }

    /// Number of ranks (across every process).
    pub fn size(&self) -> usize {
        self.shared.size()
    }

    /// This rank's device.
    pub fn device(&self) -> &Device {
        &self.shared.devices[self.local]
    }

    /// This process's index and the number of processes the communicator spans (`(0, 1)`
    /// for a communicator of this process only).
    pub fn process(&self) -> (usize, usize) {
        self.shared
            .world
            .as_ref()
            .map_or((0, 1), |w| (w.process, w.counts.len()))
    }

    /// The communicator's timeout.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Whether [`Communicator::abort`] was called on any rank (or the runtime shut down).
    pub fn is_aborted(&self) -> bool {
        self.shared.is_aborted()
    }

    /// Release every pending collective and receive of the communicator (all ranks of this
    /// process) with an error; later calls fail. Collectives whose ranks have all arrived
    /// finish normally. Other processes are not told: their pending calls fail at their
    /// timeout (as NCCL's `ncclCommAbort`).
    pub fn abort(&self) {
        self.shared
            .abort(&format!("abort() on rank {}", self.rank()));
    }

    /// Retire this rank's handle: later calls on it fail with `InvalidHandle`. Collectives
    /// already queued still run.
    pub fn destroy(&self) {
        self.shared.destroyed[self.local].store(true, Ordering::SeqCst);
    }

    fn check(&self) -> Result<()> {
        if self.shared.destroyed[self.local].load(Ordering::SeqCst) {
            return Err(DeviceError::InvalidHandle {
                what: format!("{self:?}"),
                why: "it was destroyed".into(),
            }
            .into());
        }
        if let Some(e) = self.shared.abort_reason() {
            return Err(e);
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
                    self.rank(),
                    self.device().index()
                ),
            ));
        }
        Ok(())
    }

    fn check_tensor(&self, arg: impl std::fmt::Display, t: &Tensor) -> Result<()> {
        t.buffer().check()?;
        if t.buffer().device() != self.device().index() {
            return Err(arg_error(
                arg.to_string(),
                format!(
                    "is on device {}, but rank {} of this communicator is on device {}",
                    t.buffer().device(),
                    self.rank(),
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

    /// `rank` (argument `arg`) must be a rank of this communicator.
    fn check_rank(&self, arg: &str, rank: usize) -> Result<()> {
        let n = self.size();
        if rank >= n {
            return Err(arg_error(
                arg,
                format!(
                    "{rank} is not a rank of this communicator: its {n} ranks are 0 to {}",
                    n - 1
                ),
            ));
        }
        Ok(())
    }

    fn check_root(&self, root: usize) -> Result<()> {
        self.check_rank("root", root)
    }

    /// Queue this rank's part of a collective on `stream`. It takes its number now, or,
    /// captured, at each launch of the graph (`LaunchBound`).
    fn issue(&self, stream: &Stream, part: Part) -> Result<()> {
        self.check()?;
        self.check_stream(stream)?;
        let op = Collective {
            shared: self.shared.clone(),
            local: self.local,
            uses: part.accesses(),
            part: Arc::new(part),
        };
        stream.enqueue_bound(Arc::new(op))?;
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
            Part::new(
                Kind::AllReduce(op),
                Some(send.dtype()),
                send.len(),
                Some(send.clone()),
                Some(recv.clone()),
            ),
        )
    }

    /// `all_reduce` of a list of buffers in one collective (torch's
    /// `all_reduce_coalesced`): pair `i` is `(sends[i], recvs[i])`, each pair as for
    /// [`Communicator::all_reduce`], every pair of one dtype; the ranks agree on the number of
    /// pairs and their lengths. Buffers of different pairs must not share memory (reads of
    /// two pairs' sends excepted).
    ///
    /// # Errors
    /// As for [`Communicator::all_reduce`]; no pairs; `sends` and `recvs` of different lengths;
    /// pairs of different dtypes or sharing memory.
    pub fn all_reduce_coalesced(
        &self,
        sends: &[Tensor],
        recvs: &[Tensor],
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        if sends.is_empty() {
            return Err(arg_error("send", "needs at least one buffer"));
        }
        if sends.len() != recvs.len() {
            return Err(arg_error(
                "recv",
                format!(
                    "has {} buffers for {} send buffers",
                    recvs.len(),
                    sends.len()
                ),
            ));
        }
        let dtype = sends[0].dtype();
        op.check_dtype(dtype)?;
        for (i, (s, r)) in sends.iter().zip(recvs).enumerate() {
            self.check_tensor(format_args!("send[{i}]"), s)?;
            self.check_tensor(format_args!("recv[{i}]"), r)?;
            for (arg, t) in [("send", s), ("recv", r)] {
                if t.dtype() != dtype {
                    return Err(arg_error(
                        format!("{arg}[{i}]"),
                        format!(
                            "dtype {} differs from send[0]'s {}: one collective reduces one dtype",
                            t.dtype().name(),
                            dtype.name()
                        ),
                    ));
                }
            }
            self.same_len(format_args!("recv[{i}]"), r, s.len())?;
            self.in_place_or_disjoint(s, r, 0)?;
            for (j, (s2, r2)) in sends.iter().zip(recvs).enumerate().take(i) {
                if overlaps(r, r2) || overlaps(r, s2) || overlaps(s, r2) {
                    return Err(arg_error(
                        format!("recv[{i}]"),
                        format!("pairs {j} and {i} share memory; each pair needs its own"),
                    ));
                }
            }
        }
        let mut part = Part::new(
            Kind::AllReduceCoalesced(op),
            Some(dtype),
            sends.iter().map(Tensor::len).sum(),
            Some(sends[0].clone()),
            Some(recvs[0].clone()),
        );
        part.more = sends[1..]
            .iter()
            .cloned()
            .zip(recvs[1..].iter().cloned())
            .collect();
        self.issue(stream, part)
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
            Part::new(
                Kind::Broadcast(root),
                Some(buf.dtype()),
                buf.len(),
                None,
                Some(buf.clone()),
            ),
        )
    }

    /// Copy root's `send` into every rank's `recv`, the root's own included (`ncclBroadcast`
    /// out of place). `send` is needed on the root and ignored elsewhere; on the root it has
    /// `recv`'s dtype and length and is the same elements (in place) or disjoint.
    ///
    /// # Errors
    /// As for [`Communicator::broadcast`]; no `send` on the root.
    pub fn broadcast_from(
        &self,
        send: Option<&Tensor>,
        recv: &Tensor,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.check_tensor("recv", recv)?;
        self.check_root(root)?;
        let send = if self.rank() == root {
            let send = send.ok_or_else(|| {
                arg_error(
                    "buf",
                    format!("is needed on the root (rank {root}): it is what is broadcast"),
                )
            })?;
            self.check_pair(send, recv)?;
            self.same_len("recv", recv, send.len())?;
            self.in_place_or_disjoint(send, recv, 0)?;
            // In place is the in-place broadcast.
            (!is_block_of(send, recv, 0)).then(|| send.clone())
        } else {
            None
        };
        self.issue(
            stream,
            Part::new(
                Kind::Broadcast(root),
                Some(recv.dtype()),
                recv.len(),
                send,
                Some(recv.clone()),
            ),
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
        let recv = if self.rank() == root {
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
            Part::new(
                Kind::Reduce(op, root),
                Some(send.dtype()),
                send.len(),
                Some(send.clone()),
                recv,
            ),
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
        self.in_place_or_disjoint(send, recv, self.rank() * send.len())?;
        self.issue(
            stream,
            Part::new(
                Kind::AllGather,
                Some(send.dtype()),
                send.len(),
                Some(send.clone()),
                Some(recv.clone()),
            ),
        )
    }

    /// `counts` (one per rank, the same on every rank) and their sum, checked.
    fn check_counts(&self, arg: &str, counts: &[usize]) -> Result<usize> {
        if counts.len() != self.size() {
            return Err(arg_error(
                arg,
                format!(
                    "has {} counts; one per rank ({}) expected",
                    counts.len(),
                    self.size()
                ),
            ));
        }
        counts
            .iter()
            .try_fold(0usize, |a, &c| a.checked_add(c))
            .ok_or_else(|| arg_error(arg, "the counts overflow"))
    }

    /// `all_gather` with a count per rank (MPI's `Allgatherv`, torch's `all_gather` of
    /// uneven sizes): rank `q` contributes `counts[q]` elements, and `recv` (`sum(counts)`
    /// elements) holds the blocks back to back in rank order. `send` has `counts[rank]`
    /// elements and may be this rank's block of `recv` (in place). Every rank passes the same
    /// `counts`.
    ///
    /// # Errors
    /// As for [`Communicator::all_gather`]; `counts` of the wrong length.
    pub fn all_gatherv(
        &self,
        send: &Tensor,
        recv: &Tensor,
        counts: &[usize],
        stream: &Stream,
    ) -> Result<()> {
        let total = self.check_counts("counts", counts)?;
        self.check_pair(send, recv)?;
        self.same_len("send", send, counts[self.rank()])?;
        self.same_len("recv", recv, total)?;
        let at: usize = counts[..self.rank()].iter().sum();
        self.in_place_or_disjoint(send, recv, at)?;
        let mut part = Part::new(
            Kind::AllGatherV,
            Some(send.dtype()),
            total,
            Some(send.clone()),
            Some(recv.clone()),
        );
        part.counts = counts.to_vec();
        self.issue(stream, part)
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
        self.in_place_or_disjoint(recv, send, self.rank() * recv.len())?;
        self.issue(
            stream,
            Part::new(
                Kind::ReduceScatter(op),
                Some(send.dtype()),
                recv.len(),
                Some(send.clone()),
                Some(recv.clone()),
            ),
        )
    }

    /// `reduce_scatter` with a count per rank (MPI's `Reduce_scatter`): `send` holds
    /// `sum(counts)` elements, blocks back to back in rank order, and rank `q` gets block `q`
    /// of the reduction (`counts[q]` elements) in `recv`, which may be that block of `send`
    /// (in place). Every rank passes the same `counts`.
    ///
    /// # Errors
    /// As for [`Communicator::reduce_scatter`]; `counts` of the wrong length.
    pub fn reduce_scatterv(
        &self,
        send: &Tensor,
        recv: &Tensor,
        counts: &[usize],
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        op.check_dtype(send.dtype())?;
        let total = self.check_counts("counts", counts)?;
        self.check_pair(send, recv)?;
        self.same_len("send", send, total)?;
        self.same_len("recv", recv, counts[self.rank()])?;
        let at: usize = counts[..self.rank()].iter().sum();
        self.in_place_or_disjoint(recv, send, at)?;
        let mut part = Part::new(
            Kind::ReduceScatterV(op),
            Some(send.dtype()),
            total,
            Some(send.clone()),
            Some(recv.clone()),
        );
        part.counts = counts.to_vec();
        self.issue(stream, part)
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
            Part::new(
                Kind::AllToAll,
                Some(send.dtype()),
                send.len(),
                Some(send.clone()),
                Some(recv.clone()),
            ),
        )
    }

    /// `all_to_all` with counts per pair of ranks (MPI's `Alltoallv`; torch's
    /// `all_to_all_single` with split sizes): the first `send_counts[0]` elements of `send`
    /// go to rank 0, the next `send_counts[1]` to rank 1, and so on; `recv` holds what each
    /// rank sends here, `recv_counts[q]` elements from rank `q`, back to back in rank order.
    /// What rank `a` sends to `b` must be what `b` expects from `a` (checked across ranks:
    /// the collective fails on every rank otherwise). `send` and `recv` must not overlap.
    ///
    /// # Errors
    /// As for [`Communicator::all_to_all`]; counts of the wrong length or not summing to the
    /// buffers' lengths.
    pub fn all_to_allv(
        &self,
        send: &Tensor,
        send_counts: &[usize],
        recv: &Tensor,
        recv_counts: &[usize],
        stream: &Stream,
    ) -> Result<()> {
        let st = self.check_counts("send_counts", send_counts)?;
        let rt = self.check_counts("recv_counts", recv_counts)?;
        self.check_pair(send, recv)?;
        self.same_len("send", send, st)?;
        self.same_len("recv", recv, rt)?;
        if overlaps(send, recv) {
            return Err(arg_error(
                "recv",
                "overlaps send; all_to_allv cannot run in place",
            ));
        }
        let mut part = Part::new(
            Kind::AllToAllV,
            Some(send.dtype()),
            0,
            Some(send.clone()),
            Some(recv.clone()),
        );
        part.counts = send_counts.to_vec();
        part.recv_counts = recv_counts.to_vec();
        self.issue(stream, part)
    }

    /// Every rank's `send` to rank `root`'s `recv`, block `q` from rank `q` (`recv` holds
    /// `size × send.len()` elements; needed on the root and ignored elsewhere). On the root,
    /// `send` may be its block of `recv` (in place).
    ///
    /// # Errors
    /// As for [`Communicator::all_gather`]; `root` out of range; no `recv` on the root.
    pub fn gather(
        &self,
        send: &Tensor,
        recv: Option<&Tensor>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.check_tensor("send", send)?;
        self.check_root(root)?;
        let recv = if self.rank() == root {
            let recv = recv.ok_or_else(|| {
                arg_error(
                    "recv",
                    format!("is needed on the root (rank {root}) to hold every rank's block"),
                )
            })?;
            self.check_pair(send, recv)?;
            self.same_len("recv", recv, send.len() * self.size())?;
            self.in_place_or_disjoint(send, recv, root * send.len())?;
            Some(recv.clone())
        } else {
            None
        };
        self.issue(
            stream,
            Part::new(
                Kind::Gather(root),
                Some(send.dtype()),
                send.len(),
                Some(send.clone()),
                recv,
            ),
        )
    }

    /// Block `q` of rank `root`'s `send` (`size × recv.len()` elements; needed on the root and
    /// ignored elsewhere) to rank `q`'s `recv`. On the root, `recv` may be its block of `send`
    /// (in place).
    ///
    /// # Errors
    /// As for [`Communicator::gather`]; no `send` on the root.
    pub fn scatter(
        &self,
        send: Option<&Tensor>,
        recv: &Tensor,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.check_tensor("recv", recv)?;
        self.check_root(root)?;
        let send = if self.rank() == root {
            let send = send.ok_or_else(|| {
                arg_error(
                    "send",
                    format!("is needed on the root (rank {root}): it holds every rank's block"),
                )
            })?;
            self.check_pair(send, recv)?;
            self.same_len("send", send, recv.len() * self.size())?;
            self.in_place_or_disjoint(recv, send, root * recv.len())?;
            Some(send.clone())
        } else {
            None
        };
        self.issue(
            stream,
            Part::new(
                Kind::Scatter(root),
                Some(recv.dtype()),
                recv.len(),
                send,
                Some(recv.clone()),
            ),
        )
    }

    /// Complete on every rank's stream only once every rank's stream has reached it.
    ///
    /// # Errors
    /// As for [`Communicator::all_reduce`].
    pub fn barrier(&self, stream: &Stream) -> Result<()> {
        self.issue(stream, Part::new(Kind::Barrier, None, 0, None, None))
    }

    /// The error that made the communicator unusable, if any (NCCL's
    /// `ncclCommGetAsyncError`): an `abort()` on any rank, a shutdown, or, for a communicator
    /// spanning processes, a failed collective. `None` while it works.
    pub fn async_error(&self) -> Option<Error> {
        self.shared.abort_reason()
    }

    /// The transport of a communicator spanning processes.
    pub fn transport(&self) -> Option<&Arc<dyn Transport>> {
        self.shared.world.as_ref().map(|w| &w.transport)
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        self.check_rank("peer", peer)
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
    /// the order they run. A peer of this process gets a copy (the send completes once the
    /// data is copied aside); a peer in another process gets it through the transport. A rank
    /// may send to itself.
    ///
    /// # Errors
    /// As for [`Communicator::all_reduce`]; `peer` out of range.
    pub fn send(&self, buf: &Tensor, peer: usize, stream: &Stream) -> Result<()> {
        self.p2p(buf, peer, stream, true)
    }

    /// Receive into `buf` from rank `peer` (`ncclRecv`).
    ///
    /// # Errors
    /// As for [`Communicator::send`]. Through `stream`: `Timeout` when no send arrives in
    /// time, an argument error when the send's dtype or count differ.
    pub fn recv(&self, buf: &Tensor, peer: usize, stream: &Stream) -> Result<()> {
        self.p2p(buf, peer, stream, false)
    }

    fn p2p(&self, buf: &Tensor, peer: usize, stream: &Stream, sending: bool) -> Result<()> {
        self.check_p2p(buf, peer, stream)?;
        let name = if sending { "send" } else { "recv" };
        let (shared, local, t) = (self.shared.clone(), self.local, buf.clone());
        let rank = self.rank();
        let uses = buf
            .buffer()
            .access(if sending { Access::Read } else { Access::Write });
        let op = match self.shared.local_of(peer) {
            Some(peer_local) if sending => {
                FnOp::with_accesses(name, OpKind::Compute, uses, move || {
                    let bytes = reduce::stage(&t).map_err(|e| failure(name, e))?;
                    let msg = Message {
                        dtype: t.dtype(),
                        count: t.len(),
                        bytes,
                    };
                    shared
                        .post(local, peer_local, msg)
                        .map_err(|e| failure(name, e))
                })
            }
            Some(peer_local) => FnOp::with_accesses(name, OpKind::Compute, uses, move || {
                let msg = shared
                    .take(peer_local, local)
                    .map_err(|e| failure(name, e))?;
                if msg.dtype != t.dtype() || msg.count != t.len() {
                    return Err(failure(
                        name,
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
                reduce::unstage(&t, &msg.bytes).map_err(|e| failure(name, e))
            }),
            None => {
                let w = self
                    .shared
                    .world
                    .as_ref()
                    .expect("a rank of another process");
                let (peer_process, peer_local) = w.locate(peer);
                let tag = if sending {
                    w.tag(local, peer_local)
                } else {
                    w.tag(peer_local, local)
                };
                FnOp::with_accesses(name, OpKind::Compute, uses, move || {
                    let w = shared.world.as_ref().expect("spans processes");
                    let what = format!(
                        "{name} of {} x {} {} rank {peer} (rank {rank} of Communicator#{})",
                        t.len(),
                        t.dtype().name(),
                        if sending { "to" } else { "from" },
                        shared.id
                    );
                    let r = w.p2p(&shared, &what, &t, peer_process, tag, sending);
                    if let Err(e) = &r {
                        shared.abort(&format!("{what} failed: {e}"));
                    }
                    r.map_err(|e| failure(name, e))
                })
            }
        };
        stream.enqueue(op)?;
        Ok(())
    }

    fn same_len(&self, arg: impl std::fmt::Display, t: &Tensor, want: usize) -> Result<()> {
        if t.len() != want {
            return Err(arg_error(
                arg.to_string(),
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
