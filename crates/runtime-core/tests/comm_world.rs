//! Communicators spanning processes (`comm::connect`, `comm/world.rs`) over a loopback
//! [`Transport`]: each "process" is a thread with its own devices and its own communicators,
//! and the transport moves bytes between them in memory, so the core's protocol and steps
//! (hierarchical reductions, the gather-and-reduce fallback, byte movement for every dtype,
//! point-to-point across and within processes, timeouts naming the missing processes, abort)
//! are checked against plain Rust reference results without MPI. The MPI transport itself is
//! checked by `tests/test_comm_mpi.py` under `mpiexec`.
//!
//! The binary has its own runtime with 8 small devices (never shut down).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use half::{bf16, f16};
use num_complex::Complex;
use runtime_core::comm::{
    self, Communicator, Exchange, Pending, ReduceOp, Region, Transport, TransportError,
};
use runtime_core::config::ConfigBuilder;
use runtime_core::error::{Error, StreamError};
use runtime_core::kernel::{DType, Tensor};
use runtime_core::runtime::{self, Runtime};
use runtime_core::stream::Stream;

fn rt() -> Arc<Runtime> {
    runtime::init(&ConfigBuilder {
        device_count: Some(8),
        memory: Some(runtime_core::Bytes::mib(64)),
        profile: None,
    })
    .expect("init the runtime")
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

// --- the loopback transport --------------------------------------------------------------

/// What one process put into a collective exchange.
struct Contribution {
    bytes: Vec<u8>,
    /// `AllToAll`: bytes per destination.
    counts: Vec<usize>,
}

#[derive(Default)]
struct FabricState {
    /// Collective exchange `k` of every process (every process makes them in the same order).
    coll: HashMap<u64, Vec<Option<Contribution>>>,
    /// How many processes have finished exchange `k`.
    finished: HashMap<u64, usize>,
    /// Point-to-point messages by (from, to, tag).
    mail: HashMap<(usize, usize, u64), VecDeque<Vec<u8>>>,
}

/// Fabrics of split communicators, by (color, processes, how many such splits before).
type SubFabrics = HashMap<(u64, Vec<usize>, u64), Arc<Fabric>>;

/// The memory the "processes" of one communicator share.
struct Fabric {
    nproc: usize,
    state: Mutex<FabricState>,
    subs: Mutex<SubFabrics>,
}

impl Fabric {
    fn new(nproc: usize) -> Arc<Fabric> {
        Arc::new(Fabric {
            nproc,
            state: Mutex::new(FabricState::default()),
            subs: Mutex::new(HashMap::new()),
        })
    }
}

struct Loopback {
    fabric: Arc<Fabric>,
    process: usize,
    next: Mutex<u64>,
    /// Whether `reduces` says yes for i64 and f64 (otherwise the core gathers and reduces).
    native: bool,
    /// Fail every exchange once this many collective exchanges were started.
    fail_after: Option<u64>,
    /// Splits made so far, by (color, processes).
    splits: Mutex<HashMap<(u64, Vec<usize>), u64>>,
}

/// Every exchange of every test: what process `me` only sends refuses a transport's writes
/// (the collective holds it for reading only, so a host thread or another stream may read
/// it meanwhile); what it receives or reduces in place takes them. A transport writing a
/// send buffer used to race those readers (RELIABILITY.md W16).
fn check_sealed(ex: &Exchange, me: usize) {
    let (send_only, written): (Option<&Region>, Vec<&Region>) = match ex {
        Exchange::Barrier => (None, vec![]),
        Exchange::Broadcast { buf, root } | Exchange::Scatter { buf, root, .. } => {
            if *root == me {
                (Some(buf), vec![])
            } else {
                (None, vec![buf])
            }
        }
        Exchange::Reduce { buf, root, .. } | Exchange::Gather { buf, root, .. } => {
            if *root == me {
                (None, vec![buf])
            } else {
                (Some(buf), vec![])
            }
        }
        Exchange::AllReduce { buf, .. } | Exchange::AllGather { buf, .. } => (None, vec![buf]),
        Exchange::ReduceScatter { send, recv, .. } | Exchange::AllToAll { send, recv, .. } => {
            (Some(send), vec![recv])
        }
        Exchange::Send { buf, .. } => (Some(buf), vec![]),
        Exchange::Recv { buf, .. } => (None, vec![buf]),
    };
    if let Some(r) = send_only {
        assert!(!r.is_writable(), "{ex:?}: process {me} only sends {r:?}");
        let e = r
            .write(0, &[])
            .expect_err("a send-only region refuses writes");
        assert!(e.to_string().contains("only sent"), "{e}");
    }
    assert!(written.iter().all(|r| r.is_writable()), "{ex:?}");
}

fn read_all(r: &Region) -> Vec<u8> {
    let mut v = vec![0u8; r.nbytes()];
    r.read(0, &mut v).expect("region live");
    v
}

/// A bitwise operator over the bytes of two values (integers only: the core refuses them
/// for floats), as a value of the same type.
fn bits<T: FromBytes8>(op: ReduceOp, a: [u8; 8], b: [u8; 8]) -> T {
    let (x, y) = (u64::from_le_bytes(a), u64::from_le_bytes(b));
    let r = match op {
        ReduceOp::BAnd => x & y,
        ReduceOp::BOr => x | y,
        _ => x ^ y,
    };
    T::from_bytes8(r.to_le_bytes())
}

trait FromBytes8 {
    fn from_bytes8(b: [u8; 8]) -> Self;
}

impl FromBytes8 for i64 {
    fn from_bytes8(b: [u8; 8]) -> Self {
        i64::from_le_bytes(b)
    }
}

impl FromBytes8 for f64 {
    fn from_bytes8(_: [u8; 8]) -> Self {
        unreachable!("bitwise operators are refused for floats")
    }
}

fn reduce_bytes(dtype: DType, op: ReduceOp, a: &mut [u8], b: &[u8]) {
    macro_rules! go {
        ($t:ty) => {{
            for (x, y) in a
                .chunks_exact_mut(size_of::<$t>())
                .zip(b.chunks_exact(size_of::<$t>()))
            {
                let u = <$t>::from_le_bytes(x.try_into().unwrap());
                let v = <$t>::from_le_bytes(y.try_into().unwrap());
                let r = match op {
                    ReduceOp::Sum => u + v,
                    ReduceOp::Prod => u * v,
                    ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
                        bits(op, u.to_le_bytes(), v.to_le_bytes())
                    }
                    ReduceOp::Max => {
                        if v > u {
                            v
                        } else {
                            u
                        }
                    }
                    ReduceOp::Min => {
                        if v < u {
                            v
                        } else {
                            u
                        }
                    }
                    ReduceOp::Avg | ReduceOp::PreMulSum(_) => {
                        unreachable!("the core never asks for avg or premul_sum")
                    }
                };
                x.copy_from_slice(&r.to_le_bytes());
            }
        }};
    }
    match dtype {
        DType::I64 => go!(i64),
        DType::F64 => go!(f64),
        other => panic!("the loopback does not reduce {other:?}"),
    }
}

