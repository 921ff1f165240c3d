//! Copies and memset: `memcpy_host_to_device`, `memcpy_device_to_host` and `memcpy_d2d` are one
//! path ([`memcpy`]) over a [`Direction`]; each end is a host buffer or a device buffer view.
//! Arguments are converted and their ranges checked here so that errors name the argument;
//! what a copy is (the overlap rule, staging or stream order) is decided by the core
//! (`stream::copy::copy`, `copy_2d`), and the op is queued on `stream=` or run blocking on
//! the current stream ([`wait::submit_copy`]).

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use runtime_core::memory::Buffer;
use runtime_core::stream::copy::{self, HostMemory};

use crate::convert::{buffer_arg, naming, nonneg, numpy, opt_nonneg, stream_arg};
use crate::errors::RtErr;
use crate::handles::PyDeviceBuffer;
use crate::host::HostBuf;
use crate::wait;

/// Which ends of a copy are on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

/// One end of a copy.
enum Side {
    Host(HostBuf),
    /// A device view: (core buffer, absolute offset of the view, bytes of the view).
    Device(Buffer, u64, u64),
}

impl Side {
    fn len(&self) -> u64 {
        match self {
            Side::Host(h) => h.len() as u64,
            Side::Device(_, _, len) => *len,
        }
    }

    fn noun(&self) -> &'static str {
        match self {
            Side::Host(_) => "host buffer",
            Side::Device(..) => "device buffer",
        }
    }

    /// The core's end: a device view, host memory, or (`device_view`) host memory that is
    /// a view of device memory.
    fn end(self, device_view: bool) -> PyResult<copy::End> {
        Ok(match self {
            Side::Host(h) if device_view => copy::End::DeviceView(Arc::new(h)),
            Side::Host(h) => copy::End::Host(Arc::new(h)),
            Side::Device(b, base, len) => copy::End::Device(b.view(base, len).map_err(RtErr)?),
        })
    }
}

/// A copy end as given: argument name, user offset (bytes into the end) and the end.
struct End {
    arg: &'static str,
    offset: u64,
    side: Side,
}

/// A device-side copy endpoint: (core buffer, absolute offset, bytes of the view). A byte
/// copy moves a view's bytes as one range: any dense layout (C, F, a transpose); a strided
/// view is refused (`ValueError` naming `arg`).
fn device_side(py: Python<'_>, obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<(Buffer, u64, u64)> {
    let b = buffer_arg(obj, arg)?.get();
    let (off, len) = b.contiguous_bytes(arg)?;
    Ok((b.buffer(py)?, off, len))
}

/// Copy every byte a view reaches (its elements and, for a strided view, the gaps between
/// them: `Layout::span`) from device view `src` into host memory `dst` (a writable,
/// C-contiguous byte array of that length), on `stream` or blocking: what `copy_to_host`
/// and `copy_to_device` stage a strided or F-ordered view through.
pub fn span_to_host(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &PyDeviceBuffer,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let b = src.buffer(py)?;
    let side = Side::Device(b, src.offset, src.layout().span());
    copy_span(py, Direction::DeviceToHost, dst, side, stream)
}

/// The reverse of [`span_to_host`]: host bytes `src` over every byte device view `dst`
/// reaches.
pub fn span_to_device(
    py: Python<'_>,
    dst: &PyDeviceBuffer,
    src: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let b = dst.buffer(py)?;
    let side = Side::Device(b, dst.offset, dst.layout().span());
    copy_span(py, Direction::HostToDevice, src, side, stream)
}

/// A whole-range copy between host object `host` and device end `dev`.
fn copy_span(
    py: Python<'_>,
    dir: Direction,
    host: &Bound<'_, PyAny>,
    dev: Side,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let stream = stream_arg(stream)?;
    let count = dev.len();
    let (dst, src, host_arg) = match dir {
        Direction::DeviceToHost => (host_end(py, host, "dst", true)?, dev, "dst"),
        _ => (dev, host_end(py, host, "src", false)?, "src"),
    };
    let host_len = if dir == Direction::DeviceToHost {
        dst.len()
    } else {
        src.len()
    };
    fits(host_arg, "host buffer", host_len, 0, count)?;
    let planned = copy::copy(
        dst.end(false)?,
        0,
        src.end(false)?,
        0,
        count,
        submit_of(&stream),
    )
    .map_err(RtErr)?;
    let device = planned.device.expect("a span copy has a device end");
    submit_planned(py, planned, stream, device)
}

