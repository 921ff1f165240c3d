//! Managed (unified) memory: `cudaMallocManaged`'s allocations, which kernels, copies and the
//! host all address.
//!
//! A virtual device's memory is host memory, so a managed allocation is an ordinary device
//! allocation ([`allocate`]) that is *registered* as managed: [`is_managed`] says so, the host
//! may view it (the Python layer's `DeviceBuffer.host_view()`), and it accepts prefetches and
//! advice, which plain device memory refuses (as `cudaMemPrefetchAsync` and `cudaMemAdvise`
//! refuse it). Since nothing migrates between virtual devices, a prefetch is a stream-ordered
//! marker (it orders and is traced; `stream::copy::prefetch`) and advice is recorded
//! ([`state`]) and traced; neither changes where bytes are. A managed buffer takes part in
//! kernels on the device it was allocated on, like any device buffer.
//!
//! The registry holds a `Weak` per managed allocation, keyed by the allocation's address: the
//! `Weak` keeps that address from being reused while the entry exists, and dead entries are
//! swept as new ones are added.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::{Allocation, Buffer, DeviceMemory};
use crate::clock::now_ns;
use crate::error::{arg_error, Result};
use crate::trace;

/// Advice for a managed range, with `cudaMemoryAdvise`'s numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Advice {
    /// The data is mostly read (`cudaMemAdviseSetReadMostly`, 1).
    SetReadMostly = 1,
    /// Undo `SetReadMostly` (2).
    UnsetReadMostly = 2,
    /// Prefer keeping the data on a device (3).
    SetPreferredLocation = 3,
    /// Undo `SetPreferredLocation` (4).
    UnsetPreferredLocation = 4,
    /// The data is accessed by a device (5).
    SetAccessedBy = 5,
    /// Undo `SetAccessedBy` (6).
    UnsetAccessedBy = 6,
}

impl Advice {
    /// Every advice, in numbering order.
    pub const ALL: [Advice; 6] = [
        Advice::SetReadMostly,
        Advice::UnsetReadMostly,
        Advice::SetPreferredLocation,
        Advice::UnsetPreferredLocation,
        Advice::SetAccessedBy,
        Advice::UnsetAccessedBy,
    ];

    /// The snake-case name (`"set_read_mostly"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Advice::SetReadMostly => "set_read_mostly",
            Advice::UnsetReadMostly => "unset_read_mostly",
            Advice::SetPreferredLocation => "set_preferred_location",
            Advice::UnsetPreferredLocation => "unset_preferred_location",
            Advice::SetAccessedBy => "set_accessed_by",
            Advice::UnsetAccessedBy => "unset_accessed_by",
        }
    }

    /// The advice with CUDA's number `code` (1..=6).
    ///
    /// # Errors
    /// Any other number (naming the valid ones).
    pub fn from_code(code: i64) -> Result<Advice> {
        Advice::ALL
            .into_iter()
            .find(|a| *a as i64 == code)
            .ok_or_else(|| bad_advice(&code.to_string()))
    }

    /// The advice named `name` (as [`Advice::name`], case-insensitive, an optional
    /// `cudaMemAdvise` prefix and CamelCase accepted: `"cudaMemAdviseSetReadMostly"`).
    ///
    /// # Errors
    /// An unknown name (naming the valid ones).
    pub fn parse(name: &str) -> Result<Advice> {
        let key: String = name
            .trim_start_matches("cudaMemAdvise")
            .chars()
            .filter(|c| *c != '_')
            .flat_map(char::to_lowercase)
            .collect();
        Advice::ALL
            .into_iter()
            .find(|a| a.name().replace('_', "") == key)
            .ok_or_else(|| bad_advice(&format!("{name:?}")))
    }
}

fn bad_advice(got: &str) -> crate::error::Error {
    let valid: Vec<String> = Advice::ALL
        .iter()
        .map(|a| format!("{} ({})", a.name(), *a as i64))
        .collect();
    arg_error(
        "advice",
        format!("unknown advice {got}; valid: {}", valid.join(", ")),
    )
}

/// Where a prefetch or an advice points: a device, or the host (`cudaCpuDeviceId`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// The host.
    Host,
    /// A device index.
    Device(usize),
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Host => write!(f, "host"),
            Location::Device(d) => write!(f, "device {d}"),
        }
    }
}

/// What was advised and prefetched for a managed allocation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ManagedState {
    /// `SetReadMostly` is in effect.
    pub read_mostly: bool,
    /// The preferred location, if set.
    pub preferred_location: Option<Location>,
    /// Locations advised with `SetAccessedBy` (in advice order, no repeats).
    pub accessed_by: Vec<Location>,
    /// Where the last completed prefetch pointed.
    pub last_prefetch: Option<Location>,
}

