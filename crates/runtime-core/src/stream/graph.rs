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
}

pub(crate) struct GraphInner {
    pub(crate) nodes: Vec<Node>,
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
                Node::Record(e) => format!("record(Event#{})", e.id),
                Node::Wait(e) => format!("wait(Event#{})", e.id),
            })
            .collect()
    }
}