enum Job {
    Coll {
        k: u64,
        exchange: Exchange,
    },
    Recv {
        buf: Region,
        key: (usize, usize, u64),
    },
    Done,
}

struct LoopPending {
    fabric: Arc<Fabric>,
    process: usize,
    job: Job,
}

impl Pending for LoopPending {
    fn test(&mut self) -> Result<bool, TransportError> {
        let mut st = self.fabric.state.lock().unwrap();
        match &self.job {
            Job::Done => Ok(true),
            Job::Recv { buf, key } => {
                let Some(msg) = st.mail.get_mut(key).and_then(VecDeque::pop_front) else {
                    return Ok(false);
                };
                if msg.len() != buf.nbytes() {
                    return Err(format!(
                        "received {} bytes for a {}-byte buffer",
                        msg.len(),
                        buf.nbytes()
                    )
                    .into());
                }
                buf.write(0, &msg).map_err(|e| e.to_string())?;
                Ok(true)
            }
            Job::Coll { k, exchange } => {
                let k = *k;
                let all = st.coll.get(&k).expect("contributed at start");
                if all.iter().any(Option::is_none) {
                    return Ok(false);
                }
                let parts: Vec<&Contribution> = all.iter().map(|c| c.as_ref().unwrap()).collect();
                let me = self.process;
                match exchange {
                    Exchange::Barrier => {}
                    Exchange::Broadcast { buf, root } => {
                        if *root != me {
                            buf.write(0, &parts[*root].bytes).unwrap();
                        }
                    }
                    Exchange::AllReduce { buf, op } => {
                        let mut acc = parts[0].bytes.clone();
                        for p in &parts[1..] {
                            reduce_bytes(buf.dtype(), *op, &mut acc, &p.bytes);
                        }
                        buf.write(0, &acc).unwrap();
                    }
                    Exchange::Reduce { buf, op, root } => {
                        if *root == me {
                            let mut acc = parts[0].bytes.clone();
                            for p in &parts[1..] {
                                reduce_bytes(buf.dtype(), *op, &mut acc, &p.bytes);
                            }
                            buf.write(0, &acc).unwrap();
                        }
                    }
                    Exchange::AllGather { buf, counts } => {
                        let mut at = 0;
                        for (q, p) in parts.iter().enumerate() {
                            buf.write(at, &p.bytes).unwrap();
                            at += counts[q];
                        }
                    }
                    Exchange::ReduceScatter {
                        recv, counts, op, ..
                    } => {
                        let mut acc = parts[0].bytes.clone();
                        for p in &parts[1..] {
                            reduce_bytes(recv.dtype(), *op, &mut acc, &p.bytes);
                        }
                        let esz = recv.dtype().size();
                        let from: usize = counts[..me].iter().sum::<usize>() * esz;
                        recv.write(0, &acc[from..from + counts[me] * esz]).unwrap();
                    }
                    Exchange::AllToAll { recv, .. } => {
                        let mut at = 0;
                        for p in &parts {
                            let from: usize = p.counts[..me].iter().sum();
                            let block = &p.bytes[from..from + p.counts[me]];
                            recv.write(at, block).unwrap();
                            at += block.len();
                        }
                    }
                    Exchange::Gather { buf, counts, root } => {
                        if *root == me {
                            let mut at = 0;
                            for (q, p) in parts.iter().enumerate() {
                                if q != me {
                                    buf.write(at, &p.bytes).unwrap();
                                }
                                at += counts[q];
                            }
                        }
                    }
                    Exchange::Scatter { buf, counts, root } => {
                        if *root != me {
                            let from: usize = counts[..me].iter().sum();
                            buf.write(0, &parts[*root].bytes[from..from + counts[me]])
                                .unwrap();
                        }
                    }
                    Exchange::Send { .. } | Exchange::Recv { .. } => unreachable!(),
                }
                let done = st.finished.entry(k).or_insert(0);
                *done += 1;
                if *done == self.fabric.nproc {
                    st.coll.remove(&k);
                    st.finished.remove(&k);
                }
                Ok(true)
            }
        }
    }
}

impl Transport for Loopback {
    fn split(&self, processes: &[usize], color: u64) -> Result<Arc<dyn Transport>, TransportError> {
        let me = processes
            .iter()
            .position(|&q| q == self.process)
            .expect("a member of the split");
        let k = {
            let mut n = self.splits.lock().unwrap();
            let k = n.entry((color, processes.to_vec())).or_insert(0);
            *k += 1;
            *k
        };
        let fabric = self
            .fabric
            .subs
            .lock()
            .unwrap()
            .entry((color, processes.to_vec(), k))
            .or_insert_with(|| Fabric::new(processes.len()))
            .clone();
        Ok(Arc::new(Loopback {
            fabric,
            process: me,
            next: Mutex::new(0),
            native: self.native,
            fail_after: None,
            splits: Mutex::new(HashMap::new()),
        }))
    }

    fn reduces(&self, dtype: DType, op: ReduceOp) -> bool {
        assert_ne!(op, ReduceOp::Avg, "the core divides averages itself");
        assert!(
            !matches!(op, ReduceOp::PreMulSum(_)),
            "the core applies premul_sum factors itself"
        );
        assert!(!dtype.is_bool(), "booleans are asked as bytes");
        self.native && matches!(dtype, DType::I64 | DType::F64)
    }

