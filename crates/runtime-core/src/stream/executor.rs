//! The execution side of one device, as streams see it: its engines (worker threads), its
//! submission gate, the process options, and the registry of its live streams.
//!
//! A device owns one [`Executor`]; every stream of the device holds it. Streams need nothing
//! else from their device, so this module, not `device`, is what they depend on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::sync::lock::Mutex;

use super::engine::Engines;
use super::{Stream, StreamInner};
use crate::clock::{deadline_after, time_left};
use crate::config::Options;
use crate::error::{DeviceError, Error, Result};
use crate::sync::gate::{EntryGate, EntryGuard};

/// Engines, submission gate, options and stream registry of one device.
pub struct Executor {
    device: usize,
    /// The runtime generation the device belongs to.
    generation: u64,
    pub(crate) engines: Engines,
    pub(crate) options: Arc<Options>,
    /// Open until shutdown: new work enters through it (see `gate`).
    gate: EntryGate,
    /// Every live stream of the device, for shutdown's drain and the reclaimer.
    streams: Mutex<HashMap<u64, Weak<StreamInner>>>,
    /// The streams a barrier must look at: each stream that was submitted to or began a
    /// capture since a barrier last found it quiet (`StreamInner::listed` says whether it is
    /// here). Barriers cost O(these), not O(every live stream).
    active: Mutex<Vec<Weak<StreamInner>>>,
    /// The length of `active`, written under its lock and read without it: a barrier on a
    /// device with nothing listed returns after one load.
    listed: AtomicUsize,
    /// The fork count when the device was made (see [`crate::generation::forks`]): in a
    /// forked child the device is dead and its locks are left alone.
    forks: u64,
    /// The device's memory, for stream-ordered allocation (weak: the memory's async pool may
    /// hold streams, which hold this executor).
    memory: std::sync::Weak<crate::memory::DeviceMemory>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Executor(device {})", self.device)
    }
}

impl Executor {
    /// Start the engines of device `device` (`compute_workers` compute threads).
    pub(crate) fn new(
        device: usize,
        generation: u64,
        compute_workers: usize,
        options: Arc<Options>,
        memory: &Arc<crate::memory::DeviceMemory>,
    ) -> Executor {
        Executor {
            device,
            generation,
            engines: Engines::new(device, compute_workers),
            options,
            gate: EntryGate::new(),
            streams: Mutex::new(HashMap::new()),
            active: Mutex::new(Vec::new()),
            listed: AtomicUsize::new(0),
            forks: crate::generation::forks(),
            memory: Arc::downgrade(memory),
        }
    }

    /// The device's memory, while it lives.
    pub fn memory(&self) -> Option<Arc<crate::memory::DeviceMemory>> {
        self.memory.upgrade()
    }

    /// The device index.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The generation of the runtime the device belongs to.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Compute worker threads.
    pub fn compute_workers(&self) -> usize {
        self.engines.compute_workers()
    }

    /// Time the device has spent running compute work (kernels, host functions), summed
    /// over its workers.
    pub fn compute_busy(&self) -> Duration {
        self.engines.compute_busy()
    }

    /// Percent of the compute workers' time spent busy since the previous call (see
    /// `Device::compute_utilization`).
    pub fn compute_utilization(&self) -> u32 {
        self.engines.utilization()
    }

    /// The process options this device runs under.
    pub fn options(&self) -> &Arc<Options> {
        &self.options
    }

    /// Whether the device still takes work (its runtime has not begun shutting down).
    pub fn is_open(&self) -> bool {
        self.gate.is_open() && !self.forked_away()
    }

    /// Whether this device belongs to the parent of this (forked) process.
    fn forked_away(&self) -> bool {
        self.forks != crate::generation::forks()
    }

    /// Fails with `InvalidHandle` once the runtime that made this device began shutting down.
    pub fn check_alive(&self) -> Result<()> {
        if self.is_open() {
            Ok(())
        } else {
            Err(self.dead())
        }
    }

    fn dead(&self) -> Error {
        let why = if self.forked_away() {
            "it belongs to the runtime of the parent process (this process was forked); call runtime.init() here"
        } else {
            "the runtime was shut down"
        };
        DeviceError::InvalidHandle {
            what: format!("Device({})", self.device),
            why: why.into(),
        }
        .into()
    }

