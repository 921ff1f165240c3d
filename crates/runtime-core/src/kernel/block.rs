//! Multi-block launches: one launch runs as `block_num` instances of its kernel (Ascend C's
//! `kernel<<<blockDim, ..., stream>>>`, a CUDA grid), each told its index.
//!
//! A kernel sees its instance through a [`RunContext`] (`block_idx` of `block_num`), and
//! code called from it through [`current`] (what `runtime.get_block_idx()` reads). The
//! blocks run concurrently on the device's compute workers: the thread that runs the op
//! posts a request for help to the compute engine (`Engine::post_help`) and then claims
//! blocks itself, one at a time from a shared counter, as every helper does, so a launch
//! never waits for a worker that is busy elsewhere (with no helper, its own thread runs every
//! block). The op completes when every block has run; each block runs under `catch_unwind`,
//! and the launch fails with the failure of the lowest failing block, naming it.
//!
//! The op's thread holds the launch's allocations (`memory::access`) while its blocks run on
//! other threads: each block borrows those holdings for its duration
//! (`memory::access::Lending`), so safe host accesses from a block neither wait for
//! the op nor race with the other blocks.

use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::error::{ArgError, KernelFailure};
use crate::memory::access::{self, Lending};
use crate::stream::engine::Help;
use crate::stream::Executor;

/// The largest `block_dim` a launch accepts (Ascend C's limit).
pub const MAX_BLOCK_DIM: u32 = 65_535;

/// How long the thread running a launch that asks for sleeping workers first waits for a
/// helper already awake (a thread entering `synchronize` on the stream): about the time a
/// launching thread takes to return from the launch and start waiting, from Python too; a
/// fraction of what a wake-up costs on these VMs (10-25 us).
const WAKE_GRACE: Duration = Duration::from_micros(5);

/// Which instance of a launch is running: block `block_idx` of `block_num` (Ascend C's
/// `GetBlockIdx()` / `GetBlockNum()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunContext {
    block_idx: u32,
    block_num: u32,
    /// The multi-block launch this block belongs to (0: none, or made by [`RunContext::new`]):
    /// what the built-in kernels compare with the launch their arguments and their thread's
    /// borrowed holdings belong to (see `builtin`).
    launch: u64,
}

impl RunContext {
    /// Block `block_idx` of `block_num`.
    ///
    /// # Panics
    /// When `block_idx >= block_num`.
    pub fn new(block_idx: u32, block_num: u32) -> RunContext {
        assert!(
            block_idx < block_num,
            "block index {block_idx} out of range for {block_num} blocks"
        );
        RunContext {
            block_idx,
            block_num,
            launch: 0,
        }
    }

    /// Block `block_idx` of `block_num` of the multi-block launch `launch`.
    pub(crate) fn of_launch(block_idx: u32, block_num: u32, launch: u64) -> RunContext {
        RunContext {
            launch,
            ..RunContext::new(block_idx, block_num)
        }
    }

    /// The launch this block belongs to (0 when none).
    pub(crate) fn launch(&self) -> u64 {
        self.launch
    }

    /// The only block of a single-block launch.
    pub fn single() -> RunContext {
        RunContext::new(0, 1)
    }

    /// This instance's index, `0..block_num`.
    pub fn block_idx(&self) -> u32 {
        self.block_idx
    }

    /// The number of instances of the launch.
    pub fn block_num(&self) -> u32 {
        self.block_num
    }

    /// This block's contiguous share of `len` items: the blocks' shares are disjoint, in
    /// block order, cover `0..len`, and differ in length by at most one.
    pub fn share(&self, len: usize) -> Range<usize> {
        self.share_aligned(len, 1)
    }

    /// [`RunContext::share`] with every boundary between shares a multiple of `align` items
    /// (so that each block's vector loop starts on a whole vector); the last share takes the
    /// rest.
    pub fn share_aligned(&self, len: usize, align: usize) -> Range<usize> {
        let align = align.max(1);
        let units = len.div_ceil(align);
        let (i, n) = (self.block_idx as usize, self.block_num as usize);
        // units * i / n, without overflow: units <= usize::MAX / 1 and n <= 65,535.
        let cut = |k: usize| ((units as u128 * k as u128 / n as u128) as usize * align).min(len);
        cut(i)..cut(i + 1)
    }
}

