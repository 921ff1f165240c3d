//! Scoped current device and streams (`device::frame`), the rules the Python package's
//! `with stream:` / `with Device(i):` follow (moved from the bindings' `context.rs`): how a
//! missing device or stream resolves, nesting, `set_device` and `use()` inside a scope, and
//! stale frames after a shutdown.
//!
//! Every test holds a file-level lock (one shuts the runtime down).

use std::sync::{Arc, Mutex, MutexGuard};

use runtime_core::config::ConfigBuilder;
use runtime_core::device::frame::{self, Frame};
use runtime_core::device::{self, Device};
use runtime_core::runtime::{self, Runtime};
use runtime_core::stream::Stream;

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn init() -> Arc<Runtime> {
    runtime::init(&ConfigBuilder {
        device_count: Some(2),
        memory: Some(runtime_core::Bytes::mib(64)),
        profile: None,
    })
    .unwrap()
}

fn devices(rt: &Runtime) -> (Device, Device) {
    (rt.device(0).unwrap().clone(), rt.device(1).unwrap().clone())
}

/// Entering installs the frame; a nested one inherits the streams of other devices.
fn enter(cur: Option<&Arc<Frame>>, d: &Device, s: Option<&Stream>) -> Arc<Frame> {
    let e = frame::enter(cur, d, s);
    assert!(e.restore.is_none());
    Arc::new(e.frame)
}

#[test]
fn without_a_frame_the_thread_state_answers() {
    let _l = lock();
    let rt = init();
    let (d0, d1) = devices(&rt);
    assert_eq!(frame::device_index(None), device::current_device_index());
    let s = Stream::new(&d1, 0).unwrap();
    device::set_current_stream(&d1, Some(s.clone()));
    assert_eq!(frame::stream(None, &d1).unwrap(), s);
    assert!(frame::stream(None, &d0).unwrap().is_default());
    device::set_current_stream(&d1, None);
}

#[test]
fn scopes_nest_and_resolve_devices_and_streams() {
    let _l = lock();
    let rt = init();
    let (d0, d1) = devices(&rt);
    let s0 = Stream::new(&d0, 0).unwrap();
    let s1 = Stream::new(&d1, 0).unwrap();
    // with s1: device 1 and s1 current; device 0 answers from the thread.
    let outer = enter(None, &d1, Some(&s1));
    assert!(outer.is_live());
    assert_eq!(frame::device_index(Some(&outer)), 1);
    assert_eq!(frame::stream(Some(&outer), &d1).unwrap(), s1);
    assert!(frame::stream(Some(&outer), &d0).unwrap().is_default());
    // with s0 inside: device 0, and s1 is still current on device 1.
    let inner = enter(Some(&outer), &d0, Some(&s0));
    assert_eq!(frame::device_index(Some(&inner)), 0);
    assert_eq!(frame::stream(Some(&inner), &d0).unwrap(), s0);
    assert_eq!(frame::stream(Some(&inner), &d1).unwrap(), s1);
    // with Device(0) (no stream) inside the outer scope keeps its streams.
    let dev_only = enter(Some(&outer), &d0, None);
    assert_eq!(frame::device_index(Some(&dev_only)), 0);
    assert_eq!(frame::stream(Some(&dev_only), &d1).unwrap(), s1);
    // set_device inside a scope: the device changes, the streams stay.
    let moved = outer.with_device(&d0);
    assert_eq!(frame::device_index(Some(&moved)), 0);
    assert_eq!(frame::stream(Some(&moved), &d1).unwrap(), s1);
    // A scope's stream that was destroyed reads as the device's default stream.
    s1.destroy().unwrap();
    assert!(frame::stream(Some(&outer), &d1).unwrap().is_default());
}

/// CuPy's `test_mix_use_context`: `use()` inside a `with` replaces that scope's frame for the
/// rest of it; a scope entered afterwards builds on and returns to the `with`'s own frame.
#[test]
fn use_inside_a_scope_replaces_its_frame_and_remembers_the_scope() {
    let _l = lock();
    let rt = init();
    let (d0, d1) = devices(&rt);
    let (a, b, c) = (
        Stream::new(&d0, 0).unwrap(),
        Stream::new(&d0, 0).unwrap(),
        Stream::new(&d1, 0).unwrap(),
    );
    let with_a = enter(None, &d0, Some(&a));
    let used = Arc::new(frame::use_stream(Some(&with_a), &d1, &c).unwrap().unwrap());
    assert_eq!(frame::device_index(Some(&used)), 1);
    assert_eq!(frame::stream(Some(&used), &d1).unwrap(), c);
    assert_eq!(frame::stream(Some(&used), &d0).unwrap(), a);
    // A `with b:` entered now restores `with a:`'s frame first and builds on it: `c` (set by
    // use()) is not inherited.
    let e = frame::enter(Some(&used), &d0, Some(&b));
    let restore = e.restore.expect("the scope's own frame");
    assert_eq!(frame::device_index(Some(&restore)), 0);
    assert!(frame::stream(Some(&restore), &d1).unwrap().is_default());
    assert_eq!(frame::stream(Some(&e.frame), &d0).unwrap(), b);
    assert!(frame::stream(Some(&e.frame), &d1).unwrap().is_default());
    // A second use() in the same scope still remembers the scope's own frame.
    let again = Arc::new(frame::use_stream(Some(&used), &d0, &b).unwrap().unwrap());
    let e = frame::enter(Some(&again), &d1, None);
    assert_eq!(
        frame::stream(Some(&e.restore.unwrap()), &d0).unwrap(),
        a,
        "the with's own stream"
    );
}

#[test]
fn use_outside_any_scope_sets_the_thread_state() {
    let _l = lock();
    let rt = init();
    let (_, d1) = devices(&rt);
    let s = Stream::new(&d1, 0).unwrap();
    assert!(frame::use_stream(None, &d1, &s).unwrap().is_none());
    assert_eq!(device::current_device_index(), 1);
    assert_eq!(device::current_stream(&d1).unwrap(), s);
    device::set_current_stream(&d1, None);
    runtime::set_device(0).unwrap();
}

/// A frame made before a shutdown reads as absent under the next runtime: the thread's state
/// answers, and entering or using inside it behaves as outside any scope.
#[test]
fn frames_from_before_a_shutdown_are_stale() {
    let _l = lock();
    let rt = init();
    let (_, d1) = devices(&rt);
    let s = Stream::new(&d1, 0).unwrap();
    let old = enter(None, &d1, Some(&s));
    runtime::shutdown().unwrap();
    let rt = init();
    let (d0, d1) = devices(&rt);
    assert!(!old.is_live());
    assert_eq!(frame::device_index(Some(&old)), 0);
    assert!(frame::stream(Some(&old), &d1).unwrap().is_default());
    let e = frame::enter(Some(&old), &d0, None);
    assert!(e.restore.is_none() && e.frame.is_live());
    let fresh = Stream::new(&d1, 0).unwrap();
    assert!(frame::use_stream(Some(&old), &d1, &fresh)
        .unwrap()
        .is_none());
    assert_eq!(device::current_stream(&d1).unwrap(), fresh);
    device::set_current_stream(&d1, None);
    runtime::set_device(0).unwrap();
}
