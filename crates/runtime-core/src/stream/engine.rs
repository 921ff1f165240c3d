//! Execution engines: the worker threads that drain streams.
//!
//! Each device has compute engines (one worker per host core), a copy engine with two workers
//! (like a GPU's separate host-to-device and device-to-host engines) and one serial engine. With `enablePipelining` on, a stream's copies run on the copy engine and its
//! kernels on a compute worker, so copies on one stream overlap compute on another; with it
//! off, the serial engine runs all of the device's work in submission order.
//!
//! Threads are started by the first submission to the device (all three engines, so that a
//! stream handed from one engine to another always finds workers) and reused by every
//! stream; creating a stream spawns nothing. A thread the OS refuses is an error of that
//! submission (`ThreadSpawn`), and the command is not queued. A worker that runs out of work
//! spins for [`SPIN`] before it parks, at most [`max_spinners`] at a time in the process, so
//! that a launch right after another one costs no wake-up (waking a parked thread costs
//! 10-25 us on these VMs); a push wakes a sleeping worker only when none of the engine's
//! workers is spinning. Ready streams wait in one
//! queue per priority level; workers always take the highest level first.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::sync::lock::Mutex;
use crossbeam_channel::{Receiver, Sender};

use super::command::OpKind;
use super::spread::{self, Spread};
use super::{run_stream, Runner, StreamInner, PRIORITY_LEVELS};
use crate::error::{DeviceError, Result};

/// How long an idle worker spins before parking.
pub const SPIN: Duration = Duration::from_micros(200);

/// How long a worker whose stream ran dry keeps it and watches for the next command before
/// letting it go (see `Engine::linger`).
pub const LINGER: Duration = Duration::from_micros(20);
/// Spin-loop hints between a lingering worker's first two looks at its stream, doubling up
/// to [`LINGER_PAUSE_MAX`].
const LINGER_PAUSE_MIN: u32 = 8;
const LINGER_PAUSE_MAX: u32 = 512;
/// The longest first pause [`Linger`] chooses for a stream fed one command at a time.
const LINGER_PAUSE_BATCH: u32 = 64;

/// How long a runner pauses where its stream's `ready` commands run out: before it takes the
/// batch that arrived meanwhile ([`Engine::gather`]) and between the looks of the linger that
/// follows when none did; chosen from the batches the run has seen so far. A worker faster
/// than the launcher feeding it found the stream empty after every command and looked again
/// at once; each look took the launcher's cache lines (the
/// submission count, the queue's lock) from it, so the launcher paid several cache misses
/// per launch (a phase of about 1.1 us per no-op launch instead of 0.3, lasting seconds).
/// So while the batches it takes are of one or two commands and nobody waits for the
/// stream, the pause grows (doubling up to [`LINGER_PAUSE_BATCH`] hints, about 27 ns each
/// on this project's AMD EPYC VMs), and the launcher queues a few commands in between; a batch of 16 or more halves it again, and a
/// thread waiting in the stream's `synchronize` sets it back to the shortest.
pub(crate) struct Linger {
    first_pause: u32,
    /// Commands run since `ready` last ran out: the last batch.
    batch: u32,
}

impl Linger {
    pub(crate) fn new() -> Linger {
        Linger {
            first_pause: LINGER_PAUSE_MIN,
            batch: 0,
        }
    }

    /// One more command ran.
    pub(crate) fn ran(&mut self) {
        self.batch = self.batch.saturating_add(1);
    }

    /// The stream's `ready` commands ran out: the pause before the next batch (and the
    /// first pause of a linger, if none came). `awaited`: a thread waits for the stream now.
    pub(crate) fn first_pause(&mut self, awaited: bool) -> u32 {
        self.first_pause = if awaited {
            LINGER_PAUSE_MIN
        } else if self.batch <= 2 {
            (self.first_pause * 2).min(LINGER_PAUSE_BATCH)
        } else if self.batch >= 16 {
            (self.first_pause / 2).max(LINGER_PAUSE_MIN)
        } else {
            self.first_pause
        };
        self.batch = 0;
        self.first_pause
    }
}

