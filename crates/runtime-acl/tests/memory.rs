//! The ACL face's memory calls (`memory`) against the core's ordering of host memory.

use ascendcl::memory::{self, DeviceKind, Foreign};
use ascendcl::{lifecycle, state};

/// `aclInit` once for the binary (its tests run on parallel threads; a second `aclInit` is
/// an error, as in CANN), then device 0 on this thread.
fn init() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| lifecycle::init(None).unwrap());
    state::set_device(0).unwrap();
}

/// `aclrtMemsetAsync` on pinned host memory (`aclrtMallocHost`) ran as an op that named no
/// memory, so a device-to-host `aclrtMemcpyAsync` into the same block on another stream
/// wrote it at the same time: the block ended half 0xAA, half 0x55 in 33 of 40 rounds. The
/// memset now names the block's tracker, as the copy does, and the two take turns: each
/// round leaves the block all one value.
#[test]
fn a_host_memset_and_a_copy_into_the_same_block_take_turns() {
    const LEN: u64 = 8 << 20;
    init();
    let host = memory::malloc_host(LEN).unwrap();
    let dev = memory::malloc(LEN, DeviceKind::Malloc).unwrap();
    let s1 = state::stream("t", state::create_stream(0).unwrap()).unwrap();
    let s2 = state::stream("t", state::create_stream(0).unwrap()).unwrap();
    // SAFETY: `Foreign::Refuse` touches only memory in the ACL table.
    unsafe { memory::memset(dev, LEN, 0x55, LEN, None, Foreign::Refuse).unwrap() };
    for round in 0..20 {
        // SAFETY: as above.
        unsafe {
            memory::memset(host, LEN, 0x00, LEN, None, Foreign::Refuse).unwrap();
            memory::memset(host, LEN, 0xAA, LEN, Some(&s1), Foreign::Refuse).unwrap();
            memory::memcpy(host, LEN, dev, LEN, 2, Some(&s2), Foreign::Refuse).unwrap();
        }
        s1.synchronize(None).unwrap();
        s2.synchronize(None).unwrap();
        // SAFETY: both streams are idle, so nothing writes the block while it is read; it
        // is `LEN` bytes of live pinned memory.
        let bytes = unsafe { std::slice::from_raw_parts(host as *const u8, LEN as usize) };
        let aa = bytes.iter().filter(|&&b| b == 0xAA).count();
        assert!(
            aa == 0 || aa == LEN as usize,
            "round {round}: {aa} of {LEN} bytes are the memset's, the rest the copy's"
        );
    }
}

/// A blocking host-to-host `aclrtMemcpy` between two pinned blocks copied on the caller's
/// thread without the blocks' trackers, so it wrote the destination while a device-to-host
/// `aclrtMemcpyAsync` queued into it was writing too. It now copies as a safe host access:
/// after the queued copy, holding both blocks, so each round ends with the block all the
/// blocking copy's bytes.
#[test]
fn a_blocking_host_copy_waits_for_the_copy_queued_into_its_destination() {
    const LEN: u64 = 8 << 20;
    init();
    let (dst, src) = (
        memory::malloc_host(LEN).unwrap(),
        memory::malloc_host(LEN).unwrap(),
    );
    let dev = memory::malloc(LEN, DeviceKind::Malloc).unwrap();
    let s = state::stream("t", state::create_stream(0).unwrap()).unwrap();
    // SAFETY: `Foreign::Refuse` touches only memory in the ACL table.
    unsafe {
        memory::memset(dev, LEN, 0x55, LEN, None, Foreign::Refuse).unwrap();
        memory::memset(src, LEN, 0xAA, LEN, None, Foreign::Refuse).unwrap();
    }
    for round in 0..20 {
        // SAFETY: as above.
        unsafe {
            memory::memset(dst, LEN, 0x00, LEN, None, Foreign::Refuse).unwrap();
            memory::memcpy(dst, LEN, dev, LEN, 2, Some(&s), Foreign::Refuse).unwrap();
            memory::memcpy(dst, LEN, src, LEN, 0, None, Foreign::Refuse).unwrap();
        }
        s.synchronize(None).unwrap();
        // SAFETY: the stream is idle, so nothing writes the block while it is read; it is
        // `LEN` bytes of live pinned memory.
        let bytes = unsafe { std::slice::from_raw_parts(dst as *const u8, LEN as usize) };
        let aa = bytes.iter().filter(|&&b| b == 0xAA).count();
        assert!(
            aa == LEN as usize,
            "round {round}: {aa} of {LEN} bytes are the blocking copy's, the rest the queued copy's"
        );
    }
}