/// `dst.copy_to_device(src)` between two device views: numpy's `copyto` (every element to
/// the same index, the layouts may differ), in the core (`copy::d2d_layout`); on `stream` or
/// blocking on the current stream of `dst`'s device.
pub fn d2d_elements(
    py: Python<'_>,
    dst: &PyDeviceBuffer,
    src: &PyDeviceBuffer,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let stream = stream_arg(stream)?;
    let (db, sb) = (dst.buffer(py)?, src.buffer(py)?);
    let op = copy::d2d_layout(&db, dst.offset, dst.layout(), &sb, src.offset, src.layout())
        .map_err(RtErr)?;
    let peer = (sb.device() != db.device()).then_some(sb.device());
    wait::submit_copy(py, op, stream, db.device(), peer)
}

/// Copy host values `src` (C order of `dst`'s shape, already staged) into the elements of
/// `dst`, any layout, as one stream op (`copy::h2d_layout`): queued on `stream`, or blocking
/// without one.
pub fn h2d_elements(
    py: Python<'_>,
    dst: &PyDeviceBuffer,
    src: Vec<u8>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let stream = stream_arg(stream)?;
    let db = dst.buffer(py)?;
    let op = copy::h2d_layout(&db, dst.offset, dst.layout(), src).map_err(RtErr)?;
    wait::submit_copy(py, op, stream, db.device(), None)
}

/// Check that `[off, off + count)` fits in a side of `len` bytes (ValueError naming `arg`).
fn fits(arg: &str, what: &str, len: u64, off: u64, count: u64) -> PyResult<()> {
    match off.checked_add(count) {
        Some(end) if end <= len => Ok(()),
        _ => Err(PyValueError::new_err(format!(
            "{arg}: {count} bytes at offset {off} do not fit in the {len}-byte {what}; nothing was copied"
        ))),
    }
}

/// The host source of a copy: its bytes if it is C-contiguous, else (a strided numpy array,
/// a non-contiguous memoryview) a C-contiguous copy of it, as `to_device` makes. The export
/// holds the copy until the queued transfer has run.
fn host_source(py: Python<'_>, src: &Bound<'_, PyAny>) -> PyResult<HostBuf> {
    match HostBuf::get(src, "src", false).map(|h| viewing(py, src, h)) {
        // ValueError: a buffer, but not a C-contiguous one.
        Err(e) if e.is_instance_of::<PyValueError>(py) => {
            let kw = PyDict::new(py);
            kw.set_item("order", "C")?;
            let copy = numpy(py)?
                .getattr("asarray")?
                .call((src,), Some(&kw))
                .map_err(|e| naming(py, "src", e))?;
            HostBuf::get(&copy, "src", false)
        }
        other => other,
    }
}

/// Whether host object `obj` is a view of device memory (`np.asarray(buf)`, a managed
/// buffer's `host_view()`): `Some` when its chain of `.base` / `memoryview.obj` reaches a
/// `DeviceBuffer`, with that buffer's core buffer while the handle is live. The core reads
/// such a source in stream order rather than staging it (`copy::End::DeviceView`), and
/// copies through it take turns with the buffer's own ops ([`HostBuf::viewing`]).
fn viewed_buffer(py: Python<'_>, obj: &Bound<'_, PyAny>) -> Option<Option<Buffer>> {
    crate::host::find_owner(obj, |cur| {
        cur.cast::<crate::handles::PyDeviceBuffer>()
            .ok()
            .map(|d| d.borrow().buffer(py).ok())
    })
}

/// Export host object `obj` for a copy (`arg`, `writable` as [`HostBuf::get`]), naming the
/// device buffer it views, if any.
fn host_end(py: Python<'_>, obj: &Bound<'_, PyAny>, arg: &str, writable: bool) -> PyResult<Side> {
    let h = HostBuf::get(obj, arg, writable)?;
    Ok(Side::Host(viewing(py, obj, h)))
}

/// `h`, the export of `obj`, naming the device buffer `obj` views, if any.
fn viewing(py: Python<'_>, obj: &Bound<'_, PyAny>, h: HostBuf) -> HostBuf {
    match viewed_buffer(py, obj).flatten() {
        Some(b) => h.viewing(&b),
        None => h,
    }
}