/// Workers allowed to spin at once, process wide: half the host's cores, at least one.
pub fn max_spinners() -> usize {
    // A plain cache (0: not computed yet; a race computes it twice), not a `OnceLock`: a
    // `fork()` while a parent worker was initialising a `OnceLock` leaves it initialising for
    // ever in the child, whose workers then all wait on it (a C program's forked child hung
    // so in crates/runtime-acl/tests/c/fork.c).
    static N: AtomicUsize = AtomicUsize::new(0);
    match N.load(Ordering::Relaxed) {
        0 => {
            let n = (std::thread::available_parallelism().map_or(1, |n| n.get()) / 2).max(1);
            N.store(n, Ordering::Relaxed);
            n
        }
        n => n,
    }
}

/// Workers spinning now, process wide. On a cache line of its own: every linger writes it,
/// and the statics beside it (the runtime handle, the fork count) are read by every launch,
/// which then missed its cache each time a worker started or stopped lingering.
static SPINNERS: crossbeam_utils::CachePadded<AtomicUsize> =
    crossbeam_utils::CachePadded::new(AtomicUsize::new(0));

/// After `fork()`, in the child: the parent's spinning workers are gone.
pub(crate) fn after_fork_in_child() {
    SPINNERS.store(0, Ordering::SeqCst);
}

/// Whether the calling thread is an engine worker (running a kernel or host function).
pub fn on_worker_thread() -> bool {
    crate::sync::on_runtime_thread()
}

/// A hook that wraps every worker thread's body (the Python bindings use it to keep one
/// Python thread state per worker alive).
pub type ThreadWrapper = Arc<dyn Fn(Box<dyn FnOnce() + Send>) + Send + Sync>;

static THREAD_WRAPPER: OnceLock<ThreadWrapper> = OnceLock::new();

/// Install the worker thread wrapper; only the first call takes effect.
pub fn set_thread_wrapper(w: ThreadWrapper) {
    let _ = THREAD_WRAPPER.set(w);
}

/// Which engine of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EngineKind {
    Compute,
    Copy,
    Serial,
}

/// Work an engine's workers lend a hand with besides streams: the blocks of a multi-block
/// launch (`kernel::block`). `help` claims and runs what is left and returns whether it ran
/// any; a helper that comes late finds nothing to do.
pub(crate) trait Help: Send + Sync {
    fn help(&self) -> bool;
    /// Whether work is left for a helper to claim (a hint: it may be gone by the time it
    /// helps).
    fn wanted(&self) -> bool;
}

/// One request for help ([`Engine::post_help`]).
type HelpRequest = Arc<dyn Help>;

pub(crate) enum Msg {
    Run(Arc<StreamInner>),
    Help(Arc<dyn Help>),
    Stop,
}

