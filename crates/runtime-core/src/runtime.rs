//! The runtime object: owns the virtual devices between `init` and `shutdown`, and the
//! process-wide options.
//!
//! `init` is idempotent; `shutdown` marks every device dead (so new work is refused and old
//! handles fail with `InvalidHandle`), waits for the queued work, stops the engines and drops
//! the runtime's references to device memory. Memory still referenced by live views stays
//! mapped until the last view goes away, so nothing can dangle. `init` works again after
//! `shutdown`; an `init` racing a `shutdown` waits for it and builds a new runtime.
//!
//! `fork()`: the first `init` registers the runtime's own handlers with `pthread_atfork`, so
//! every fork (Python's `os.fork`, `multiprocessing`, C code) takes the process-wide locks
//! around the copy and the child abandons the parent's runtime. The handlers are private:
//! nothing public unlocks a lock it does not hold.
//!
//! ```compile_fail
//! runtime_core::runtime::after_fork_in_parent();
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::config::{Config, ConfigBuilder};
use crate::device::{Device, DeviceProperties};
use crate::error::{arg_error, DeviceError, Error, Result, StreamError};
use crate::memory::DeviceMemory;
use crate::stream::Executor;

use crate::config::{options, RuntimeOption};

/// Set a process-wide option (it outlives `shutdown`). Turning
/// [`RuntimeOption::MemoryReuse`] off also releases the caches.
pub fn set_option(option: RuntimeOption, value: bool) {
    options().set(option, value);
    if option == RuntimeOption::MemoryReuse && !value {
        if let Ok(rt) = get() {
            for d in &rt.devices {
                d.memory().empty_cache();
            }
        }
    }
}

/// Read a process-wide option.
pub fn get_option(option: RuntimeOption) -> bool {
    options().get(option)
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

static RUNTIME: crate::sync::StaticRwLock<Option<Arc<Runtime>>> =
    crate::sync::StaticRwLock::new(None);

/// Initialise the runtime; a no-op when it is already initialised with the same settings.
///
/// # Errors
/// `ConfigError` for bad settings; `InvalidArgument` when already initialised with different
/// explicit settings (call `shutdown` first).
pub fn init(builder: &ConfigBuilder) -> Result<Arc<Runtime>> {
    loop {
        if let Some(rt) = init_within(builder, None)? {
            return Ok(rt);
        }
    }
}

/// [`init`] that waits at most `timeout` for a shutdown in progress (`Ok(None)` when the time
/// ran out first; call again to keep waiting). Callers that must stay interruptible (the
/// Python bindings, for Ctrl-C) call it in slices.
///
/// A runtime whose shutdown was begun but not finished (its caller was interrupted) is
/// drained and taken out here, as [`shutdown_within`] would, before the new one is built.
///
/// # Errors
/// As [`init`].
pub(crate) fn init_within(
    builder: &ConfigBuilder,
    timeout: Option<std::time::Duration>,
) -> Result<Option<Arc<Runtime>>> {
    install_fork_handlers();
    let deadline = crate::clock::deadline_after(timeout);
    let config = builder.build()?;
    let mut slot = RUNTIME.write();
    // While `shutdown` drains, the dying runtime is still installed: help drain it and take
    // it out (work queued on the dying runtime cannot wait for its own drain: it gets an
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
        if !shutdown_within(crate::clock::time_left(deadline))? {
            return Ok(None);
        }
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
        return Ok(Some(rt.clone()));
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
            uuid: crate::device::device_uuid(p.name, index),
        };
        let memory = Arc::new(memory);
        let exec = Executor::new(index, generation, compute_engines, opts.clone(), &memory);
        devices.push(Device::new(index, props, memory, exec));
    }
    let rt = Arc::new(Runtime {
        config,
        devices,
        generation,
        closing: AtomicBool::new(false),
    });
    *slot = Some(rt.clone());
    crate::generation::install(generation);
    Ok(Some(rt))
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
    while !shutdown_within(None)? {}
    Ok(())
}

