//! Communicators whose ranks span processes: the [`Transport`] a host library (MPI through
//! mpi4py in the Python package) implements to move bytes between processes, and the steps
//! the core runs over it.
//!
//! The ranks of such a communicator are (process, local device) pairs numbered process by
//! process. Everything but the bytes crossing a process boundary is the core's, as for a
//! communicator of one process: numbering, the rendezvous of the local ranks, the agreement
//! check, timeouts, abort, local reductions and copies. Once the local ranks of a collective
//! have all arrived, its leader (the last to arrive) runs one step: it reduces or gathers the
//! local buffers, starts one [`Exchange`] across the processes, polls it ([`Pending::test`])
//! until it completes, the communicator is aborted or the collective's deadline passes, and
//! writes the result to every local buffer. Steps start in collective number order, which is
//! the order every process makes them in.
//!
//! When the transport cannot reduce a dtype and operator itself ([`Transport::reduces`]:
//! MPI has no float16, for example), the step gathers every process's partial result and
//! reduces them here, in process order, with the same arithmetic as in-process collectives.
//! Data movement (broadcast, gathers, all-to-all, send/recv) is bytes, so every dtype works.
//!
//! Regions handed to the transport are device memory (local buffers, or staging allocated on
//! the first local device). They are the transport's only for the step: [`Region::read`] and
//! [`Region::write`] fail once the step ended (completed, timed out or aborted). The core
//! reads and writes staging memory directly, holding its lock for as long as it uses it
//! (`Staged`), as a collective's op holds the local buffers; the region's tensor, which a
//! transport could keep past the step, is only reachable through an `unsafe fn`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sync::lock::Mutex;

use crate::device::Device;
use crate::error::{arg_error, Error, KernelFailure, Result, StreamError};
use crate::kernel::{DType, Tensor};
use crate::memory::access::{Access, Held};

use super::protocol::{panic_message, rank_list, Part, Shared};
use super::{reduce, Communicator, Kind, ReduceOp};

/// After this long inside one exchange, polls are spaced by naps (a peer is late; the core is
/// left to others).
const SPIN: Duration = Duration::from_millis(50);
const NAP: Duration = Duration::from_micros(200);

/// A failure reported by a [`Transport`].
#[derive(Clone)]
pub struct TransportError {
    /// What went wrong.
    pub message: String,
    /// The original error object (the Python bindings keep the Python exception here so that
    /// it becomes the raised error's `__cause__`).
    pub payload: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TransportError({:?})", self.message)
    }
}

impl From<String> for TransportError {
    fn from(message: String) -> Self {
        TransportError {
            message,
            payload: None,
        }
    }
}

impl TransportError {
    /// The core error a collective fails with: a kernel failure named after the exchange.
    pub(super) fn into_error(self, what: &str) -> Error {
        let mut f = KernelFailure::new(what, self.message);
        f.payload = self.payload;
        StreamError::Kernel(f).into()
    }
}

/// Whether a step's regions may still be touched.
pub(super) struct StepLive(Mutex<bool>);

/// Marks its step ended when dropped (completed, failed, timed out, aborted or unwound).
struct StepGuard(Arc<StepLive>);

impl Drop for StepGuard {
    fn drop(&mut self) {
        *self.0 .0.lock() = false;
    }
}

/// Device memory an exchange reads or writes: `len` elements of `dtype`, contiguous. Valid for
/// the step only.
pub struct Region {
    tensor: Tensor,
    step: Arc<StepLive>,
    /// Whether the transport may write it: not a buffer this process only sends
    /// ([`Exchange::sealed`]), which the collective's op holds for reading only.
    writable: bool,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Region({} x {} in {:?})",
            self.len(),
            self.dtype().name(),
            self.tensor.buffer()
        )
    }
}

impl Region {
    fn new(step: &Arc<StepLive>, t: &Tensor, dtype: DType, start: usize, len: usize) -> Region {
        let at = t.offset() + (start * t.dtype().size()) as u64;
        let tensor = Tensor::new(t.buffer().clone(), at, dtype, vec![len])
            .expect("a region inside a checked tensor");
        Region {
            tensor,
            step: step.clone(),
            writable: true,
        }
    }

    /// The whole of `t`, as bytes.
    fn bytes(step: &Arc<StepLive>, t: &Tensor) -> Region {
        let tensor = Tensor::new(
            t.buffer().clone(),
            t.offset(),
            DType::U8,
            vec![t.nbytes() as usize],
        )
        .expect("the bytes of a checked tensor");
        Region {
            tensor,
            step: step.clone(),
            writable: true,
        }
    }

    /// Whether [`Region::write`] may write it (false for what this process only sends).
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The region's bytes as a tensor (1-D, `len` elements of `dtype`), for bindings that
    /// export it to their host language; Rust transports use [`Region::read`] and
    /// [`Region::write`], which enforce what this leaves to the caller.
    ///
    /// # Safety
    /// The caller takes over the region's rules for the tensor and every clone of it: its
    /// memory is touched only while the step lasts (a collective's op or the leader holds it
    /// only that long), written only when [`Region::is_writable`], and never while another
    /// access of the same bytes by the transport (a [`Region::write`] from another thread,
    /// say) is under way. The tensor's own safe accesses do not enforce this: on the
    /// leader's thread they reach memory its op holds without waiting.
    pub unsafe fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.tensor.dtype()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.tensor.len()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.tensor.nbytes() as usize
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.nbytes())
        {
            return Err(arg_error(
                "offset",
                format!(
                    "{len} bytes at {offset} do not fit in a {}-byte region",
                    self.nbytes()
                ),
            ));
        }
        Ok(())
    }

    /// Copy `dst.len()` bytes at byte `offset` of the region into `dst`.
    ///
    /// # Errors
    /// Out of range; `Invalid` once the step ended.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        let live = self.step.0.lock();
        if !*live {
            return Err(ended());
        }
        reduce::read_bytes(&self.tensor, offset, dst);
        Ok(())
    }

    /// Copy `src` to byte `offset` of the region.
    ///
    /// # Errors
    /// Out of range; `Invalid` once the step ended, or for a region this process only sends
    /// (the collective holds that buffer for reading: others may read it meanwhile).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        if !self.writable {
            return Err(StreamError::Invalid(format!(
                "{self:?} is only sent by this process: a transport may not write it"
            ))
            .into());
        }
        self.check(offset, src.len())?;
        let live = self.step.0.lock();
        if !*live {
            return Err(ended());
        }
        reduce::write_bytes(&self.tensor, offset, src);
        Ok(())
    }
}

