//! What a stream carries: operations (kernels, copies, host functions), event records and
//! event waits, and graph replays.

use std::sync::Arc;

use crate::error::KernelFailure;
use crate::event::EventInner;
use crate::stream::graph::GraphInner;

/// Which engine an operation belongs on when pipelining is enabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Kernels and host functions: the device's compute engines.
    Compute,
    /// Copies and memsets: the device's copy engine.
    Copy,
}

/// One unit of stream work. Implemented by kernels, copies and host functions.
///
/// `run` may be called more than once when the op is part of a replayed graph.
pub trait Op: Send + Sync {
    /// Name shown in errors and traces.
    fn name(&self) -> &str;
    /// Engine class.
    fn kind(&self) -> OpKind {
        OpKind::Compute
    }
    /// Do the work. Panics are caught by the executor and reported as a [`KernelFailure`].
    fn run(&self) -> Result<(), KernelFailure>;
}

/// An operation built from a closure.
pub struct FnOp<F> {
    name: String,
    kind: OpKind,
    f: F,
}

impl<F> FnOp<F>
where
    F: Fn() -> Result<(), KernelFailure> + Send + Sync + 'static,
{
    /// Wrap `f` as an op named `name`.
    pub fn shared(name: impl Into<String>, kind: OpKind, f: F) -> Arc<dyn Op> {
        Arc::new(FnOp {
            name: name.into(),
            kind,
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
    fn run(&self) -> Result<(), KernelFailure> {
        (self.f)()
    }
}

/// A queued command.
#[derive(Clone)]
pub(crate) enum Command {
    Op(Arc<dyn Op>),
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
            Command::Graph(..) => Some(OpKind::Compute),
            Command::Record(..) | Command::Wait(..) => None,
        }
    }
}
