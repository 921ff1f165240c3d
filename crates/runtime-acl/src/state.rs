//! ACL's objects and their handles: whether `aclInit` ran, the handle table (contexts,
//! streams, events), each device's default context with its reference count, and every
//! thread's current context.
//!
//! A handle is a number from one counter that never repeats (`0x1000_0000`, then every 16th),
//! handed to C as `aclrtContext` / `aclrtStream` / `aclrtEvent` pointers and to Python as
//! ints; a destroyed handle is therefore always reported stale
//! (`ACL_ERROR_INVALID_RESOURCE_HANDLE`), never mistaken for a newer object. Handle 0 (NULL)
//! names the current context's default stream wherever a stream is asked for.
//!
//! Every context remembers the generation of the runtime its device belongs to. When the
//! runtime is shut down and started again while ACL stays initialised, a default context of
//! the earlier runtime counts as absent: `aclrtSetDevice` replaces it with one on the new
//! runtime's device, and `aclrtResetDevice` releases it without reporting the dead runtime's
//! errors. The other handles made under the earlier runtime (contexts, streams, events) fail
//! when used (`ACL_ERROR_INVALID_RESOURCE_HANDLE`, "the runtime was shut down"); destroying
//! them releases the handle.
//!
//! Locks: the handle table and the default contexts each have their own lock, held only to
//! look up, insert or remove; no wait and no user code runs under either.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use runtime_core::device::Device;
use runtime_core::event::Event;
use runtime_core::runtime as rt;
use runtime_core::stream::Stream;

use crate::codes::*;
use crate::error::{AclError, AclResult};

/// An ACL handle (the value of an `aclrtContext`, `aclrtStream` or `aclrtEvent`).
pub type Handle = u64;

/// Whether `aclInit` ran (and `aclFinalize` did not since).
static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// Whether ACL is initialised.
pub fn is_initialized() -> bool {
    INITIALIZED.load(Ordering::Acquire)
}

pub(crate) fn set_initialized(on: bool) {
    INITIALIZED.store(on, Ordering::Release);
}

/// `ACL_ERROR_UNINITIALIZE` unless `aclInit` ran.
pub fn check_init(name: &str) -> AclResult<()> {
    if is_initialized() {
        Ok(())
    } else {
        Err(AclError::new(
            ACL_ERROR_UNINITIALIZE,
            format!("{name}: aclInit has not been called"),
        ))
    }
}

/// A device context: its device, its default stream and the streams made under it.
pub struct Context {
    handle: Handle,
    device: Device,
    /// The generation of the runtime `device` belongs to.
    generation: u64,
    is_default: bool,
    stream: Stream,
    streams: Mutex<Vec<Handle>>,
    alive: AtomicBool,
}

impl Context {
    /// The context's handle.
    pub fn handle(&self) -> Handle {
        self.handle
    }
    /// The device it belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// The device index.
    pub fn device_id(&self) -> usize {
        self.device.index()
    }
    /// Its default stream (what a NULL stream names while it is current).
    pub fn stream(&self) -> &Stream {
        &self.stream
    }
    /// Whether its device belongs to the runtime running now (not one shut down since).
    pub fn is_live(&self) -> bool {
        is_live(self.generation)
    }
}

/// Whether the runtime of generation `generation` (`Runtime::generation`) is the one
/// installed now (not shut down; no other started in its place).
pub(crate) fn is_live(generation: u64) -> bool {
    rt::get().is_ok_and(|r| r.generation() == generation)
}

/// A stream made by `aclrtCreateStream`, with the context that made it.
pub struct StreamRec {
    stream: Stream,
    ctx: Arc<Context>,
}

/// An event made by `aclrtCreateEvent[WithFlag]`: the runtime event (replaced by
/// `aclrtResetEvent`) and its flags.
pub struct EventRec {
    ev: Mutex<Event>,
    flag: u32,
    /// The streams made to wait for the event (`aclrtStreamWaitEvent`) whose wait is not
    /// known to be passed yet: each with its submission count just after the wait.
    waits: Mutex<Vec<(Stream, u64)>>,
}