fn ended() -> Error {
    StreamError::Invalid("the exchange this region belongs to has ended".into()).into()
}

impl Exchange {
    /// The exchange as process `process` hands it to the transport: the regions it only
    /// sends refuse writes ([`Region::write`]), since the collective holds those buffers for
    /// reading only (a host thread or another stream may read them meanwhile).
    fn sealed(mut self, process: usize) -> Exchange {
        let send_only: Option<&mut Region> = match &mut self {
            Exchange::Broadcast { buf, root } if *root == process => Some(buf),
            Exchange::Reduce { buf, root, .. } if *root != process => Some(buf),
            Exchange::Gather { buf, root, .. } if *root != process => Some(buf),
            Exchange::Scatter { buf, root, .. } if *root == process => Some(buf),
            Exchange::ReduceScatter { send, .. } | Exchange::AllToAll { send, .. } => Some(send),
            Exchange::Send { buf, .. } => Some(buf),
            _ => None,
        };
        if let Some(r) = send_only {
            r.writable = false;
        }
        self
    }
}

/// One step across the processes. Every process makes the same exchanges in the same order
/// (one at a time per communicator); counts are per process, in process order.
#[derive(Debug)]
pub enum Exchange {
    /// Complete once every process has made it.
    Barrier,
    /// Process `root`'s `buf` to every process's `buf` (bytes).
    Broadcast {
        /// In place.
        buf: Region,
        /// The source process.
        root: usize,
    },
    /// `buf = op(buf of every process)` on every process, element-wise, in place.
    AllReduce {
        /// In place.
        buf: Region,
        /// Never `Avg` (the core divides).
        op: ReduceOp,
    },
    /// `buf = op(buf of every process)` on process `root`; elsewhere `buf` is only read.
    Reduce {
        /// In place on the root.
        buf: Region,
        /// Never `Avg`.
        op: ReduceOp,
        /// The process that gets the result.
        root: usize,
    },
    /// `buf` holds one block per process, `counts[q]` bytes for process `q`, back to back; on
    /// entry this process's block is filled, on completion every block.
    AllGather {
        /// In place.
        buf: Region,
        /// Bytes per process.
        counts: Vec<usize>,
    },
    /// `recv = block p of op(send of every process)` on process `p`; block `q` of `send` is
    /// `counts[q]` elements; `recv` holds `counts[p]`.
    ReduceScatter {
        /// `counts.sum()` elements.
        send: Region,
        /// This process's block of the result.
        recv: Region,
        /// Elements per process.
        counts: Vec<usize>,
        /// Never `Avg`.
        op: ReduceOp,
    },
    /// Block `q` of `send` (`send_counts[q]` bytes) goes to process `q`; block `q` of `recv`
    /// (`recv_counts[q]` bytes) comes from process `q`.
    AllToAll {
        /// Bytes to send, block per destination process.
        send: Region,
        /// Bytes per destination.
        send_counts: Vec<usize>,
        /// Bytes received, block per source process.
        recv: Region,
        /// Bytes per source.
        recv_counts: Vec<usize>,
    },
    /// Every process's block to process `root`: at the root `buf` holds one block per
    /// process (`counts[q]` bytes for process `q`, back to back), its own already filled, and
    /// on completion every block; elsewhere `buf` is this process's block, only read.
    Gather {
        /// At the root every block; elsewhere this process's.
        buf: Region,
        /// Bytes per process.
        counts: Vec<usize>,
        /// The process that gets the blocks.
        root: usize,
    },
    /// Process `root`'s block `q` to process `q`: at the root `buf` holds one block per
    /// process (`counts[q]` bytes for process `q`, back to back) and is only read; elsewhere
    /// `buf` receives this process's block.
    Scatter {
        /// At the root every block; elsewhere this process's.
        buf: Region,
        /// Bytes per process.
        counts: Vec<usize>,
        /// The process the blocks come from.
        root: usize,
    },
    /// `buf` (bytes) to process `to`, matched with its `Recv` of the same `tag` in order.
    Send {
        /// Read only.
        buf: Region,
        /// Destination process.
        to: usize,
        /// Tag: the (source, destination) pair of local ranks.
        tag: u64,
    },
    /// Receive `buf.nbytes()` bytes from process `from`; a message of another size fails.
    Recv {
        /// Written.
        buf: Region,
        /// Source process.
        from: usize,
        /// As for `Send`.
        tag: u64,
    },
}

/// An exchange in flight.
pub trait Pending: Send {
    /// Whether it has completed. Called repeatedly by the core until it answers true or
    /// fails; the core drops it (abandoning it) on timeout or abort.
    ///
    /// # Errors
    /// The exchange failed; the communicator is aborted.
    fn test(&mut self) -> std::result::Result<bool, TransportError>;
}

/// Moves bytes between the processes of a communicator that spans processes.
///
/// The core calls `start` and the pending exchange's `test` from one thread at a time per
/// communicator for collectives (in collective order), and from the sending or receiving
/// rank's thread for `Send`/`Recv`, which may run meanwhile.
pub trait Transport: Send + Sync {
    /// Whether `AllReduce`, `Reduce` and `ReduceScatter` of `dtype` under `op` are done by
    /// the transport; otherwise the core gathers and reduces them itself. Must give the same
    /// answer in every process. Booleans are asked as `U8` with `Max`/`Min`; `Avg` is never
    /// asked.
    fn reduces(&self, dtype: DType, op: ReduceOp) -> bool;