thread_local! {
    static CURRENT: Cell<Option<RunContext>> = const { Cell::new(None) };
}

/// The block the calling thread is running, if it is running a kernel: what
/// `runtime.get_block_idx()` and `get_block_num()` read.
pub fn current() -> Option<RunContext> {
    CURRENT.with(Cell::get)
}

/// Run `f` as block `cx` (visible through [`current`]); the previous value comes back after,
/// also when `f` unwinds.
pub(crate) fn as_block<R>(cx: RunContext, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<RunContext>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(Some(cx))));
    f()
}

/// Check a `block_dim` given by a caller: `1..=MAX_BLOCK_DIM`.
///
/// # Errors
/// `ArgError` naming `block_dim` and the value.
pub fn check_block_dim(block_dim: i64) -> Result<u32, ArgError> {
    match u32::try_from(block_dim) {
        Ok(n) if (1..=MAX_BLOCK_DIM).contains(&n) => Ok(n),
        _ => Err(ArgError::new(
            "block_dim",
            format!("must be between 1 and {MAX_BLOCK_DIM}, got {block_dim}"),
        )),
    }
}

/// What each block of a launch runs.
pub type BlockBody = dyn Fn(RunContext) -> Result<(), KernelFailure> + Send + Sync;

/// How long the op's thread spins for the last blocks of its helpers before it sleeps.
const SPIN: Duration = Duration::from_micros(50);

/// Launch ids (never 0, never reused).
static NEXT_LAUNCH: AtomicU64 = AtomicU64::new(1);

/// A new multi-block launch id: give it to [`run_blocks_on`] and to the launch's arguments
/// (`Args::for_launch`).
pub(crate) fn new_launch() -> u64 {
    NEXT_LAUNCH.fetch_add(1, Ordering::Relaxed)
}

/// Run `body` as `block_num` blocks on the compute workers of `exec`'s device and on the
/// calling thread, and return when all have run (the lowest failing block's failure, named).
/// Called (through [`BlockRunner::run`]) by the op that runs the launch, holding its allocations; a single block runs right
/// here. Blocks run only on runtime threads (for bodies that need the Python interpreter,
/// which a waiting host thread may hold).
///
/// # Errors
/// The failure of the lowest-numbered block that failed (or panicked), its message prefixed
/// with `block i of n` and `block` set.
pub(crate) fn run_blocks(
    exec: &Executor,
    name: &str,
    block_num: u32,
    body: Arc<BlockBody>,
) -> Result<(), KernelFailure> {
    run_blocks_on(exec, name, block_num, body, new_launch(), false, true)
}

/// Where the blocks of a launch queued on a stream run: its device's compute workers. An op
/// built outside the core (the Python bindings' kernels) keeps one and runs its blocks with
/// [`BlockRunner::run`].
#[derive(Clone)]
pub struct BlockRunner {
    exec: Arc<Executor>,
}

impl BlockRunner {
    /// The runner of the device `stream` belongs to.
    pub fn of(stream: &crate::stream::Stream) -> BlockRunner {
        BlockRunner {
            exec: stream.executor().clone(),
        }
    }

    /// Run `body` as `block_num` blocks: on the device's compute workers and the calling
    /// thread, returning when all have run.
    ///
    /// # Errors
    /// The failure of the lowest-numbered block that failed (or panicked), its message
    /// prefixed with `block i of n` and `block` set.
    pub fn run(
        &self,
        name: &str,
        block_num: u32,
        body: Arc<BlockBody>,
    ) -> Result<(), KernelFailure> {
        run_blocks(&self.exec, name, block_num, body)
    }
}

