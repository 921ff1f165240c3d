//! Capture and replay: a [`Graph`] is the sequence of operations, records and waits captured
//! on a stream between `begin_capture` and `end_capture`. Replaying it submits the whole
//! sequence as one command, so a hundred small kernels cost one queue operation and at most
//! one wake-up.

use std::sync::Arc;

use crate::event::EventInner;
use crate::memory::access::AccessSet;
use crate::stream::command::Op;

/// A captured operation that takes something at each launch: a collective takes its sequence
/// number when its graph is launched, as a direct call takes it when issued, so that a rank's
/// collectives are numbered in issue order whether they are captured or not.
pub(crate) trait LaunchBound: Send + Sync {
    /// The operation one launch runs (called once per launch, in launch order).
    fn bind(&self) -> Arc<dyn Op>;
    /// Name shown by [`Graph::node_names`].
    fn name(&self) -> &str;
    /// The device memory every bound op touches (see [`Op::accesses`]).
    fn accesses(&self) -> &AccessSet;
}

/// One captured step.
#[derive(Clone)]
pub(crate) enum Node {
    Op(Arc<dyn Op>),
    /// An operation bound by [`GraphInner::bind`] at each launch.
    Launch(Arc<dyn LaunchBound>),
    /// Record the event (a new record number each replay).
    Record(Arc<EventInner>),
    /// Wait for the event's latest record at replay time.
    Wait(Arc<EventInner>),
    /// `Record` bound by [`GraphInner::bind`] to the record number it took at launch.
    RecordId(Arc<EventInner>, u64),
    /// `Wait` bound by [`GraphInner::bind`] to the record that was latest at launch.
    WaitId(Arc<EventInner>, u64),
}

pub(crate) struct GraphInner {
    pub(crate) nodes: Vec<Node>,
    /// Every allocation its ops touch: noted as one use when a replay is queued.
    pub(crate) accesses: AccessSet,
    /// The device it was captured on.
    pub(crate) device: usize,
    /// The runtime generation it was captured under.
    pub(crate) generation: u64,
}

impl GraphInner {
    /// The nodes to run for one launch, with records and waits bound to record numbers now
    /// and launch-bound operations (collectives) bound to their numbers.
    ///
    /// Binding at launch, not when the replay runs, makes a replay behave exactly like
    /// submitting the captured commands at that moment, as `Stream::record` and
    /// `Stream::wait_event` do: a wait never picks up a record queued after the launch (on
    /// its own stream, behind the graph, that would deadlock), and a `wait_event` on another
    /// stream after the launch sees the graph's record. Graphs without records or waits are
    /// shared as they are.
    pub(crate) fn bind(self: &Arc<Self>) -> Arc<GraphInner> {
        if !self
            .nodes
            .iter()
            .any(|n| matches!(n, Node::Record(_) | Node::Wait(_) | Node::Launch(_)))
        {
            return self.clone();
        }
        let nodes = self
            .nodes
            .iter()
            .filter_map(|n| match n {
                Node::Record(e) => Some(Node::RecordId(e.clone(), e.next_record())),
                // A never-recorded event: the wait is a no-op, as for `wait_event`.
                Node::Wait(e) => match e.recorded() {
                    0 => None,
                    id => Some(Node::WaitId(e.clone(), id)),
                },
                Node::Launch(l) => Some(Node::Op(l.bind())),
                other => Some(other.clone()),
            })
            .collect();
        Arc::new(GraphInner {
            nodes,
            accesses: self.accesses.clone(),
            device: self.device,
            generation: self.generation,
        })
    }
}

/// A captured, replayable sequence of stream work. Cheap to clone.
#[derive(Clone)]
pub struct Graph(pub(crate) Arc<GraphInner>);

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({} nodes)", self.0.nodes.len())
    }
}

impl Graph {
    pub(crate) fn new(nodes: Vec<Node>, device: usize, generation: u64) -> Graph {
        let accesses = AccessSet::union(nodes.iter().filter_map(|n| match n {
            Node::Op(op) => Some(op.accesses()),
            Node::Launch(l) => Some(l.accesses()),
            _ => None,
        }));
        Graph(Arc::new(GraphInner {
            nodes,
            accesses,
            device,
            generation,
        }))
    }

    /// The device it was captured on.
    pub fn device(&self) -> usize {
        self.0.device
    }

    /// Fails with `InvalidHandle` when the runtime it was captured under was shut down, and
    /// with an argument error (as for a kernel argument on another device) when `exec` runs
    /// another device.
    pub fn check_for(&self, exec: &super::Executor) -> crate::error::Result<()> {
        if !crate::generation::is_live(self.0.generation) || exec.generation() != self.0.generation
        {
            return Err(crate::error::DeviceError::InvalidHandle {
                what: format!("{self:?}"),
                why: "the runtime was shut down".into(),
            }
            .into());
        }
        if exec.device() != self.0.device {
            return Err(crate::error::arg_error(
                "graph",
                format!(
                    "{self:?} was captured on device {}, but the stream runs on device {}",
                    self.0.device,
                    exec.device()
                ),
            ));
        }
        Ok(())
    }

    /// Number of captured steps.
    pub fn len(&self) -> usize {
        self.0.nodes.len()
    }

    /// Whether nothing was captured.
    pub fn is_empty(&self) -> bool {
        self.0.nodes.is_empty()
    }

    /// Names of the captured operations, in order (records and waits are shown as such).
    pub fn node_names(&self) -> Vec<String> {
        self.0
            .nodes
            .iter()
            .map(|n| match n {
                Node::Op(op) => op.name().to_string(),
                Node::Launch(l) => l.name().to_string(),
                Node::Record(e) | Node::RecordId(e, _) => format!("record(Event#{})", e.id),
                Node::Wait(e) | Node::WaitId(e, _) => format!("wait(Event#{})", e.id),
            })
            .collect()
    }
}