impl EventRec {
    /// The runtime event now behind the handle.
    pub fn event(&self) -> Event {
        self.ev.lock().clone()
    }
    /// The flags it was created with.
    pub fn flag(&self) -> u32 {
        self.flag
    }
}

#[derive(Clone)]
enum Obj {
    Context(Arc<Context>),
    Stream(Arc<StreamRec>),
    Event(Arc<EventRec>),
}

impl Obj {
    fn kind(&self) -> &'static str {
        match self {
            Obj::Context(_) => "context",
            Obj::Stream(_) => "stream",
            Obj::Event(_) => "event",
        }
    }
}

static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0x1000_0000);
static HANDLES: crate::fork::Mutex<Option<HashMap<Handle, Obj>>> = crate::fork::Mutex::new(None);

/// A handle number no object ever had (also for the Python face's own objects: tensor
/// descriptors, data buffers, operator attributes).
pub fn new_handle_number() -> Handle {
    NEXT_HANDLE.fetch_add(16, Ordering::Relaxed)
}

fn insert(obj: Obj) -> Handle {
    let h = new_handle_number();
    HANDLES
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert(h, obj);
    h
}

fn lookup(h: Handle) -> Option<Obj> {
    HANDLES.lock().as_ref().and_then(|m| m.get(&h).cloned())
}

fn remove(h: Handle) -> Option<Obj> {
    HANDLES.lock().as_mut().and_then(|m| m.remove(&h))
}

fn stale(name: &str, what: &str, h: Handle, want: &str, found: Option<&Obj>) -> AclError {
    if h == 0 {
        return AclError::param(format!("{name}: {what} is NULL"));
    }
    let why = match found {
        Some(o) => format!("it is a {}, not a {want}", o.kind()),
        None => "destroyed, or never created".to_string(),
    };
    AclError::new(
        ACL_ERROR_INVALID_RESOURCE_HANDLE,
        format!("{name}: {what} {h:#x} is not a live {want} ({why})"),
    )
}

// --------------------------------------------------------------------------- contexts

/// Each device's default context and how many `aclrtSetDevice` calls hold it.
type DefaultContexts = HashMap<usize, (Arc<Context>, u64)>;
static DEFAULT_CONTEXTS: crate::fork::Mutex<Option<DefaultContexts>> =
    crate::fork::Mutex::new(None);

thread_local! {
    static CURRENT: RefCell<Option<Arc<Context>>> = const { RefCell::new(None) };
}

fn set_current(ctx: Option<Arc<Context>>) {
    // The previous context is dropped after the borrow ends.
    let old = CURRENT.try_with(|c| std::mem::replace(&mut *c.borrow_mut(), ctx));
    drop(old);
}

/// This thread's current context, if it is still alive.
pub fn current_context() -> Option<Arc<Context>> {
    CURRENT
        .try_with(|c| c.borrow().clone())
        .ok()
        .flatten()
        .filter(|c| c.alive.load(Ordering::Acquire))
}

/// This thread's current context, or `ACL_ERROR_RT_CONTEXT_NULL` (`ACL_ERROR_UNINITIALIZE`
/// before `aclInit`).
pub fn need_context(name: &str) -> AclResult<Arc<Context>> {
    if let Some(c) = current_context() {
        return Ok(c);
    }
    check_init(name)?;
    Err(AclError::new(
        ACL_ERROR_RT_CONTEXT_NULL,
        format!("{name}: this thread has no current context (call aclrtSetDevice or aclrtSetCurrentContext first)"),
    ))
}

/// The runtime device `id`, checked against the device count.
fn device(name: &str, id: i32) -> AclResult<Device> {
    Ok(runtime_device(name, id)?.0)
}

/// The runtime device `id` and the generation of the runtime it belongs to.
fn runtime_device(name: &str, id: i32) -> AclResult<(Device, u64)> {
    let rt = rt::get().map_err(|e| AclError::core(name, &e))?;
    let n = rt.devices().len();
    if id < 0 || id as usize >= n {
        return Err(AclError::new(
            ACL_ERROR_RT_INVALID_DEVICEID,
            format!(
                "{name}: deviceId {id} is out of range (0..{})",
                n as i64 - 1
            ),
        ));
    }
    Ok((rt.devices()[id as usize].clone(), rt.generation()))
}

