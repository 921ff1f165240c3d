//! Stream capture as in CUDA (`cudaStreamBeginCapture`): between `begin_capture` and
//! `end_capture`, work issued to a capturing stream is recorded into a graph instead of run.
//!
//! A capture is a [`Session`] shared by every stream taking part in it:
//!
//! * **Fork.** An event recorded on a capturing stream belongs to the capture. Another stream
//!   that waits on that event joins the same session: its later work is captured too, after
//!   the record it waited for.
//! * **Join.** A joined stream is joined back when a stream of the session that was already
//!   in it waits on an event the joined stream recorded as its last captured step. The origin
//!   (the stream that began the capture) ends it; `end_capture` fails if a forked stream was
//!   never joined back (CUDA's `cudaErrorStreamCaptureUnjoined`), and the capture ends either
//!   way.
//! * **Replay.** Steps are kept in issue order, which respects every captured dependency
//!   (a wait is always issued after the record it waits for), so one stream replays the whole
//!   fork/join graph with the same results; the branches run one after the other.
//! * Waiting inside a capture on an event recorded outside any capture is an ordinary
//!   dependency, bound to the event's latest record when the graph is launched.
//! * Work that would wait for captured work (a stream or device synchronize, a blocking
//!   copy on a capturing stream) is refused: it would wait for work that is only being
//!   recorded.
//!
//! Nodes are dropped only after every lock of this module is released (a node may own a
//! Python callable, whose drop takes the interpreter lock).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::Mutex;

use super::graph::Node;
use super::StreamInner;
use crate::event::EventInner;

/// Active sessions, for the fast check on the wait path.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// Event id -> the session whose capture recorded it last.
static RECORDED_IN: LazyLock<Mutex<HashMap<u64, Weak<Session>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

static RECORDED_FORK: crate::sync::ForkGuarded<Mutex<HashMap<u64, Weak<Session>>>> =
    crate::sync::ForkGuarded::new(|| &RECORDED_IN);

/// Around `fork()`: hold the record map's lock (see `runtime::install_fork_handlers`).
pub(crate) fn before_fork(wait: std::time::Duration) {
    RECORDED_FORK.before_fork(wait);
}

/// After `fork()`: release what [`before_fork`] took (in the child also a hold of a thread
/// that vanished).
pub(crate) fn after_fork(child: bool) {
    RECORDED_FORK.after_fork(child);
}

/// One step with the stream that issued it.
struct Step {
    node: Node,
    stream: u64,
}

#[derive(Default)]
struct State {
    steps: Vec<Step>,
    /// Streams taking part, besides the origin, and whether each was joined back.
    forked: HashMap<u64, (Weak<StreamInner>, bool)>,
    /// For each event recorded in the capture: the stream and step index of its record.
    records: HashMap<u64, (u64, usize)>,
    ended: bool,
}

/// The capture shared by the streams taking part in it.
pub(crate) struct Session {
    origin: u64,
    state: Mutex<State>,
}

impl Drop for Session {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Session {
    /// A capture begun by stream `origin`.
    pub(crate) fn begin(origin: u64) -> Arc<Session> {
        ACTIVE.fetch_add(1, Ordering::AcqRel);
        Arc::new(Session {
            origin,
            state: Mutex::new(State::default()),
        })
    }

    /// The stream that began the capture.
    pub(crate) fn origin(&self) -> u64 {
        self.origin
    }

    /// Append a step issued by `stream`.
    pub(crate) fn push(&self, stream: u64, node: Node) {
        self.state.lock().steps.push(Step { node, stream });
    }

    /// `stream` records `event` inside the capture.
    pub(crate) fn record(self: &Arc<Self>, stream: u64, event: &Arc<EventInner>) {
        let old = {
            let mut st = self.state.lock();
            let index = st.steps.len();
            st.steps.push(Step {
                node: Node::Record(event.clone()),
                stream,
            });
            st.records.insert(event.id, (stream, index));
            RECORDED_IN.lock().insert(event.id, Arc::downgrade(self))
        };
        drop(old);
    }

    /// `stream`, already in the capture, waits on `event`: a dependency step, and a join of
    /// the stream that recorded it if that record was its last step.
    pub(crate) fn wait(&self, stream: u64, event: &Arc<EventInner>) {
        let mut st = self.state.lock();
        if let Some(&(by, index)) = st.records.get(&event.id) {
            let last_of_recorder = st.steps.iter().rposition(|s| s.stream == by);
            if by != stream && last_of_recorder == Some(index) {
                if let Some((_, joined)) = st.forked.get_mut(&by) {
                    *joined = true;
                }
            }
        }
        st.steps.push(Step {
            node: Node::Wait(event.clone()),
            stream,
        });
    }

    /// `stream` (not capturing) joins the session through a wait on `event`.
    pub(crate) fn fork(&self, stream: &Arc<StreamInner>, event: &Arc<EventInner>) {
        let mut st = self.state.lock();
        st.forked.insert(stream.id, (Arc::downgrade(stream), false));
        st.steps.push(Step {
            node: Node::Wait(event.clone()),
            stream: stream.id,
        });
    }

    /// `stream` left the capture without joining back (it was destroyed).
    pub(crate) fn leave(&self, stream: u64) {
        let mut st = self.state.lock();
        if let Some((w, _)) = st.forked.get_mut(&stream) {
            *w = Weak::new();
        }
    }

    /// The forked streams still alive (to end their part in the capture).
    pub(crate) fn forked(&self) -> Vec<Arc<StreamInner>> {
        let weak: Vec<Weak<StreamInner>> = self
            .state
            .lock()
            .forked
            .values()
            .map(|(w, _)| w.clone())
            .collect();
        weak.iter().filter_map(Weak::upgrade).collect()
    }

    /// End the capture: the steps in issue order, or the forked streams never joined back.
    /// Either way the session is over and its events no longer fork.
    pub(crate) fn end(&self) -> Result<Vec<Node>, Vec<u64>> {
        let (steps, unjoined, events) = {
            let mut st = self.state.lock();
            st.ended = true;
            let mut unjoined: Vec<u64> = st
                .forked
                .iter()
                .filter(|(_, (_, joined))| !joined)
                .map(|(&s, _)| s)
                .collect();
            unjoined.sort_unstable();
            let events: Vec<u64> = st.records.keys().copied().collect();
            (std::mem::take(&mut st.steps), unjoined, events)
        };
        let stale: Vec<Weak<Session>> = {
            let mut map = RECORDED_IN.lock();
            events.iter().filter_map(|e| map.remove(e)).collect()
        };
        drop(stale);
        if unjoined.is_empty() {
            Ok(steps.into_iter().map(|s| s.node).collect())
        } else {
            drop(steps);
            Err(unjoined)
        }
    }
}

/// The live session whose capture recorded `event` last, if any (one relaxed load when no
/// capture is active).
pub(crate) fn session_of(event: &EventInner) -> Option<Arc<Session>> {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    let s = RECORDED_IN.lock().get(&event.id).and_then(Weak::upgrade);
    s.filter(|s| !s.state.lock().ended)
}

/// `event` was recorded outside any capture: waits on it no longer fork.
pub(crate) fn recorded_outside(event: &EventInner) {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return;
    }
    let old = RECORDED_IN.lock().remove(&event.id);
    drop(old);
}