    /// Start `exchange`.
    ///
    /// # Errors
    /// It could not start; the communicator is aborted.
    fn start(&self, exchange: Exchange) -> std::result::Result<Box<dyn Pending>, TransportError>;

    /// A transport over the processes `processes` (indices of this transport's processes, in
    /// the order they take in the new one; this process is one of them), for a communicator
    /// split from this one (`Communicator::split`). Called by every process of `processes`
    /// for the same `color`, right after an exchange all of them took part in, from one
    /// thread at a time per communicator, in the same order of colors in every process, so
    /// it may block until the others call it (MPI's `MPI_Comm_create_group`).
    ///
    /// # Errors
    /// The transport cannot make one (the default: splitting is not supported); the split
    /// fails and the communicator is aborted.
    fn split(
        &self,
        processes: &[usize],
        color: u64,
    ) -> std::result::Result<Arc<dyn Transport>, TransportError> {
        let _ = (processes, color);
        Err(TransportError::from(
            "this transport cannot make a transport for a subset of its processes".to_string(),
        ))
    }

    /// The host object behind the transport, for bindings that hand it back to their users
    /// (the Python package's MPI communicators); `None` by default.
    fn host_object(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        None
    }
}

/// The processes a communicator spans and its transport.
pub(super) struct World {
    pub(super) transport: Arc<dyn Transport>,
    pub(super) process: usize,
    /// Ranks of every process.
    pub(super) counts: Vec<usize>,
    offsets: Vec<usize>,
    pub(super) size: usize,
    max_local: usize,
    reduces: Mutex<HashMap<(DType, ReduceOp), bool>>,
}

/// The form a reduction takes across processes: booleans as bytes (or is max, and is min;
/// the bitwise operators stay), averages and `premul_sum` as sums (divided by the rank count
/// afterwards; factors applied by each process to its own inputs first).
fn transport_form(dtype: DType, op: ReduceOp) -> (DType, ReduceOp) {
    let op = partial(op);
    if dtype.is_bool() {
        let op = match op {
            ReduceOp::Sum => ReduceOp::Max,
            ReduceOp::Prod => ReduceOp::Min,
            other => other,
        };
        return (DType::U8, op);
    }
    (dtype, op)
}

/// Without `Avg` or `premul_sum`: partial results are sums until the end.
fn partial(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Avg | ReduceOp::PreMulSum(_) => ReduceOp::Sum,
        other => other,
    }
}

/// The reduction of a process's own inputs: `premul_sum` applies each local rank's factor,
/// `Avg` sums (the division comes at the end).
fn local_form(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Avg => ReduceOp::Sum,
        other => other,
    }
}

/// A fresh staging tensor of `len` elements on `device`, held by the calling thread (the
/// step's leader) for writing until the [`Staged`] value is dropped.
fn staging(device: &Device, dtype: DType, len: usize) -> Result<Staged> {
    let buf = device.memory().allocate((len * dtype.size()) as u64)?;
    // A fresh allocation has the newest lock id, so taking it follows the global order and
    // nothing else holds it yet.
    let held = buf.access(Access::Write).acquire()?;
    Ok(Staged {
        tensor: Tensor::new(buf, 0, dtype, vec![len])?,
        _held: held,
    })
}

/// Staging memory of one collective, which the core reads and writes directly (`reduce`),
/// without the allocation's lock: the leader holds that lock for as long as it uses the
/// memory, as an op holds its buffers. A region of it hands the transport a tensor, which a
/// transport may keep past the step; its safe accesses then wait for this value to go
/// instead of racing the core's.
struct Staged {
    tensor: Tensor,
    _held: Held,
}

impl std::ops::Deref for Staged {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        &self.tensor
    }
}

impl World {
    /// The processes of `transport`, this one being `process`, with `counts[q]` ranks in
    /// process `q`.
    pub(super) fn new(transport: Arc<dyn Transport>, process: usize, counts: Vec<usize>) -> World {
        let offsets = reduce::displacements(&counts);
        World {
            transport,
            process,
            size: counts.iter().sum(),
            max_local: counts.iter().copied().max().unwrap_or(1),
            counts,
            offsets,
            reduces: Mutex::new(HashMap::new()),
        }
    }

    /// The global rank of this process's first local rank.
    pub(super) fn first_rank(&self) -> usize {
        self.offsets[self.process]
    }

    /// (process, local rank) of global rank `rank`.
    pub(super) fn locate(&self, rank: usize) -> (usize, usize) {
        let p = self.offsets.partition_point(|&o| o <= rank) - 1;
        (p, rank - self.offsets[p])
    }

    /// The tag of point-to-point messages from local rank `src` to local rank `dst`.
    pub(super) fn tag(&self, src: usize, dst: usize) -> u64 {
        (src * self.max_local + dst) as u64
    }

    fn native(&self, dtype: DType, op: ReduceOp) -> bool {
        let (d, o) = transport_form(dtype, op);
        if let Some(&known) = self.reduces.lock().get(&(d, o)) {
            return known;
        }
        // Asked without the lock held: the transport is user code.
        let answer = self.transport.reduces(d, o);
        self.reduces.lock().insert((d, o), answer);
        answer
    }

    /// Processes other than this one, and their ranks, for a timeout message.
    fn others(&self) -> String {
        let procs: Vec<usize> = (0..self.counts.len())
            .filter(|&q| q != self.process)
            .collect();
        let ranks: Vec<usize> = procs
            .iter()
            .flat_map(|&q| self.offsets[q]..self.offsets[q] + self.counts[q])
            .collect();
        format!(
            "one or more of processes {} (ranks {})",
            rank_list(&procs),
            rank_list(&ranks)
        )
    }

