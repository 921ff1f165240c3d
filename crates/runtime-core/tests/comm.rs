//! Collectives (`comm`) against plain Rust reference results, for 1, 2, 3 and 8 ranks, sizes
//! that do not divide by the rank count, every reduction operator, in place and not; and the
//! failure paths: ranks that disagree, a rank that never joins (timeout), `abort`.
//!
//! The binary has its own runtime with 8 small devices (never shut down).

mod common;

use std::sync::Arc;
use std::time::Duration;

use runtime_core::comm::{self, Communicator, ReduceOp};
use runtime_core::config::ConfigBuilder;
use runtime_core::error::{Error, StreamError};
use runtime_core::kernel::{DType, Tensor};
use runtime_core::runtime::{self, Runtime};
use runtime_core::stream::Stream;

use common::Rng;

fn rt() -> Arc<Runtime> {
    runtime::init(&ConfigBuilder {
        device_count: Some(8),
        memory: Some("64MiB".into()),
        profile: None,
    })
    .expect("init the runtime")
}

/// The tests share the devices' default streams (and a stream error is reported to whoever
/// synchronises next), so they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn comms(n: usize, timeout: Duration) -> Vec<Communicator> {
    let r = rt();
    comm::init_all(&r.devices()[..n], timeout).expect("init_all")
}

fn tensor(c: &Communicator, dtype: DType, len: usize) -> Tensor {
    let buf = c
        .device()
        .memory()
        .allocate((len * dtype.size()) as u64)
        .expect("allocate");
    Tensor::new(buf, 0, dtype, vec![len]).expect("tensor")
}

fn i64s(c: &Communicator, v: &[i64]) -> Tensor {
    let t = tensor(c, DType::I64, v.len());
    t.write(v).expect("write");
    t
}

fn stream(c: &Communicator) -> Stream {
    c.device().default_stream().expect("stream")
}

fn sync_all(cs: &[Communicator]) -> Vec<runtime_core::Result<()>> {
    cs.iter()
        .map(|c| stream(c).synchronize(Some(Duration::from_secs(60))))
        .collect()
}

fn reduce_ref(op: ReduceOp, xs: &[i64], n: usize) -> i64 {
    let mut a = xs[0];
    for &x in &xs[1..] {
        a = match op {
            ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(x),
            ReduceOp::Prod => a.wrapping_mul(x),
            ReduceOp::Max => a.max(x),
            ReduceOp::Min => a.min(x),
        };
    }
    if op == ReduceOp::Avg {
        a / n as i64
    } else {
        a
    }
}

fn inputs(n: usize, len: usize, seed: u64) -> Vec<Vec<i64>> {
    let mut rng = Rng(seed);
    (0..n)
        .map(|_| {
            (0..len)
                .map(|_| (rng.next() % 2001) as i64 - 1000)
                .collect()
        })
        .collect()
}

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
];