/// [`run_blocks`], also letting host threads that wait for the stream running the launch
/// run blocks while they wait (a thread in `synchronize()` has a core and nothing else to
/// do with it: on a host with few cores it is the one that can run a second block at once).
/// Without `wake`, no sleeping worker is woken: the blocks run on this thread, on workers
/// that are awake (spinning) and on waiting host threads (`Kernel::wakes_workers`).
pub(crate) fn run_blocks_on(
    exec: &Executor,
    name: &str,
    block_num: u32,
    body: Arc<BlockBody>,
    launch_id: u64,
    waiters_help: bool,
    wake: bool,
) -> Result<(), KernelFailure> {
    if block_num <= 1 {
        return as_block(RunContext::single(), || body(RunContext::single()));
    }
    let launch = Arc::new(Launch::new(name, block_num, body.clone(), launch_id));
    let help: Arc<dyn Help> = launch.clone();
    let offer = waiters_help
        .then(|| crate::stream::offer_help(&help))
        .flatten();
    let engine = exec.engines.compute();
    let wanted = (block_num as usize - 1).min(engine.helpers_for_caller());
    // A waiter spinning for the stream takes a block at once: it is one of the helpers, and
    // no request is posted (nor a sleeping worker woken) for it. A request for it too would
    // outlive the launch in the engine's queue, and a wake-up costs this thread a system
    // call before its own first block, more than a small block takes.
    let spinning = usize::from(
        offer
            .as_ref()
            .is_some_and(crate::stream::Offer::waiter_spinning),
    );
    let copies = wanted.saturating_sub(spinning);
    // Without `wake`, only workers that are awake find the requests. With it, and nobody
    // awake to take them (no waiter spinning yet, no worker spinning), the requests are
    // posted unwoken first, and sleepers are woken only if within `WAKE_GRACE` no waiter
    // starts spinning and no helper claims a block: a thread that launches and then
    // synchronizes (from Python, a microsecond or two later) is then the helper, where the
    // wake-up cost a system call here and, with both cores busy, a core.
    let grace = wake && copies > 0 && offer.is_some() && !engine.has_spinner();
    let unwoken = if wake && !grace { 0 } else { copies };
    let posted = engine.post_help(&help, copies, unwoken);
    if grace && posted.is_some() {
        let came = launch.await_helper(WAKE_GRACE, || {
            offer
                .as_ref()
                .is_some_and(crate::stream::Offer::waiter_spinning)
        });
        if !came {
            engine.wake_sleepers(copies);
        }
    }
    {
        // Noted where it runs its blocks now, and off a core where another busy thread of
        // the device is noted: where it ran the stream from may no longer be where it is.
        let _visit = crate::stream::spread::visit(exec.engines.spread(), Instant::now());
        let _borrowed = launch.lending.enter();
        launch.run_claimed(&*body, End::First);
    }
    drop(offer);
    drop(help);
    drop(body);
    let result = launch.finish();
    drop(posted);
    result
}

/// One multi-block launch in flight.
struct Launch {
    name: String,
    block_num: u32,
    /// Blocks claimed from each end ([`Claims`]): the op's thread takes them from block 0 up,
    /// helpers from the last block down.
    claims: Claims,
    /// What the op's thread waits for ([`Launch::finish`]): the blocks not yet run plus the
    /// helpers inside (joined under `state`'s lock, leaving after they let go of the body),
    /// and [`SLEEPING`] once the op's thread may sleep on `left`. On a cache line of its own,
    /// and changed by one atomic update per block and per helper leaving: the op's thread
    /// reads it in a loop, and each update elsewhere has to take the line back from it (with
    /// the claim counter, two counters and the lock on one line, a helper's way out took
    /// about 0.5 us).
    pending: CachePadded<AtomicU64>,
    /// The launch's id (its blocks' `RunContext::launch`).
    launch: u64,
    lending: Arc<Lending>,
    state: Mutex<State>,
    /// Signalled by the update that brings `pending` to zero once the op's thread may sleep.
    left: Condvar,
}

/// Which end of a launch's blocks a thread claims from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum End {
    /// Block 0 up: the op's thread.
    First,
    /// The last block down: helpers (waiting host threads, workers asked for help).
    Last,
}

/// The claims on a launch's blocks from either end, in one atomic: claims from the first
/// block in the low 32 bits, from the last in the high 32. Two ends, so that a block runs on
/// the same thread from one launch to the next: with one counter the op's thread and a
/// waiting host thread took blocks 0 and 1 in whichever order they came (a third of the
/// launches of a Rust `add` 2^16 + synchronize loop swapped them), and each swap moved
/// both halves of the output between their cores' caches.
///
/// A claim adds one to its end's count and is valid when, before it, the two counts summed
/// to less than the number of blocks: the claims are totally ordered (one atomic), so the
/// first `block_num` of them are valid and the rest are not, and a valid claim from the
/// first end takes index `low` and one from the last end index `block_num - 1 - high`,
/// which no valid claim from the other end can take (it would need `low + high` to be
/// `block_num - 1` at both claims, but each valid claim raised it). Counts stay below
/// 2^32: each thread stops at its first invalid claim, and `block_num` is at most 65,535.
#[derive(Default)]
struct Claims(CachePadded<AtomicU64>);

