//! Stream executor round trips beside plain worker threads, in one run.
//!
//! * `runtime`: a no-op `FnOp` launched on a `Stream`, then `Stream::synchronize`;
//! * `std-mpsc`: a worker thread fed through `std::sync::mpsc`, answering on a second
//!   channel;
//! * `crossbeam`: the same worker over `crossbeam_channel` (what the runtime itself uses).
//!
//! Rows: `launch_sync` (one job, wait for it) and `launch_10k_sync` (10,000 jobs, then one
//! wait). Run: `cargo bench -p runtime-core --bench executor` (add `-- --warm-up-time 1
//! --measurement-time 3` for a short run).

use std::hint::black_box;
use std::sync::Arc;
use std::thread::JoinHandle;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use runtime_core::config::ConfigBuilder;
use runtime_core::runtime;
use runtime_core::stream::command::{FnOp, OpKind};
use runtime_core::stream::{Op, Stream};

const BATCH: u64 = 10_000;

type Job = Box<dyn FnOnce() + Send>;

enum Msg {
    Run(Job),
    /// Answer on the done channel once everything before it has run.
    Sync,
    Stop,
}

/// A worker thread behind a std mpsc channel.
struct MpscWorker {
    tx: std::sync::mpsc::Sender<Msg>,
    done: std::sync::mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

impl MpscWorker {
    fn new() -> MpscWorker {
        let (tx, rx) = std::sync::mpsc::channel::<Msg>();
        let (done_tx, done) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            while let Ok(m) = rx.recv() {
                match m {
                    Msg::Run(f) => f(),
                    Msg::Sync => done_tx.send(()).expect("bench thread alive"),
                    Msg::Stop => return,
                }
            }
        });
        MpscWorker {
            tx,
            done,
            thread: Some(thread),
        }
    }

    fn launch(&self, f: Job) {
        self.tx.send(Msg::Run(f)).expect("worker alive");
    }

    fn sync(&self) {
        self.tx.send(Msg::Sync).expect("worker alive");
        self.done.recv().expect("worker alive");
    }
}

impl Drop for MpscWorker {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A worker thread behind crossbeam channels.
struct CrossbeamWorker {
    tx: crossbeam_channel::Sender<Msg>,
    done: crossbeam_channel::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

impl CrossbeamWorker {
    fn new() -> CrossbeamWorker {
        let (tx, rx) = crossbeam_channel::unbounded::<Msg>();
        let (done_tx, done) = crossbeam_channel::unbounded();
        let thread = std::thread::spawn(move || {
            while let Ok(m) = rx.recv() {
                match m {
                    Msg::Run(f) => f(),
                    Msg::Sync => done_tx.send(()).expect("bench thread alive"),
                    Msg::Stop => return,
                }
            }
        });
        CrossbeamWorker {
            tx,
            done,
            thread: Some(thread),
        }
    }

    fn launch(&self, f: Job) {
        self.tx.send(Msg::Run(f)).expect("worker alive");
    }

    fn sync(&self) {
        self.tx.send(Msg::Sync).expect("worker alive");
        self.done.recv().expect("worker alive");
    }
}

impl Drop for CrossbeamWorker {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn noop_job() -> Job {
    Box::new(|| {
        black_box(());
    })
}

fn bench_executor(c: &mut Criterion) {
    let rt = runtime::init(&ConfigBuilder {
        device_count: Some(1),
        memory: Some(runtime_core::Bytes::mib(64)),
        ..Default::default()
    })
    .expect("init the runtime");
    let dev = rt.device(0).expect("device 0").clone();
    let stream = Stream::new(&dev, 0).expect("stream");
    let noop: Arc<dyn Op> = FnOp::shared("noop", OpKind::Compute, || Ok(()));
    let mpsc = MpscWorker::new();
    let xbeam = CrossbeamWorker::new();

    let mut g = c.benchmark_group("launch_sync");
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("runtime", "noop"), |b| {
        b.iter(|| {
            stream.launch(noop.clone()).expect("launch");
            stream.synchronize(None).expect("sync");
        })
    });
    g.bench_function(BenchmarkId::new("std-mpsc", "noop"), |b| {
        b.iter(|| {
            mpsc.launch(noop_job());
            mpsc.sync();
        })
    });
    g.bench_function(BenchmarkId::new("crossbeam", "noop"), |b| {
        b.iter(|| {
            xbeam.launch(noop_job());
            xbeam.sync();
        })
    });
    g.finish();

    let mut g = c.benchmark_group("launch_10k_sync");
    g.throughput(Throughput::Elements(BATCH));
    g.sample_size(20);
    g.bench_function(BenchmarkId::new("runtime", "noop"), |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                stream.launch(noop.clone()).expect("launch");
            }
            stream.synchronize(None).expect("sync");
        })
    });
    g.bench_function(BenchmarkId::new("std-mpsc", "noop"), |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                mpsc.launch(noop_job());
            }
            mpsc.sync();
        })
    });
    g.bench_function(BenchmarkId::new("crossbeam", "noop"), |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                xbeam.launch(noop_job());
            }
            xbeam.sync();
        })
    });
    g.finish();

    drop((mpsc, xbeam));
    stream.destroy().expect("destroy");
    drop(stream);
    runtime::shutdown().expect("shutdown");
}

criterion_group!(benches, bench_executor);
criterion_main!(benches);
