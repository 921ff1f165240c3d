//! Property test: random programs of ops, event records and event waits over three streams
//! (on one device, or spread over two) run in an order that respects the partial order the
//! program defines, and every op runs exactly once.
//!
//! The partial order: program order on each stream, plus for every `B.wait_event(e)` an edge
//! from every op submitted on stream A before the latest `A.record(e)` (at the time of the
//! wait) to every op submitted on B after the wait. Records also carry the waits their stream
//! had queued before them, so the order is transitive across streams.
//!
//! All tests in this file share one runtime (same settings, never shut down).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::Config;
use runtime_core::event::{Event, EventOptions};
use runtime_core::runtime::{self};
use runtime_core::stream::{FnOp, OpKind, Stream};

use common::init;

const STREAMS: usize = 3;
const EVENTS: usize = 3;

#[derive(Debug, Clone)]
enum Step {
    /// Append (stream, seq) to the log; `delay` perturbs the schedule (0: none, 1: yield,
    /// 2..: a short sleep).
    Op {
        stream: usize,
        delay: u8,
    },
    Record {
        event: usize,
        stream: usize,
    },
    Wait {
        event: usize,
        stream: usize,
    },
    /// Capture `body` (ops, records and waits, all on `stream`) into a graph and launch it
    /// once: it must behave as if the body had been submitted at the launch.
    Graph {
        stream: usize,
        body: Vec<Step>,
    },
}

fn simple_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0..STREAMS, 0u8..4).prop_map(|(stream, delay)| Step::Op { stream, delay }),
        2 => (0..EVENTS, 0..STREAMS).prop_map(|(event, stream)| Step::Record { event, stream }),
        2 => (0..EVENTS, 0..STREAMS).prop_map(|(event, stream)| Step::Wait { event, stream }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        9 => simple_step(),
        1 => (0..STREAMS, prop::collection::vec(simple_step(), 0..6)).prop_map(|(stream, body)| {
            // The body runs on the graph's stream.
            let body = body
                .into_iter()
                .map(|st| match st {
                    Step::Op { delay, .. } => Step::Op { stream, delay },
                    Step::Record { event, .. } => Step::Record { event, stream },
                    Step::Wait { event, .. } => Step::Wait { event, stream },
                    g @ Step::Graph { .. } => g,
                })
                .collect();
            Step::Graph { stream, body }
        }),
    ]
}

fn layout() -> impl Strategy<Value = ([usize; STREAMS], [i32; STREAMS])> {
    (
        prop_oneof![Just([0usize; STREAMS]), prop::array::uniform3(0usize..2)],
        prop::array::uniform3(-3i32..=0),
    )
}

type Log = Arc<Mutex<Vec<(usize, usize)>>>;

/// The program's partial order, built as it is submitted, next to the real streams.
struct Model {
    streams: Vec<Stream>,
    events: Vec<Event>,
    log: Log,
    /// For each op id (in submission order), the ids it must follow.
    preds: Vec<Vec<usize>>,
    /// (stream, seq) -> op id.
    ids: Vec<Vec<usize>>,
    last_op: Vec<Option<usize>>,
    /// Dependencies from waits that the stream's next op (and next record) inherit.
    pending: Vec<Vec<usize>>,
    /// For each event, what its latest record stands for.
    record_point: Vec<Option<Vec<usize>>>,
}

impl Model {
    fn apply(&mut self, step: &Step) {
        match step {
            &Step::Op { stream: s, delay } => {
                let id = self.preds.len();
                let seq = self.ids[s].len();
                let mut p: Vec<usize> = self.last_op[s].into_iter().collect();
                p.append(&mut self.pending[s]);
                self.preds.push(p);
                self.ids[s].push(id);
                self.last_op[s] = Some(id);
                let log = self.log.clone();
                let op = FnOp::shared(format!("s{s}op{seq}"), OpKind::Compute, move || {
                    match delay {
                        0 => {}
                        1 => std::thread::yield_now(),
                        d => std::thread::sleep(Duration::from_micros(10 * u64::from(d))),
                    }
                    log.lock().unwrap().push((s, seq));
                    Ok(())
                });
                self.streams[s].launch(op).unwrap();
            }
            &Step::Record {
                event: e,
                stream: s,
            } => {
                let mut point: Vec<usize> = self.last_op[s].into_iter().collect();
                point.extend_from_slice(&self.pending[s]);
                self.record_point[e] = Some(point);
                self.streams[s].record(&self.events[e]).unwrap();
            }
            &Step::Wait {
                event: e,
                stream: s,
            } => {
                if let Some(point) = &self.record_point[e] {
                    self.pending[s].extend_from_slice(point);
                }
                self.streams[s].wait_event(&self.events[e]).unwrap();
            }
            Step::Graph { stream: s, body } => {
                // Nothing else is submitted between the capture and the launch, so the model
                // treats the body as submitted here.
                self.streams[*s].begin_capture().unwrap();
                for st in body {
                    self.apply(st);
                }
                let g = self.streams[*s].end_capture().unwrap();
                assert_eq!(g.len(), body.len());
                self.streams[*s].launch_graph(&g).unwrap();
            }
        }
    }
}

