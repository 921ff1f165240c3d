//! Virtual devices: what a device is (properties, its memory, its executor and default
//! stream) and the per-thread current device and current streams.
//!
//! A [`Device`] owns its [`DeviceMemory`] and its `Executor` (the engines that run its
//! streams, and the registry of those streams). Devices live as long as the runtime that
//! created them; a `Device` handle checks on each use that its runtime is still alive.
//!
//! Per-thread state (current device, current stream per device) is reset for every thread
//! by `reset_thread_state`, which `shutdown` calls: a thread's state is tagged with the
//! reset count it was set under and reads as the default once that count moves on.
//! Scopes above the thread's state (the Python package's `with stream:`) are [`frame`]s.

pub mod frame;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use crate::config::profile;
use crate::error::Result;
use crate::memory::DeviceMemory;
use crate::stream::{Executor, Stream};

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
    /// A stable identity of the device: the same for the same profile and index in every
    /// process (see [`device_uuid`]).
    pub uuid: String,
}

/// The UUID (version 5, RFC 4122: SHA-1 of a namespace and a name) of device `index` of
/// profile `profile`: the name `runtime://<profile>/<index>` in the URL namespace, so that
/// `uuid.uuid5(uuid.NAMESPACE_URL, f"runtime://{profile}/{index}")` gives the same value.
/// Formatted as torch prints `props.uuid`: 8-4-4-4-12 lowercase hex digits.
pub fn device_uuid(profile: &str, index: usize) -> String {
    // uuid.NAMESPACE_URL: 6ba7b811-9dad-11d1-80b4-00c04fd430c8.
    const NAMESPACE_URL: [u8; 16] = [
        0x6b, 0xa7, 0xb8, 0x11, 0x9d, 0xad, 0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30,
        0xc8,
    ];
    let mut msg = NAMESPACE_URL.to_vec();
    msg.extend_from_slice(format!("runtime://{profile}/{index}").as_bytes());
    let h = sha1(&msg);
    let mut b = [0u8; 16];
    b.copy_from_slice(&h[..16]);
    b[6] = (b[6] & 0x0f) | 0x50; // version 5
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// SHA-1 (FIPS 180-4) of `data`; used only to derive [`device_uuid`], not for security.
fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for chunk in msg.chunks_exact(64) {
        let mut w = [0u32; 80];
        for (i, word) in chunk.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (i, x) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
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
    pub(crate) exec: Arc<Executor>,
    /// The default stream, created on first use.
    pub(crate) default_stream: crate::sync::lock::Mutex<Option<Stream>>,
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
        exec: Executor,
    ) -> Device {
        let exec = Arc::new(exec);
        memory.set_reclaimer(reclaimer(Arc::downgrade(&exec)));
        Device(Arc::new(DeviceShared {
            index,
            props,
            memory,
            exec,
            default_stream: crate::sync::lock::Mutex::new(None),
        }))
    }

    /// Device index.
    pub fn index(&self) -> usize {
        self.0.index
    }

    /// Fails with `InvalidHandle` if the runtime that made this device was shut down.
    pub fn check_alive(&self) -> Result<()> {
        self.0.exec.check_alive()
    }

    /// The device's executor (engines, submission gate, stream registry).
    pub(crate) fn executor(&self) -> &Arc<Executor> {
        &self.0.exec
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
            compute_engines: self.0.exec.compute_workers(),
        }
    }

    /// Time this device has spent running compute work (kernels, host functions, and the
    /// blocks of launches), summed over its compute workers; work still running counts once
    /// it finishes.
    pub fn compute_busy(&self) -> std::time::Duration {
        self.0.exec.compute_busy()
    }

    /// Utilisation in percent (0..=100): the share of the compute workers' time spent
    /// running compute work since the previous call on this device (the first call: since
    /// the device was made), measured from [`Device::compute_busy`]. What
    /// `aclrtGetDeviceUtilizationRate` reports as the cube utilisation and
    /// `torch.cuda.utilization` as the device's. The window is per device, shared by every
    /// caller.
    pub fn compute_utilization(&self) -> u32 {
        self.0.exec.compute_utilization()
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
        let s = Stream::new_internal(&self.0.exec, 0, true, false)?;
        *slot = Some(s.clone());
        Ok(s)
    }

    /// Wait until every stream of this device has finished its queued work and report every
    /// stream's error.
    ///
    /// # Errors
    /// `Timeout` when `timeout` passed first; the streams' errors; `Capturing` while one of
    /// its streams captures; `NotPermitted` from a runtime thread.
    pub fn synchronize(&self, timeout: Option<std::time::Duration>) -> Result<()> {
        if self.wait_idle(timeout)? {
            Ok(())
        } else {
            Err(crate::error::StreamError::Timeout {
                what: format!("{self:?}"),
                timeout_ms: timeout.map_or(f64::INFINITY, |t| t.as_secs_f64() * 1e3),
            }
            .into())
        }
    }

    /// [`Device::synchronize`] for callers that wait in slices: `Ok(false)` on timeout.
    ///
    /// # Errors
    /// As for [`Device::synchronize`], without `Timeout`.
    pub(crate) fn wait_idle(&self, timeout: Option<std::time::Duration>) -> Result<bool> {
        self.check_alive()?;
        self.0.exec.wait_all(timeout)
    }
}