fn new_context(
    name: &str,
    (device, generation): (Device, u64),
    is_default: bool,
) -> AclResult<Arc<Context>> {
    let stream = if is_default {
        device.default_stream()
    } else {
        Stream::new(&device, 0)
    }
    .map_err(|e| AclError::core(name, &e))?;
    let handle = new_handle_number();
    let ctx = Arc::new(Context {
        handle,
        device,
        generation,
        is_default,
        stream,
        streams: Mutex::new(Vec::new()),
        alive: AtomicBool::new(true),
    });
    HANDLES
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert(handle, Obj::Context(ctx.clone()));
    Ok(ctx)
}

/// `aclrtSetDevice`: make `id`'s default context (created on first use) current on this
/// thread and count one more reference to it. A default context of a runtime shut down
/// since is released and replaced (its references ended with its runtime).
pub fn set_device(id: i32) -> AclResult<()> {
    const NAME: &str = "aclrtSetDevice";
    check_init(NAME)?;
    let (dev, generation) = runtime_device(NAME, id)?;
    let index = dev.index();
    let mut all = DEFAULT_CONTEXTS.lock();
    let map = all.get_or_insert_with(HashMap::new);
    let dead = match map.get(&index) {
        Some((ctx, _)) if !ctx.is_live() => map.remove(&index).map(|(c, _)| c),
        _ => None,
    };
    let made = match map.get_mut(&index) {
        Some((ctx, refs)) => {
            *refs += 1;
            Ok(ctx.clone())
        }
        None => new_context(NAME, (dev, generation), true).inspect(|ctx| {
            map.insert(index, (ctx.clone(), 1));
        }),
    };
    drop(all);
    if let Some(old) = dead {
        // Its runtime is gone: nothing of it can fail in a way this call should report.
        let _ = teardown(&old);
    }
    set_current(Some(made?));
    Ok(())
}

/// Destroy a context: its streams (after their queued work), then its own stream (a default
/// context's stream is the device's default stream: waited for, not destroyed).
fn teardown(ctx: &Arc<Context>) -> AclResult<()> {
    ctx.alive.store(false, Ordering::Release);
    remove(ctx.handle);
    let streams = std::mem::take(&mut *ctx.streams.lock());
    let mut first_err = None;
    for h in streams {
        if let Some(Obj::Stream(rec)) = remove(h) {
            crate::state::forget_stream_hooks(&rec.stream);
            if let Err(e) = rec.stream.destroy() {
                first_err.get_or_insert(e);
            }
        }
    }
    let r = if ctx.is_default {
        ctx.stream.synchronize(None)
    } else {
        crate::state::forget_stream_hooks(&ctx.stream);
        ctx.stream.destroy()
    };
    if let Err(e) = r {
        first_err.get_or_insert(e);
    }
    if CURRENT
        .try_with(|c| c.borrow().as_ref().is_some_and(|c| Arc::ptr_eq(c, ctx)))
        .unwrap_or(false)
    {
        set_current(None);
    }
    match first_err {
        // The streams' pending kernel errors are reported, not lost; a runtime that was
        // shut down under ACL (handles already invalid, whether or not another runtime
        // started since) is not an error of this call.
        Some(e) if ctx.is_live() => Err(AclError::core("aclrtDestroyContext", &e)),
        _ => Ok(()),
    }
}

/// `aclrtResetDevice` (`force`: `aclrtResetDeviceForce`): drop one reference to `id`'s default
/// context (all of them with `force`); the last one releases the context, its default stream's
/// work being waited for and the streams made under it destroyed.
pub fn reset_device(id: i32, force: bool) -> AclResult<()> {
    let name = if force {
        "aclrtResetDeviceForce"
    } else {
        "aclrtResetDevice"
    };
    check_init(name)?;
    let dev = device(name, id)?;
    let mut all = DEFAULT_CONTEXTS.lock();
    let map = all.get_or_insert_with(HashMap::new);
    let release = match map.get_mut(&dev.index()) {
        None => {
            return Err(AclError::param(format!(
                "{name}: device {id} is not set in this process (aclrtSetDevice was not called, or every reference was reset already)"
            )))
        }
        Some((_, refs)) if !force && *refs > 1 => {
            *refs -= 1;
            None
        }
        Some(_) => map.remove(&dev.index()).map(|(c, _)| c),
    };
    drop(all);
    match release {
        Some(ctx) => teardown(&ctx),
        None => Ok(()),
    }
}

