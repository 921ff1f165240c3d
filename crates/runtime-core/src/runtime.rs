//! The runtime object: owns the virtual devices between `init` and `shutdown`, and the
//! process-wide options.
//!
//! `init` is idempotent; `shutdown` marks every device dead (so new work is refused and old
//! handles fail with `InvalidHandle`), waits for the queued work, stops the engines and drops
//! the runtime's references to device memory. Memory still referenced by live views stays
//! mapped until the last view goes away, so nothing can dangle. `init` works again after
//! `shutdown`; an `init` racing a `shutdown` waits for it and builds a new runtime.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::config::{Config, ConfigBuilder};
use crate::device::{Device, DeviceProperties};
use crate::error::{arg_error, DeviceError, Error, Result, StreamError};
use crate::memory::DeviceMemory;
use crate::stream::Executor;

pub use crate::config::{get_option, options, Options, OPTION_NAMES};

/// Set an option by name. Turning `enableMemoryReuse` off also releases the caches.
pub fn set_option(name: &str, value: bool) -> Result<()> {
    options().set(name, value)?;
    if name == "enableMemoryReuse" && !value {
        if let Ok(rt) = get() {
            for d in &rt.devices {
                d.memory().empty_cache();
            }
        }
    }
    Ok(())
}

/// An initialised runtime.
pub struct Runtime {
    config: Config,
    devices: Vec<Device>,
    generation: u64,
    /// Set by `shutdown` before it drains: the runtime stays installed (queued work may look it
    /// up) but `init` must not hand it out.
    closing: AtomicBool,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("devices", &self.devices.len())
            .field("generation", &self.generation)
            .finish()
    }
}

static RUNTIME: RwLock<Option<Arc<Runtime>>> = RwLock::new(None);
/// The generation of the runtime installed now (0 when not initialised). A handle made under
/// another generation belongs to a runtime that was shut down.
pub fn live_generation() -> u64 {
    crate::generation::live()
}

/// Initialise the runtime; a no-op when it is already initialised with the same settings.
///
/// # Errors
/// `ConfigError` for bad settings; `InvalidArgument` when already initialised with different
/// explicit settings (call `shutdown` first).
pub fn init(builder: &ConfigBuilder) -> Result<Arc<Runtime>> {
    let config = builder.build()?;
    let mut slot = RUNTIME.write();
    // While `shutdown` drains, the dying runtime is still installed: wait until it has been
    // taken out (work queued on the dying runtime cannot wait for its own drain: it gets an
    // error instead).
    while let Some(rt) = slot
        .as_ref()
        .filter(|rt| rt.closing.load(Ordering::Acquire))
    {
        if crate::stream::engine::on_worker_thread() {
            return Err(DeviceError::InvalidHandle {
                what: format!("the runtime (generation {})", rt.generation),
                why: "shutdown() is draining it, and init() from its own queued work would wait for itself".into(),
            }
            .into());
        }
        drop(slot);
        std::thread::sleep(std::time::Duration::from_millis(1));
        slot = RUNTIME.write();
    }
    if let Some(rt) = slot.as_ref() {
        let explicit = *builder != ConfigBuilder::default();
        if explicit && rt.config != config {
            return Err(arg_error(
                "config",
                format!(
                    "the runtime is already initialised with {} devices x {} bytes ({}); call shutdown() before init() with other settings",
                    rt.config.device_count, rt.config.memory_per_device, rt.config.profile.name
                ),
            ));
        }
        return Ok(rt.clone());
    }
    let generation = crate::generation::next();
    let opts = options().clone();
    let compute_engines = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .max(2);
    let mut devices = Vec::with_capacity(config.device_count);
    for index in 0..config.device_count {
        let memory = DeviceMemory::new(index, config.memory_per_device, opts.clone())
            .map_err(Error::from)?;
        let p = &config.profile;
        let props = DeviceProperties {
            index,
            name: p.device_name.clone(),
            total_memory: config.memory_per_device,
            clock_rate: p.clock_rate_khz,
            cores: p.cores,
            fpeak: p.fpeak,
            memory_bandwidth: p.memory_bandwidth,
            profile: p.name.to_string(),
        };
        let exec = Executor::new(index, generation, compute_engines, opts.clone());
        devices.push(Device::new(index, props, Arc::new(memory), exec));
    }
    let rt = Arc::new(Runtime {
        config,
        devices,
        generation,
        closing: AtomicBool::new(false),
    });
    *slot = Some(rt.clone());
    crate::generation::install(generation);
    Ok(rt)
}