thread_local! {
    /// The engine whose worker the calling thread is (its address), 0 on other threads.
    static WORKER_OF: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How pushers and an engine's idle workers meet: the wake-up protocol, apart from the queue
/// it guards (each method takes the queue's operations as closures), so that loom can check
/// it (`loom_tests`). A push wakes a sleeper only when no worker spins, since a spinner finds
/// the work; so every worker that stops spinning (or lingering) and leaves work behind wakes a
/// sleeper for it, and a worker going to sleep looks at the queue once more after it counted
/// itself asleep. Both counters are read and written with sequentially consistent
/// read-modify-writes, so either the pusher sees the spinner or sleeper, or that worker sees
/// the pushed work.
pub(crate) struct Idle {
    /// Workers spinning (or lingering) for work right now.
    spinning: crate::sync::AtomicUsize,
    /// Workers asleep on `wake`. Workers never block on the queues themselves.
    sleeping: crate::sync::AtomicUsize,
    /// Where idle workers sleep: std's futex-based lock and condvar (`sync::SleepMutex`),
    /// since idle workers park and wake all the time and a `fork()` must not copy a
    /// parking_lot table locked by one of them.
    sleep_lock: crate::sync::SleepMutex<()>,
    wake: crate::sync::SleepCondvar,
}

impl Idle {
    pub(crate) fn new() -> Idle {
        Idle {
            spinning: crate::sync::AtomicUsize::new(0),
            sleeping: crate::sync::AtomicUsize::new(0),
            sleep_lock: crate::sync::SleepMutex::new(()),
            wake: crate::sync::SleepCondvar::new(),
        }
    }

    /// After a push: wake a sleeping worker unless one is spinning (it will find the work).
    pub(crate) fn wake_one(&self) {
        use crate::sync::Ordering;
        if self.spinning.fetch_add(0, Ordering::SeqCst) == 0
            && self.sleeping.fetch_add(0, Ordering::SeqCst) > 0
        {
            let _g = self.sleep_lock.lock();
            self.wake.notify_one();
        }
    }

    /// Wake every sleeping worker (stopping the engine).
    pub(crate) fn wake_all(&self) {
        let _g = self.sleep_lock.lock();
        self.wake.notify_all();
    }

    /// Spin with `look` (counted as spinning, so pushes wake nobody); when it is done, wake
    /// a sleeper if `left_behind()` says work waits. Returns what `look` found.
    pub(crate) fn spin<R>(&self, look: impl FnOnce() -> R, left_behind: impl Fn() -> bool) -> R {
        use crate::sync::Ordering;
        self.spinning.fetch_add(1, Ordering::SeqCst);
        let r = look();
        self.spinning.fetch_sub(1, Ordering::SeqCst);
        // Every push that saw us spinning woke nobody, and several may have come.
        if left_behind() {
            self.wake_one();
        }
        r
    }

    /// Sleep until a push wakes us, then take work with `try_pop` (or find none and sleep
    /// again).
    pub(crate) fn sleep_pop<M>(&self, try_pop: impl Fn() -> Option<M>) -> M {
        use crate::sync::Ordering;
        loop {
            let g = self.sleep_lock.lock();
            self.sleeping.fetch_add(1, Ordering::SeqCst);
            if let Some(m) = try_pop() {
                self.sleeping.fetch_sub(1, Ordering::SeqCst);
                return m;
            }
            let g = self.wake.wait(g);
            self.sleeping.fetch_sub(1, Ordering::SeqCst);
            drop(g);
            if let Some(m) = try_pop() {
                return m;
            }
        }
    }
}

/// The linger loop ([`Engine::linger`]) over its inputs: `arrived` (the stream got a
/// command), `waiting` (another stream waits on the engine), `expired` (the linger's time is
/// up) and `pause` (between looks). Counted as spinning; on leaving, wakes a sleeper whenever
/// a stream waits (pushes during the linger woke nobody), whether or not this worker goes
/// back to its own stream. Returns whether `arrived()` became true.
pub(crate) fn linger_on(
    idle: &Idle,
    arrived: impl Fn() -> bool,
    waiting: impl Fn() -> bool,
    mut expired: impl FnMut() -> bool,
    mut pause: impl FnMut(),
) -> bool {
    idle.spin(
        || loop {
            if arrived() {
                break true;
            }
            if waiting() || expired() {
                break false;
            }
            pause();
        },
        &waiting,
    )
}

pub(crate) struct Engine {
    kind: EngineKind,
    device: usize,
    workers: usize,
    /// Ready streams, one queue per priority level (and the workers' `Stop`).
    queues: Vec<(Sender<Msg>, Receiver<Msg>)>,
    /// Requests for help with the blocks of a launch ([`Engine::post_help`]), apart from the
    /// streams: a request its launch no longer needs (every block was claimed, the launch
    /// ended) stays queued until a worker pops it, and must not read as a stream waiting
    /// (the op's own worker would stop lingering on its stream, and the next launch pay a
    /// wake-up).
    helps: (Sender<HelpRequest>, Receiver<HelpRequest>),
    /// Launches whose requests for help may still be queued and wanted: from their
    /// [`Engine::post_help`] until the launch ends ([`HelpPosted`]).
    live_helps: AtomicUsize,
    threads: Mutex<Vec<JoinHandle<()>>>,
    started: AtomicBool,
    /// The wake-up protocol of this engine's idle workers.
    idle: Idle,
    /// The device's compute busy time (shared with [`Engines`]), which this engine's workers
    /// add their helping time to.
    busy_ns: Arc<AtomicU64>,
    /// Where the device's busy workers run (shared by its engines), and this engine's first
    /// slot in it.
    spread: Arc<Spread>,
    first_slot: usize,
}

impl Engine {
    fn new(
        kind: EngineKind,
        device: usize,
        workers: usize,
        busy_ns: Arc<AtomicU64>,
        (spread, first_slot): (Arc<Spread>, usize),
    ) -> Arc<Engine> {
        Arc::new(Engine {
            kind,
            device,
            workers,
            busy_ns,
            spread,
            first_slot,
            queues: (0..PRIORITY_LEVELS)
                .map(|_| crossbeam_channel::unbounded())
                .collect(),
            helps: crossbeam_channel::unbounded(),
            live_helps: AtomicUsize::new(0),
            threads: Mutex::new(Vec::new()),
            started: AtomicBool::new(false),
            idle: Idle::new(),
        })
    }

    /// Queue a ready stream at its priority level. The engine was started before the command
    /// was accepted ([`Engines::ensure_started`]); a push that still finds it stopped starts it,
    /// and if that fails too, the stream waits for the next successful start.
    pub(crate) fn push(self: &Arc<Self>, s: Arc<StreamInner>) {
        if !self.started.load(Ordering::Acquire) {
            let _ = self.start();
        }
        let level = s.level;
        let _ = self.queues[level].0.send(Msg::Run(s));
        self.idle.wake_one();
    }

    /// Ask `copies` workers to help with `work` (taken before any stream, and running streams
    /// yield their turn to it), waking sleepers for all but `unwoken` of them (those only
    /// spinning workers, and sleepers that wake for other work, find). The caller does not
    /// wait for them: whatever they do not take, it does itself. The requests count as work
    /// waiting (for lingering workers, time slices, and sleepers left to wake) until the
    /// returned guard is dropped, when the launch has ended; `None` when nothing was posted.
    pub(crate) fn post_help(
        self: &Arc<Self>,
        work: &Arc<dyn Help>,
        copies: usize,
        unwoken: usize,
    ) -> Option<HelpPosted<'_>> {
        if copies == 0 || (!self.started.load(Ordering::Acquire) && self.start().is_err()) {
            return None;
        }
        // Counted live before the first request is visible: whoever finds a request queued
        // and the count zero may take it for one whose launch ended.
        self.live_helps.fetch_add(1, Ordering::SeqCst);
        for i in 0..copies {
            let _ = self.helps.0.send(work.clone());
            if i >= unwoken {
                self.idle.wake_one();
            }
        }
        Some(HelpPosted(self))
    }

    /// Whether one of this engine's workers spins (or lingers) now, and so finds requests
    /// posted without waking anyone.
    pub(crate) fn has_spinner(&self) -> bool {
        self.idle.spinning.load(crate::sync::Ordering::SeqCst) > 0
    }

    /// Wake up to `n` sleeping workers for requests posted unwoken ([`Engine::post_help`]),
    /// as that many pushes would: none while a worker spins (it finds them).
    pub(crate) fn wake_sleepers(&self, n: usize) {
        for _ in 0..n {
            self.idle.wake_one();
        }
    }

    /// Workers of this engine that could help the calling thread: all of them, less the
    /// caller when it is one.
    pub(crate) fn helpers_for_caller(self: &Arc<Self>) -> usize {
        let me = Arc::as_ptr(self) as usize;
        self.workers - usize::from(WORKER_OF.with(std::cell::Cell::get) == me)
    }

    /// Start every worker, or none: when the OS refuses one, the workers already started are
    /// told to stop (they are not joined: the caller may hold the interpreter lock that a
    /// starting worker needs) and the error is returned, so a later call can try again.
    fn start(self: &Arc<Self>) -> Result<()> {
        let mut threads = self.threads.lock();
        if self.started.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut spawned = Vec::with_capacity(self.workers);
        for i in 0..self.workers {
            let me = self.clone();
            let body: Box<dyn FnOnce() + Send> = Box::new(move || me.work(i));
            let wrapper = THREAD_WRAPPER.get().cloned();
            let name = format!("runtime-d{}-{:?}-{i}", self.device, self.kind).to_lowercase();
            let started = crate::sync::spawn_thread(name.clone(), move || match wrapper {
                Some(w) => w(body),
                None => body(),
            });
            match started {
                Ok(h) => spawned.push(h),
                Err(e) => {
                    for _ in &spawned {
                        let _ = self.queues[0].0.send(Msg::Stop);
                    }
                    self.idle.wake_all();
                    return Err(DeviceError::ThreadSpawn {
                        what: format!("engine worker thread {name}"),
                        reason: e.to_string(),
                    }
                    .into());
                }
            }
        }
        *threads = spawned;
        self.started.store(true, Ordering::Release);
        Ok(())
    }

    /// Stop the workers and join them. Queued streams must have been drained before.
    pub(crate) fn stop(&self) {
        let threads = std::mem::take(&mut *self.threads.lock());
        for _ in &threads {
            let _ = self.queues[0].0.send(Msg::Stop);
        }
        self.idle.wake_all();
        let me = std::thread::current().id();
        for h in threads {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
        self.started.store(false, Ordering::Release);
    }

    fn try_pop(&self) -> Option<Msg> {
        self.helps
            .1
            .try_recv()
            .ok()
            .map(Msg::Help)
            .or_else(|| self.queues.iter().find_map(|(_, rx)| rx.try_recv().ok()))
    }

    /// Whether work waits for a worker: another stream at `level` or above (used to yield a
    /// long-running stream), or a request for help of a launch still running. Requests left
    /// over from launches that ended do not count (they are popped and found empty).
    pub(crate) fn has_waiting(&self, level: usize) -> bool {
        self.queues[..=level].iter().any(|(_, rx)| !rx.is_empty())
            || (self.live_helps.load(Ordering::SeqCst) > 0 && !self.helps.1.is_empty())
    }

    /// For a worker whose stream's `ready` commands ran out while its submitter keeps
    /// queueing more (batching on): spin `pause` spin-loop hints before taking the batch
    /// that arrived meanwhile, so that it is a batch. Without the pause the worker, faster
    /// than one launching thread, took each command as it came (1-2 per batch: each take
    /// moved the queue's lock, the submission count and a slot from the launcher's core to
    /// the worker's, and the launcher paid for all three at its next launch). [`Linger`]
    /// chooses `pause` from the batches seen (at most [`LINGER_PAUSE_BATCH`] hints, about
    /// 2 us here); it is skipped when another stream waits on this engine, and cut short
    /// when a thread starts waiting for the stream (`awaited`), so a synchronize never waits
    /// for it.
    pub(crate) fn gather(&self, pause: u32, awaited: impl Fn() -> bool) {
        if self.has_waiting(PRIORITY_LEVELS - 1) {
            return;
        }
        for i in 0..pause {
            if i % 8 == 0 && awaited() {
                return;
            }
            std::hint::spin_loop();
        }
    }

    /// For a worker whose stream just ran dry: keep it for up to [`LINGER`] while
    /// `arrived()` is false, so that a launcher submitting one command after another finds
    /// the stream still running and only queues its command (no hand-off through the ready
    /// queue, no engine hop per launch). Counts as spinning (a spinner slot, and this
    /// engine's `spinning`, so a push elsewhere wakes nobody): it gives up at once when
    /// another stream is waiting on this engine, and on leaving wakes a sleeper whenever a
    /// stream waits. Returns whether `arrived()` became true.
    ///
    /// With `share_core` (the submitter last ran on this core) the worker first moves to
    /// another core ([`crate::sync::move_off_feeders_core`]); where it stays, it yields between looks
    /// instead of spinning: the submitter cannot send its next command while this worker
    /// holds the core (each launch + synchronize took the whole LINGER, 27 us, with a third
    /// busy thread on two cores).
    ///
    /// The first look comes after `first_pause` spin-loop hints ([`Linger`] chooses it), and
    /// whenever `awaited()` (a thread waits for the stream) the next look comes soon.
    pub(crate) fn linger(
        &self,
        share_core: bool,
        first_pause: u32,
        arrived: impl Fn() -> bool,
        awaited: impl Fn() -> bool,
    ) -> bool {
        if SPINNERS.fetch_add(1, Ordering::AcqRel) >= max_spinners() {
            SPINNERS.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        let start = Instant::now();
        let share_core = share_core && !crate::sync::move_off_feeders_core(start);
        // Look less often the longer nothing comes: each look pulls the cache line the
        // launcher writes, so a launcher in a tight loop gets several launches in between
        // (and they run as one batch), while a command right after the last still starts
        // within a few hundred nanoseconds.
        let mut pause = first_pause;
        let got = linger_on(
            &self.idle,
            arrived,
            || self.has_waiting(PRIORITY_LEVELS - 1),
            || start.elapsed() >= LINGER,
            || {
                if share_core {
                    std::thread::yield_now();
                } else {
                    for _ in 0..pause {
                        std::hint::spin_loop();
                    }
                }
                pause = if awaited() {
                    LINGER_PAUSE_MIN
                } else {
                    (pause * 2).min(LINGER_PAUSE_MAX)
                };
            },
        );
        SPINNERS.fetch_sub(1, Ordering::AcqRel);
        got
    }

    fn spin_pop(&self) -> Option<Msg> {
        if SPINNERS.fetch_add(1, Ordering::AcqRel) >= max_spinners() {
            SPINNERS.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let start = Instant::now();
        // A push that saw us spinning woke nobody, counting on us to take its work; we take
        // one item only. Look once more after spinning, and if work is left behind, wake a
        // sleeper for it (`Idle::spin`).
        let found = self.idle.spin(
            || {
                let mut round = 0u32;
                while start.elapsed() < SPIN {
                    if let Some(m) = self.try_pop() {
                        return Some(m);
                    }
                    round += 1;
                    if round.is_multiple_of(4) {
                        std::thread::yield_now();
                    } else {
                        for _ in 0..32 {
                            std::hint::spin_loop();
                        }
                    }
                }
                None
            },
            || false,
        );
        SPINNERS.fetch_sub(1, Ordering::AcqRel);
        let found = found.or_else(|| self.try_pop());
        if found.is_some() && self.has_waiting(PRIORITY_LEVELS - 1) {
            self.idle.wake_one();
        }
        found
    }

    fn work(self: Arc<Self>, index: usize) {
        crate::sync::mark_runtime_thread();
        WORKER_OF.with(|w| w.set(Arc::as_ptr(&self) as usize));
        spread::join(self.spread.clone(), self.first_slot + index);
        loop {
            let msg = match self.try_pop().or_else(|| self.spin_pop()) {
                Some(m) => m,
                None => {
                    crate::sync::forget_move();
                    self.idle.sleep_pop(|| self.try_pop())
                }
            };
            match msg {
                Msg::Stop => return,
                Msg::Run(s) => {
                    run_stream(&s, Runner::Engine(self.kind));
                    spread::leave();
                }
                Msg::Help(h) => {
                    // Blocks of a launch: compute time on this worker.
                    let t = Instant::now();
                    spread::settle(t);
                    h.help();
                    spread::leave();
                    add_busy(&self.busy_ns, t);
                }
            }
        }
    }
}

/// Requests for help of one launch posted to an engine ([`Engine::post_help`]); dropped when
/// the launch has ended, after which they no longer count as work waiting.
pub(crate) struct HelpPosted<'a>(&'a Engine);

impl Drop for HelpPosted<'_> {
    fn drop(&mut self) {
        self.0.live_helps.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Add the time since `since` to a busy-time counter.
fn add_busy(busy_ns: &AtomicU64, since: Instant) {
    let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
    busy_ns.fetch_add(ns, Ordering::Relaxed);
}

/// The engines of one device.
pub(crate) struct Engines {
    compute: Arc<Engine>,
    copy: Arc<Engine>,
    serial: Arc<Engine>,
    /// Nanoseconds the device's workers (and callers running its work inline) spent running
    /// compute work: kernels, host functions, and the blocks of a launch they helped with.
    busy_ns: Arc<AtomicU64>,
    /// The last [`Engines::utilization`] sample: when, and `busy_ns` then.
    sample: Mutex<(Instant, u64)>,
    /// Every engine started: what each submission reads. Kept apart from the engines' own
    /// flags, which share a cache line with the counters idle workers write as they spin.
    all_started: AtomicBool,
}

impl Engines {
    pub(crate) fn new(device: usize, compute_workers: usize) -> Engines {
        const COPY_WORKERS: usize = 2;
        const SERIAL_WORKERS: usize = 1;
        let busy_ns = Arc::new(AtomicU64::new(0));
        // One slot per worker, engine after engine; the slots after them are for guests.
        let (copy_slot, serial_slot) = (compute_workers, compute_workers + COPY_WORKERS);
        let spread = Arc::new(Spread::new(serial_slot + SERIAL_WORKERS));
        Engines {
            compute: Engine::new(
                EngineKind::Compute,
                device,
                compute_workers,
                busy_ns.clone(),
                (spread.clone(), 0),
            ),
            copy: Engine::new(
                EngineKind::Copy,
                device,
                COPY_WORKERS,
                busy_ns.clone(),
                (spread.clone(), copy_slot),
            ),
            serial: Engine::new(
                EngineKind::Serial,
                device,
                SERIAL_WORKERS,
                busy_ns.clone(),
                (spread, serial_slot),
            ),
            busy_ns,
            sample: Mutex::new((Instant::now(), 0)),
            all_started: AtomicBool::new(false),
        }
    }

    pub(crate) fn compute_workers(&self) -> usize {
        self.compute.workers
    }

    /// Count `busy` as compute busy time (commands of kind `Compute` ran that long).
    pub(crate) fn add_compute_busy(&self, busy: Duration) {
        let ns = u64::try_from(busy.as_nanos()).unwrap_or(u64::MAX);
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Compute busy time so far (work still running counts once it finishes).
    pub(crate) fn compute_busy(&self) -> Duration {
        Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed))
    }

    /// Percent (0..=100) of the compute workers' time spent running compute work since the
    /// previous call (the first call: since the engines were made): busy time over the
    /// window's length times the number of compute workers. Work still running at the call
    /// counts in the window in which it finishes, so a window can read high; it is capped
    /// at 100.
    pub(crate) fn utilization(&self) -> u32 {
        let now = Instant::now();
        let busy = self.busy_ns.load(Ordering::Relaxed);
        let (then, before) = {
            let mut s = self.sample.lock();
            std::mem::replace(&mut *s, (now, busy))
        };
        let window = now.saturating_duration_since(then).as_nanos() as f64;
        let capacity = window * self.compute.workers.max(1) as f64;
        if capacity <= 0.0 {
            return 0;
        }
        let pct = busy.saturating_sub(before) as f64 * 100.0 / capacity;
        pct.round().clamp(0.0, 100.0) as u32
    }

    /// The compute engine: where the blocks of a launch run.
    pub(crate) fn compute(&self) -> &Arc<Engine> {
        &self.compute
    }

    /// Where the device's busy workers run (`spread`).
    pub(crate) fn spread(&self) -> &Spread {
        &self.compute.spread
    }

    pub(crate) fn get(&self, kind: EngineKind) -> &Arc<Engine> {
        match kind {
            EngineKind::Compute => &self.compute,
            EngineKind::Copy => &self.copy,
            EngineKind::Serial => &self.serial,
        }
    }

    /// The engine a command of `kind` should run on under the current pipelining setting.
    pub(crate) fn target(pipelining: bool, kind: Option<OpKind>) -> Option<EngineKind> {
        match (pipelining, kind) {
            (false, _) => Some(EngineKind::Serial),
            (true, Some(OpKind::Copy)) => Some(EngineKind::Copy),
            (true, Some(OpKind::Compute)) => Some(EngineKind::Compute),
            (true, None) => None,
        }
    }

    /// Start every engine of the device that is not running yet (before a command is
    /// accepted, so that no command waits for a worker that could not start).
    ///
    /// # Errors
    /// `ThreadSpawn` when the OS refuses a worker thread; engines started fully stay started.
    pub(crate) fn ensure_started(&self) -> Result<()> {
        if self.all_started.load(Ordering::Acquire) {
            return Ok(());
        }
        for e in [&self.compute, &self.copy, &self.serial] {
            if !e.started.load(Ordering::Acquire) {
                e.start()?;
            }
        }
        self.all_started.store(true, Ordering::Release);
        Ok(())
    }

    pub(crate) fn stop(&self) {
        self.all_started.store(false, Ordering::Release);
        self.compute.stop();
        self.copy.stop();
        self.serial.stop();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    struct Nothing;
    impl Help for Nothing {
        fn help(&self) -> bool {
            false
        }
        fn wanted(&self) -> bool {
            false
        }
    }

    /// A request for help outlives its launch in the queue until a worker pops it; once the
    /// launch has ended it is not work waiting, or the worker of the stream that ran the
    /// launch stopped lingering on it (and the next launch paid a wake-up).
    #[test]
    fn a_help_request_left_over_from_an_ended_launch_is_not_work_waiting() {
        let e = Engine::new(
            EngineKind::Compute,
            0,
            2,
            Arc::new(AtomicU64::new(0)),
            (Arc::new(Spread::new(1)), 0),
        );
        // Marked started with no workers: the requests stay queued.
        e.started.store(true, Ordering::Release);
        let work: Arc<dyn Help> = Arc::new(Nothing);
        assert!(
            e.post_help(&work, 0, 0).is_none(),
            "no request, nothing posted"
        );
        assert!(!e.has_waiting(PRIORITY_LEVELS - 1));
        let posted = e.post_help(&work, 2, 2);
        assert!(posted.is_some());
        assert!(
            e.has_waiting(0),
            "a running launch's requests are work waiting"
        );
        drop(posted);
        assert!(
            !e.has_waiting(PRIORITY_LEVELS - 1),
            "the ended launch's requests are not"
        );
        assert!(matches!(e.try_pop(), Some(Msg::Help(_))), "still queued");
        assert!(matches!(e.try_pop(), Some(Msg::Help(_))));
        assert!(e.try_pop().is_none());
    }

    /// A stream queued behind a leftover request is still work waiting.
    #[test]
    fn a_waiting_stream_counts_whatever_requests_are_left_over() {
        let e = Engine::new(
            EngineKind::Compute,
            0,
            2,
            Arc::new(AtomicU64::new(0)),
            (Arc::new(Spread::new(1)), 0),
        );
        e.started.store(true, Ordering::Release);
        let work: Arc<dyn Help> = Arc::new(Nothing);
        drop(e.post_help(&work, 1, 1));
        let _ = e.queues[PRIORITY_LEVELS - 1].0.send(Msg::Stop);
        assert!(!e.has_waiting(0));
        assert!(e.has_waiting(PRIORITY_LEVELS - 1));
    }
}