    fn start(&self, exchange: Exchange) -> Result<Box<dyn Pending>, TransportError> {
        let me = self.process;
        check_sealed(&exchange, me);
        let fabric = self.fabric.clone();
        let job = match exchange {
            Exchange::Send { buf, to, tag } => {
                let bytes = read_all(&buf);
                let mut st = fabric.state.lock().unwrap();
                st.mail.entry((me, to, tag)).or_default().push_back(bytes);
                Job::Done
            }
            Exchange::Recv { buf, from, tag } => Job::Recv {
                buf,
                key: (from, me, tag),
            },
            exchange => {
                let k = {
                    let mut next = self.next.lock().unwrap();
                    let k = *next;
                    *next += 1;
                    k
                };
                if self.fail_after.is_some_and(|n| k >= n) {
                    return Err("the loopback was told to fail".to_string().into());
                }
                let contribution = match &exchange {
                    Exchange::Barrier => Contribution {
                        bytes: vec![],
                        counts: vec![],
                    },
                    Exchange::Broadcast { buf, .. }
                    | Exchange::AllReduce { buf, .. }
                    | Exchange::Reduce { buf, .. } => Contribution {
                        bytes: read_all(buf),
                        counts: vec![],
                    },
                    Exchange::AllGather { buf, counts } => {
                        let from: usize = counts[..me].iter().sum();
                        let mut bytes = vec![0u8; counts[me]];
                        buf.read(from, &mut bytes).unwrap();
                        Contribution {
                            bytes,
                            counts: vec![],
                        }
                    }
                    Exchange::ReduceScatter { send, .. } => Contribution {
                        bytes: read_all(send),
                        counts: vec![],
                    },
                    Exchange::AllToAll {
                        send, send_counts, ..
                    } => Contribution {
                        bytes: read_all(send),
                        counts: send_counts.clone(),
                    },
                    Exchange::Gather { buf, counts, root } => {
                        // The root's own block is in place already.
                        let bytes = if *root == me { vec![] } else { read_all(buf) };
                        assert!(*root == me || bytes.len() == counts[me]);
                        Contribution {
                            bytes,
                            counts: vec![],
                        }
                    }
                    Exchange::Scatter { buf, root, .. } => Contribution {
                        bytes: if *root == me { read_all(buf) } else { vec![] },
                        counts: vec![],
                    },
                    Exchange::Send { .. } | Exchange::Recv { .. } => unreachable!(),
                };
                let mut st = fabric.state.lock().unwrap();
                let slot = st
                    .coll
                    .entry(k)
                    .or_insert_with(|| (0..fabric.nproc).map(|_| None).collect());
                slot[me] = Some(contribution);
                Job::Coll { k, exchange }
            }
        };
        Ok(Box::new(LoopPending {
            fabric,
            process: me,
            job,
        }))
    }
}