impl Claims {
    const LAST: u64 = 1 << 32;

    fn split(v: u64) -> (u32, u32) {
        (v as u32, (v >> 32) as u32)
    }

    /// Claim the next block from `end`: its index, or `None` when every block was taken.
    fn claim(&self, end: End, block_num: u32) -> Option<u32> {
        let add = match end {
            End::First => 1,
            End::Last => Self::LAST,
        };
        let (low, high) = Self::split(self.0.fetch_add(add, Ordering::Relaxed));
        if u64::from(low) + u64::from(high) >= u64::from(block_num) {
            return None;
        }
        Some(match end {
            End::First => low,
            End::Last => block_num - 1 - high,
        })
    }

    /// Whether any block was claimed.
    fn any(&self) -> bool {
        self.0.load(Ordering::SeqCst) != 0
    }

    /// Whether every block was claimed.
    fn all_taken(&self, block_num: u32) -> bool {
        let (low, high) = Self::split(self.0.load(Ordering::Relaxed));
        u64::from(low) + u64::from(high) >= u64::from(block_num)
    }
}

/// The flag of [`Launch::pending`] set by the op's thread, under `state`'s lock, before it
/// sleeps on `left`.
const SLEEPING: u64 = 1 << 63;

struct State {
    /// Taken out by the op's thread once every block ran and every helper left, so the body
    /// (which may own Python objects) is dropped there, never by a helper.
    body: Option<Arc<BlockBody>>,
    /// The lowest failing block and its failure.
    failure: Option<(u32, KernelFailure)>,
}

