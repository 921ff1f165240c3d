//! Virtual devices: what a device is (properties, its memory, its execution engines) and the
//! per-thread current device.
//!
//! * [`profile`]: the device models (`ascend910`, `host`).
//! * `gate`: the submission gate that `shutdown` closes before it drains.
//!
//! A [`Device`] owns its [`DeviceMemory`] and the engines that
//! run its streams (see [`crate::stream`]). Devices live as long as the runtime that created
//! them; a `Device` handle checks on each use that its runtime is still alive.

pub(crate) mod gate;
pub mod profile;

use std::cell::Cell;
use std::sync::Arc;

pub(crate) use gate::GateGuard;
use gate::SubmitGate;

use crate::error::{DeviceError, Result};
use crate::memory::DeviceMemory;
use crate::runtime::Options;
use crate::stream::engine::Engines;
use crate::stream::Stream;

/// What a device reports about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceProperties {
    /// Device index.
    pub index: usize,
    /// Name; always says the device is virtual.
    pub name: String,
    /// Capacity in bytes (enforced by the allocator).
    pub total_memory: u64,
    /// Clock rate in kHz.
    pub clock_rate: u64,
    /// Compute cores.
    pub cores: u32,
    /// Nominal peak FLOP/s.
    pub fpeak: f64,
    /// Nominal memory bandwidth, bytes per second.
    pub memory_bandwidth: f64,
    /// Profile name.
    pub profile: String,
}

/// Compute capability summary.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeInfo {
    /// Nominal peak FLOP/s.
    pub fpeak: f64,
    /// Compute cores.
    pub cores: u32,
    /// Clock rate in kHz.
    pub clock_rate: u64,
    /// Execution engines (worker threads) that run this device's compute work.
    pub compute_engines: usize,
}

/// The shared state of one device.
pub(crate) struct DeviceShared {
    pub(crate) index: usize,
    pub(crate) props: DeviceProperties,
    pub(crate) memory: Arc<DeviceMemory>,
    pub(crate) engines: Engines,
    pub(crate) options: Arc<Options>,
    /// Open until shutdown: new work enters through it (see `gate`).
    pub(crate) gate: SubmitGate,
    /// The default stream, created on first use.
    pub(crate) default_stream: parking_lot::Mutex<Option<Stream>>,
}

/// A handle to a virtual device. Cheap to clone.
#[derive(Clone)]
pub struct Device(pub(crate) Arc<DeviceShared>);

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.0.index)
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Device {
    pub(crate) fn new(
        index: usize,
        props: DeviceProperties,
        memory: Arc<DeviceMemory>,
        options: Arc<Options>,
        compute_engines: usize,
    ) -> Device {
        Device(Arc::new(DeviceShared {
            index,
            props,
            memory,
            engines: Engines::new(index, compute_engines),
            options,
            gate: SubmitGate::new(),
            default_stream: parking_lot::Mutex::new(None),
        }))
    }

    /// Device index.
    pub fn index(&self) -> usize {
        self.0.index
    }

    /// Fails with `InvalidHandle` if the runtime that made this device was shut down.
    pub fn check_alive(&self) -> Result<()> {
        if self.0.gate.is_open() {
            Ok(())
        } else {
            Err(self.dead())
        }
    }

    fn dead(&self) -> crate::error::Error {
        DeviceError::InvalidHandle {
            what: format!("Device({})", self.0.index),
            why: "the runtime was shut down".into(),
        }
        .into()
    }

    /// Begin a submission: fails like [`Device::check_alive`] once shutdown has begun; while
    /// the guard lives, [`Device::close`] waits, so shutdown's drain covers the command.
    pub(crate) fn enter_submit(&self) -> Result<GateGuard<'_>> {
        self.0.gate.enter().ok_or_else(|| self.dead())
    }

    /// Refuse new work and wait for submissions already past their check (shutdown, before
    /// it drains).
    pub(crate) fn close(&self) {
        self.0.gate.close();
    }

    /// Properties.
    pub fn properties(&self) -> &DeviceProperties {
        &self.0.props
    }

    /// Compute summary.
    pub fn compute_info(&self) -> ComputeInfo {
        let p = &self.0.props;
        ComputeInfo {
            fpeak: p.fpeak,
            cores: p.cores,
            clock_rate: p.clock_rate,
            compute_engines: self.0.engines.compute_workers(),
        }
    }

    /// The device's memory.
    pub fn memory(&self) -> &Arc<DeviceMemory> {
        &self.0.memory
    }

    /// The device's default stream (created on first use).
    pub fn default_stream(&self) -> Result<Stream> {
        self.check_alive()?;
        let mut slot = self.0.default_stream.lock();
        if let Some(s) = slot.as_ref() {
            return Ok(s.clone());
        }
        let s = Stream::new_internal(self, 0, true)?;
        *slot = Some(s.clone());
        Ok(s)
    }

    /// Wait until every stream of this device has finished its queued work.
    pub fn synchronize(&self, timeout: Option<std::time::Duration>) -> Result<bool> {
        self.check_alive()?;
        crate::stream::synchronize_all(Some(self.0.index), timeout)
    }
}

thread_local! {
    static CURRENT_DEVICE: Cell<usize> = const { Cell::new(0) };
}

/// The calling thread's current device index (default 0).
pub fn current_device_index() -> usize {
    CURRENT_DEVICE.with(Cell::get)
}

/// Set the calling thread's current device index (validated by the caller).
pub(crate) fn set_current_device_index(i: usize) {
    CURRENT_DEVICE.with(|c| c.set(i));
}