/// `aclrtGetDevice`: the device of this thread's current context.
pub fn get_device() -> AclResult<i32> {
    Ok(need_context("aclrtGetDevice")?.device_id() as i32)
}

/// `aclrtGetDeviceCount`.
pub fn get_device_count() -> AclResult<u32> {
    const NAME: &str = "aclrtGetDeviceCount";
    check_init(NAME)?;
    let rt = rt::get().map_err(|e| AclError::core(NAME, &e))?;
    Ok(rt.devices().len() as u32)
}

/// The device of this thread's current context (`aclrtSynchronizeDevice` and the memory
/// calls).
pub fn current_device(name: &str) -> AclResult<Device> {
    Ok(need_context(name)?.device.clone())
}

/// `aclrtSynchronizeDevice[WithTimeout]`: wait for every stream of the current context's
/// device. `Ok(false)` when `timeout` passed first.
pub fn synchronize_device(timeout: Option<Duration>) -> AclResult<bool> {
    const NAME: &str = "aclrtSynchronizeDevice";
    let dev = current_device(NAME)?;
    runtime_core::bindings::device_wait(&dev, timeout).map_err(|e| AclError::core(NAME, &e))
}

/// `aclrtCreateContext`: a context on `device` with its own default stream; it becomes this
/// thread's current context.
pub fn create_context(device_id: i32) -> AclResult<Handle> {
    const NAME: &str = "aclrtCreateContext";
    check_init(NAME)?;
    let ctx = new_context(NAME, runtime_device(NAME, device_id)?, false)?;
    let h = ctx.handle;
    set_current(Some(ctx));
    Ok(h)
}

fn context(name: &str, h: Handle) -> AclResult<Arc<Context>> {
    match lookup(h) {
        Some(Obj::Context(c)) => Ok(c),
        other => {
            check_init(name)?;
            Err(stale(name, "context", h, "context", other.as_ref()))
        }
    }
}

/// `aclrtDestroyContext`: destroy a context from `aclrtCreateContext`; its streams are
/// destroyed with it (after their queued work), as CANN does.
pub fn destroy_context(h: Handle) -> AclResult<()> {
    const NAME: &str = "aclrtDestroyContext";
    check_init(NAME)?;
    let ctx = context(NAME, h)?;
    if ctx.is_default {
        return Err(AclError::param(format!(
            "{NAME}: context {h:#x} is device {}'s default context, which aclrtResetDevice releases",
            ctx.device_id()
        )));
    }
    teardown(&ctx)
}

/// `aclrtSetCurrentContext`.
pub fn set_context(h: Handle) -> AclResult<()> {
    const NAME: &str = "aclrtSetCurrentContext";
    check_init(NAME)?;
    set_current(Some(context(NAME, h)?));
    Ok(())
}

/// `aclrtGetCurrentContext`.
pub fn get_context() -> AclResult<Handle> {
    Ok(need_context("aclrtGetCurrentContext")?.handle)
}

// --------------------------------------------------------------------------- streams

/// `aclrtCreateStream` (`priority`: `aclrtCreateStreamWithConfig`, clamped to the runtime's
/// range): a stream on the current context's device.
pub fn create_stream(priority: i32) -> AclResult<Handle> {
    const NAME: &str = "aclrtCreateStream";
    let ctx = need_context(NAME)?;
    let (lo, hi) = (
        runtime_core::stream::PRIORITY_HIGHEST,
        runtime_core::stream::PRIORITY_LOWEST,
    );
    let p = priority.clamp(lo.min(hi), lo.max(hi));
    let stream = Stream::new(&ctx.device, p).map_err(|e| AclError::core(NAME, &e))?;
    let h = insert(Obj::Stream(Arc::new(StreamRec {
        stream,
        ctx: ctx.clone(),
    })));
    ctx.streams.lock().push(h);
    Ok(h)
}

