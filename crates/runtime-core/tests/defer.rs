//! Deferred deallocation (`memory::defer`): buffers released inside a scope stay allocated
//! until the outermost scope closes; the device UUID (`device::device_uuid`).

mod common;

use runtime_core::device::device_uuid;
use runtime_core::memory::defer;

#[test]
fn defer_scopes_hold_released_buffers() {
    let rt = common::init();
    let mem = rt.device(1).unwrap().memory().clone();
    let base = mem.stats().allocated;
    let outer = defer::enter();
    let a = mem.allocate(4096).unwrap();
    let b = mem.allocate(4096).unwrap();
    let live = mem.stats().allocated;
    assert!(live >= base + 8192);
    defer::release(a);
    let inner = defer::enter();
    defer::release(b);
    assert_eq!(defer::state(), (2, 2));
    drop(inner);
    assert_eq!(mem.stats().allocated, live); // an inner close frees nothing
    drop(outer);
    assert_eq!(defer::state(), (0, 0));
    assert_eq!(mem.stats().allocated, base);
    // Without a scope, release frees at once.
    let c = mem.allocate(4096).unwrap();
    defer::release(c);
    assert_eq!(mem.stats().allocated, base);
}

#[test]
fn device_uuid_is_uuid5_of_profile_and_index() {
    // Python: str(uuid.uuid5(uuid.NAMESPACE_URL, "runtime://ascend910/0")).
    assert_eq!(
        device_uuid("ascend910", 0),
        "50c5f949-7ecf-518e-acb6-29d04bbc144a"
    );
    assert_ne!(device_uuid("ascend910", 1), device_uuid("ascend910", 0));
    assert_ne!(device_uuid("host", 0), device_uuid("ascend910", 0));
    let rt = common::init();
    assert_eq!(
        rt.device(1).unwrap().properties().uuid,
        device_uuid(&rt.device(1).unwrap().properties().profile, 1)
    );
}