#[test]
fn all_reduce_matches_reference_for_every_op_and_rank_count() {
    let _serial = serial();
    for n in [1, 2, 3, 8] {
        let cs = comms(n, Duration::from_secs(60));
        for len in [0, 1, 7, 1001, 20_011] {
            for op in OPS {
                for in_place in [false, true] {
                    let xs = inputs(n, len, (n * 1000 + len) as u64);
                    let sends: Vec<Tensor> = cs.iter().zip(&xs).map(|(c, x)| i64s(c, x)).collect();
                    let recvs: Vec<Tensor> = if in_place {
                        sends.clone()
                    } else {
                        cs.iter().map(|c| tensor(c, DType::I64, len)).collect()
                    };
                    for (i, c) in cs.iter().enumerate() {
                        c.all_reduce(&sends[i], &recvs[i], op, &stream(c)).unwrap();
                    }
                    assert!(sync_all(&cs).iter().all(Result::is_ok));
                    let want: Vec<i64> = (0..len)
                        .map(|j| reduce_ref(op, &xs.iter().map(|x| x[j]).collect::<Vec<_>>(), n))
                        .collect();
                    for r in &recvs {
                        assert_eq!(r.to_vec::<i64>().unwrap(), want, "n={n} len={len} {op:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn float_all_reduce_sums_every_dtype() {
    let _serial = serial();
    let cs = comms(3, Duration::from_secs(60));
    for dtype in [DType::F32, DType::F64, DType::I32, DType::U8] {
        let len = 1000;
        let ts: Vec<Tensor> = cs.iter().map(|c| tensor(c, dtype, len)).collect();
        for (r, t) in ts.iter().enumerate() {
            match dtype {
                DType::F32 => t.write(&vec![r as f32 + 0.5; len]).unwrap(),
                DType::F64 => t.write(&vec![r as f64 + 0.5; len]).unwrap(),
                DType::I32 => t.write(&vec![r as i32 + 1; len]).unwrap(),
                _ => t.write(&vec![r as u8 + 100; len]).unwrap(),
            }
        }
        for (c, t) in cs.iter().zip(&ts) {
            c.all_reduce(t, t, ReduceOp::Sum, &stream(c)).unwrap();
        }
        assert!(sync_all(&cs).iter().all(Result::is_ok));
        for t in &ts {
            match dtype {
                DType::F32 => assert_eq!(t.to_vec::<f32>().unwrap(), vec![4.5f32; len]),
                DType::F64 => assert_eq!(t.to_vec::<f64>().unwrap(), vec![4.5f64; len]),
                DType::I32 => assert_eq!(t.to_vec::<i32>().unwrap(), vec![6i32; len]),
                // 100 + 101 + 102 wraps to 47.
                _ => assert_eq!(t.to_vec::<u8>().unwrap(), vec![47u8; len]),
            }
        }
    }
}

#[test]
fn broadcast_reduce_gather_scatter_all_to_all() {
    let _serial = serial();
    for n in [1, 2, 3, 8] {
        let cs = comms(n, Duration::from_secs(60));
        for len in [1, 5, 4099] {
            let xs = inputs(n, len, 7 + len as u64);
            let root = n - 1;
            // broadcast
            let bufs: Vec<Tensor> = cs.iter().zip(&xs).map(|(c, x)| i64s(c, x)).collect();
            for (c, b) in cs.iter().zip(&bufs) {
                c.broadcast(b, root, &stream(c)).unwrap();
            }
            assert!(sync_all(&cs).iter().all(Result::is_ok));
            for b in &bufs {
                assert_eq!(b.to_vec::<i64>().unwrap(), xs[root]);
            }
            // reduce (recv only on the root)
            let sends: Vec<Tensor> = cs.iter().zip(&xs).map(|(c, x)| i64s(c, x)).collect();
            let out = tensor(&cs[root], DType::I64, len);
            for (r, c) in cs.iter().enumerate() {
                let recv = (r == root).then_some(&out);
                c.reduce(&sends[r], recv, root, ReduceOp::Max, &stream(c))
                    .unwrap();
            }
            assert!(sync_all(&cs).iter().all(Result::is_ok));
            let want: Vec<i64> = (0..len)
                .map(|j| xs.iter().map(|x| x[j]).max().unwrap())
                .collect();
            assert_eq!(out.to_vec::<i64>().unwrap(), want);
            // all_gather
            let recvs: Vec<Tensor> = cs.iter().map(|c| tensor(c, DType::I64, n * len)).collect();
            for (r, c) in cs.iter().enumerate() {
                c.all_gather(&sends[r], &recvs[r], &stream(c)).unwrap();
            }
            assert!(sync_all(&cs).iter().all(Result::is_ok));
            let cat: Vec<i64> = xs.concat();
            for r in &recvs {
                assert_eq!(r.to_vec::<i64>().unwrap(), cat);
            }
            // reduce_scatter over the gathered data: block r of the sum of n copies.
            let outs: Vec<Tensor> = cs.iter().map(|c| tensor(c, DType::I64, len)).collect();
            for (r, c) in cs.iter().enumerate() {
                c.reduce_scatter(&recvs[r], &outs[r], ReduceOp::Sum, &stream(c))
                    .unwrap();
            }
            assert!(sync_all(&cs).iter().all(Result::is_ok));
            for (r, o) in outs.iter().enumerate() {
                let want: Vec<i64> = xs[r].iter().map(|v| v * n as i64).collect();
                assert_eq!(o.to_vec::<i64>().unwrap(), want);
            }
            // all_to_all: block q of rank r's input lands in block r of rank q's output.
            let ins: Vec<Tensor> = cs
                .iter()
                .enumerate()
                .map(|(r, c)| {
                    i64s(
                        c,
                        &(0..n * len)
                            .map(|i| (r * 1_000_000 + i) as i64)
                            .collect::<Vec<_>>(),
                    )
                })
                .collect();
            let outs: Vec<Tensor> = cs.iter().map(|c| tensor(c, DType::I64, n * len)).collect();
            for (r, c) in cs.iter().enumerate() {
                c.all_to_all(&ins[r], &outs[r], &stream(c)).unwrap();
            }
            assert!(sync_all(&cs).iter().all(Result::is_ok));
            for (q, o) in outs.iter().enumerate() {
                let got = o.to_vec::<i64>().unwrap();
                for r in 0..n {
                    for i in 0..len {
                        assert_eq!(got[r * len + i], (r * 1_000_000 + q * len + i) as i64);
                    }
                }
            }
        }
    }
}

#[test]
fn in_place_gather_and_scatter_use_the_rank_block() {
    let _serial = serial();
    let n = 3;
    let cs = comms(n, Duration::from_secs(60));
    let len = 11;
    let bufs: Vec<Tensor> = cs
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let mut v = vec![-1i64; n * len];
            v[r * len..(r + 1) * len].fill(r as i64 + 1);
            i64s(c, &v)
        })
        .collect();
    let blocks: Vec<Tensor> = bufs
        .iter()
        .enumerate()
        .map(|(r, b)| {
            Tensor::new(
                b.buffer().clone(),
                (r * len * 8) as u64,
                DType::I64,
                vec![len],
            )
            .unwrap()
        })
        .collect();
    for (r, c) in cs.iter().enumerate() {
        c.all_gather(&blocks[r], &bufs[r], &stream(c)).unwrap();
    }
    assert!(sync_all(&cs).iter().all(Result::is_ok));
    let want: Vec<i64> = (0..n * len).map(|i| (i / len) as i64 + 1).collect();
    for b in &bufs {
        assert_eq!(b.to_vec::<i64>().unwrap(), want);
    }
    for (r, c) in cs.iter().enumerate() {
        c.reduce_scatter(&bufs[r], &blocks[r], ReduceOp::Sum, &stream(c))
            .unwrap();
    }
    assert!(sync_all(&cs).iter().all(Result::is_ok));
    for (r, b) in blocks.iter().enumerate() {
        assert_eq!(b.to_vec::<i64>().unwrap(), vec![3 * (r as i64 + 1); len]);
    }
    // A partial overlap is refused at once.
    let shifted = Tensor::new(bufs[0].buffer().clone(), 8, DType::I64, vec![len]).unwrap();
    let whole = Tensor::new(bufs[0].buffer().clone(), 0, DType::I64, vec![len]).unwrap();
    assert!(matches!(
        cs[0].all_reduce(&whole, &shifted, ReduceOp::Sum, &stream(&cs[0])),
        Err(Error::Arg(_))
    ));
}

#[test]
fn send_recv_pairs_do_not_deadlock() {
    let _serial = serial();
    let cs = comms(2, Duration::from_secs(60));
    let a = i64s(&cs[0], &[1, 2, 3]);
    let b = i64s(&cs[1], &[4, 5, 6]);
    let ra = tensor(&cs[0], DType::I64, 3);
    let rb = tensor(&cs[1], DType::I64, 3);
    // Both ranks send first, then receive.
    cs[0].send(&a, 1, &stream(&cs[0])).unwrap();
    cs[0].recv(&ra, 1, &stream(&cs[0])).unwrap();
    cs[1].send(&b, 0, &stream(&cs[1])).unwrap();
    cs[1].recv(&rb, 0, &stream(&cs[1])).unwrap();
    assert!(sync_all(&cs).iter().all(Result::is_ok));
    assert_eq!(ra.to_vec::<i64>().unwrap(), vec![4, 5, 6]);
    assert_eq!(rb.to_vec::<i64>().unwrap(), vec![1, 2, 3]);
}

fn is_timeout(r: &runtime_core::Result<()>) -> bool {
    match r {
        Err(Error::Stream(StreamError::Kernel(k))) => k
            .payload
            .as_ref()
            .and_then(|p| p.downcast_ref::<Error>())
            .is_some_and(|e| matches!(e, Error::Stream(StreamError::Timeout { .. }))),
        _ => false,
    }
}

#[test]
fn mismatched_counts_fail_on_every_rank() {
    let _serial = serial();
    let cs = comms(2, Duration::from_secs(60));
    let a = tensor(&cs[0], DType::I64, 4);
    let b = tensor(&cs[1], DType::I64, 5);
    cs[0]
        .all_reduce(&a, &a, ReduceOp::Sum, &stream(&cs[0]))
        .unwrap();
    cs[1]
        .all_reduce(&b, &b, ReduceOp::Sum, &stream(&cs[1]))
        .unwrap();
    for r in sync_all(&cs) {
        let e = r.expect_err("mismatch fails");
        assert!(e.to_string().contains("different collectives"), "{e}");
    }
    // The communicator still works afterwards.
    let b = tensor(&cs[1], DType::I64, 4);
    cs[0]
        .all_reduce(&a, &a, ReduceOp::Sum, &stream(&cs[0]))
        .unwrap();
    cs[1]
        .all_reduce(&b, &b, ReduceOp::Sum, &stream(&cs[1]))
        .unwrap();
    assert!(sync_all(&cs).iter().all(Result::is_ok));
}

#[test]
fn a_missing_rank_times_out_and_abort_releases() {
    let _serial = serial();
    let cs = comms(2, Duration::from_millis(200));
    let a = tensor(&cs[0], DType::F32, 4);
    cs[0]
        .all_reduce(&a, &a, ReduceOp::Sum, &stream(&cs[0]))
        .unwrap();
    let r = stream(&cs[0]).synchronize(Some(Duration::from_secs(30)));
    assert!(is_timeout(&r), "{r:?}");

    let cs = comms(2, Duration::from_secs(600));
    let a = tensor(&cs[0], DType::F32, 4);
    cs[0].barrier(&stream(&cs[0])).unwrap();
    cs[0]
        .all_reduce(&a, &a, ReduceOp::Sum, &stream(&cs[0]))
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    cs[1].abort();
    let e = stream(&cs[0])
        .synchronize(Some(Duration::from_secs(30)))
        .expect_err("aborted");
    assert!(e.to_string().contains("aborted"), "{e}");
    assert!(cs[0].barrier(&stream(&cs[0])).is_err());
}

#[test]
fn captured_collectives_replay() {
    let _serial = serial();
    let cs = comms(2, Duration::from_secs(60));
    let ts: Vec<Tensor> = cs.iter().map(|c| i64s(c, &[1, 1])).collect();
    let streams: Vec<Stream> = cs
        .iter()
        .map(|c| Stream::new(c.device(), 0).unwrap())
        .collect();
    let graphs: Vec<_> = cs
        .iter()
        .zip(&ts)
        .zip(&streams)
        .map(|((c, t), s)| {
            s.begin_capture().unwrap();
            c.all_reduce(t, t, ReduceOp::Sum, s).unwrap();
            s.end_capture().unwrap()
        })
        .collect();
    for _ in 0..3 {
        for (g, s) in graphs.iter().zip(&streams) {
            s.launch_graph(g).unwrap();
        }
    }
    for s in &streams {
        s.synchronize(Some(Duration::from_secs(60))).unwrap();
    }
    for t in &ts {
        assert_eq!(t.to_vec::<i64>().unwrap(), vec![8, 8]);
    }
}

#[test]
fn bad_arguments_are_refused_at_once() {
    let _serial = serial();
    let cs = comms(2, Duration::from_secs(60));
    let r = rt();
    assert!(comm::init_all(&[], Duration::from_secs(1)).is_err());
    assert!(comm::init_all(
        &[r.devices()[0].clone(), r.devices()[0].clone()],
        Duration::from_secs(1)
    )
    .is_err());
    let a = tensor(&cs[0], DType::I64, 4);
    let f = tensor(&cs[0], DType::F32, 4);
    let other = tensor(&cs[1], DType::I64, 4);
    let s0 = stream(&cs[0]);
    assert!(cs[0].all_reduce(&a, &f, ReduceOp::Sum, &s0).is_err());
    assert!(cs[0]
        .all_reduce(&other, &other, ReduceOp::Sum, &s0)
        .is_err());
    assert!(cs[0]
        .all_reduce(&a, &a, ReduceOp::Sum, &stream(&cs[1]))
        .is_err());
    assert!(cs[0].broadcast(&a, 2, &s0).is_err());
    assert!(cs[0].all_gather(&a, &a, &s0).is_err());
    assert!(ReduceOp::parse("mean").is_err());
    cs[0].destroy();
    assert!(cs[0].barrier(&s0).is_err());
}

/// Issue 22: an in-place block made by slicing (a `Buffer::view`, as `buf[a:b]` and `buf + n`
/// make) was compared with its whole by view-relative offsets and refused as a partial
/// overlap, while the same block as a tensor offset of the whole buffer was accepted. Both
/// name the same bytes of one allocation, so both run in place.
#[test]
fn in_place_blocks_made_by_slicing_are_accepted() {
    let _serial = serial();
    let n = 3;
    let cs = comms(n, Duration::from_secs(60));
    let len = 5;
    let bufs: Vec<Tensor> = cs
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let mut v = vec![-1i64; n * len];
            v[r * len..(r + 1) * len].fill(r as i64 + 1);
            i64s(c, &v)
        })
        .collect();
    // Block r as a view of the allocation (slicing), and through pointer arithmetic.
    let sliced: Vec<Tensor> = bufs
        .iter()
        .enumerate()
        .map(|(r, b)| {
            let view = b
                .buffer()
                .view((r * len * 8) as u64, (len * 8) as u64)
                .unwrap();
            Tensor::new(view, 0, DType::I64, vec![len]).unwrap()
        })
        .collect();
    let shifted: Vec<Tensor> = bufs
        .iter()
        .enumerate()
        .map(|(r, b)| {
            let view = b.buffer().shifted((r * len * 8) as i64).unwrap();
            Tensor::new(view, 0, DType::I64, vec![len]).unwrap()
        })
        .collect();
    for (r, c) in cs.iter().enumerate() {
        c.all_gather(&sliced[r], &bufs[r], &stream(c)).unwrap();
    }
    assert!(sync_all(&cs).iter().all(Result::is_ok));
    let want: Vec<i64> = (0..n * len).map(|i| (i / len) as i64 + 1).collect();
    for b in &bufs {
        assert_eq!(b.to_vec::<i64>().unwrap(), want);
    }
    for (r, c) in cs.iter().enumerate() {
        c.reduce_scatter(&bufs[r], &shifted[r], ReduceOp::Sum, &stream(c))
            .unwrap();
    }
    assert!(sync_all(&cs).iter().all(Result::is_ok));
    for (r, b) in shifted.iter().enumerate() {
        assert_eq!(b.to_vec::<i64>().unwrap(), vec![3 * (r as i64 + 1); len]);
    }
    // A view one element off is a partial overlap, however it was made.
    let off = bufs[0].buffer().view(8, (len * 8) as u64).unwrap();
    let off = Tensor::new(off, 0, DType::I64, vec![len]).unwrap();
    let e = cs[0]
        .all_gather(&off, &bufs[0], &stream(&cs[0]))
        .expect_err("partial overlap");
    assert!(e.to_string().contains("partly overlap"), "{e}");
}

/// Issue 22: a direct collective, a graph replay containing one, then a direct one, issued
/// by ranks running at different speeds, deadlocked until the timeout: direct collectives
/// took their number when issued, captured ones when they ran. Rank 1's stream is held back
/// by a user event until everything is issued, so without launch-time numbering rank 0's
/// replay took number 2 and rank 1's number 1.
#[test]
fn graph_replays_take_their_numbers_at_launch_whatever_the_ranks_speed() {
    let _serial = serial();
    let cs = comms(2, Duration::from_secs(10));
    let ts: Vec<Tensor> = cs.iter().map(|c| i64s(c, &[1, 1])).collect();
    let streams: Vec<Stream> = cs
        .iter()
        .map(|c| Stream::new(c.device(), 0).unwrap())
        .collect();
    let graphs: Vec<_> = cs
        .iter()
        .zip(&ts)
        .zip(&streams)
        .map(|((c, t), s)| {
            s.begin_capture().unwrap();
            c.all_reduce(t, t, ReduceOp::Sum, s).unwrap();
            s.end_capture().unwrap()
        })
        .collect();
    let gate = runtime_core::event::Event::user();
    streams[1].wait_event(&gate).unwrap();
    // Rank 0: direct, replay, direct, all issued and free to run.
    cs[0]
        .all_reduce(&ts[0], &ts[0], ReduceOp::Sum, &streams[0])
        .unwrap();
    streams[0].launch_graph(&graphs[0]).unwrap();
    cs[0]
        .all_reduce(&ts[0], &ts[0], ReduceOp::Sum, &streams[0])
        .unwrap();
    // Rank 1: the same program, its stream held back until rank 0 is done issuing.
    cs[1]
        .all_reduce(&ts[1], &ts[1], ReduceOp::Sum, &streams[1])
        .unwrap();
    streams[1].launch_graph(&graphs[1]).unwrap();
    gate.set().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    cs[1]
        .all_reduce(&ts[1], &ts[1], ReduceOp::Sum, &streams[1])
        .unwrap();
    for s in &streams {
        s.synchronize(Some(Duration::from_secs(30))).unwrap();
    }
    for t in &ts {
        assert_eq!(t.to_vec::<i64>().unwrap(), vec![8, 8]);
    }
}

/// Issue 22: an out-of-range root said "(0..4)" for 4 ranks.
#[test]
fn an_out_of_range_root_or_peer_names_the_valid_ranks() {
    let _serial = serial();
    let cs = comms(4, Duration::from_secs(60));
    let a = tensor(&cs[0], DType::I64, 4);
    let s0 = stream(&cs[0]);
    let e = cs[0].broadcast(&a, 4, &s0).expect_err("root 4 of 4 ranks");
    assert_eq!(
        e.to_string(),
        "root: 4 is not a rank of this communicator: its 4 ranks are 0 to 3"
    );
    let e = cs[0].send(&a, 7, &s0).expect_err("peer 7 of 4 ranks");
    assert!(e.to_string().contains("its 4 ranks are 0 to 3"), "{e}");
}

/// A rank may send to itself (NCCL and the in-process ranks always did; the MPI
/// communicators refused it before they ran on this protocol).
#[test]
fn a_rank_sends_to_itself() {
    let _serial = serial();
    let cs = comms(2, Duration::from_secs(60));
    let a = i64s(&cs[1], &[7, 8, 9]);
    let r = tensor(&cs[1], DType::I64, 3);
    cs[1].send(&a, 1, &stream(&cs[1])).unwrap();
    cs[1].recv(&r, 1, &stream(&cs[1])).unwrap();
    assert!(sync_all(&cs).iter().all(Result::is_ok));
    assert_eq!(r.to_vec::<i64>().unwrap(), vec![7, 8, 9]);
}