/// The runtime stream behind handle `h`; 0 (NULL) is the current context's default stream.
pub fn stream(name: &str, h: Handle) -> AclResult<Stream> {
    match lookup(h) {
        Some(Obj::Stream(rec)) => Ok(rec.stream.clone()),
        _ if h == 0 => Ok(need_context(name)?.stream.clone()),
        other => {
            check_init(name)?;
            Err(stale(name, "stream", h, "stream", other.as_ref()))
        }
    }
}

/// `aclrtDestroyStream[Force]`: destroy a stream from `aclrtCreateStream` after its queued
/// work ran (the runtime has no way to drop queued work, so `Force` waits too). A stream of a
/// runtime shut down since is released without error.
pub fn destroy_stream(h: Handle) -> AclResult<()> {
    const NAME: &str = "aclrtDestroyStream";
    check_init(NAME)?;
    let rec = match lookup(h) {
        Some(Obj::Stream(rec)) => rec,
        other => return Err(stale(NAME, "stream", h, "stream", other.as_ref())),
    };
    if remove(h).is_none() {
        return Err(stale(NAME, "stream", h, "stream", None));
    }
    rec.ctx.streams.lock().retain(|&s| s != h);
    forget_stream_hooks(&rec.stream);
    match rec.stream.destroy() {
        Err(e) if rec.ctx.is_live() => Err(AclError::core(NAME, &e)),
        _ => Ok(()),
    }
}

/// What runs when a stream goes away.
type StreamHook = fn(&Stream);

/// Hooks that run when a stream goes away (the report module forgets its subscription).
static STREAM_HOOKS: crate::fork::Mutex<Vec<StreamHook>> = crate::fork::Mutex::new(Vec::new());

/// Run `f` for every stream destroyed from now on (before it is destroyed).
pub(crate) fn on_stream_destroyed(f: fn(&Stream)) {
    let mut hooks = STREAM_HOOKS.lock();
    if !hooks.iter().any(|&g| std::ptr::fn_addr_eq(g, f)) {
        hooks.push(f);
    }
}

pub(crate) fn forget_stream_hooks(s: &Stream) {
    let hooks: Vec<StreamHook> = STREAM_HOOKS.lock().clone();
    for f in hooks {
        f(s);
    }
}

/// `aclrtSynchronizeStream[WithTimeout]`: wait for the stream's queued work and report a
/// failure among it. `Ok(false)` when `timeout` passed first.
pub fn synchronize_stream(h: Handle, timeout: Option<Duration>) -> AclResult<bool> {
    const NAME: &str = "aclrtSynchronizeStream";
    let s = stream(NAME, h)?;
    let core = |e: runtime_core::Error| AclError::core(NAME, &e);
    let target = runtime_core::bindings::synchronize_target(&s).map_err(core)?;
    if !runtime_core::bindings::wait_for(&s, target, timeout).map_err(core)? {
        return Ok(false);
    }
    runtime_core::bindings::take_error(&s).map_err(core)?;
    Ok(true)
}

/// `aclrtStreamQuery`: whether everything queued on the stream has run.
pub fn stream_query(h: Handle) -> AclResult<bool> {
    const NAME: &str = "aclrtStreamQuery";
    stream(NAME, h)?
        .query()
        .map_err(|e| AclError::core(NAME, &e))
}

// --------------------------------------------------------------------------- events

fn event_rec(name: &str, what: &str, h: Handle) -> AclResult<Arc<EventRec>> {
    match lookup(h) {
        Some(Obj::Event(e)) => Ok(e),
        other => {
            check_init(name)?;
            Err(stale(name, what, h, "event", other.as_ref()))
        }
    }
}

/// The runtime event behind handle `h`.
pub fn event(name: &str, h: Handle) -> AclResult<Event> {
    Ok(event_rec(name, "event", h)?.event())
}

/// `aclrtCreateEvent` / `aclrtCreateEventWithFlag` (`flag`: `ACL_EVENT_*` bits).
pub fn create_event(flag: u32) -> AclResult<Handle> {
    const NAME: &str = "aclrtCreateEventWithFlag";
    need_context(NAME)?;
    if flag & !EVENT_FLAGS != 0 {
        return Err(AclError::param(format!(
            "{NAME}: flag {flag:#x} has bits that are no ACL_EVENT_* flag (known: {EVENT_FLAGS:#x})"
        )));
    }
    Ok(insert(Obj::Event(Arc::new(EventRec {
        ev: Mutex::new(Event::new()),
        flag,
        waits: Mutex::new(Vec::new()),
    }))))
}

