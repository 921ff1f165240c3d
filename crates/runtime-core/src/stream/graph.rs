//! Capture and replay: a [`Graph`] is the sequence of operations, records and waits captured
//! on a stream between `begin_capture` and `end_capture`. Replaying it submits the whole
//! sequence as one command, so a hundred small kernels cost one queue operation and at most
//! one wake-up.

use std::sync::Arc;

use crate::event::EventInner;
use crate::stream::command::Op;

/// One captured step.
#[derive(Clone)]
pub(crate) enum Node {
    Op(Arc<dyn Op>),
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
}

impl GraphInner {
    /// The nodes to run for one launch, with records and waits bound to record numbers now.
    ///
    /// Fix: records and waits used to take their record numbers when the replay ran, not when
    /// the graph was launched. A wait then picked up records queued after the launch (on its
    /// own stream, behind the graph: a deadlock), and a `wait_event` on another stream after
    /// the launch missed the graph's record. Binding at launch makes a replay behave exactly
    /// like submitting the captured commands at that moment, as `Stream::record` and
    /// `Stream::wait_event` do. Graphs without records or waits are shared as they are.
    pub(crate) fn bind(self: &Arc<Self>) -> Arc<GraphInner> {
        if !self
            .nodes
            .iter()
            .any(|n| matches!(n, Node::Record(_) | Node::Wait(_)))
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
                other => Some(other.clone()),
            })
            .collect();
        Arc::new(GraphInner { nodes })
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
    pub(crate) fn new(nodes: Vec<Node>) -> Graph {
        Graph(Arc::new(GraphInner { nodes }))
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
                Node::Record(e) | Node::RecordId(e, _) => format!("record(Event#{})", e.id),
                Node::Wait(e) | Node::WaitId(e, _) => format!("wait(Event#{})", e.id),
            })
            .collect()
    }
}
