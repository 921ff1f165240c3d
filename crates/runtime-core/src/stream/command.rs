//! What a stream carries: operations (kernels, copies, host functions), event records and
//! event waits, and graph replays.

use std::sync::Arc;

use crate::error::KernelFailure;
use crate::event::EventInner;
use crate::memory::access::AccessSet;
use crate::stream::graph::GraphInner;

/// Which engine an operation belongs on when pipelining is enabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Kernels and host functions: the device's compute engines.
    Compute,
    /// Copies and memsets: the device's copy engine.
    Copy,
}

/// One unit of stream work: kernels (`kernel::launch`), copies (`stream::copy`), collectives,
/// and closures ([`FnOp`]).
///
/// `run` may be called more than once when the op is part of a replayed graph.
///
/// Sealed: its methods other than `run` are called by the engines outside `catch_unwind`
/// and, for `name` and `kind`, under stream locks, so only the core's own ops implement it;
/// user code reaches a stream as a [`FnOp`] closure or a `Kernel`, whose user parts run
/// contained:
///
/// ```compile_fail
/// use runtime_core::stream::Op;
/// struct Mine;
/// impl Op for Mine {
///     fn name(&self) -> &str { "mine" }
///     fn run(&self) -> Result<(), runtime_core::error::KernelFailure> { Ok(()) }
/// }
/// ```
pub trait Op: sealed::Sealed + Send + Sync {
    /// Name shown in errors and traces.
    fn name(&self) -> &str;
    /// Engine class.
    fn kind(&self) -> OpKind {
        OpKind::Compute
    }
    /// The device memory the op touches, and how. The stream notes it when the op is queued
    /// (host access to those allocations then waits for the op) and holds the allocations'
    /// locks while `run` runs (see [`crate::memory::access`]). Ops that touch device memory
    /// only through safe [`Buffer`](crate::memory::Buffer) calls may name nothing: each such
    /// call orders itself.
    fn accesses(&self) -> &AccessSet {
        AccessSet::empty()
    }
    /// Do the work. Panics are caught by the executor and reported as a [`KernelFailure`].
    fn run(&self) -> Result<(), KernelFailure>;
}

pub(crate) mod sealed {
    /// The seal of [`super::Op`].
    pub trait Sealed {}
}

impl<F> sealed::Sealed for FnOp<F> {}

/// An operation built from a closure.
pub struct FnOp<F> {
    name: String,
    kind: OpKind,
    accesses: AccessSet,
    f: F,
}

impl<F> FnOp<F>
where
    F: Fn() -> Result<(), KernelFailure> + Send + Sync + 'static,
{
    /// Wrap `f` as an op named `name` that names no device memory.
    pub fn shared(name: impl Into<String>, kind: OpKind, f: F) -> Arc<dyn Op> {
        FnOp::with_accesses(name, kind, AccessSet::default(), f)
    }

    /// Wrap `f` as an op named `name` that touches `accesses` (see [`Op::accesses`]).
    pub fn with_accesses(
        name: impl Into<String>,
        kind: OpKind,
        accesses: AccessSet,
        f: F,
    ) -> Arc<dyn Op> {
        Arc::new(FnOp {
            name: name.into(),
            kind,
            accesses,
            f,
        })
    }
}

impl<F> Op for FnOp<F>
where
    F: Fn() -> Result<(), KernelFailure> + Send + Sync,
{
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> OpKind {
        self.kind
    }
    fn accesses(&self) -> &AccessSet {
        &self.accesses
    }
    fn run(&self) -> Result<(), KernelFailure> {
        (self.f)()
    }
}