struct Entry {
    alloc: Weak<Allocation>,
    state: ManagedState,
}

static REGISTRY: Mutex<Option<HashMap<usize, Entry>>> = Mutex::new(None);

fn key(b: &Buffer) -> usize {
    Arc::as_ptr(&b.alloc) as usize
}

/// Allocate `size` zeroed bytes of managed memory on `mem`'s device.
///
/// # Errors
/// As [`DeviceMemory::allocate`].
pub fn allocate(mem: &Arc<DeviceMemory>, size: u64) -> Result<Buffer> {
    let b = mem.allocate(size)?;
    let mut reg = REGISTRY.lock();
    let map = reg.get_or_insert_with(HashMap::new);
    if map.len() >= 64 && map.len().is_power_of_two() {
        map.retain(|_, e| e.alloc.strong_count() > 0);
    }
    map.insert(
        key(&b),
        Entry {
            alloc: Arc::downgrade(&b.alloc),
            state: ManagedState::default(),
        },
    );
    Ok(b)
}

/// Whether `b` (or the allocation it views) was allocated as managed memory.
pub fn is_managed(b: &Buffer) -> bool {
    REGISTRY
        .lock()
        .as_ref()
        .and_then(|m| m.get(&key(b)))
        .is_some_and(|e| e.alloc.as_ptr() == Arc::as_ptr(&b.alloc))
}

/// What was advised and prefetched for `b`; `None` when it is not managed.
pub fn state(b: &Buffer) -> Option<ManagedState> {
    REGISTRY
        .lock()
        .as_ref()
        .and_then(|m| m.get(&key(b)))
        .filter(|e| e.alloc.as_ptr() == Arc::as_ptr(&b.alloc))
        .map(|e| e.state.clone())
}

/// Refuse a buffer that is not managed memory (what `cudaMemPrefetchAsync` and
/// `cudaMemAdvise` answer for device memory), or that is no longer usable.
///
/// # Errors
/// `arg` is not managed (`ValueError`-like argument error); [`Buffer::check`]'s errors.
pub fn check_managed(b: &Buffer, arg: &str) -> Result<()> {
    b.check()?;
    if !is_managed(b) {
        return Err(arg_error(
            arg,
            format!("{b:?} is device memory, not managed memory (allocate it with malloc_managed)"),
        ));
    }
    Ok(())
}

fn update(b: &Buffer, f: impl FnOnce(&mut ManagedState)) {
    if let Some(e) = REGISTRY.lock().as_mut().and_then(|m| m.get_mut(&key(b))) {
        f(&mut e.state);
    }
}

/// Record `advice` about `location` for managed buffer `b`, and trace it.
///
/// # Errors
/// As [`check_managed`]; `location` must be given for the location advices
/// (`Set/UnsetPreferredLocation`, `Set/UnsetAccessedBy`); the device index itself is checked
/// by the caller, which knows the devices.
pub fn advise(b: &Buffer, advice: Advice, location: Location) -> Result<()> {
    check_managed(b, "buf")?;
    update(b, |s| match advice {
        Advice::SetReadMostly => s.read_mostly = true,
        Advice::UnsetReadMostly => s.read_mostly = false,
        Advice::SetPreferredLocation => s.preferred_location = Some(location),
        Advice::UnsetPreferredLocation => s.preferred_location = None,
        Advice::SetAccessedBy => {
            if !s.accessed_by.contains(&location) {
                s.accessed_by.push(location);
            }
        }
        Advice::UnsetAccessedBy => s.accessed_by.retain(|l| *l != location),
    });
    if trace::enabled() {
        trace::push(trace::Record {
            name: format!("mem_advise {} {location} ({} B)", advice.name(), b.size()),
            device: b.device(),
            stream: 0,
            ts_ns: now_ns(),
            phase: trace::Phase::Advise { bytes: b.size() },
        });
    }
    Ok(())
}

/// Note that a prefetch of `b` to `location` completed (called by the prefetch op).
pub(crate) fn note_prefetch(b: &Buffer, location: Location) {
    update(b, |s| s.last_prefetch = Some(location));
}

static FORK: crate::sync::ForkGuarded<Mutex<Option<HashMap<usize, Entry>>>> =
    crate::sync::ForkGuarded::new(|| &REGISTRY);

/// Around `fork()`: hold the lock so that no other thread is inside it when the process is
/// copied (see `runtime::install_fork_handlers`).
pub(crate) fn before_fork(wait: std::time::Duration) {
    FORK.before_fork(wait);
}

/// After `fork()`, in the parent or the child: release what [`before_fork`] took.
pub(crate) fn after_fork(child: bool) {
    FORK.after_fork(child);
}