impl Launch {
    fn new(name: &str, block_num: u32, body: Arc<BlockBody>, launch: u64) -> Launch {
        Launch {
            name: name.to_string(),
            block_num,
            claims: Claims::default(),
            pending: CachePadded::new(AtomicU64::new(u64::from(block_num))),
            launch,
            lending: access::lend(launch),
            state: Mutex::new(State {
                body: Some(body),
                failure: None,
            }),
            left: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Spin for up to `grace` until a block is claimed or `waiter()` is true; returns whether
    /// one of them happened. Never longer than `grace`, so a launch whose blocks wait for
    /// each other still gets its sleeping workers woken after it.
    fn await_helper(&self, grace: Duration, waiter: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        loop {
            if self.claims.any() || waiter() {
                return true;
            }
            if start.elapsed() >= grace {
                return false;
            }
            for _ in 0..16 {
                std::hint::spin_loop();
            }
        }
    }

    /// Claim and run blocks from `end` until none is left; returns whether it ran any.
    fn run_claimed(&self, body: &BlockBody, end: End) -> bool {
        let mut ran = false;
        loop {
            let Some(i) = self.claims.claim(end, self.block_num) else {
                return ran;
            };
            ran = true;
            let cx = RunContext::of_launch(i, self.block_num, self.launch);
            let result = as_block(cx, || {
                crate::stream::panics::run_caught(&self.name, || body(cx))
            });
            if let Err(e) = result {
                let mut st = self.lock();
                if st.failure.as_ref().is_none_or(|(j, _)| i < *j) {
                    st.failure = Some((i, e));
                }
            }
            self.settle_one();
        }
    }

    /// One block ran, or one helper left: count it down from `pending`, and wake the op's
    /// thread if this was the last and it sleeps. (Taking the lock before the notification
    /// orders it after the op's thread started waiting: it set [`SLEEPING`] and checked
    /// `pending` under that lock.)
    fn settle_one(&self) {
        if self.pending.fetch_sub(1, Ordering::SeqCst) == SLEEPING | 1 {
            let st = self.lock();
            self.left.notify_all();
            drop(st);
        }
    }

    /// On the op's thread, after it ran out of blocks to claim: wait for the blocks helpers
    /// run and for every helper to leave, then drop the body and report.
    fn finish(&self) -> Result<(), KernelFailure> {
        let settled = || self.pending.load(Ordering::SeqCst) & !SLEEPING == 0;
        let until = Instant::now() + SPIN;
        let pause = crate::sync::Pause::new();
        let mut turn = 0u32;
        while !settled() && Instant::now() < until {
            // Mostly spin (the blocks left run on other cores); yield now and then, for a
            // helper that shares this core.
            turn += 1;
            if turn.is_multiple_of(8) {
                std::thread::yield_now();
            } else {
                pause.spin();
            }
        }
        let mut st = self.lock();
        // Checked again under the lock, which a helper joins under: one that joined after
        // the spin saw nothing pending is waited for too.
        while self.pending.fetch_or(SLEEPING, Ordering::SeqCst) & !SLEEPING != 0 {
            st = self.left.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        let body = st.body.take();
        let failure = st.failure.take();
        drop(st);
        drop(body);
        match failure {
            None => Ok(()),
            Some((i, mut e)) => {
                e.message = format!("block {i} of {}: {}", self.block_num, e.message);
                e.block = Some(i);
                Err(e)
            }
        }
    }
}

impl Help for Launch {
    fn wanted(&self) -> bool {
        !self.claims.all_taken(self.block_num)
    }

    fn help(&self) -> bool {
        if self.claims.all_taken(self.block_num) {
            return false; // came late: nothing left
        }
        let body = {
            let st = self.lock();
            let Some(body) = st.body.clone() else {
                return false;
            };
            self.pending.fetch_add(1, Ordering::SeqCst);
            body
        };
        let ran = {
            let _borrowed = self.lending.enter();
            self.run_claimed(&*body, End::Last)
        };
        // Dropped before leaving: the op's thread holds the body until every helper left,
        // so this is never the last reference.
        drop(body);
        self.settle_one();
        ran
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::AtomicU32;

    proptest! {
        /// Against a model: claims from either end, in any order, give every block exactly
        /// once, the first end's in order from block 0 and the last end's from the last
        /// block down, and nothing once all are taken.
        #[test]
        fn claims_from_both_ends_take_every_block_once(
            block_num in 1u32..40,
            ends in proptest::collection::vec(any::<bool>(), 0..100),
        ) {
            let c = Claims::default();
            let (mut low, mut high) = (0u32, 0u32);
            let mut seen = vec![false; block_num as usize];
            prop_assert!(!c.any());
            for first in ends {
                let end = if first { End::First } else { End::Last };
                let left = low + high < block_num;
                let got = c.claim(end, block_num);
                if !left {
                    prop_assert_eq!(got, None);
                    continue;
                }
                let want = if first { low } else { block_num - 1 - high };
                prop_assert_eq!(got, Some(want));
                prop_assert!(!seen[want as usize], "block {} taken twice", want);
                seen[want as usize] = true;
                if first { low += 1 } else { high += 1 }
                prop_assert!(c.any());
                prop_assert_eq!(c.all_taken(block_num), low + high == block_num);
            }
        }
    }

    /// Threads claiming from both ends at once take every block exactly once.
    #[test]
    fn racing_claims_from_both_ends_take_every_block_once() {
        for block_num in [1u32, 2, 3, 64, 1000] {
            let c = Arc::new(Claims::default());
            let taken: Arc<Vec<AtomicU32>> =
                Arc::new((0..block_num).map(|_| AtomicU32::new(0)).collect());
            let threads: Vec<_> = (0..4)
                .map(|t| {
                    let (c, taken) = (c.clone(), taken.clone());
                    std::thread::spawn(move || {
                        let end = if t % 2 == 0 { End::First } else { End::Last };
                        while let Some(i) = c.claim(end, block_num) {
                            taken[i as usize].fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert!(taken.iter().all(|n| n.load(Ordering::Relaxed) == 1));
            assert!(c.all_taken(block_num));
        }
    }

    #[test]
    fn shares_cover_the_range_in_order_without_overlap() {
        for len in [0usize, 1, 7, 64, 1000, 1 << 20] {
            for n in [1u32, 2, 3, 8, 13] {
                for align in [1usize, 16] {
                    let mut at = 0;
                    for i in 0..n {
                        let r = RunContext::new(i, n).share_aligned(len, align);
                        assert_eq!(r.start, at, "len {len} n {n} align {align}");
                        assert!(r.end >= r.start);
                        if r.end < len {
                            assert_eq!(r.end % align, 0);
                        }
                        at = r.end;
                    }
                    assert_eq!(at, len);
                }
            }
        }
    }

    /// The op's thread and helpers joining at any moment (before the first block, during,
    /// after the last, after the op's thread took the body): every block runs exactly once,
    /// the op's thread returns only after every helper left, and the body is dropped there.
    #[test]
    fn the_op_waits_for_every_block_and_helper_and_drops_the_body_itself() {
        struct DroppedOn(Arc<Mutex<Option<std::thread::ThreadId>>>);
        impl Drop for DroppedOn {
            fn drop(&mut self) {
                *self.0.lock().unwrap() = Some(std::thread::current().id());
            }
        }
        for round in 0..300u32 {
            let blocks = 1 + round % 7;
            let ran: Arc<Vec<AtomicU32>> =
                Arc::new((0..blocks).map(|_| AtomicU32::new(0)).collect());
            let inside = Arc::new(AtomicU32::new(0));
            let dropped_on = Arc::new(Mutex::new(None));
            let guard = DroppedOn(dropped_on.clone());
            let (r, ins) = (ran.clone(), inside.clone());
            let body: Arc<BlockBody> = Arc::new(move |cx: RunContext| {
                let _keep = &guard;
                ins.fetch_add(1, Ordering::SeqCst);
                for _ in 0..(cx.block_idx() * 50) {
                    std::hint::spin_loop();
                }
                r[cx.block_idx() as usize].fetch_add(1, Ordering::SeqCst);
                ins.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            });
            let launch = Arc::new(Launch::new("k", blocks, body.clone(), 0));
            let helpers: Vec<_> = (0..3)
                .map(|h| {
                    let l = launch.clone();
                    std::thread::spawn(move || {
                        for _ in 0..(h * (round % 5) * 40) {
                            std::hint::spin_loop();
                        }
                        l.help();
                    })
                })
                .collect();
            {
                let _borrowed = launch.lending.enter();
                launch.run_claimed(&*body, End::First);
            }
            drop(body);
            launch.finish().unwrap();
            assert_eq!(
                inside.load(Ordering::SeqCst),
                0,
                "a block still ran after finish"
            );
            assert_eq!(
                *dropped_on.lock().unwrap(),
                Some(std::thread::current().id()),
                "the body was dropped by the op's thread"
            );
            for h in helpers {
                h.join().unwrap();
            }
            let counts: Vec<u32> = ran.iter().map(|c| c.load(Ordering::SeqCst)).collect();
            assert_eq!(counts, vec![1; blocks as usize], "round {round}");
        }
    }

    /// A helper says whether it ran a block: a waiting host thread that came after every
    /// block was claimed hears "no", and pauses before it asks again instead of asking at
    /// once for as long as the last block runs.
    #[test]
    fn a_helper_says_whether_it_ran_a_block() {
        let body: Arc<BlockBody> = Arc::new(|_| Ok(()));
        let launch = Launch::new("k", 2, body.clone(), 0);
        assert!(launch.help(), "blocks were left: the helper ran them");
        assert!(!launch.help(), "every block was taken: the helper ran none");
        {
            let _borrowed = launch.lending.enter();
            assert!(
                !launch.run_claimed(&*body, End::First),
                "nothing left for the op's thread"
            );
        }
        drop(body);
        launch.finish().unwrap();
        assert!(!launch.help(), "after the launch ended: nothing to run");
    }

    #[test]
    fn block_dim_bounds() {
        assert_eq!(check_block_dim(1).unwrap(), 1);
        assert_eq!(check_block_dim(65_535).unwrap(), 65_535);
        for bad in [0, -1, 65_536, i64::MAX, i64::MIN] {
            let e = check_block_dim(bad).unwrap_err();
            assert!(e.to_string().contains("block_dim"), "{e}");
        }
    }

    #[test]
    fn current_is_set_inside_and_restored_after() {
        assert_eq!(current(), None);
        as_block(RunContext::new(2, 4), || {
            assert_eq!(current(), Some(RunContext::new(2, 4)));
            as_block(RunContext::single(), || {
                assert_eq!(current().map(|c| c.block_num()), Some(1));
            });
            assert_eq!(current().map(|c| c.block_idx()), Some(2));
        });
        assert_eq!(current(), None);
        let caught = std::panic::catch_unwind(|| as_block(RunContext::single(), || panic!("x")));
        assert!(caught.is_err());
        assert_eq!(current(), None, "restored after a panic");
    }
}