    /// Begin a submission: fails like [`Executor::check_alive`] once shutdown has begun;
    /// while the guard lives, [`Executor::close`] waits, so shutdown's drain covers it.
    ///
    /// The device's engines are started here (on first use), so a command is accepted only
    /// when there are workers to run it.
    pub(crate) fn enter_submit(&self) -> Result<EntryGuard<'_>> {
        if self.forked_away() {
            return Err(self.dead());
        }
        let guard = self.gate.enter().ok_or_else(|| self.dead())?;
        self.engines.ensure_started()?;
        Ok(guard)
    }

    /// Refuse new work and wait for submissions already past their check.
    pub(crate) fn close(&self) {
        self.gate.close(None);
    }

    /// Stop the engines (after the drain).
    pub(crate) fn stop(&self) {
        self.engines.stop();
    }

    pub(crate) fn register(&self, s: &Arc<StreamInner>) {
        self.streams.lock().insert(s.id, Arc::downgrade(s));
    }

    /// The live stream of this device whose id is `id` (`None`: no such stream, or it was
    /// dropped).
    pub(crate) fn stream(&self, id: u64) -> Option<Stream> {
        let inner = self.streams.lock().get(&id)?.upgrade()?;
        Some(Stream(inner))
    }

    pub(crate) fn unregister(&self, id: u64) {
        if self.forked_away() {
            return; // a thread that vanished in the fork may hold the lock
        }
        self.streams.lock().remove(&id);
    }

    /// Put `s` on the list barriers look at, unless it is there. Called after a submission
    /// counted itself and before a capture begins. One SeqCst load when already listed.
    ///
    /// Against [`Executor::prune`]: the pruner clears `listed` and then re-reads the stream's
    /// state; a submitter counts its command and then reads `listed`. Both in SeqCst order,
    /// so either the pruner sees the new command (and keeps the stream), or the submitter
    /// sees `listed` cleared (and lists the stream again).
    pub(crate) fn mark_active(&self, s: &Arc<StreamInner>) {
        if s.listed.load(Ordering::SeqCst) || s.listed.swap(true, Ordering::SeqCst) {
            return;
        }
        if self.forked_away() {
            return; // a thread that vanished in the fork may hold the lock
        }
        let mut active = self.active.lock();
        active.push(Arc::downgrade(s));
        self.listed.store(active.len(), Ordering::SeqCst);
    }

    /// Whether a barrier has anything to look at on this device: a stream submitted to, or
    /// that began a capture, since a barrier last found it quiet. One load, no lock. A
    /// submission that returned before this call is seen (it listed its stream first).
    pub(crate) fn has_listed(&self) -> bool {
        !self.forked_away() && self.listed.load(Ordering::SeqCst) > 0
    }

    /// The listed streams (see [`Executor::streams`] for why they are returned, not dropped,
    /// outside the lock).
    fn active_streams(&self) -> Vec<Stream> {
        if self.forked_away() {
            return Vec::new();
        }
        let all: Vec<Arc<StreamInner>> = self
            .active
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        all.into_iter().map(Stream).collect()
    }

    /// Take quiet and dropped streams off the list (after a barrier waited for them).
    fn prune(&self) {
        if self.forked_away() {
            return;
        }
        let mut keep_alive = Vec::new(); // dropped after the lock (see `streams`)
        let mut active = self.active.lock();
        active.retain(|w| {
            let Some(s) = w.upgrade() else {
                return false;
            };
            let keep = if s.quiet() {
                s.listed.store(false, Ordering::SeqCst);
                // Work that arrived meanwhile: keep the entry, unless its submitter saw the
                // flag cleared and lists the stream itself.
                !s.quiet() && !s.listed.swap(true, Ordering::SeqCst)
            } else {
                true
            };
            keep_alive.push(s);
            keep
        });
        self.listed.store(active.len(), Ordering::SeqCst);
        drop(active);
        drop(keep_alive);
    }

    /// The live streams. Handles are upgraded under the lock but returned, and so dropped,
    /// after it is released: an upgraded handle can be the last one when its owner drops
    /// the stream meanwhile, and dropping a stream takes this lock.
    pub(crate) fn streams(&self) -> Vec<Stream> {
        if self.forked_away() {
            return Vec::new();
        }
        let all: Vec<Arc<StreamInner>> = self
            .streams
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        all.into_iter().map(Stream).collect()
    }

    /// Fails with `Capturing` when a live stream of the device captures: a barrier would wait
    /// for work that is only being recorded.
    ///
    /// # Errors
    /// As said.
    pub fn refuse_if_any_captures(&self) -> Result<()> {
        if !self.has_listed() {
            return Ok(()); // a capturing stream is listed when its capture begins
        }
        for s in self.active_streams().iter().filter(|s| !s.is_destroyed()) {
            s.refuse_if_capturing("a device or all-streams synchronize")?;
        }
        Ok(())
    }

    /// Wait for every live stream of the device; report every error raised since each
    /// stream's last synchronisation (each once). Returns `Ok(false)` on timeout.
    ///
    /// A destroyed stream's queued work is waited for too (a launch accepted just before
    /// `destroy` took effect may still be queued), but its errors belong to `destroy`'s
    /// caller and are not reported here.
    ///
    /// # Errors
    /// The first failed stream's error; every error when several failed
    /// (`StreamError::Multiple`).
    pub fn wait_all(&self, timeout: Option<Duration>) -> Result<bool> {
        if !self.has_listed() {
            return Ok(true);
        }
        let deadline = deadline_after(timeout);
        self.refuse_if_any_captures()?;
        let streams = self.active_streams();
        let mut errors = Vec::new();
        for s in streams {
            if !s.wait_for(s.submitted(), time_left(deadline))? {
                return Ok(false);
            }
            if s.is_destroyed() {
                continue;
            }
            match s.take_error() {
                Ok(()) => {}
                Err(e) => errors.push(e),
            }
        }
        self.prune();
        Error::collect(errors).map(|()| true)
    }

    /// Wait until `deadline` (forever when `None`) for all queued work of the device, the
    /// work's errors dropped (shutdown, after `close`). Returns false if the deadline came
    /// first. Never called from a runtime thread (shutdown refuses that first).
    pub(crate) fn drain_until(&self, deadline: Option<std::time::Instant>) -> bool {
        for s in self.streams() {
            if let Ok(false) = s.wait_for(s.submitted(), time_left(deadline)) {
                return false;
            }
        }
        true
    }
}