/// How long an allocation that finds the device full waits, at most, for queued work that
/// may hold freed blocks, before it reports out of memory (a stream blocked on an event
/// that nobody records must not hang an allocation).
pub const RECLAIM_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The device's memory reclaimer: before an allocation fails for lack of memory, wait (up to
/// [`RECLAIM_WAIT`]) for the work queued on every stream of the device, which may hold the
/// last references to buffers its callers have already freed (true if there was any to wait
/// for). On an engine worker thread it returns false at once: a kernel that allocates would
/// otherwise wait for its own stream.
fn reclaimer(exec: std::sync::Weak<Executor>) -> crate::memory::Reclaimer {
    Arc::new(move || {
        if crate::stream::engine::on_worker_thread() {
            return false;
        }
        let Some(exec) = exec.upgrade() else {
            return false;
        };
        let deadline = crate::clock::deadline_after(Some(RECLAIM_WAIT));
        let mut waited = false;
        for s in exec.streams() {
            let (submitted, completed) = s.counters();
            if completed < submitted {
                let _ = s.wait_for(submitted, crate::clock::time_left(deadline));
                waited = true;
            }
        }
        waited
    })
}

impl crate::stream::sealed::Sealed for Device {}

impl crate::stream::StreamDevice for Device {
    fn executor(&self, _: crate::stream::sealed::Token) -> &Arc<Executor> {
        &self.0.exec
    }
}

/// Bumped by [`reset_thread_state`]; thread state set under an older count is stale.
static RESETS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static CURRENT_DEVICE: Cell<(u64, usize)> = const { Cell::new((0, 0)) };
    static CURRENT_STREAMS: RefCell<(u64, HashMap<usize, Stream>)> =
        RefCell::new((0, HashMap::new()));
}

/// Forget every thread's current device and current streams (they read as device 0 and the
/// default streams afterwards). `shutdown` calls it.
pub(crate) fn reset_thread_state() {
    RESETS.fetch_add(1, Ordering::AcqRel);
    // This thread's streams are dropped now rather than at its next use.
    let _ = CURRENT_STREAMS.try_with(|c| std::mem::take(&mut *c.borrow_mut()));
}

/// The calling thread's current device index (default 0).
pub fn current_device_index() -> usize {
    let (epoch, index) = CURRENT_DEVICE.with(Cell::get);
    if epoch == RESETS.load(Ordering::Acquire) {
        index
    } else {
        0
    }
}

/// Set the calling thread's current device index (validated by the caller).
pub(crate) fn set_current_device_index(i: usize) {
    CURRENT_DEVICE.with(|c| c.set((RESETS.load(Ordering::Acquire), i)));
}

/// The calling thread's current stream on `device`: the one set by [`set_current_stream`],
/// or the device's default stream.
pub fn current_stream(device: &Device) -> Result<Stream> {
    let epoch = RESETS.load(Ordering::Acquire);
    let s = CURRENT_STREAMS.with(|c| {
        let c = c.borrow();
        (c.0 == epoch)
            .then(|| c.1.get(&device.index()).cloned())
            .flatten()
    });
    match s {
        Some(s) if Arc::ptr_eq(s.executor(), &device.0.exec) && !s.is_destroyed() => Ok(s),
        _ => device.default_stream(),
    }
}

/// Submit work the caller will wait for on `stream`, ordered also after the work queued so
/// far on `peer` (when it is another stream). Callers that keep their own notion of the
/// current stream (the Python bindings' context-local one) pass it here. Runs the op right
/// here when the stream is idle; otherwise queues it. Returns the stream to wait for
/// (`Stream::synchronize`, or a sliced `Stream::wait_for` then `Stream::take_error`).
///
/// # Errors
/// `Capturing` when `stream` is capturing (the copy would return before it ran, as CUDA's
/// `cudaErrorStreamCaptureImplicit`); `InvalidHandle` after shutdown; `NotPermitted` from a
/// runtime thread when the stream is busy (nothing is queued then).
pub(crate) fn submit_blocking_on(
    stream: &Stream,
    peer: Option<&Stream>,
    op: Arc<dyn crate::stream::Op>,
) -> Result<Stream> {
    stream.refuse_if_capturing("a blocking copy or memset")?;
    if let Some(p) = peer.filter(|p| *p != stream) {
        // A capturing stream has nothing queued to order after.
        if !p.is_capturing() {
            let ev =
                crate::event::Event::with_options(crate::event::EventOptions::without_timing());
            p.record(&ev)?;
            stream.wait_event(&ev)?;
        }
    }
    if crate::stream::engine::on_worker_thread() {
        // The wait that would follow could not be made here: run it now or refuse before
        // queueing anything.
        if !stream.run_inline_from_runtime_thread(&op)? {
            return Err(stream.busy_from_runtime_thread("a blocking copy or memset"));
        }
    } else if !stream.try_run_inline(&op)? {
        stream.enqueue(op)?;
    }
    Ok(stream.clone())
}

/// Make `stream` the calling thread's current stream on `device` (`None` restores the
/// default); returns the previous one.
pub fn set_current_stream(device: &Device, stream: Option<Stream>) -> Option<Stream> {
    let epoch = RESETS.load(Ordering::Acquire);
    // The displaced map (stale after a reset) is dropped after the borrow ends.
    let (prev, _stale) = CURRENT_STREAMS.with(|c| {
        let mut c = c.borrow_mut();
        let stale = if c.0 == epoch {
            HashMap::new()
        } else {
            c.0 = epoch;
            std::mem::take(&mut c.1)
        };
        let prev = match stream {
            Some(s) => c.1.insert(device.index(), s),
            None => c.1.remove(&device.index()),
        };
        (prev, stale)
    });
    prev
}