/// Run `program` and check the log against the partial order it defines.
fn run_program(
    program: &[Step],
    devices: [usize; STREAMS],
    priorities: [i32; STREAMS],
) -> Result<(), TestCaseError> {
    // Programs capture, and the all-streams barrier below refuses while any stream
    // captures: one program at a time.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rt = init();
    let mut m = Model {
        streams: (0..STREAMS)
            .map(|i| Stream::new(rt.device(devices[i]).unwrap(), priorities[i]).unwrap())
            .collect(),
        events: (0..EVENTS)
            .map(|_| Event::with_options(EventOptions::without_timing()))
            .collect(),
        log: Arc::new(Mutex::new(Vec::new())),
        preds: Vec::new(),
        ids: vec![Vec::new(); STREAMS],
        last_op: vec![None; STREAMS],
        pending: vec![Vec::new(); STREAMS],
        record_point: vec![None; EVENTS],
    };
    for st in program {
        m.apply(st);
    }

    for s in &m.streams {
        s.synchronize(None).unwrap();
    }
    runtime::synchronize_all(None).unwrap();
    for s in &m.streams {
        let (submitted, completed) = s.counters();
        prop_assert_eq!(submitted, completed);
        prop_assert!(s.query().unwrap());
    }
    for e in &m.events {
        prop_assert!(e.query().unwrap());
    }

    let log = m.log.lock().unwrap().clone();
    let n = m.preds.len();
    prop_assert_eq!(log.len(), n, "every op runs exactly once: {:?}", log);
    let mut pos = vec![usize::MAX; n];
    for (i, &(s, seq)) in log.iter().enumerate() {
        let id = m.ids[s][seq];
        prop_assert_eq!(pos[id], usize::MAX, "op {:?} ran twice", (s, seq));
        pos[id] = i;
    }
    for (id, ps) in m.preds.iter().enumerate() {
        for &p in ps {
            prop_assert!(
                pos[p] < pos[id],
                "op {} ran at {} before its predecessor {} (at {}); log {:?}",
                id,
                pos[id],
                p,
                pos[p],
                log
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    })]

    #[test]
    fn random_programs_respect_stream_and_event_order(
        program in prop::collection::vec(step(), 1..80),
        (devices, priorities) in layout(),
    ) {
        run_program(&program, devices, priorities)?;
    }
}

/// A fixed program that needs every kind of edge, run a few times.
#[test]
fn chained_waits_are_transitive() {
    use Step::*;
    let program = [
        Op {
            stream: 0,
            delay: 3,
        },
        Op {
            stream: 0,
            delay: 3,
        },
        Record {
            event: 0,
            stream: 0,
        },
        Wait {
            event: 0,
            stream: 1,
        },
        Record {
            event: 1,
            stream: 1,
        },
        Wait {
            event: 1,
            stream: 2,
        },
        Op {
            stream: 2,
            delay: 0,
        },
        Op {
            stream: 1,
            delay: 0,
        },
    ];
    for _ in 0..20 {
        run_program(&program, [0, 0, 0], [0, 0, 0]).unwrap();
        run_program(&program, [0, 1, 0], [0, -3, -1]).unwrap();
    }
}

/// Re-recording an event on a second stream must not release a wait queued for the earlier
/// record (records on different streams can complete out of order).
#[test]
fn wait_is_for_the_record_current_at_wait_time() {
    use Step::*;
    let program = [
        Op {
            stream: 0,
            delay: 3,
        },
        Op {
            stream: 0,
            delay: 3,
        },
        Op {
            stream: 0,
            delay: 3,
        },
        Record {
            event: 0,
            stream: 0,
        },
        Wait {
            event: 0,
            stream: 1,
        },
        Record {
            event: 0,
            stream: 2,
        },
        Op {
            stream: 1,
            delay: 0,
        },
    ];
    for _ in 0..20 {
        run_program(&program, [0, 0, 0], [0, 0, 0]).unwrap();
    }
}