/// The current runtime.
///
/// # Errors
/// `NotInitialized` before `init` and after `shutdown`.
pub fn get() -> Result<Arc<Runtime>> {
    RUNTIME
        .read()
        .clone()
        .ok_or_else(|| DeviceError::NotInitialized.into())
}

/// Whether the runtime is initialised.
pub fn is_initialized() -> bool {
    RUNTIME.read().is_some()
}

/// Shut the runtime down: wait for queued work, stop engines, invalidate all handles.
/// A no-op when not initialised.
///
/// # Errors
/// `NotPermitted` from a runtime thread (a kernel or host function): the drain would wait
/// for the work running the call.
pub fn shutdown() -> Result<()> {
    if crate::stream::engine::on_worker_thread() {
        return Err(StreamError::NotPermitted {
            what: "shutdown() from a kernel or host function".into(),
        }
        .into());
    }
    // Refuse new work first and wait for submissions already past their check (the gate),
    // drain with the runtime still installed (queued work may look it up while it runs),
    // then take it out.
    let Some(rt) = RUNTIME.read().clone() else {
        return Ok(());
    };
    rt.closing.store(true, Ordering::Release);
    for d in &rt.devices {
        d.executor().close();
    }
    for d in &rt.devices {
        // Queued work finishes first; errors it raised are dropped with the runtime.
        d.executor().drain();
    }
    {
        let mut slot = RUNTIME.write();
        if !slot.as_ref().is_some_and(|cur| Arc::ptr_eq(cur, &rt)) {
            return Ok(()); // another thread's shutdown took it meanwhile
        }
        slot.take();
        crate::generation::clear();
    }
    for d in &rt.devices {
        // Taken out under the lock and dropped after it: a stream's queue may own Python
        // objects, whose drop takes the interpreter lock.
        let default = d.0.default_stream.lock().take();
        drop(default);
        d.executor().stop();
        d.memory().empty_cache();
        d.memory().close();
    }
    crate::device::reset_thread_state();
    Ok(())
}

/// The all-streams barrier (`stream_synchronize`): wait for every stream of every device and
/// report every error raised since each stream's last synchronisation, each once
/// (`StreamError::Multiple` when several streams failed).
///
/// # Errors
/// `NotInitialized`; `Timeout` when `timeout` passed first; the streams' errors;
/// `Capturing`; `NotPermitted` from a runtime thread.
pub fn synchronize_all(timeout: Option<std::time::Duration>) -> Result<()> {
    if wait_all(timeout)? {
        Ok(())
    } else {
        Err(StreamError::Timeout {
            what: "the all-streams barrier".into(),
            timeout_ms: timeout.map_or(f64::INFINITY, |t| t.as_secs_f64() * 1e3),
        }
        .into())
    }
}

/// [`synchronize_all`] for callers that wait in slices: `Ok(false)` on timeout.
///
/// # Errors
/// As for [`synchronize_all`], without `Timeout`.
pub fn wait_all(timeout: Option<std::time::Duration>) -> Result<bool> {
    let rt = get()?;
    let deadline = crate::clock::deadline_after(timeout);
    let mut errors = Vec::new();
    for d in &rt.devices {
        match d.executor().wait_all(crate::clock::time_left(deadline)) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(Error::Stream(StreamError::Multiple(es))) => errors.extend(es),
            Err(e) => errors.push(e),
        }
    }
    Error::collect(errors).map(|()| true)
}

impl Runtime {
    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// All devices.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Which `init` this is (1 for the first, 2 after one shutdown, ...).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether `shutdown` has begun on this runtime (it refuses new work and is draining).
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// A device by index.
    ///
    /// # Errors
    /// `InvalidDevice` naming the valid range.
    pub fn device(&self, index: i64) -> Result<&Device> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or_else(|| {
                DeviceError::InvalidDevice {
                    index,
                    count: self.devices.len(),
                }
                .into()
            })
    }
}

/// The calling thread's current device.
pub fn current_device() -> Result<Device> {
    let rt = get()?;
    let d = rt.device(crate::device::current_device_index() as i64)?;
    Ok(d.clone())
}

/// Make device `index` current for the calling thread.
pub fn set_device(index: i64) -> Result<()> {
    let rt = get()?;
    let d = rt.device(index)?;
    crate::device::set_current_device_index(d.index());
    Ok(())
}