/// The one copy path. Arguments are read in a fixed order (offsets, device ends, stream, host
/// end, count) so that the first bad one is the one reported. Without `count` the copy covers
/// the host end from its offset (the source for device-to-device).
#[allow(clippy::too_many_arguments)]
pub fn memcpy(
    py: Python<'_>,
    dir: Direction,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
    dst_offset: Option<&Bound<'_, PyAny>>,
    src_offset: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let dst_offset = opt_nonneg(dst_offset, "dst_offset")?.unwrap_or(0);
    let src_offset = opt_nonneg(src_offset, "src_offset")?.unwrap_or(0);
    let dst_dev = dir != Direction::DeviceToHost;
    let src_dev = dir != Direction::HostToDevice;
    let device =
        |obj, arg| device_side(py, obj, arg).map(|(b, off, len)| Side::Device(b, off, len));
    let dst_side = dst_dev.then(|| device(dst, "dst")).transpose()?;
    let src_side = src_dev.then(|| device(src, "src")).transpose()?;
    let stream = stream_arg(stream)?;
    let dst_views_device = !dst_dev && viewed_buffer(py, dst).is_some();
    let dst = End {
        arg: "dst",
        offset: dst_offset,
        side: match dst_side {
            Some(s) => s,
            None => host_end(py, dst, "dst", true)?,
        },
    };
    let src_views_device = !src_dev && viewed_buffer(py, src).is_some();
    let src = End {
        arg: "src",
        offset: src_offset,
        side: match src_side {
            Some(s) => s,
            None => Side::Host(host_source(py, src)?),
        },
    };
    // The end that sizes a default count and is checked first: the host end, else the source.
    let (first, second) = match dir {
        Direction::DeviceToHost => (&dst, &src),
        Direction::HostToDevice | Direction::DeviceToDevice => (&src, &dst),
    };
    let count = match opt_nonneg(count, "count")? {
        Some(c) => c,
        None => {
            let len = first.side.len();
            len.checked_sub(first.offset).ok_or_else(|| {
                let noun = match first.side {
                    Side::Host(_) => "host buffer",
                    Side::Device(..) => "source",
                };
                PyValueError::new_err(format!(
                    "{}_offset: {} is past the end of the {len}-byte {noun}",
                    first.arg, first.offset
                ))
            })?
        }
    };
    for e in [first, second] {
        fits(e.arg, e.side.noun(), e.side.len(), e.offset, count)?;
    }
    let submit = submit_of(&stream);
    let planned = copy::copy(
        dst.side.end(dst_views_device)?,
        dst_offset,
        src.side.end(src_views_device)?,
        src_offset,
        count,
        submit,
    )
    .map_err(RtErr)?;
    let device = planned.device.expect("a memcpy has a device end");
    submit_planned(py, planned, stream, device)
}

/// Submit a planned copy: waited for on return when it is a queued copy into pageable host
/// memory (CUDA's rule, [`copy::completes_before_return`]).
fn submit_planned(
    py: Python<'_>,
    planned: copy::Planned,
    stream: Option<runtime_core::stream::Stream>,
    device: usize,
) -> PyResult<()> {
    let peer = planned.peer;
    match stream {
        Some(s) if planned.finish => {
            wait::submit_and_finish(py, &s, planned.into_op().map_err(RtErr)?)
        }
        Some(s) => {
            // A copy from pageable memory runs here at once when the stream is idle (else
            // its source is staged), so the GIL is released; the op comes back to be queued
            // or dropped with the GIL held (it may hold a Python buffer).
            let (op, ran) = py.detach(|| planned.run_now_or_stage(&s)).map_err(RtErr)?;
            if ran {
                wait::after_enqueue(py, &s)
            } else {
                wait::submit(py, &s, op)
            }
        }
        None => wait::submit_copy(py, planned.into_op().map_err(RtErr)?, None, device, peer),
    }
}

/// Queued on `stream=`, or blocking on the current stream.
fn submit_of(stream: &Option<runtime_core::stream::Stream>) -> copy::Submit {
    match stream {
        Some(_) => copy::Submit::Queued,
        None => copy::Submit::Blocking,
    }
}

/// Copy host memory `src` (any buffer; a non-contiguous one is copied C-contiguous first, as
/// `to_device` does) into device buffer `dst`.
#[pyfunction]
// Offsets default to None in Rust (so that any object can be checked and named in errors);
// the Python-visible signature says 0, which behaves the same.
#[pyo3(
    signature = (dst, src, stream=None, *, count=None, dst_offset=None, src_offset=None),
    text_signature = "(dst, src, stream=None, *, count=None, dst_offset=0, src_offset=0)"
)]
pub fn memcpy_host_to_device(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
    dst_offset: Option<&Bound<'_, PyAny>>,
    src_offset: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let dir = Direction::HostToDevice;
    memcpy(py, dir, dst, src, stream, count, dst_offset, src_offset)
}

/// Copy device buffer `src` into host memory `dst` (a writable, C-contiguous buffer).
#[pyfunction]
#[pyo3(
    signature = (dst, src, stream=None, *, count=None, dst_offset=None, src_offset=None),
    text_signature = "(dst, src, stream=None, *, count=None, dst_offset=0, src_offset=0)"
)]
pub fn memcpy_device_to_host(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
    dst_offset: Option<&Bound<'_, PyAny>>,
    src_offset: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let dir = Direction::DeviceToHost;
    memcpy(py, dir, dst, src, stream, count, dst_offset, src_offset)
}