/// Every process's communicators, made by one thread per process (`connect` waits for all).
fn world(
    layout: &[&[usize]],
    native: bool,
    timeout: Duration,
    fail_after: Option<u64>,
) -> Vec<Vec<Communicator>> {
    let r = rt();
    let fabric = Fabric::new(layout.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = layout
            .iter()
            .enumerate()
            .map(|(p, devs)| {
                let devices: Vec<_> = devs.iter().map(|&d| r.devices()[d].clone()).collect();
                let transport = Arc::new(Loopback {
                    fabric: fabric.clone(),
                    process: p,
                    next: Mutex::new(0),
                    native,
                    fail_after,
                    splits: Mutex::new(HashMap::new()),
                });
                s.spawn(move || {
                    comm::connect(&devices, p, layout.len(), transport, timeout)
                        .expect("connect")
                        .wait()
                        .expect("every process joins")
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

// --- values of every dtype, and the reference -----------------------------------------------

/// A value as (real, imaginary) in f64; booleans are 0 and 1.
type V = (f64, f64);

fn encode(dtype: DType, vals: &[V]) -> Vec<u8> {
    let mut out = Vec::new();
    for &(re, im) in vals {
        match dtype {
            DType::I64 => out.extend((re as i64).to_le_bytes()),
            DType::F64 => out.extend(re.to_le_bytes()),
            DType::F16 => out.extend(f16::from_f64(re).to_le_bytes()),
            DType::BF16 => out.extend(bf16::from_f64(re).to_le_bytes()),
            DType::C64 => out.extend(
                [Complex::new(re as f32, im as f32)]
                    .iter()
                    .flat_map(|c| [c.re.to_le_bytes(), c.im.to_le_bytes()].concat()),
            ),
            DType::Bool => out.push(u8::from(re != 0.0)),
            DType::U8 => out.push(re as u8),
            other => panic!("no encoding for {other:?}"),
        }
    }
    out
}

fn decode(dtype: DType, bytes: &[u8]) -> Vec<V> {
    let sz = dtype.size();
    bytes
        .chunks_exact(sz)
        .map(|b| match dtype {
            DType::I64 => (i64::from_le_bytes(b.try_into().unwrap()) as f64, 0.0),
            DType::F64 => (f64::from_le_bytes(b.try_into().unwrap()), 0.0),
            DType::F16 => (f16::from_le_bytes(b.try_into().unwrap()).to_f64(), 0.0),
            DType::BF16 => (bf16::from_le_bytes(b.try_into().unwrap()).to_f64(), 0.0),
            DType::C64 => (
                f32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
                f32::from_le_bytes(b[4..].try_into().unwrap()) as f64,
            ),
            DType::Bool | DType::U8 => (b[0] as f64, 0.0),
            other => panic!("no decoding for {other:?}"),
        })
        .collect()
}

/// Rank `rank`'s input `i`: small integers (exact in every dtype, products included).
fn value(dtype: DType, rank: usize, i: usize, seed: usize) -> V {
    let h = (rank * 7 + i * 13 + seed * 5) % 5;
    match dtype {
        DType::Bool => (u8::from(!(rank + i + seed).is_multiple_of(3)) as f64, 0.0),
        DType::C64 => (h as f64 - 2.0, (i % 3) as f64 - 1.0),
        DType::U8 => (h as f64, 0.0),
        _ => (h as f64 - 2.0, 0.0),
    }
}

fn reduce_ref(dtype: DType, op: ReduceOp, xs: &[V], n: usize) -> V {
    let bitwise = |x: i64, y: i64| match op {
        ReduceOp::BAnd => x & y,
        ReduceOp::BOr => x | y,
        _ => x ^ y,
    };
    let mut a = xs[0];
    if let ReduceOp::PreMulSum(f) = op {
        // Rank r's factor is the one `premul` gives it.
        let f0 = premul(0).factor().unwrap_or(f.value());
        a = (a.0 * f0, a.1 * f0);
    }
    for (r, &b) in xs.iter().enumerate().skip(1) {
        a = if dtype.is_bool() {
            let (x, y) = (a.0 != 0.0, b.0 != 0.0);
            let r = match op {
                ReduceOp::Sum | ReduceOp::Max | ReduceOp::BOr => x || y,
                ReduceOp::Prod | ReduceOp::Min | ReduceOp::BAnd => x && y,
                ReduceOp::BXor => x != y,
                ReduceOp::Avg | ReduceOp::PreMulSum(_) => unreachable!(),
            };
            (r as u8 as f64, 0.0)
        } else {
            match op {
                ReduceOp::Sum | ReduceOp::Avg => (a.0 + b.0, a.1 + b.1),
                ReduceOp::PreMulSum(_) => {
                    let f = premul(r).factor().expect("premul_sum");
                    (a.0 + f * b.0, a.1 + f * b.1)
                }
                ReduceOp::Prod => (a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0),
                ReduceOp::Max => (a.0.max(b.0), 0.0),
                ReduceOp::Min => (a.0.min(b.0), 0.0),
                ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
                    let v = bitwise(a.0 as i64, b.0 as i64);
                    let v = if dtype == DType::U8 { v & 0xff } else { v };
                    (v as f64, 0.0)
                }
            }
        };
    }
    if op == ReduceOp::Avg {
        a = if dtype == DType::I64 {
            ((a.0 / n as f64).trunc(), 0.0)
        } else {
            (a.0 / n as f64, a.1 / n as f64)
        };
    }
    a
}

/// Rank `r`'s `premul_sum` operator: factor `r + 1` (exact in every dtype).
fn premul(r: usize) -> ReduceOp {
    ReduceOp::premul_sum(r as f64 + 1.0).unwrap()
}

fn close(dtype: DType, got: &[V], want: &[V], what: &str) {
    let tol = match dtype {
        DType::F16 => 1e-2,
        DType::BF16 => 5e-2, // 8 significant bits, rounded at each step
        DType::C64 => 1e-5,
        _ => 0.0,
    };
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.0 - w.0).abs() <= tol * w.0.abs().max(1.0)
            && (g.1 - w.1).abs() <= tol * w.1.abs().max(1.0);
        assert!(ok, "{what}: element {i}: got {g:?}, want {w:?}");
    }
}

// --- helpers over one process's communicators ------------------------------------------

fn tensor(c: &Communicator, dtype: DType, len: usize) -> Tensor {
    let buf = c
        .device()
        .memory()
        .allocate((len * dtype.size()).max(1) as u64)
        .expect("allocate");
    Tensor::new(buf, 0, dtype, vec![len]).expect("tensor")
}

fn filled(c: &Communicator, dtype: DType, vals: &[V]) -> Tensor {
    let t = tensor(c, dtype, vals.len());
    t.buffer().write(0, &encode(dtype, vals)).unwrap();
    t
}

fn read(t: &Tensor) -> Vec<V> {
    let mut b = vec![0u8; t.nbytes() as usize];
    t.buffer().read(t.offset(), &mut b).unwrap();
    decode(t.dtype(), &b)
}

fn stream(c: &Communicator) -> Stream {
    c.device().default_stream().expect("stream")
}

fn sync(cs: &[Communicator]) -> Vec<runtime_core::Result<()>> {
    cs.iter()
        .map(|c| stream(c).synchronize(Some(Duration::from_secs(60))))
        .collect()
}

fn inputs(dtype: DType, size: usize, len: usize, seed: usize) -> Vec<Vec<V>> {
    (0..size)
        .map(|r| (0..len).map(|i| value(dtype, r, i, seed)).collect())
        .collect()
}

/// Every operator (`premul_sum` stands for each rank's own: see [`rank_op`]).
fn ops() -> [ReduceOp; 9] {
    [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::BAnd,
        ReduceOp::BOr,
        ReduceOp::BXor,
        premul(0),
    ]
}

fn ops_for(dtype: DType) -> Vec<ReduceOp> {
    ops()
        .into_iter()
        .filter(|op| op.check_dtype(dtype).is_ok())
        .collect()
}

/// The operator rank `r` passes: its own factor for `premul_sum`.
fn rank_op(op: ReduceOp, r: usize) -> ReduceOp {
    match op {
        ReduceOp::PreMulSum(_) => premul(r),
        other => other,
    }
}

/// Every collective, every operator the dtype has, every root, in place and not, on one
/// process's communicators; the reference is computed from every rank's inputs.
fn run_everything(cs: &[Communicator], dtype: DType) {
    let size = cs[0].size();
    let len = 7;
    let mut seed = 0;
    for op in ops_for(dtype) {
        for in_place in [false, true] {
            seed += 1;
            let xs = inputs(dtype, size, len, seed);
            let sends: Vec<Tensor> = cs.iter().map(|c| filled(c, dtype, &xs[c.rank()])).collect();
            let recvs: Vec<Tensor> = if in_place {
                sends.clone()
            } else {
                cs.iter().map(|c| tensor(c, dtype, len)).collect()
            };
            for ((c, s), r) in cs.iter().zip(&sends).zip(&recvs) {
                c.all_reduce(s, r, rank_op(op, c.rank()), &stream(c))
                    .unwrap();
            }
            assert!(sync(cs).iter().all(Result::is_ok));
            let want: Vec<V> = (0..len)
                .map(|i| {
                    reduce_ref(
                        dtype,
                        op,
                        &xs.iter().map(|x| x[i]).collect::<Vec<_>>(),
                        size,
                    )
                })
                .collect();
            for r in &recvs {
                close(
                    dtype,
                    &read(r),
                    &want,
                    &format!("all_reduce {op:?} {dtype:?}"),
                );
            }
        }
        // reduce to every root, in place at the root (the root's recv is its send)
        for root in 0..size {
            seed += 1;
            let xs = inputs(dtype, size, len, seed);
            let sends: Vec<Tensor> = cs.iter().map(|c| filled(c, dtype, &xs[c.rank()])).collect();
            for (c, s) in cs.iter().zip(&sends) {
                let recv = (c.rank() == root).then_some(s);
                c.reduce(s, recv, root, rank_op(op, c.rank()), &stream(c))
                    .unwrap();
            }
            assert!(sync(cs).iter().all(Result::is_ok));
            let want: Vec<V> = (0..len)
                .map(|i| {
                    reduce_ref(
                        dtype,
                        op,
                        &xs.iter().map(|x| x[i]).collect::<Vec<_>>(),
                        size,
                    )
                })
                .collect();
            for (c, s) in cs.iter().zip(&sends) {
                if c.rank() == root {
                    close(
                        dtype,
                        &read(s),
                        &want,
                        &format!("in-place reduce {op:?} to {root}"),
                    );
                } else {
                    close(dtype, &read(s), &xs[c.rank()], "a non-root's send is kept");
                }
            }
        }
        // reduce_scatter, out of place and with recv as block `rank` of send
        for in_place in [false, true] {
            seed += 1;
            let xs = inputs(dtype, size, len * size, seed);
            let sends: Vec<Tensor> = cs.iter().map(|c| filled(c, dtype, &xs[c.rank()])).collect();
            let recvs: Vec<Tensor> = cs
                .iter()
                .zip(&sends)
                .map(|(c, s)| {
                    if in_place {
                        let at = (c.rank() * len * dtype.size()) as u64;
                        let v = s.buffer().view(at, (len * dtype.size()) as u64).unwrap();
                        Tensor::new(v, 0, dtype, vec![len]).unwrap()
                    } else {
                        tensor(c, dtype, len)
                    }
                })
                .collect();
            for ((c, s), r) in cs.iter().zip(&sends).zip(&recvs) {
                c.reduce_scatter(s, r, rank_op(op, c.rank()), &stream(c))
                    .unwrap();
            }
            assert!(sync(cs).iter().all(Result::is_ok));
            for (c, r) in cs.iter().zip(&recvs) {
                let want: Vec<V> = (0..len)
                    .map(|i| {
                        let col: Vec<V> = xs.iter().map(|x| x[c.rank() * len + i]).collect();
                        reduce_ref(dtype, op, &col, size)
                    })
                    .collect();
                close(
                    dtype,
                    &read(r),
                    &want,
                    &format!("reduce_scatter {op:?} in place {in_place}"),
                );
            }
        }
    }
    // broadcast from every root
    for root in 0..size {
        seed += 1;
        let xs = inputs(dtype, size, len, seed);
        let bufs: Vec<Tensor> = cs.iter().map(|c| filled(c, dtype, &xs[c.rank()])).collect();
        for (c, b) in cs.iter().zip(&bufs) {
            c.broadcast(b, root, &stream(c)).unwrap();
        }
        assert!(sync(cs).iter().all(Result::is_ok));
        for b in &bufs {
            close(
                dtype,
                &read(b),
                &xs[root],
                &format!("broadcast from {root}"),
            );
        }
    }
    // all_gather, out of place and in place (send is block `rank` of recv, a view)
    for in_place in [false, true] {
        seed += 1;
        let xs = inputs(dtype, size, len, seed);
        let recvs: Vec<Tensor> = cs.iter().map(|c| tensor(c, dtype, len * size)).collect();
        let sends: Vec<Tensor> = cs
            .iter()
            .zip(&recvs)
            .map(|(c, r)| {
                if in_place {
                    let at = (c.rank() * len * dtype.size()) as u64;
                    let v = r.buffer().view(at, (len * dtype.size()) as u64).unwrap();
                    let t = Tensor::new(v, 0, dtype, vec![len]).unwrap();
                    t.buffer().write(0, &encode(dtype, &xs[c.rank()])).unwrap();
                    t
                } else {
                    filled(c, dtype, &xs[c.rank()])
                }
            })
            .collect();
        for ((c, s), r) in cs.iter().zip(&sends).zip(&recvs) {
            c.all_gather(s, r, &stream(c)).unwrap();
        }
        assert!(sync(cs).iter().all(Result::is_ok));
        let want: Vec<V> = xs.concat();
        for r in &recvs {
            close(
                dtype,
                &read(r),
                &want,
                &format!("all_gather in place {in_place}"),
            );
        }
    }
    // all_to_all
    seed += 1;
    let xs = inputs(dtype, size, len * size, seed);
    let sends: Vec<Tensor> = cs.iter().map(|c| filled(c, dtype, &xs[c.rank()])).collect();
    let recvs: Vec<Tensor> = cs.iter().map(|c| tensor(c, dtype, len * size)).collect();
    for ((c, s), r) in cs.iter().zip(&sends).zip(&recvs) {
        c.all_to_all(s, r, &stream(c)).unwrap();
    }
    assert!(sync(cs).iter().all(Result::is_ok));
    for (c, r) in cs.iter().zip(&recvs) {
        let q = c.rank();
        let want: Vec<V> = (0..size)
            .flat_map(|src| xs[src][q * len..(q + 1) * len].to_vec())
            .collect();
        close(dtype, &read(r), &want, "all_to_all");
    }
    // send/recv around the ring (across processes and within), and to itself
    seed += 1;
    let xs = inputs(dtype, size, len, seed);
    let mut pairs = Vec::new();
    for c in cs {
        let r = c.rank();
        let send_s = Stream::new(c.device(), 0).unwrap();
        let recv_s = Stream::new(c.device(), 0).unwrap();
        let out = filled(c, dtype, &xs[r]);
        let got = tensor(c, dtype, len);
        c.send(&out, (r + 1) % size, &send_s).unwrap();
        c.recv(&got, (r + size - 1) % size, &recv_s).unwrap();
        let own = tensor(c, dtype, len);
        c.send(&out, r, &send_s).unwrap();
        c.recv(&own, r, &recv_s).unwrap();
        pairs.push((r, got, own, send_s, recv_s));
    }
    for (r, got, own, send_s, recv_s) in &pairs {
        send_s.synchronize(Some(Duration::from_secs(60))).unwrap();
        recv_s.synchronize(Some(Duration::from_secs(60))).unwrap();
        close(dtype, &read(got), &xs[(r + size - 1) % size], "ring");
        close(dtype, &read(own), &xs[*r], "send to self");
    }
    for c in cs {
        c.barrier(&stream(c)).unwrap();
    }
    assert!(sync(cs).iter().all(Result::is_ok));
}

/// A view of `len` elements at element `at` of `t`.
fn block(t: &Tensor, at: usize, len: usize) -> Tensor {
    let esz = t.dtype().size();
    let v = t
        .buffer()
        .view(t.offset() + (at * esz) as u64, (len * esz) as u64)
        .unwrap();
    Tensor::new(v, 0, t.dtype(), vec![len]).unwrap()
}

/// The shapes of the second round (issue 25): out-of-place broadcast, gather, scatter,
/// per-rank counts (all_gatherv, reduce_scatterv, all_to_allv, counts of 0 included),
/// all_reduce_coalesced; every root, in place where the call allows it.
fn run_new_shapes(cs: &[Communicator], dtype: DType) {
    let size = cs[0].size();
    // Not a multiple of 5, the period of `value` in the element index: blocks differ.
    let len = 6;
    let mut seed = 1000;
    // out-of-place broadcast from every root: the root's send to every recv, its own too
    for root in 0..size {
        seed += 1;
        let xs = inputs(dtype, size, len, seed);
        let sends: Vec<Tensor> = cs.iter().map(|c| filled(c, dtype, &xs[c.rank()])).collect();
        let recvs: Vec<Tensor> = cs.iter().map(|c| tensor(c, dtype, len)).collect();
        for ((c, s), r) in cs.iter().zip(&sends).zip(&recvs) {
            let send = (c.rank() == root).then_some(s);
            c.broadcast_from(send, r, root, &stream(c)).unwrap();
        }
        assert!(sync(cs).iter().all(Result::is_ok));
        for ((c, s), r) in cs.iter().zip(&sends).zip(&recvs) {
            close(
                dtype,
                &read(r),
                &xs[root],
                &format!("broadcast_from {root}"),
            );
            close(dtype, &read(s), &xs[c.rank()], "a send is kept");
        }
    }
    // gather to every root, in place at the root (its send is its block of recv)
    for root in 0..size {
        for in_place in [false, true] {
            seed += 1;
            let xs = inputs(dtype, size, len, seed);
            let mut roots_recv = None;
            for c in cs {
                let (send, recv) = if c.rank() == root {
                    let recv = tensor(c, dtype, len * size);
                    let send = if in_place {
                        block(&recv, root * len, len)
                    } else {
                        tensor(c, dtype, len)
                    };
                    send.buffer()
                        .write(send.offset(), &encode(dtype, &xs[root]))
                        .unwrap();
                    roots_recv = Some(recv.clone());
                    (send, Some(recv))
                } else {
                    (filled(c, dtype, &xs[c.rank()]), None)
                };
                c.gather(&send, recv.as_ref(), root, &stream(c)).unwrap();
            }
            assert!(sync(cs).iter().all(Result::is_ok));
            if let Some(r) = roots_recv {
                close(dtype, &read(&r), &xs.concat(), &format!("gather to {root}"));
            }
        }
    }
    // scatter from every root, in place at the root (its recv is its block of send)
    for root in 0..size {
        for in_place in [false, true] {
            seed += 1;
            let all = inputs(dtype, 1, len * size, seed).remove(0);
            let mut recvs = Vec::new();
            for c in cs {
                let (send, recv) = if c.rank() == root {
                    let send = filled(c, dtype, &all);
                    let recv = if in_place {
                        block(&send, root * len, len)
                    } else {
                        tensor(c, dtype, len)
                    };
                    (Some(send), recv)
                } else {
                    (None, tensor(c, dtype, len))
                };
                c.scatter(send.as_ref(), &recv, root, &stream(c)).unwrap();
                recvs.push(recv);
            }
            assert!(sync(cs).iter().all(Result::is_ok));
            for (c, r) in cs.iter().zip(&recvs) {
                let q = c.rank();
                close(
                    dtype,
                    &read(r),
                    &all[q * len..(q + 1) * len],
                    &format!("scatter from {root}"),
                );
            }
        }
    }
    // all_gatherv with uneven counts (rank 0 contributes none), in place and not
    let counts: Vec<usize> = (0..size).map(|q| q % 3).collect();
    let displ: Vec<usize> = counts
        .iter()
        .scan(0, |a, &c| {
            let d = *a;
            *a += c;
            Some(d)
        })
        .collect();
    let total: usize = counts.iter().sum();
    for in_place in [false, true] {
        seed += 1;
        let xs = inputs(dtype, size, 3, seed);
        let want: Vec<V> = (0..size)
            .flat_map(|q| xs[q][..counts[q]].to_vec())
            .collect();
        let recvs: Vec<Tensor> = cs.iter().map(|c| tensor(c, dtype, total)).collect();
        for (c, r) in cs.iter().zip(&recvs) {
            let q = c.rank();
            let send = if in_place {
                block(r, displ[q], counts[q])
            } else {
                tensor(c, dtype, counts[q])
            };
            send.buffer()
                .write(send.offset(), &encode(dtype, &xs[q][..counts[q]]))
                .unwrap();
            c.all_gatherv(&send, r, &counts, &stream(c)).unwrap();
        }
        assert!(sync(cs).iter().all(Result::is_ok));
        for r in &recvs {
            close(
                dtype,
                &read(r),
                &want,
                &format!("all_gatherv in place {in_place}"),
            );
        }
    }
    // reduce_scatterv with every operator, in place and not
    for op in ops_for(dtype) {
        for in_place in [false, true] {
            seed += 1;
            let xs = inputs(dtype, size, total, seed);
            let sends: Vec<Tensor> = cs.iter().map(|c| filled(c, dtype, &xs[c.rank()])).collect();
            let recvs: Vec<Tensor> = cs
                .iter()
                .zip(&sends)
                .map(|(c, s)| {
                    let q = c.rank();
                    if in_place {
                        block(s, displ[q], counts[q])
                    } else {
                        tensor(c, dtype, counts[q])
                    }
                })
                .collect();
            for ((c, s), r) in cs.iter().zip(&sends).zip(&recvs) {
                c.reduce_scatterv(s, r, &counts, rank_op(op, c.rank()), &stream(c))
                    .unwrap();
            }
            assert!(sync(cs).iter().all(Result::is_ok));
            for (c, r) in cs.iter().zip(&recvs) {
                let q = c.rank();
                let want: Vec<V> = (displ[q]..displ[q] + counts[q])
                    .map(|i| {
                        let col: Vec<V> = xs.iter().map(|x| x[i]).collect();
                        reduce_ref(dtype, op, &col, size)
                    })
                    .collect();
                close(dtype, &read(r), &want, &format!("reduce_scatterv {op:?}"));
            }
        }
    }
    // all_to_allv: rank a sends (a + 2b) % 4 elements to rank b
    let sc = |a: usize, b: usize| (a + 2 * b) % 4;
    seed += 1;
    let xs = inputs(dtype, size, 4 * size, seed);
    let mut recvs = Vec::new();
    for c in cs {
        let a = c.rank();
        let send_counts: Vec<usize> = (0..size).map(|b| sc(a, b)).collect();
        let recv_counts: Vec<usize> = (0..size).map(|b| sc(b, a)).collect();
        let st: usize = send_counts.iter().sum();
        let send = filled(c, dtype, &xs[a][..st]);
        let recv = tensor(c, dtype, recv_counts.iter().sum());
        c.all_to_allv(&send, &send_counts, &recv, &recv_counts, &stream(c))
            .unwrap();
        recvs.push(recv);
    }
    assert!(sync(cs).iter().all(Result::is_ok));
    for (c, r) in cs.iter().zip(&recvs) {
        let b = c.rank();
        let want: Vec<V> = (0..size)
            .flat_map(|a| {
                let from: usize = (0..b).map(|j| sc(a, j)).sum();
                xs[a][from..from + sc(a, b)].to_vec()
            })
            .collect();
        close(dtype, &read(r), &want, "all_to_allv");
    }
    // all_reduce_coalesced: three buffers (one empty), the second in place
    let lens = [len, 0, 3];
    for op in ops_for(dtype) {
        seed += 1;
        let xs: Vec<Vec<Vec<V>>> = lens
            .iter()
            .map(|&l| inputs(dtype, size, l, seed + l))
            .collect();
        let mut outs = Vec::new();
        for c in cs {
            let sends: Vec<Tensor> = (0..3).map(|i| filled(c, dtype, &xs[i][c.rank()])).collect();
            let recvs: Vec<Tensor> = (0..3)
                .map(|i| {
                    if i == 1 {
                        sends[1].clone()
                    } else {
                        tensor(c, dtype, lens[i])
                    }
                })
                .collect();
            c.all_reduce_coalesced(&sends, &recvs, rank_op(op, c.rank()), &stream(c))
                .unwrap();
            outs.push(recvs);
        }
        assert!(sync(cs).iter().all(Result::is_ok));
        for recvs in &outs {
            for (i, r) in recvs.iter().enumerate() {
                let want: Vec<V> = (0..lens[i])
                    .map(|e| {
                        let col: Vec<V> = xs[i].iter().map(|x| x[e]).collect();
                        reduce_ref(dtype, op, &col, size)
                    })
                    .collect();
                close(
                    dtype,
                    &read(r),
                    &want,
                    &format!("all_reduce_coalesced {op:?} #{i}"),
                );
            }
        }
    }
}

/// Three processes driving 2, 1 and 2 devices (5 ranks): every collective and dtype.
fn every_collective(native: bool, dtypes: &[DType]) {
    let _serial = serial();
    let layout: &[&[usize]] = &[&[0, 1], &[2], &[3, 4]];
    let procs = world(layout, native, Duration::from_secs(60), None);
    let ranks: Vec<Vec<usize>> = procs
        .iter()
        .map(|cs| cs.iter().map(Communicator::rank).collect())
        .collect();
    assert_eq!(ranks, vec![vec![0, 1], vec![2], vec![3, 4]]);
    assert!(procs.iter().flatten().all(|c| c.size() == 5));
    assert_eq!(procs[2][1].process(), (2, 3));
    std::thread::scope(|s| {
        for cs in &procs {
            s.spawn(move || {
                for &dtype in dtypes {
                    run_everything(cs, dtype);
                    run_new_shapes(cs, dtype);
                }
            });
        }
    });
}

#[test]
fn every_collective_across_processes_with_the_transport_reducing() {
    every_collective(true, &[DType::I64, DType::F64]);
}

/// The transport reduces nothing: the core gathers and reduces (float16, bfloat16, complex,
/// booleans: what MPI cannot reduce), and moves every dtype as bytes.
#[test]
fn every_collective_and_dtype_across_processes_with_the_core_reducing() {
    every_collective(
        false,
        &[
            DType::I64,
            DType::F16,
            DType::BF16,
            DType::C64,
            DType::Bool,
            DType::U8,
        ],
    );
}

/// Issue 22: an in-place reduce whose root is not its process's first local rank gave 9
/// where 10 was right (the local reduction overwrote the root's buffer before reading it).
/// `mpiexec -n 2` with 2 devices each: values 1, 2, 3, 4.
#[test]
fn in_place_reduce_at_a_root_that_is_not_the_first_local_rank() {
    let _serial = serial();
    let procs = world(&[&[0, 1], &[2, 3]], true, Duration::from_secs(60), None);
    std::thread::scope(|s| {
        for cs in &procs {
            s.spawn(move || {
                for root in 0..4 {
                    let bufs: Vec<Tensor> = cs
                        .iter()
                        .map(|c| filled(c, DType::I64, &[(c.rank() as f64 + 1.0, 0.0)]))
                        .collect();
                    for (c, b) in cs.iter().zip(&bufs) {
                        let recv = (c.rank() == root).then_some(b);
                        c.reduce(b, recv, root, ReduceOp::Sum, &stream(c)).unwrap();
                    }
                    assert!(sync(cs).iter().all(Result::is_ok));
                    for (c, b) in cs.iter().zip(&bufs) {
                        let want = if c.rank() == root {
                            10.0
                        } else {
                            c.rank() as f64 + 1.0
                        };
                        assert_eq!(read(b), vec![(want, 0.0)], "root {root}, rank {}", c.rank());
                    }
                }
            });
        }
    });
}

fn payload(r: &runtime_core::Result<()>) -> Option<Error> {
    match r {
        Err(Error::Stream(StreamError::Kernel(k))) => k
            .payload
            .as_ref()
            .and_then(|p| p.downcast_ref::<Error>())
            .cloned(),
        _ => None,
    }
}

/// Issue 22: a rendezvous timeout said "waited for local rank(s) []" when a remote process
/// was missing. A missing process is named (with its ranks), a missing local rank too, and
/// the communicator is aborted afterwards (its peers can no longer match calls).
#[test]
fn timeouts_name_the_missing_processes_and_ranks() {
    let _serial = serial();
    let procs = world(&[&[0, 1], &[2]], true, Duration::from_millis(300), None);
    // Process 1 never joins: both local ranks of process 0 arrive, the exchange times out.
    let cs = &procs[0];
    let ts: Vec<Tensor> = cs
        .iter()
        .map(|c| filled(c, DType::I64, &[(1.0, 0.0)]))
        .collect();
    for (c, t) in cs.iter().zip(&ts) {
        c.all_reduce(t, t, ReduceOp::Sum, &stream(c)).unwrap();
    }
    let rs = sync(cs);
    for r in &rs {
        let e = payload(r).unwrap_or_else(|| panic!("a collective failure: {r:?}"));
        assert!(
            matches!(e, Error::Stream(StreamError::Timeout { .. })),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("waiting for one or more of processes [1] (ranks [2])"),
            "{msg}"
        );
    }
    assert!(cs[0].is_aborted());
    let e = cs[1]
        .all_reduce(&ts[1], &ts[1], ReduceOp::Sum, &stream(&cs[1]))
        .expect_err("aborted");
    assert!(e.to_string().contains("aborted"), "{e}");

    // A local rank that never arrives is named as a rank of this process.
    let procs = world(&[&[0, 1], &[2]], true, Duration::from_millis(300), None);
    let c = &procs[0][0];
    let t = filled(c, DType::I64, &[(1.0, 0.0)]);
    c.all_reduce(&t, &t, ReduceOp::Sum, &stream(c)).unwrap();
    let r = stream(c).synchronize(Some(Duration::from_secs(30)));
    let msg = payload(&r).expect("timeout").to_string();
    assert!(
        msg.contains("waiting for ranks [1] of this process"),
        "{msg}"
    );
}

/// `abort` releases a step waiting for a peer process at once.
#[test]
fn abort_releases_a_step_waiting_for_another_process() {
    let _serial = serial();
    let procs = world(&[&[0], &[1]], true, Duration::from_secs(600), None);
    let c = &procs[0][0];
    let t = filled(c, DType::I64, &[(1.0, 0.0)]);
    c.all_reduce(&t, &t, ReduceOp::Sum, &stream(c)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    c.abort();
    let r = stream(c).synchronize(Some(Duration::from_secs(30)));
    assert!(r.expect_err("aborted").to_string().contains("aborted"));
    assert!(t0.elapsed() < Duration::from_secs(30));
}

/// A transport failure fails the collective with the transport's message and aborts the
/// communicator.
#[test]
fn a_transport_failure_fails_the_collective_and_aborts() {
    let _serial = serial();
    // Exchange 0 is connect's; the first collective's exchange fails.
    let procs = world(&[&[0], &[1]], true, Duration::from_secs(60), Some(1));
    std::thread::scope(|s| {
        for cs in &procs {
            s.spawn(move || {
                let c = &cs[0];
                let t = filled(c, DType::I64, &[(1.0, 0.0)]);
                c.all_reduce(&t, &t, ReduceOp::Sum, &stream(c)).unwrap();
                let r = stream(c).synchronize(Some(Duration::from_secs(30)));
                let e = payload(&r).expect("a transport failure");
                assert!(
                    e.to_string().contains("the loopback was told to fail"),
                    "{e}"
                );
                assert!(c.is_aborted());
            });
        }
    });
}

/// Connecting: a process index out of range is refused; a process that never connects makes
/// the others time out.
#[test]
fn connect_checks_its_arguments_and_times_out() {
    let _serial = serial();
    let r = rt();
    let fabric = Fabric::new(2);
    let transport = Arc::new(Loopback {
        fabric,
        process: 0,
        next: Mutex::new(0),
        native: true,
        fail_after: None,
        splits: Mutex::new(HashMap::new()),
    });
    let e = comm::connect(
        &r.devices()[..1],
        2,
        2,
        transport.clone(),
        Duration::from_secs(1),
    )
    .expect_err("process 2 of 2");
    assert!(e.to_string().contains("0 to 1"), "{e}");
    let e = comm::connect(
        &r.devices()[..1],
        0,
        2,
        transport,
        Duration::from_millis(200),
    )
    .unwrap()
    .wait()
    .expect_err("process 1 never connects");
    assert!(
        matches!(e, Error::Stream(StreamError::Timeout { .. })),
        "{e}"
    );
}

/// `split` across processes: every rank's color and key are shared, a color spanning
/// processes gets a transport of its own (`Transport::split`), one within a process none;
/// the processes of a new communicator are ordered by their first rank in key order. Then
/// every collective runs on the new communicators.
#[test]
fn split_across_processes() {
    let _serial = serial();
    let layout: &[&[usize]] = &[&[0, 1], &[2], &[3, 4]];
    let procs = world(layout, false, Duration::from_secs(60), None);
    let subs: Vec<Vec<Option<Communicator>>> = std::thread::scope(|s| {
        let hs: Vec<_> = procs
            .iter()
            .map(|cs| {
                s.spawn(move || {
                    // Ranks 0, 2, 4 (color 0) and 1, 3 (color 1), keyed by -rank.
                    let forming: Vec<_> = cs
                        .iter()
                        .map(|c| {
                            c.split(Some((c.rank() % 2) as u32), -(c.rank() as i64))
                                .unwrap()
                        })
                        .collect();
                    forming
                        .into_iter()
                        .map(|f| f.wait().unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // color 0: rank 4 (process 2) -> 0, rank 2 (process 1) -> 1, rank 0 (process 0) -> 2;
    // color 1: rank 3 (process 2) -> 0, rank 1 (process 0) -> 1.
    let new_rank = [2, 1, 1, 0, 0];
    let new_size = [3, 2, 3, 2, 3];
    for (p, cs) in procs.iter().enumerate() {
        for (c, sub) in cs.iter().zip(&subs[p]) {
            let sub = sub.as_ref().expect("every rank has a color");
            let r = c.rank();
            assert_eq!(
                (sub.rank(), sub.size()),
                (new_rank[r], new_size[r]),
                "rank {r}"
            );
            assert_eq!(sub.device().index(), c.device().index());
        }
    }
    std::thread::scope(|s| {
        for subs in &subs {
            s.spawn(move || {
                let cs: Vec<Communicator> = subs.iter().flatten().cloned().collect();
                // Each process's new communicators, by color: run everything on each color's.
                for color in 0..2 {
                    let mine: Vec<Communicator> = cs
                        .iter()
                        .filter(|c| c.device().index() % 2 == color)
                        .cloned()
                        .collect();
                    if !mine.is_empty() {
                        run_everything(&mine, DType::I64);
                        run_new_shapes(&mine, DType::I64);
                    }
                }
            });
        }
    });
    // A rank with no color joins none; process 1 (rank 2) has no new communicator.
    let subs: Vec<Vec<Option<Communicator>>> = std::thread::scope(|s| {
        let hs: Vec<_> = procs
            .iter()
            .map(|cs| {
                s.spawn(move || {
                    let forming: Vec<_> = cs
                        .iter()
                        .map(|c| c.split((c.rank() != 2).then_some(7), 0).unwrap())
                        .collect();
                    forming
                        .into_iter()
                        .map(|f| f.wait().unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(subs[1][0].is_none());
    let ranks: Vec<usize> = subs
        .iter()
        .flatten()
        .flatten()
        .map(Communicator::rank)
        .collect();
    assert_eq!(ranks, vec![0, 1, 2, 3]);
}