/// `aclrtDestroyEvent`: forget the event; work that records it still completes (no wait).
pub fn destroy_event(h: Handle) -> AclResult<()> {
    const NAME: &str = "aclrtDestroyEvent";
    check_init(NAME)?;
    match remove(h) {
        Some(Obj::Event(_)) => Ok(()),
        Some(other) => {
            // Not an event: put it back untouched.
            HANDLES
                .lock()
                .get_or_insert_with(HashMap::new)
                .insert(h, other.clone());
            Err(stale(NAME, "event", h, "event", Some(&other)))
        }
        None => Err(stale(NAME, "event", h, "event", None)),
    }
}

/// `aclrtRecordEvent`: record `event` at the end of `stream`'s queued work (NULL: the default
/// stream).
pub fn record_event(event: Handle, stream_h: Handle) -> AclResult<()> {
    const NAME: &str = "aclrtRecordEvent";
    let ev = event_rec(NAME, "event", event)?;
    let s = stream(NAME, stream_h)?;
    let e = ev.event();
    s.record(&e).map_err(|e| AclError::core(NAME, &e))
}

/// `aclrtResetEvent`: the event returns to its never-recorded state (at once).
pub fn reset_event(event: Handle, stream_h: Handle) -> AclResult<()> {
    const NAME: &str = "aclrtResetEvent";
    let ev = event_rec(NAME, "event", event)?;
    stream(NAME, stream_h)?;
    *ev.ev.lock() = Event::new();
    Ok(())
}

/// Whether the event's latest record has completed (true if never recorded).
pub fn query_event(name: &str, event: Handle) -> AclResult<bool> {
    let e = event_rec(name, "event", event)?.event();
    e.query().map_err(|e| AclError::core(name, &e))
}

/// `aclrtStreamWaitEvent`: work queued on `stream` from now on waits for the event's latest
/// record.
pub fn stream_wait_event(stream_h: Handle, event: Handle) -> AclResult<()> {
    const NAME: &str = "aclrtStreamWaitEvent";
    let s = stream(NAME, stream_h)?;
    let rec = event_rec(NAME, "event", event)?;
    s.wait_event(&rec.event())
        .map_err(|e| AclError::core(NAME, &e))?;
    // The wait is passed once the stream has completed everything submitted up to it.
    let target = s.counters().0;
    let mut waits = rec.waits.lock();
    waits.retain(|(w, t)| w.counters().1 < *t);
    waits.push((s, target));
    Ok(())
}

/// `aclrtQueryEventWaitStatus`: whether every stream made to wait for the event
/// (`aclrtStreamWaitEvent`) has passed its wait, i.e. received the event (`true` also when
/// no stream waits for it).
pub fn query_event_wait_status(event: Handle) -> AclResult<bool> {
    const NAME: &str = "aclrtQueryEventWaitStatus";
    let rec = event_rec(NAME, "event", event)?;
    let mut waits = rec.waits.lock();
    waits.retain(|(w, t)| w.counters().1 < *t);
    Ok(waits.is_empty())
}

/// `aclrtQueryDeviceStatus`: whether device `id` is usable (`false` once its runtime is gone,
/// as in a forked child or after a shutdown).
pub fn query_device_status(id: i32) -> AclResult<bool> {
    const NAME: &str = "aclrtQueryDeviceStatus";
    check_init(NAME)?;
    Ok(device(NAME, id)?.check_alive().is_ok())
}

/// `aclrtUtilizationInfo`'s numbers, in percent; -1 for a unit the device lacks (as CANN
/// reports a unit a product has not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Utilization {
    /// Measured: the percent of the device's compute workers' time spent running kernels
    /// and host functions since the previous query of the device (the first: since it
    /// started).
    pub cube: i32,
    /// -1: the virtual device has no separate vector unit.
    pub vector: i32,
    /// -1: no AI CPU.
    pub aicpu: i32,
    /// -1: memory utilisation is reserved in CANN too.
    pub memory: i32,
}