/// Copy device buffer `src` into device buffer `dst` (any devices). With `stream` the copy is
/// queued on it; without, it is ordered on the current stream and waited for.
#[pyfunction]
#[pyo3(
    signature = (dst, src, stream=None, *, count=None, dst_offset=None, src_offset=None),
    text_signature = "(dst, src, stream=None, *, count=None, dst_offset=0, src_offset=0)"
)]
pub fn memcpy_d2d(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
    count: Option<&Bound<'_, PyAny>>,
    dst_offset: Option<&Bound<'_, PyAny>>,
    src_offset: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let dir = Direction::DeviceToDevice;
    memcpy(py, dir, dst, src, stream, count, dst_offset, src_offset)
}

/// Set `count` bytes (default: the whole view from `offset`) of `buf` to `value` (0..=255).
#[pyfunction]
#[pyo3(
    signature = (buf, value, count=None, *, offset=None, stream=None),
    text_signature = "(buf, value, count=None, *, offset=0, stream=None)"
)]
pub fn memset(
    py: Python<'_>,
    buf: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
    count: Option<&Bound<'_, PyAny>>,
    offset: Option<&Bound<'_, PyAny>>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let offset = opt_nonneg(offset, "offset")?.unwrap_or(0);
    let (b, boff, blen) = device_side(py, buf, "buf")?;
    let v = nonneg(value, "value")?;
    let v = u8::try_from(v)
        .map_err(|_| PyValueError::new_err(format!("value must be a byte, 0..=255, got {v}")))?;
    let stream = stream_arg(stream)?;
    let count = match opt_nonneg(count, "count")? {
        Some(c) => c,
        None => blen.checked_sub(offset).ok_or_else(|| {
            PyValueError::new_err(format!(
                "offset: {offset} is past the end of the {blen}-byte buffer"
            ))
        })?,
    };
    fits("buf", "device buffer", blen, offset, count)?;
    let op = copy::memset(&b, boff + offset, count, v).map_err(RtErr)?;
    wait::submit_copy(py, op, stream, b.device(), None)
}

/// One end of a 2-D copy: a device buffer view or host memory.
fn end_2d(py: Python<'_>, obj: &Bound<'_, PyAny>, arg: &str, writable: bool) -> PyResult<Side> {
    if obj.cast::<crate::handles::PyDeviceBuffer>().is_ok() {
        let (b, off, len) = device_side(py, obj, arg)?;
        return Ok(Side::Device(b, off, len));
    }
    host_end(py, obj, arg, writable)
}

/// Copy `height` rows of `width` bytes from `src` (rows `spitch` bytes apart, from byte
/// `src_offset`) to `dst` (rows `dpitch` apart, from `dst_offset`), as `cudaMemcpy2D` /
/// `aclrtMemcpy2d`. Each end is a `DeviceBuffer` or host memory, in any direction. With
/// `stream` the copy is queued on it; without, it runs on the current stream and is waited
/// for.
#[pyfunction]
#[pyo3(
    signature = (dst, dpitch, src, spitch, width, height, stream=None, *, dst_offset=None, src_offset=None),
    text_signature = "(dst, dpitch, src, spitch, width, height, stream=None, *, dst_offset=0, src_offset=0)"
)]
#[allow(clippy::too_many_arguments)]
pub fn memcpy_2d(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    dpitch: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    spitch: &Bound<'_, PyAny>,
    width: &Bound<'_, PyAny>,
    height: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
    dst_offset: Option<&Bound<'_, PyAny>>,
    src_offset: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let rel = copy::Rect {
        dst_off: opt_nonneg(dst_offset, "dst_offset")?.unwrap_or(0),
        dpitch: nonneg(dpitch, "dpitch")?,
        src_off: opt_nonneg(src_offset, "src_offset")?.unwrap_or(0),
        spitch: nonneg(spitch, "spitch")?,
        width: nonneg(width, "width")?,
        height: nonneg(height, "height")?,
    };
    let stream = stream_arg(stream)?;
    let d = end_2d(py, dst, "dst", true)?;
    let s = end_2d(py, src, "src", false)?;
    let src_views_device = matches!(s, Side::Host(_)) && viewed_buffer(py, src).is_some();
    let planned = copy::copy_2d(
        d.end(false)?,
        s.end(src_views_device)?,
        rel,
        submit_of(&stream),
    )
    .map_err(RtErr)?;
    let device = match (planned.device, &stream) {
        (Some(d), _) => d,
        // Host to host: on the stream's device, or the current one.
        (None, Some(s)) => s.device_index(),
        (None, None) => crate::convert::resolve(py, None, "device")?.index(),
    };
    submit_planned(py, planned, stream, device)
}