/// [`shutdown`] that waits at most `timeout` for the queued work: `Ok(false)` when the time
/// ran out first. The runtime then stays closing (new work is refused, queued work keeps
/// running); calling again (or `init`) continues the drain and finishes the shutdown.
/// Callers that must stay interruptible (the Python bindings, for Ctrl-C) call it in slices.
///
/// # Errors
/// As [`shutdown`].
pub(crate) fn shutdown_within(timeout: Option<std::time::Duration>) -> Result<bool> {
    if crate::stream::engine::on_worker_thread() {
        return Err(StreamError::NotPermitted {
            what: "shutdown() from a kernel or host function".into(),
        }
        .into());
    }
    let deadline = crate::clock::deadline_after(timeout);
    // Refuse new work first and wait for submissions already past their check (the gate),
    // drain with the runtime still installed (queued work may look it up while it runs),
    // then take it out.
    let Some(rt) = RUNTIME.read().clone() else {
        return Ok(true);
    };
    rt.closing.store(true, Ordering::Release);
    // Collectives waiting for a rank that will never come would hold up the drain.
    crate::comm::abort_all("the runtime is shutting down");
    for d in &rt.devices {
        d.executor().close();
    }
    // No rank of this runtime's devices joins a communicator from here on.
    crate::comm::fail_all_gatherings("the runtime is shutting down");
    // A stream waiting on a user event nobody sets would keep the drain from finishing.
    crate::event::fail_pending_user_events(
        "the runtime was shut down before the user event was set",
    );
    for d in &rt.devices {
        // Queued work finishes first; errors it raised are dropped with the runtime.
        if !d.executor().drain_until(deadline) {
            return Ok(false);
        }
    }
    {
        let mut slot = RUNTIME.write();
        if !slot.as_ref().is_some_and(|cur| Arc::ptr_eq(cur, &rt)) {
            return Ok(true); // another thread's shutdown took it meanwhile
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
    // The pinned cache and its statistics belong to this runtime too.
    crate::memory::pinned::reset();
    Ok(true)
}

/// The exit policy of a process whose exit handlers may use the runtime (the Python
/// package registers it with `atexit`, to run after every other handler it knows of): shut
/// the runtime down (waiting for its queued work), then turn [`RuntimeOption::Async`] off, so
/// that a runtime a later exit handler initialises runs every submission to completion before
/// the call returns: nothing of it is left running or queued when the process tears down
/// (an interpreter's finalisation, which runtime threads could not survive).
///
/// # Errors
/// As [`shutdown`].
pub fn at_exit() -> Result<()> {
    while !at_exit_within(None)? {}
    Ok(())
}

/// [`at_exit`] that waits at most `timeout` for the queued work: `Ok(false)` when the time
/// ran out first (the runtime stays closing; call again).
pub(crate) fn at_exit_within(timeout: Option<std::time::Duration>) -> Result<bool> {
    if !shutdown_within(timeout)? {
        return Ok(false);
    }
    set_option(RuntimeOption::Async, false);
    Ok(true)
}

/// Register the runtime's `fork()` handlers with the C library (`pthread_atfork`), once per
/// process. Called by [`init`]: a process forks safely whoever forks it (Python's `os.fork`,
/// `multiprocessing`, C code), and no public function unlocks a lock it does not hold.
fn install_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        extern "C" fn prepare() {
            before_fork();
        }
        extern "C" fn parent() {
            after_fork_in_parent();
        }
        extern "C" fn child() {
            after_fork_in_child();
        }
        // SAFETY: the three handlers are `extern "C"` functions with no arguments that live
        // for the whole program; `pthread_atfork` only stores them.
        // It fails only when the C library is out of memory; forks then go unhandled as
        // before the first `init`, and the child still refuses the parent's handles (the
        // generation check compares the process id).
        let _ = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

/// Longest the fork handler waits for one of the runtime's process-wide locks: a thread that
/// holds one only does bookkeeping under it, so the wait is short; if it is not free by then
/// the fork goes ahead without it, and the child repairs the lock as it does for locks held
/// by threads that vanished.
const FORK_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The runtime slot's lock, as the fork handlers take and release it.
static RUNTIME_FORK: crate::sync::ForkGuarded<crate::sync::StaticRwLock<Option<Arc<Runtime>>>> =
    crate::sync::ForkGuarded::new(|| &RUNTIME);

/// `pthread_atfork` prepare handler: take the runtime's process-wide locks so that no other
/// thread is inside one when the process is copied, and the child finds each consistent.
fn before_fork() {
    RUNTIME_FORK.before_fork(FORK_LOCK_WAIT);
    crate::kernel::before_fork(FORK_LOCK_WAIT);
    crate::trace::before_fork(FORK_LOCK_WAIT);
    crate::memory::before_fork(FORK_LOCK_WAIT);
    crate::event::before_fork(FORK_LOCK_WAIT);
    crate::ipc_event::before_fork(FORK_LOCK_WAIT);
    crate::stream::before_fork(FORK_LOCK_WAIT);
    crate::comm::before_fork(FORK_LOCK_WAIT);
}

/// `pthread_atfork` parent handler: release exactly what [`before_fork`] took.
fn after_fork_in_parent() {
    crate::comm::after_fork(false);
    crate::stream::after_fork(false);
    crate::ipc_event::after_fork(false);
    crate::event::after_fork(false);
    crate::memory::after_fork(false);
    crate::trace::after_fork(false);
    crate::kernel::after_fork(false);
    RUNTIME_FORK.after_fork(false);
}

/// `pthread_atfork` child handler.
///
/// The child has only the thread that forked: the engine workers, scrubbers and copy helpers
/// of the parent's runtime are gone, and a lock one of them held stays held. So the inherited
/// runtime is abandoned without touching its threads or its locks (it is leaked), the
/// generation moves on so that every inherited handle fails (`InvalidHandle`, or
/// `NotInitialized` until `init`), and the process-wide state (the runtime slot, the copy
/// helpers, the calling thread's state) is reset: `init` then builds a runtime of the
/// child's own.
fn after_fork_in_child() {
    crate::generation::after_fork_in_child();
    crate::sync::after_fork_in_child();
    crate::comm::after_fork(true);
    crate::stream::after_fork(true);
    crate::ipc_event::after_fork(true);
    crate::event::after_fork(true);
    crate::memory::after_fork(true);
    crate::trace::after_fork(true);
    crate::kernel::after_fork(true);
    // Whoever holds the slot's lock (the forking thread after `before_fork`, or a thread that
    // vanished) does not exist as a holder any more.
    RUNTIME_FORK.after_fork(true);
    std::mem::forget(RUNTIME.write().take());
    crate::memory::after_fork_in_child();
    crate::stream::after_fork_in_child();
    crate::device::reset_thread_state();
}

/// Testing hook (cargo feature `testing`): the next `n` thread starts of the runtime (engine
/// workers, memory scrubbers, copy helpers) fail as if the OS refused them; 0 disarms.
#[cfg(feature = "testing")]
pub fn inject_thread_spawn_failures(n: u64) {
    crate::sync::inject_spawn_failures(n);
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

/// Whether an all-streams barrier has anything to wait for or report: on some device, a
/// stream submitted to, or that began a capture, since a barrier last found it quiet. No
/// lock and no wait (one load per device): callers that must release a lock to wait (the
/// Python bindings release the GIL) skip the release when this is false.
///
/// # Errors
/// `NotInitialized`.
pub(crate) fn barrier_has_work() -> Result<bool> {
    Ok(barrier_has_work_on(&*get()?))
}

fn barrier_has_work_on(rt: &Runtime) -> bool {
    rt.devices.iter().any(|d| d.executor().has_listed())
}

/// [`synchronize_all`] for callers that wait in slices: `Ok(false)` on timeout.
///
/// # Errors
/// As for [`synchronize_all`], without `Timeout`.
pub(crate) fn wait_all(timeout: Option<std::time::Duration>) -> Result<bool> {
    let rt = get()?;
    if !barrier_has_work_on(&rt) {
        return Ok(true);
    }
    // Refused before anything is waited for or any stream's error is taken.
    for d in &rt.devices {
        d.executor().refuse_if_any_captures()?;
    }
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
    pub fn device(&self, index: usize) -> Result<&Device> {
        self.devices.get(index).ok_or_else(|| {
            DeviceError::InvalidDevice {
                index: i64::try_from(index).unwrap_or(i64::MAX),
                count: self.devices.len(),
            }
            .into()
        })
    }
}

/// The calling thread's current device.
pub fn current_device() -> Result<Device> {
    let rt = get()?;
    let d = rt.device(crate::device::current_device_index())?;
    Ok(d.clone())
}

/// Make device `index` current for the calling thread.
pub fn set_device(index: usize) -> Result<()> {
    let rt = get()?;
    let d = rt.device(index)?;
    crate::device::set_current_device_index(d.index());
    Ok(())
}