    /// Start one exchange built by `make` over a fresh step and poll it to completion, the
    /// deadline or the communicator's abort.
    pub(super) fn exchange(
        &self,
        sh: &Shared,
        what: &str,
        deadline: Option<Instant>,
        make: impl FnOnce(&Arc<StepLive>) -> Exchange,
    ) -> Result<()> {
        let live = Arc::new(StepLive(Mutex::new(true)));
        let _ended = StepGuard(live.clone());
        let exchange = make(&live).sealed(self.process);
        drive(
            self.transport.as_ref(),
            exchange,
            what,
            deadline,
            || sh.abort_reason(),
            || {
                format!(
                    "{what} across processes (process {} of {}, waiting for {} to take part)",
                    self.process,
                    self.counts.len(),
                    self.others()
                )
            },
            sh.timeout,
        )
    }

    /// The leader's step of a collective whose local parts are `parts`.
    pub(super) fn collective(
        &self,
        sh: &Shared,
        what: &str,
        parts: &[Arc<Part>],
        deadline: Option<Instant>,
    ) -> Result<()> {
        let kind = parts[0].kind;
        let count = parts[0].count;
        let local = parts.len();
        let nproc = self.counts.len();
        let p = self.process;
        let first = self.first_rank();
        let send = |l: usize| parts[l].send.as_ref().expect("send checked at issue");
        let recv = |l: usize| parts[l].recv.as_ref().expect("recv checked at issue");
        let dev = &sh.devices[0];
        match kind {
            Kind::Barrier => return self.exchange(sh, what, deadline, |_| Exchange::Barrier),
            Kind::Split => return super::split::split_across(self, sh, what, parts, deadline),
            _ => {}
        }
        let dtype = parts[0]
            .dtype
            .expect("every collective but barrier and split has a dtype");
        let esz = dtype.size();
        if count == 0 && kind != Kind::AllToAllV {
            return Ok(());
        }
        let factors: Vec<f64> = parts.iter().map(|p| p.factor().unwrap_or(1.0)).collect();
        let scaled = factors.iter().any(|&f| f != 1.0);
        match kind {
            Kind::Barrier | Kind::Split => unreachable!("handled above"),
            Kind::AllReduce(op) => {
                let sends: Vec<&Tensor> = (0..local).map(send).collect();
                let recvs: Vec<&Tensor> = (0..local).map(recv).collect();
                self.all_reduce(
                    sh, what, deadline, dtype, op, &sends, &factors, &recvs, count,
                )?;
            }
            Kind::AllReduceCoalesced(op) => {
                // One exchange per buffer, on the buffers themselves (no packing copy).
                for (i, len) in parts[0].coalesced_lens().into_iter().enumerate() {
                    if len == 0 {
                        continue;
                    }
                    let sends: Vec<&Tensor> = parts.iter().map(|p| p.pair(i).0).collect();
                    let recvs: Vec<&Tensor> = parts.iter().map(|p| p.pair(i).1).collect();
                    self.all_reduce(sh, what, deadline, dtype, op, &sends, &factors, &recvs, len)?;
                }
            }
            Kind::Reduce(op, root) => {
                let (rp, rl) = self.locate(root);
                let here = rp == p;
                let staged;
                let acc: &Tensor = if here {
                    recv(rl)
                } else if local == 1 && !scaled {
                    send(0)
                } else {
                    staged = staging(dev, dtype, count)?;
                    &staged
                };
                if here || local > 1 || scaled {
                    let ins: Vec<(&Tensor, usize)> = (0..local).map(|l| (send(l), 0)).collect();
                    reduce::reduce_tensors(
                        dtype,
                        local_form(op),
                        &ins,
                        &factors,
                        &[(acc, 0)],
                        count,
                    );
                }
                self.reduce_across(sh, what, deadline, acc, 0, dtype, op, count, Some(rp))?;
                if here && op == ReduceOp::Avg {
                    reduce::divide(dtype, acc, 0, count, self.size);
                }
            }
            Kind::Broadcast(root) => {
                // Out of place on the root, its send is the source and every local recv a
                // destination; in place, its recv is the source.
                let (rp, rl) = self.locate(root);
                let (src, skip) = if rp == p {
                    match &parts[rl].send {
                        Some(s) => (s, None),
                        None => (recv(rl), Some(rl)),
                    }
                } else {
                    (recv(0), Some(0))
                };
                self.exchange(sh, what, deadline, |s| Exchange::Broadcast {
                    buf: Region::bytes(s, src),
                    root: rp,
                })?;
                for l in (0..local).filter(|&l| Some(l) != skip) {
                    reduce::copy_bytes(src, 0, recv(l), 0, count * esz);
                }
            }
            Kind::AllGather | Kind::AllGatherV => {
                let rc = parts[0].block_counts(self.size);
                let displ = reduce::displacements(&rc);
                let acc = recv(0);
                for l in 0..local {
                    let r = first + l;
                    reduce::copy_bytes(send(l), 0, acc, displ[r] * esz, rc[r] * esz);
                }
                let counts = self.per_process(&rc, esz);
                let total: usize = rc.iter().sum();
                self.exchange(sh, what, deadline, |s| Exchange::AllGather {
                    buf: Region::bytes(s, acc),
                    counts,
                })?;
                for l in 1..local {
                    reduce::copy_bytes(acc, 0, recv(l), 0, total * esz);
                }
            }
            Kind::ReduceScatter(op) | Kind::ReduceScatterV(op) => {
                let rc = parts[0].block_counts(self.size);
                self.reduce_scatter(sh, what, deadline, dtype, op, parts, &factors, &rc)?;
            }
            Kind::AllToAll => {
                let c = count / self.size;
                let block = c * esz;
                if self.max_local == 1 {
                    let counts = vec![block; nproc];
                    return self.exchange(sh, what, deadline, |s| Exchange::AllToAll {
                        send: Region::bytes(s, send(0)),
                        send_counts: counts.clone(),
                        recv: Region::bytes(s, recv(0)),
                        recv_counts: counts,
                    });
                }
                // Pack per destination process q: for each local source l, its blocks for
                // the ranks of q.
                let out = staging(dev, DType::U8, local * self.size * block)?;
                let mut send_counts = Vec::with_capacity(nproc);
                let mut pos = 0;
                for q in 0..nproc {
                    let (lo, n) = (self.offsets[q] * block, self.counts[q] * block);
                    for l in 0..local {
                        reduce::copy_bytes(send(l), lo, &out, pos, n);
                        pos += n;
                    }
                    send_counts.push(local * n);
                }
                // Receive per source process q: for each of its ranks, a block per local rank.
                let inn = staging(dev, DType::U8, self.size * local * block)?;
                let recv_counts: Vec<usize> =
                    self.counts.iter().map(|&n| n * local * block).collect();
                self.exchange(sh, what, deadline, |s| Exchange::AllToAll {
                    send: Region::new(s, &out, DType::U8, 0, out.len()),
                    send_counts,
                    recv: Region::new(s, &inn, DType::U8, 0, inn.len()),
                    recv_counts,
                })?;
                for q in 0..nproc {
                    for src in 0..self.counts[q] {
                        let at = (self.offsets[q] * local + src * local) * block;
                        for m in 0..local {
                            let j = self.offsets[q] + src;
                            reduce::copy_bytes(&inn, at + m * block, recv(m), j * block, block);
                        }
                    }
                }
            }
            Kind::AllToAllV => self.all_to_allv(sh, what, deadline, dtype, parts)?,
            Kind::Gather(root) => {
                let (rp, rl) = self.locate(root);
                let pb: Vec<usize> = self.counts.iter().map(|&n| n * count * esz).collect();
                if rp == p {
                    let rb = recv(rl);
                    for l in 0..local {
                        reduce::copy_bytes(send(l), 0, rb, (first + l) * count * esz, count * esz);
                    }
                    self.exchange(sh, what, deadline, |s| Exchange::Gather {
                        buf: Region::bytes(s, rb),
                        counts: pb,
                        root: rp,
                    })?;
                } else {
                    let staged;
                    let mine: &Tensor = if local == 1 {
                        send(0)
                    } else {
                        staged = staging(dev, dtype, local * count)?;
                        for l in 0..local {
                            reduce::copy_bytes(send(l), 0, &staged, l * count * esz, count * esz);
                        }
                        &staged
                    };
                    self.exchange(sh, what, deadline, |s| Exchange::Gather {
                        buf: Region::bytes(s, mine),
                        counts: pb,
                        root: rp,
                    })?;
                }
            }
            Kind::Scatter(root) => {
                let (rp, rl) = self.locate(root);
                let pb: Vec<usize> = self.counts.iter().map(|&n| n * count * esz).collect();
                if rp == p {
                    let sb = send(rl);
                    self.exchange(sh, what, deadline, |s| Exchange::Scatter {
                        buf: Region::bytes(s, sb),
                        counts: pb,
                        root: rp,
                    })?;
                    for l in 0..local {
                        reduce::copy_bytes(sb, (first + l) * count * esz, recv(l), 0, count * esz);
                    }
                } else {
                    let staged;
                    let mine: &Tensor = if local == 1 {
                        recv(0)
                    } else {
                        staged = staging(dev, dtype, local * count)?;
                        &staged
                    };
                    self.exchange(sh, what, deadline, |s| Exchange::Scatter {
                        buf: Region::bytes(s, mine),
                        counts: pb,
                        root: rp,
                    })?;
                    if local > 1 {
                        for l in 0..local {
                            reduce::copy_bytes(mine, l * count * esz, recv(l), 0, count * esz);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Bytes per process of per-rank element counts `rc` (ranks numbered process by process).
    fn per_process(&self, rc: &[usize], esz: usize) -> Vec<usize> {
        (0..self.counts.len())
            .map(|q| {
                let o = self.offsets[q];
                rc[o..o + self.counts[q]].iter().sum::<usize>() * esz
            })
            .collect()
    }

    /// `all_reduce` of one buffer per local rank: the local inputs reduced into the first
    /// local output (premultiplied by their factors for `premul_sum`), reduced across the
    /// processes in place there, copied to the other local outputs.
    #[allow(clippy::too_many_arguments)]
    fn all_reduce(
        &self,
        sh: &Shared,
        what: &str,
        deadline: Option<Instant>,
        dtype: DType,
        op: ReduceOp,
        sends: &[&Tensor],
        factors: &[f64],
        recvs: &[&Tensor],
        count: usize,
    ) -> Result<()> {
        let acc = recvs[0];
        let ins: Vec<(&Tensor, usize)> = sends.iter().map(|&t| (t, 0)).collect();
        reduce::reduce_tensors(dtype, local_form(op), &ins, factors, &[(acc, 0)], count);
        self.reduce_across(sh, what, deadline, acc, 0, dtype, op, count, None)?;
        if op == ReduceOp::Avg {
            reduce::divide(dtype, acc, 0, count, self.size);
        }
        for r in &recvs[1..] {
            reduce::copy_bytes(acc, 0, r, 0, count * dtype.size());
        }
        Ok(())
    }

    /// `reduce_scatter(v)`: rank `r` gets `rc[r]` elements, the blocks laid end to end.
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter(
        &self,
        sh: &Shared,
        what: &str,
        deadline: Option<Instant>,
        dtype: DType,
        op: ReduceOp,
        parts: &[Arc<Part>],
        factors: &[f64],
        rc: &[usize],
    ) -> Result<()> {
        let local = parts.len();
        let esz = dtype.size();
        let dev = &sh.devices[0];
        let send = |l: usize| parts[l].send.as_ref().expect("send checked at issue");
        let recv = |l: usize| parts[l].recv.as_ref().expect("recv checked at issue");
        let (tdtype, top) = transport_form(dtype, op);
        let native = self.native(dtype, op);
        let first = self.first_rank();
        let displ = reduce::displacements(rc);
        let total: usize = rc.iter().sum();
        let counts = self.per_process(rc, 1);
        let mine_len = counts[self.process];
        let scaled = factors.iter().any(|&f| f != 1.0);
        if local == 1 && native && !scaled && !super::overlaps(send(0), recv(0)) {
            self.exchange(sh, what, deadline, |s| Exchange::ReduceScatter {
                send: Region::new(s, send(0), tdtype, 0, total),
                recv: Region::new(s, recv(0), tdtype, 0, mine_len),
                counts,
                op: top,
            })?;
            if op == ReduceOp::Avg {
                reduce::divide(dtype, recv(0), 0, mine_len, self.size);
            }
            return Ok(());
        }
        let sum = staging(dev, dtype, total)?;
        let ins: Vec<(&Tensor, usize)> = (0..local).map(|l| (send(l), 0)).collect();
        reduce::reduce_tensors(dtype, local_form(op), &ins, factors, &[(&sum, 0)], total);
        let (mine, base) = if native {
            let mine = staging(dev, dtype, mine_len)?;
            self.exchange(sh, what, deadline, |s| Exchange::ReduceScatter {
                send: Region::new(s, &sum, tdtype, 0, total),
                recv: Region::new(s, &mine, tdtype, 0, mine_len),
                counts,
                op: top,
            })?;
            (mine, 0)
        } else {
            let from = displ[first];
            self.gather_reduce(sh, what, deadline, &sum, dtype, op, total, from, mine_len)?;
            (sum, from)
        };
        if op == ReduceOp::Avg {
            reduce::divide(dtype, &mine, base, mine_len, self.size);
        }
        for l in 0..local {
            let at = base + displ[first + l] - displ[first];
            reduce::copy_bytes(&mine, at * esz, recv(l), 0, rc[first + l] * esz);
        }
        Ok(())
    }

    /// `all_to_allv`: the processes first share every rank's send and receive counts (so
    /// that every process sees the same disagreement, if any), then move the blocks in one
    /// exchange, packed per process when a process drives several ranks.
    fn all_to_allv(
        &self,
        sh: &Shared,
        what: &str,
        deadline: Option<Instant>,
        dtype: DType,
        parts: &[Arc<Part>],
    ) -> Result<()> {
        let n = self.size;
        let local = parts.len();
        let esz = dtype.size();
        let first = self.first_rank();
        let nproc = self.counts.len();
        let dev = &sh.devices[0];
        let send = |l: usize| parts[l].send.as_ref().expect("send checked at issue");
        let recv = |l: usize| parts[l].recv.as_ref().expect("recv checked at issue");
        let mine: Vec<u64> = parts
            .iter()
            .flat_map(|p| p.counts.iter().chain(&p.recv_counts).map(|&c| c as u64))
            .collect();
        let table = self.table(sh, what, deadline, &mine, 2 * n)?;
        // sc[a][b]: what rank a sends to rank b; rcv[b][a]: what b expects from a.
        let sc = |a: usize, b: usize| table[a * 2 * n + b] as usize;
        let rcv = |b: usize, a: usize| table[b * 2 * n + n + a] as usize;
        for a in 0..n {
            for b in 0..n {
                if sc(a, b) != rcv(b, a) {
                    return Err(arg_error(
                        format!("{what} (counts)"),
                        format!(
                            "all_to_allv counts disagree: rank {a} sends {} elements to rank {b}, which expects {} from it",
                            sc(a, b),
                            rcv(b, a)
                        ),
                    ));
                }
            }
        }
        let ranks = |q: usize| self.offsets[q]..self.offsets[q] + self.counts[q];
        let sdispl = |l: usize| reduce::displacements(&parts[l].counts);
        let rdispl = |l: usize| reduce::displacements(&parts[l].recv_counts);
        let send_bytes: Vec<usize> = (0..nproc)
            .map(|q| {
                (0..local)
                    .map(|l| ranks(q).map(|j| sc(first + l, j)).sum::<usize>())
                    .sum::<usize>()
                    * esz
            })
            .collect();
        let recv_bytes: Vec<usize> = (0..nproc)
            .map(|q| {
                ranks(q)
                    .map(|i| (0..local).map(|m| sc(i, first + m)).sum::<usize>())
                    .sum::<usize>()
                    * esz
            })
            .collect();
        if self.max_local == 1 {
            // One rank per process: the buffers are already laid out per process.
            return self.exchange(sh, what, deadline, |s| Exchange::AllToAll {
                send: Region::bytes(s, send(0)),
                send_counts: send_bytes,
                recv: Region::bytes(s, recv(0)),
                recv_counts: recv_bytes,
            });
        }
        let out = staging(dev, DType::U8, send_bytes.iter().sum())?;
        let mut pos = 0;
        for q in 0..nproc {
            for l in 0..local {
                let sd = sdispl(l);
                for j in ranks(q) {
                    let len = sc(first + l, j) * esz;
                    reduce::copy_bytes(send(l), sd[j] * esz, &out, pos, len);
                    pos += len;
                }
            }
        }
        let inn = staging(dev, DType::U8, recv_bytes.iter().sum())?;
        self.exchange(sh, what, deadline, |s| Exchange::AllToAll {
            send: Region::new(s, &out, DType::U8, 0, out.len()),
            send_counts: send_bytes,
            recv: Region::new(s, &inn, DType::U8, 0, inn.len()),
            recv_counts: recv_bytes,
        })?;
        let rd: Vec<Vec<usize>> = (0..local).map(rdispl).collect();
        let mut pos = 0;
        for q in 0..nproc {
            for src in ranks(q) {
                for (m, rd) in rd.iter().enumerate() {
                    let len = sc(src, first + m) * esz;
                    reduce::copy_bytes(&inn, pos, recv(m), rd[src] * esz, len);
                    pos += len;
                }
            }
        }
        Ok(())
    }

    /// Every process's `mine` (`words` 64-bit words per local rank) gathered in global rank
    /// order: `size × words` words, the same table in every process.
    pub(super) fn table(
        &self,
        sh: &Shared,
        what: &str,
        deadline: Option<Instant>,
        mine: &[u64],
        words: usize,
    ) -> Result<Vec<u64>> {
        let all = staging(&sh.devices[0], DType::U8, self.size * words * 8)?;
        let bytes: Vec<u8> = mine.iter().flat_map(|w| w.to_le_bytes()).collect();
        reduce::write_bytes(&all, self.first_rank() * words * 8, &bytes);
        let counts: Vec<usize> = self.counts.iter().map(|&c| c * words * 8).collect();
        self.exchange(sh, what, deadline, |s| Exchange::AllGather {
            buf: Region::bytes(s, &all),
            counts,
        })?;
        let mut out = vec![0u8; self.size * words * 8];
        reduce::read_bytes(&all, 0, &mut out);
        Ok(out
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    }

    /// `op` across processes over elements `[at, at + count)` of `acc` (this process's partial
    /// result): on every process, or on process `root` only. Not divided for `Avg`.
    #[allow(clippy::too_many_arguments)]
    fn reduce_across(
        &self,
        sh: &Shared,
        what: &str,
        deadline: Option<Instant>,
        acc: &Tensor,
        at: usize,
        dtype: DType,
        op: ReduceOp,
        count: usize,
        root: Option<usize>,
    ) -> Result<()> {
        if self.native(dtype, op) {
            let (tdtype, top) = transport_form(dtype, op);
            return self.exchange(sh, what, deadline, |s| {
                let buf = Region::new(s, acc, tdtype, at, count);
                match root {
                    None => Exchange::AllReduce { buf, op: top },
                    Some(root) => Exchange::Reduce { buf, op: top, root },
                }
            });
        }
        if root.is_some_and(|r| r != self.process) {
            // Non-root processes still take part in the gather.
            let gathered = self.gather(sh, what, deadline, acc, at, dtype, count)?;
            drop(gathered);
            return Ok(());
        }
        let gathered = self.gather(sh, what, deadline, acc, at, dtype, count)?;
        let ins: Vec<(&Tensor, usize)> = (0..self.counts.len())
            .map(|q| (&*gathered, q * count))
            .collect();
        reduce::reduce_tensors(dtype, partial(op), &ins, &[], &[(acc, at)], count);
        Ok(())
    }

    /// Every process's elements `[at, at + count)` of its `acc`, block `q` from process `q`.
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &self,
        sh: &Shared,
        what: &str,
        deadline: Option<Instant>,
        acc: &Tensor,
        at: usize,
        dtype: DType,
        count: usize,
    ) -> Result<Staged> {
        let nproc = self.counts.len();
        let esz = dtype.size();
        let all = staging(&sh.devices[0], dtype, nproc * count)?;
        reduce::copy_bytes(acc, at * esz, &all, self.process * count * esz, count * esz);
        self.exchange(sh, what, deadline, |s| Exchange::AllGather {
            buf: Region::new(s, &all, DType::U8, 0, all.len() * esz),
            counts: vec![count * esz; nproc],
        })?;
        Ok(all)
    }

    /// Reduce every process's `sum` (of `total` elements) here, in process order; only
    /// elements `[from, from + len)` (this process's share) are written back to `sum`.
    #[allow(clippy::too_many_arguments)]
    fn gather_reduce(
        &self,
        sh: &Shared,
        what: &str,
        deadline: Option<Instant>,
        sum: &Tensor,
        dtype: DType,
        op: ReduceOp,
        total: usize,
        from: usize,
        len: usize,
    ) -> Result<()> {
        let gathered = self.gather(sh, what, deadline, sum, 0, dtype, total)?;
        let ins: Vec<(&Tensor, usize)> = (0..self.counts.len())
            .map(|q| (&*gathered, q * total + from))
            .collect();
        reduce::reduce_tensors(dtype, partial(op), &ins, &[], &[(sum, from)], len);
        Ok(())
    }

    /// A point-to-point message between this process's local rank and a rank of another
    /// process, run on the rank's own stream.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn p2p(
        &self,
        sh: &Shared,
        what: &str,
        t: &Tensor,
        peer_process: usize,
        tag: u64,
        sending: bool,
    ) -> Result<()> {
        let live = Arc::new(StepLive(Mutex::new(true)));
        let _ended = StepGuard(live.clone());
        let buf = Region::bytes(&live, t);
        let exchange = if sending {
            Exchange::Send {
                buf,
                to: peer_process,
                tag,
            }
        } else {
            Exchange::Recv {
                buf,
                from: peer_process,
                tag,
            }
        };
        drive(
            self.transport.as_ref(),
            exchange.sealed(self.process),
            what,
            sh.deadline(),
            || sh.abort_reason(),
            || {
                format!(
                    "{what} (process {} of {}; process {peer_process} did not {} it)",
                    self.process,
                    self.counts.len(),
                    if sending { "receive" } else { "send" }
                )
            },
            sh.timeout,
        )
    }
}

/// Start `exchange` and poll it until it completes, `aborted` says the communicator was
/// aborted, or `deadline` passes (then `timeout_what` names what was waited for).
#[allow(clippy::too_many_arguments)]
fn drive(
    transport: &dyn Transport,
    exchange: Exchange,
    what: &str,
    deadline: Option<Instant>,
    aborted: impl Fn() -> Option<Error>,
    timeout_what: impl Fn() -> String,
    timeout: Duration,
) -> Result<()> {
    let mut pending = transport.start(exchange).map_err(|e| e.into_error(what))?;
    let t0 = Instant::now();
    loop {
        if pending.test().map_err(|e| e.into_error(what))? {
            return Ok(());
        }
        if let Some(e) = aborted() {
            return Err(e);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(StreamError::Timeout {
                what: timeout_what(),
                timeout_ms: timeout.as_secs_f64() * 1e3,
            }
            .into());
        }
        if t0.elapsed() < SPIN {
            std::thread::yield_now();
        } else {
            std::thread::sleep(NAP);
        }
    }
}

/// Joining a communicator that spans processes: the processes exchange their local rank
/// counts through the transport. Every process calls [`connect`] with the same `processes`,
/// its own `process` index and its devices.
pub struct Connecting {
    devices: Vec<Device>,
    process: usize,
    transport: Arc<dyn Transport>,
    timeout: Duration,
    deadline: Option<Instant>,
    table: Tensor,
    live: Arc<StepLive>,
    pending: Option<Box<dyn Pending>>,
    t0: Instant,
}

impl std::fmt::Debug for Connecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Connecting(process {} of {}, {} devices)",
            self.process,
            self.table.len() / 8,
            self.devices.len()
        )
    }
}

/// Start joining a communicator that spans `processes` processes, this one being `process`,
/// with one rank per device of `devices` (NCCL's `ncclCommInitRank`, with the transport doing
/// what NCCL's unique id and bootstrap do). Ranks are numbered process by process. Finish
/// with [`Connecting::wait`] (or [`Connecting::poll`]).
///
/// # Errors
/// As for [`super::init_all`]; an argument error when `process >= processes`; the transport's
/// failure to start the exchange.
pub fn connect(
    devices: &[Device],
    process: usize,
    processes: usize,
    transport: Arc<dyn Transport>,
    timeout: Duration,
) -> Result<Connecting> {
    super::check_devices(devices, timeout)?;
    if process >= processes {
        return Err(arg_error(
            "process",
            format!(
                "{process} is not a process index for {processes} processes (0 to {})",
                processes.saturating_sub(1)
            ),
        ));
    }
    // The table outlives this call (`Connecting` may be polled from any thread), so the core
    // reaches it through the allocation's lock, like any host access: a transport that keeps
    // its region's tensor cannot race it.
    let buf = devices[0].memory().allocate(8 * processes as u64)?;
    buf.write(8 * process as u64, &(devices.len() as u64).to_le_bytes())?;
    let table = Tensor::new(buf, 0, DType::U8, vec![8 * processes])?;
    let live = Arc::new(StepLive(Mutex::new(true)));
    let exchange = Exchange::AllGather {
        buf: Region::new(&live, &table, DType::U8, 0, 8 * processes),
        counts: vec![8; processes],
    };
    let what = "connect (exchanging the local rank counts)";
    let pending =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| transport.start(exchange)))
            .map_err(|p| {
                Error::from(StreamError::Invalid(format!(
                    "{what}: the transport panicked: {}",
                    panic_message(p.as_ref())
                )))
            })?
            .map_err(|e| e.into_error(what))?;
    Ok(Connecting {
        devices: devices.to_vec(),
        process,
        transport,
        timeout,
        deadline: crate::clock::deadline_after(Some(timeout)),
        table,
        live,
        pending: Some(pending),
        t0: Instant::now(),
    })
}