/// A box holding one queued op, given back to the stream's submitters once the op has run
/// and been dropped, so that a launch loop allocates no op: the launching thread fills a box
/// an earlier launch emptied. An op in its own allocation (`Command::Op`) was allocated on
/// the launching thread, dropped by the worker and freed where it came from
/// ([`super::reclaim`]): a read of a count the worker wrote, two atomic updates and a
/// malloc/free pair per launch, about a quarter of a no-op launch.
pub(crate) trait Reusable: Send {
    /// The op the box holds (`None` once emptied).
    fn op(&self) -> Option<&dyn Op>;
    /// Drop the op (its destructor runs here, on the worker that ran it), keeping the box.
    fn clear(&mut self);
    /// For [`Commands::push_owned`], to find a box of its op's type.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

/// The [`Reusable`] box of an op of type `T`.
pub(crate) struct OpBox<T>(Option<T>);

impl<T: Op + 'static> Reusable for OpBox<T> {
    fn op(&self) -> Option<&dyn Op> {
        self.0.as_ref().map(|op| op as &dyn Op)
    }
    fn clear(&mut self) {
        self.0 = None;
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// Emptied boxes a stream keeps for its submitters, at most: a launch takes one, and a
/// worker gives a batch's worth back at once. Room for twice what a full queue holds
/// ([`super::MAX_QUEUED`]), so a launching thread that outruns its worker never has a box
/// freed only to make another (a Rust loop of `add` launches on 64 floats, which fills
/// the queue: 494-516 ns a launch against 530-570 with room for 256); a stream that goes
/// idle keeps [`KEEP_WHEN_EMPTY`] ([`Commands::is_empty_trimming`]).
const SPARE_BOXES: usize = 2 * super::MAX_QUEUED as usize;

/// A queued command.
pub(crate) enum Command {
    Op(Arc<dyn Op>),
    /// An op owned by the queue, in a box that goes back to the stream's submitters once the
    /// op has run ([`Reusable`]).
    Boxed(Box<dyn Reusable>),
    /// Complete `event`'s record number `.1`.
    Record(Arc<EventInner>, u64),
    /// Block the stream until `event` has completed record number `.1`.
    Wait(Arc<EventInner>, u64),
    /// Replay a graph, resuming at node `.1`.
    Graph(Arc<GraphInner>, usize),
}

impl Command {
    /// The engine this command wants; `None` runs anywhere.
    pub(crate) fn kind(&self) -> Option<OpKind> {
        match self {
            Command::Op(op) => Some(op.kind()),
            Command::Boxed(b) => b.op().map(Op::kind),
            Command::Graph(..) => Some(OpKind::Compute),
            Command::Record(..) | Command::Wait(..) => None,
        }
    }
}

/// The command queue of one stream: `ready`, which only the stream's runner (whoever moved
/// the stream to `RUNNING`, or is moving it there) locks, and `incoming`, where submitters
/// put commands while batching is on. The runner takes `incoming` whole (one lock round trip
/// for a batch of commands, not one per command) when `ready` runs dry, so consecutive
/// launches reach the worker as one unit; commands never wait there while the runner is
/// idle, because a runner looks at both before it lets the stream go.
///
/// With batching off, submitters push to `ready` (one shared queue, each launch taking the
/// lock the runner pops under). Order is the same either way: `incoming` holds only commands
/// submitted after everything in `ready` (a command is put back only to `ready`'s front).
/// Locks are taken `ready` first, then `incoming`.
#[derive(Default)]
pub(crate) struct Commands {
    ready: crate::sync::lock::Mutex<CommandQueue>,
    /// On a cache line of its own: submitters write it, the runner reads it once per batch.
    incoming: CacheLine<crate::sync::lock::Mutex<Incoming>>,
}

/// What submitters share with the runner: the commands queued since the runner last took a
/// batch, and the emptied [`Reusable`] boxes it gave back then.
#[derive(Default)]
struct Incoming {
    queue: CommandQueue,
    spare: Vec<Box<dyn Reusable>>,
}

/// A value alone on its 64-byte cache line (crossbeam's `CachePadded` pads to 128 bytes on
/// x86-64, against the adjacent-line prefetcher; a stream has two padded parts, and 64 bytes
/// each keep it within its memory budget).
#[derive(Default)]
#[repr(align(64))]
pub(crate) struct CacheLine<T>(pub(crate) T);

impl<T> std::ops::Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl Commands {
    /// Queue `cmd` behind the others (in `incoming` when `batching`).
    pub(crate) fn push(&self, cmd: Command, batching: bool) {
        if batching {
            self.incoming.lock().queue.push(cmd);
        } else {
            self.ready.lock().push(cmd);
        }
    }

    /// Queue the op in `op` (taken from it: `None` after) behind the others, in `incoming`
    /// (batching on), in an emptied box of its type when one was given back. A spare box of
    /// another type that comes first is freed: it holds no op, so nothing but the free runs
    /// under the lock. The box the next launch will take is then fetched ready to write
    /// ([`crate::sync::prefetch_for_write`]), while this launch returns and the next one is
    /// checked. (The op moves once, from the slot it was built in into its box: each move by
    /// value on the way was a copy of the whole op.)
    pub(crate) fn push_owned<T: Op + 'static>(&self, op: &mut Option<T>) {
        let mut incoming = self.incoming.lock();
        let spare = loop {
            match incoming.spare.pop() {
                Some(mut b) => {
                    if b.as_any_mut().is::<OpBox<T>>() {
                        break Some(b);
                    }
                }
                None => break None,
            }
        };
        let boxed = match spare {
            Some(mut b) => {
                if let Some(slot) = b.as_any_mut().downcast_mut::<OpBox<T>>() {
                    slot.0 = op.take();
                }
                b
            }
            None => Box::new(OpBox(op.take())),
        };
        incoming.queue.push(Command::Boxed(boxed));
        if let Some(next) = incoming.spare.last() {
            let next: &dyn Reusable = &**next;
            crate::sync::prefetch_for_write(
                std::ptr::from_ref(next).cast(),
                std::mem::size_of_val(next),
            );
        }
    }

    /// Take the next command: `ready`'s first, or the batch waiting in `incoming`
    /// ([`Commands::take_batch`]). The runner does the two steps itself, pausing between
    /// them (`Engine::gather`).
    #[cfg(test)]
    pub(crate) fn pop(&self) -> Option<Command> {
        self.pop_ready()
            .or_else(|| self.take_batch(&mut Vec::new()))
    }

    /// Take `ready`'s first command, leaving `incoming` alone.
    pub(crate) fn pop_ready(&self) -> Option<Command> {
        self.ready.lock().pop()
    }

    /// Once `ready` ran dry: take the batch that arrived in `incoming` (swapped in whole:
    /// `incoming` gets `ready`'s empty buffer, so a stream that keeps running keeps both
    /// buffers instead of growing one per batch; they are given back when the stream goes
    /// idle, [`Commands::is_empty_trimming`]) and return its first command. The boxes the
    /// runner emptied since (`emptied`) go to the submitters with the same lock.
    pub(crate) fn take_batch(&self, emptied: &mut Vec<Box<dyn Reusable>>) -> Option<Command> {
        let mut ready = self.ready.lock();
        if let Some(cmd) = ready.pop() {
            return Some(cmd);
        }
        let mut incoming = self.incoming.lock();
        let excess = incoming.give_back(emptied);
        let batch = !incoming.queue.is_empty();
        if batch {
            std::mem::swap(&mut *ready, &mut incoming.queue);
        }
        drop(incoming);
        drop(excess);
        if batch {
            ready.pop()
        } else {
            None
        }
    }

    /// Give the boxes the runner emptied (`emptied`) to the submitters.
    pub(crate) fn give_back(&self, emptied: &mut Vec<Box<dyn Reusable>>) {
        if emptied.is_empty() {
            return;
        }
        let excess = self.incoming.lock().give_back(emptied);
        drop(excess);
    }

    /// Put back a command the runner took but did not run: it stays first.
    pub(crate) fn put_back(&self, cmd: Command) {
        self.ready.lock().put_back(cmd);
    }

    /// Whether no command is queued.
    pub(crate) fn is_empty(&self) -> bool {
        let ready = self.ready.lock();
        ready.is_empty() && self.incoming.lock().queue.is_empty()
    }

    /// [`Commands::is_empty`], for a runner letting the stream go: when empty, buffers with
    /// room for more than [`KEEP_WHEN_EMPTY`] commands are freed (they hold no command, so
    /// no Python object is dropped here), so an idle stream costs a few hundred bytes
    /// whatever it ran before.
    pub(crate) fn is_empty_trimming(&self) -> bool {
        let mut ready = self.ready.lock();
        let mut incoming = self.incoming.lock();
        if !(ready.is_empty() && incoming.queue.is_empty()) {
            return false;
        }
        for q in [&mut *ready, &mut incoming.queue] {
            if q.0.capacity() > KEEP_WHEN_EMPTY {
                q.0 = std::collections::VecDeque::new();
            }
        }
        // Emptied boxes hold no op: freeing them under the lock runs no destructor of ours.
        incoming.spare.truncate(KEEP_WHEN_EMPTY);
        incoming.spare.shrink_to(KEEP_WHEN_EMPTY);
        true
    }

    /// The engine the first command wants.
    pub(crate) fn first_kind(&self) -> Option<OpKind> {
        let ready = self.ready.lock();
        if !ready.is_empty() {
            return ready.first_kind();
        }
        self.incoming.lock().queue.first_kind()
    }
}

impl Incoming {
    /// Take the boxes in `emptied` as spares, up to [`SPARE_BOXES`]; returns the ones beyond,
    /// to be freed once the lock is let go.
    fn give_back(&mut self, emptied: &mut Vec<Box<dyn Reusable>>) -> Vec<Box<dyn Reusable>> {
        self.spare.append(emptied);
        if self.spare.len() > SPARE_BOXES {
            self.spare.split_off(SPARE_BOXES)
        } else {
            Vec::new()
        }
    }
}

/// Commands a [`CommandQueue`] may keep room for once it has drained: a stream that ran a
/// burst of work gives the rest of its buffer back, so an idle stream costs a few hundred
/// bytes whatever it ran before.
const KEEP_WHEN_EMPTY: usize = 16;

/// The commands of one stream not yet taken by a runner, in order: a plain ring buffer under
/// the stream's lock. No allocation until the first command (an unused stream costs
/// nothing here), and none per command after the buffer has grown to the stream's depth.
#[derive(Default)]
pub(crate) struct CommandQueue(std::collections::VecDeque<Command>);

impl CommandQueue {
    /// Queue `cmd` behind the others.
    pub(crate) fn push(&mut self, cmd: Command) {
        self.0.push_back(cmd);
    }

