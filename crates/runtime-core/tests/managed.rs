//! Managed memory (`memory::managed`): registration, advice (parsed, validated, recorded,
//! traced) and the stream-ordered prefetch marker (`stream::copy::prefetch`).

mod common;

use std::sync::Arc;

use runtime_core::config::Options;
use runtime_core::memory::managed::{self, Advice, Location};
use runtime_core::memory::DeviceMemory;
use runtime_core::stream::copy;
use runtime_core::stream::Stream;

fn memory() -> Arc<DeviceMemory> {
    Arc::new(DeviceMemory::new(0, 16 << 20, Arc::new(Options::default())).unwrap())
}

#[test]
fn managed_allocations_are_registered_and_views_share_it() {
    let m = memory();
    let b = managed::allocate(&m, 4096).unwrap();
    assert!(managed::is_managed(&b));
    assert!(managed::is_managed(&b.clone()));
    let plain = m.allocate(4096).unwrap();
    assert!(!managed::is_managed(&plain));
    assert!(managed::check_managed(&plain, "buf")
        .unwrap_err()
        .to_string()
        .contains("not managed"));
    assert_eq!(managed::state(&b), Some(Default::default()));
    assert_eq!(managed::state(&plain), None);
}

#[test]
fn registry_does_not_confuse_a_new_allocation_with_a_dropped_one() {
    let m = memory();
    for _ in 0..200 {
        let b = managed::allocate(&m, 64).unwrap();
        drop(b);
        let plain = m.allocate(64).unwrap();
        assert!(!managed::is_managed(&plain));
    }
}

#[test]
fn advice_names_and_codes() {
    for a in Advice::ALL {
        assert_eq!(Advice::from_code(a as i64).unwrap(), a);
        assert_eq!(Advice::parse(a.name()).unwrap(), a);
    }
    assert_eq!(
        Advice::parse("cudaMemAdviseSetPreferredLocation").unwrap(),
        Advice::SetPreferredLocation
    );
    let e = Advice::from_code(0).unwrap_err().to_string();
    assert!(
        e.contains("advice: unknown advice 0") && e.contains("set_read_mostly (1)"),
        "{e}"
    );
    assert!(Advice::parse("readmost").is_err());
}

#[test]
fn advice_is_recorded() {
    let m = memory();
    let b = managed::allocate(&m, 64).unwrap();
    managed::advise(&b, Advice::SetReadMostly, Location::Device(0)).unwrap();
    managed::advise(&b, Advice::SetPreferredLocation, Location::Host).unwrap();
    managed::advise(&b, Advice::SetAccessedBy, Location::Device(1)).unwrap();
    managed::advise(&b, Advice::SetAccessedBy, Location::Device(1)).unwrap();
    let s = managed::state(&b).unwrap();
    assert!(s.read_mostly);
    assert_eq!(s.preferred_location, Some(Location::Host));
    assert_eq!(s.accessed_by, vec![Location::Device(1)]);
    managed::advise(&b, Advice::UnsetAccessedBy, Location::Device(1)).unwrap();
    managed::advise(&b, Advice::UnsetPreferredLocation, Location::Host).unwrap();
    managed::advise(&b, Advice::UnsetReadMostly, Location::Host).unwrap();
    assert_eq!(managed::state(&b), Some(Default::default()));
    let plain = m.allocate(64).unwrap();
    assert!(managed::advise(&plain, Advice::SetReadMostly, Location::Host).is_err());
}

#[test]
fn prefetch_is_a_stream_ordered_marker() {
    let rt = common::init();
    let dev = rt.device(0).unwrap();
    let b = managed::allocate(dev.memory(), 1024).unwrap();
    let s = Stream::new(dev, 0).unwrap();
    s.launch(copy::prefetch(&b, Location::Device(1)).unwrap())
        .unwrap();
    s.launch(copy::prefetch(&b, Location::Host).unwrap())
        .unwrap();
    s.synchronize(None).unwrap();
    assert_eq!(
        managed::state(&b).unwrap().last_prefetch,
        Some(Location::Host)
    );
    let plain = dev.memory().allocate(16).unwrap();
    assert!(copy::prefetch(&plain, Location::Host).is_err());
}