/// `aclrtGetDeviceUtilizationRate` of device `id` (`Device::compute_utilization`, measured
/// by the engines; each query starts the next window).
pub fn device_utilization(id: i32) -> AclResult<Utilization> {
    const NAME: &str = "aclrtGetDeviceUtilizationRate";
    check_init(NAME)?;
    let cube = device(NAME, id)?.compute_utilization().min(100) as i32;
    Ok(Utilization {
        cube,
        vector: -1,
        aicpu: -1,
        memory: -1,
    })
}

/// `aclrtSynchronizeEvent[WithTimeout]`: wait for the event's latest record. `Ok(false)` when
/// `timeout` passed first.
pub fn synchronize_event(event: Handle, timeout: Option<Duration>) -> AclResult<bool> {
    const NAME: &str = "aclrtSynchronizeEvent";
    let e = event_rec(NAME, "event", event)?.event();
    e.wait(timeout).map_err(|e| AclError::core(NAME, &e))
}

/// `aclrtEventElapsedTime`: milliseconds from `start`'s record to `end`'s (both completed).
pub fn event_elapsed_time(start: Handle, end: Handle) -> AclResult<f32> {
    const NAME: &str = "aclrtEventElapsedTime";
    let a = event_rec(NAME, "start event", start)?.event();
    let b = event_rec(NAME, "end event", end)?.event();
    a.elapsed_time(&b)
        .map(|ms| ms as f32)
        .map_err(|e| AclError::core(NAME, &e))
}

// --------------------------------------------------------------------------- finalize

/// Everything ACL made, taken out of the tables (`aclFinalize`): the streams and contexts to
/// destroy. The caller destroys them outside every lock.
pub(crate) fn take_all() -> (Vec<Stream>, Vec<Arc<Context>>) {
    let handles = HANDLES.lock().take().unwrap_or_default();
    DEFAULT_CONTEXTS.lock().take();
    let mut streams = Vec::new();
    let mut contexts = Vec::new();
    for (_, o) in handles {
        match o {
            Obj::Stream(rec) => streams.push(rec.stream.clone()),
            Obj::Context(c) => {
                c.alive.store(false, Ordering::Release);
                contexts.push(c);
            }
            Obj::Event(_) => {}
        }
    }
    set_current(None);
    (streams, contexts)
}

/// Destroy what [`take_all`] returned, ignoring errors (the runtime may be gone already).
pub(crate) fn destroy_all(streams: Vec<Stream>, contexts: Vec<Arc<Context>>) {
    for s in streams {
        forget_stream_hooks(&s);
        let _ = s.destroy();
    }
    for c in contexts {
        if c.is_default {
            let _ = c.stream.synchronize(None);
        } else {
            forget_stream_hooks(&c.stream);
            let _ = c.stream.destroy();
        }
    }
}

// --------------------------------------------------------------------------- fork

static HANDLES_FORK: crate::fork::Guarded<Option<HashMap<Handle, Obj>>> =
    crate::fork::Guarded::new(|| &HANDLES);
static DEFAULTS_FORK: crate::fork::Guarded<Option<DefaultContexts>> =
    crate::fork::Guarded::new(|| &DEFAULT_CONTEXTS);
static HOOKS_FORK: crate::fork::Guarded<Vec<StreamHook>> =
    crate::fork::Guarded::new(|| &STREAM_HOOKS);

pub(crate) fn before_fork() {
    DEFAULTS_FORK.before_fork();
    HANDLES_FORK.before_fork();
    HOOKS_FORK.before_fork();
}

pub(crate) fn after_fork(child: bool) {
    HOOKS_FORK.after_fork(child);
    HANDLES_FORK.after_fork(child);
    DEFAULTS_FORK.after_fork(child);
}

/// In a forked child: forget (leak) every object of the parent's runtime and start
/// uninitialised; this thread has no current context.
pub(crate) fn forget_in_child() {
    std::mem::forget(HANDLES.lock().take());
    std::mem::forget(DEFAULT_CONTEXTS.lock().take());
    let _ = CURRENT.try_with(|c| std::mem::forget(c.borrow_mut().take()));
    set_initialized(false);
}