    /// Put back a command a runner took but did not run (engine hand-off, time slice, event
    /// wait): it stays first.
    pub(crate) fn put_back(&mut self, cmd: Command) {
        self.0.push_front(cmd);
    }

    /// Take the first command (the buffer is kept: see [`Commands::is_empty_trimming`]).
    pub(crate) fn pop(&mut self) -> Option<Command> {
        self.0.pop_front()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The engine the first command wants.
    pub(crate) fn first_kind(&self) -> Option<OpKind> {
        self.0.front().and_then(Command::kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batched_and_direct_pushes_come_out_in_order() {
        let q = Commands::default();
        q.push(record(1), false);
        q.push(record(2), true);
        q.push(record(3), true);
        let first = q.pop().unwrap();
        assert_eq!(id_of(&first), 1);
        q.put_back(first);
        assert!(!q.is_empty());
        assert_eq!(q.first_kind(), None);
        let got: Vec<u64> = std::iter::from_fn(|| q.pop()).map(|c| id_of(&c)).collect();
        assert_eq!(got, [1, 2, 3]);
        assert!(q.is_empty());
    }

    #[test]
    fn ready_commands_come_first_and_a_batch_arrives_only_when_taken() {
        let q = Commands::default();
        q.push(record(1), false);
        q.push(record(2), true);
        q.push(record(3), true);
        assert_eq!(q.pop_ready().map(|c| id_of(&c)), Some(1));
        assert!(q.pop_ready().is_none(), "the batch waits in `incoming`");
        q.push(record(4), true);
        assert_eq!(q.take_batch(&mut Vec::new()).map(|c| id_of(&c)), Some(2));
        let rest: Vec<u64> = std::iter::from_fn(|| q.pop_ready())
            .map(|c| id_of(&c))
            .collect();
        assert_eq!(rest, [3, 4], "the whole batch came over at once");
        assert!(q.take_batch(&mut Vec::new()).is_none());
        assert!(q.is_empty());
    }

    /// An op that counts its drops.
    struct Counted(Arc<std::sync::atomic::AtomicUsize>);
    impl sealed::Sealed for Counted {}
    impl Op for Counted {
        fn name(&self) -> &str {
            "counted"
        }
        fn run(&self) -> Result<(), KernelFailure> {
            Ok(())
        }
    }
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// An op of another type.
    struct Other;
    impl sealed::Sealed for Other {}
    impl Op for Other {
        fn name(&self) -> &str {
            "other"
        }
        fn run(&self) -> Result<(), KernelFailure> {
            Ok(())
        }
    }

    /// What the runner does with a boxed command: run (here: nothing), empty, keep the box.
    fn run_boxed(cmd: Command, emptied: &mut Vec<Box<dyn Reusable>>) {
        let Command::Boxed(mut b) = cmd else {
            unreachable!("only owned ops are queued here")
        };
        assert!(b.op().is_some());
        b.clear();
        assert!(b.op().is_none());
        emptied.push(b);
    }

    #[test]
    fn an_owned_op_is_dropped_once_run_and_its_box_carries_the_next_op() {
        let q = Commands::default();
        let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut emptied = Vec::new();
        q.push_owned(&mut Some(Counted(drops.clone())));
        let first = q.take_batch(&mut emptied).unwrap();
        let Command::Boxed(b) = &first else {
            unreachable!("pushed owned")
        };
        let first_box = std::ptr::addr_of!(**b).cast::<u8>();
        run_boxed(first, &mut emptied);
        assert_eq!(
            drops.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "dropped as it ran"
        );
        q.give_back(&mut emptied);
        assert!(emptied.is_empty());
        q.push_owned(&mut Some(Counted(drops.clone())));
        let second = q.take_batch(&mut emptied).unwrap();
        let Command::Boxed(b) = &second else {
            unreachable!("pushed owned")
        };
        assert_eq!(
            std::ptr::addr_of!(**b).cast::<u8>(),
            first_box,
            "the emptied box came back"
        );
        run_boxed(second, &mut emptied);
        assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 2);
        // A spare of another type is let go, not filled.
        q.give_back(&mut emptied);
        q.push_owned(&mut Some(Other));
        assert!(q.incoming.lock().spare.is_empty());
    }

    #[test]
    fn spare_boxes_are_bounded_and_an_idle_queue_keeps_few() {
        let q = Commands::default();
        let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut emptied = Vec::new();
        for _ in 0..SPARE_BOXES + 10 {
            q.push_owned(&mut Some(Counted(drops.clone())));
        }
        while let Some(cmd) = q.take_batch(&mut emptied) {
            run_boxed(cmd, &mut emptied);
        }
        q.give_back(&mut emptied);
        assert_eq!(q.incoming.lock().spare.len(), SPARE_BOXES);
        assert!(q.is_empty_trimming());
        assert_eq!(q.incoming.lock().spare.len(), KEEP_WHEN_EMPTY);
        assert_eq!(
            drops.load(std::sync::atomic::Ordering::SeqCst),
            SPARE_BOXES + 10
        );
    }

    fn record(id: u64) -> Command {
        Command::Record(crate::event::Event::new().0, id)
    }

    fn id_of(c: &Command) -> u64 {
        match c {
            Command::Record(_, id) => *id,
            _ => unreachable!("only records are queued here"),
        }
    }

    #[test]
    fn commands_come_out_in_order_and_a_put_back_one_comes_first() {
        let mut q = CommandQueue::default();
        for id in 1..=3 {
            q.push(record(id));
        }
        let first = q.pop().unwrap();
        assert_eq!(id_of(&first), 1);
        q.put_back(first);
        let got: Vec<u64> = std::iter::from_fn(|| q.pop()).map(|c| id_of(&c)).collect();
        assert_eq!(got, [1, 2, 3]);
        assert!(q.is_empty());
        assert_eq!(q.first_kind(), None);
    }

    #[test]
    fn a_drained_burst_gives_its_buffers_back_and_a_short_queue_keeps_them() {
        let q = Commands::default();
        let caps = |q: &Commands| {
            (
                q.ready.lock().0.capacity(),
                q.incoming.lock().queue.0.capacity(),
            )
        };
        assert_eq!(caps(&q), (0, 0), "an unused queue allocates nothing");
        for batching in [false, true] {
            for id in 0..1000 {
                q.push(record(id), batching);
            }
            let mut n = 0;
            while q.pop().is_some() {
                n += 1;
            }
            assert_eq!(n, 1000);
            assert!(q.is_empty_trimming());
            assert_eq!(
                caps(&q),
                (0, 0),
                "the burst's buffers were freed once drained"
            );
        }
        q.push(record(1), false);
        let kept = caps(&q).0;
        assert!((1..=KEEP_WHEN_EMPTY).contains(&kept));
        q.pop();
        assert!(q.is_empty_trimming());
        assert_eq!(
            caps(&q).0,
            kept,
            "a buffer of a few commands is kept for reuse"
        );
        q.push(record(2), true);
        assert!(!q.is_empty_trimming());
    }
}