impl Connecting {
    /// Poll for at most `slice`: the communicators (one per device, in order) once every
    /// process has joined, `None` while waiting.
    ///
    /// # Errors
    /// `Timeout` after the timeout given to [`connect`]; the transport's failure; an
    /// argument error when a process reported no devices; `InvalidHandle` once this
    /// process's runtime shuts down (its devices would be the communicators'). After an
    /// error, polling again fails.
    pub fn poll(&mut self, slice: Duration) -> Result<Option<Vec<Communicator>>> {
        let what = "connect (exchanging the local rank counts)";
        let until = Instant::now() + slice;
        loop {
            let Some(pending) = self.pending.as_mut() else {
                return Err(StreamError::Invalid(format!("{what} already failed")).into());
            };
            if let Err(e) = self.devices.iter().try_for_each(Device::check_alive) {
                self.fail();
                return Err(e);
            }
            let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pending.test()))
                .map_err(|p| {
                    Error::from(StreamError::Invalid(format!(
                        "{what}: the transport panicked: {}",
                        panic_message(p.as_ref())
                    )))
                })
                .and_then(|r| r.map_err(|e| e.into_error(what)));
            match done {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    self.fail();
                    return Err(e);
                }
            }
            let now = Instant::now();
            if self.deadline.is_some_and(|d| now >= d) {
                self.fail();
                let processes = self.table.len() / 8;
                return Err(StreamError::Timeout {
                    what: format!(
                        "{what} (process {} of {processes}; some other process did not call it)",
                        self.process
                    ),
                    timeout_ms: self.timeout.as_secs_f64() * 1e3,
                }
                .into());
            }
            if now >= until {
                return Ok(None);
            }
            if self.t0.elapsed() < SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP.min(until - now));
            }
        }
        self.pending = None;
        *self.live.0.lock() = false;
        let processes = self.table.len() / 8;
        let mut bytes = vec![0u8; 8 * processes];
        self.table.buffer().read(0, &mut bytes)?;
        let counts: Vec<usize> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as usize)
            .collect();
        if let Some(q) = counts.iter().position(|&c| c == 0) {
            return Err(arg_error(
                "devices",
                format!("process {q} joined with no devices; every process needs at least one"),
            ));
        }
        let world = World::new(self.transport.clone(), self.process, counts);
        let shared = Shared::new(self.devices.clone(), self.timeout, Some(world));
        Ok(Some(
            (0..self.devices.len())
                .map(|local| Communicator {
                    shared: shared.clone(),
                    local,
                })
                .collect(),
        ))
    }

    fn fail(&mut self) {
        self.pending = None;
        *self.live.0.lock() = false;
    }

    /// Wait until every process has joined (the timeout given to [`connect`] bounds it).
    ///
    /// # Errors
    /// As for [`Connecting::poll`].
    pub fn wait(mut self) -> Result<Vec<Communicator>> {
        loop {
            if let Some(c) = self.poll(Duration::from_millis(100))? {
                return Ok(c);
            }
        }
    }
}
