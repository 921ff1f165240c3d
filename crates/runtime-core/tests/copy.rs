//! Stream-ordered copies between host memory and device buffers (`stream::copy`).

use runtime_core::kernel::LaunchKernel;

/// Typed, stream-ordered copies: `copy_from_host` stages (the source may be reused at once),
/// `copy_to_host` waits for the work queued before it.
#[test]
fn typed_stream_copies_follow_stream_order() {
    let rt = runtime_core::runtime::init(&runtime_core::config::ConfigBuilder {
        device_count: Some(1),
        memory: Some(runtime_core::Bytes::mib(64)),
        profile: None,
    })
    .unwrap();
    let dev = rt.device(0).unwrap();
    let s = runtime_core::stream::Stream::new(dev, 0).unwrap();
    let buf = dev.memory().allocate(64 * 4).unwrap();
    let mut src: Vec<f32> = (0..64).map(|i| i as f32).collect();
    s.copy_from_host(&buf, 0, &src).unwrap();
    src.iter_mut().for_each(|v| *v = -1.0); // reusing the source does not change the copy
    let x = runtime_core::kernel::Tensor::new(
        buf.clone(),
        0,
        runtime_core::kernel::DType::F32,
        vec![64],
    )
    .unwrap();
    s.launch_kernel(
        "scale",
        vec![
            runtime_core::kernel::KernelArg::Tensor(x.clone()),
            runtime_core::kernel::KernelArg::Tensor(x),
            runtime_core::kernel::KernelArg::Float(2.0),
        ],
    )
    .unwrap();
    let mut back = vec![0f32; 60];
    s.copy_to_host(&buf, 16, &mut back).unwrap();
    let want: Vec<f32> = (4..64).map(|i| 2.0 * i as f32).collect();
    assert_eq!(back, want);
    let mut too_many = vec![0f64; 33];
    assert!(s.copy_to_host(&buf, 0, &mut too_many).is_err());
}

use std::sync::Arc;

use proptest::prelude::*;
use runtime_core::stream::copy::{self, HostMemory, HostVec, Rect};

fn rect(dst_off: u64, dpitch: u64, src_off: u64, spitch: u64, width: u64, height: u64) -> Rect {
    Rect {
        dst_off,
        dpitch,
        src_off,
        spitch,
        width,
        height,
    }
}

/// `cudaMemcpy2D`'s checks: width above a pitch, rows outside an end, overflow.
#[test]
fn rect_checks_name_the_numbers() {
    let e = rect(0, 4, 0, 16, 8, 2).check(100, "host buffer", 100, "device buffer");
    assert_eq!(
        e.unwrap_err().to_string(),
        "width: 8 bytes per row is more than dpitch (4 bytes)"
    );
    let e = rect(0, 16, 0, 4, 8, 2).check(100, "host buffer", 100, "device buffer");
    assert!(e.unwrap_err().to_string().contains("spitch (4 bytes)"));
    let e = rect(5, 12, 0, 8, 8, 4).check(40, "device buffer", 100, "host buffer");
    assert_eq!(
        e.unwrap_err().to_string(),
        "dst: 4 rows of 8 bytes, 12 bytes apart, from offset 5 end at byte 49, outside the 40-byte device buffer"
    );
    let e = rect(0, 8, 0, u64::MAX / 2, 8, 4).check(100, "host buffer", 100, "host buffer");
    assert!(e.unwrap_err().to_string().contains("past 2^64"));
    // Empty copies only need their offsets inside.
    assert!(rect(100, 0, 0, 0, 0, 5).check(100, "a", 0, "b").is_ok());
    assert!(rect(101, 8, 0, 8, 8, 0).check(100, "a", 0, "b").is_err());
    // The last row needs only `width` bytes, not a whole pitch.
    assert!(rect(0, 10, 0, 10, 4, 3).check(24, "a", 24, "b").is_ok());
}

/// Whether a rectangle fits both ends, decided apart from the code under test (`Rect::check`):
/// cudaMemcpy2D's rule. An empty copy (no width or no rows) needs only its offsets inside;
/// otherwise each end's last row ends at `off + (height - 1) * pitch + width`.
fn fits_model(r: Rect, dst_len: u64, src_len: u64) -> bool {
    if r.width > r.dpitch || r.width > r.spitch {
        return false;
    }
    if r.width == 0 || r.height == 0 {
        return r.dst_off <= dst_len && r.src_off <= src_len;
    }
    let end =
        |off: u128, pitch: u128| off + (u128::from(r.height) - 1) * pitch + u128::from(r.width);
    end(r.dst_off.into(), r.dpitch.into()) <= dst_len.into()
        && end(r.src_off.into(), r.spitch.into()) <= src_len.into()
}

/// The model: numpy-style row copies on plain vectors.
fn model(dst: &mut [u8], src: &[u8], r: Rect) {
    for i in 0..if r.width == 0 { 0 } else { r.height } {
        let (d, s) = (
            (r.dst_off + i * r.dpitch) as usize,
            (r.src_off + i * r.spitch) as usize,
        );
        dst[d..d + r.width as usize].copy_from_slice(&src[s..s + r.width as usize]);
    }
}

fn bytes(h: &HostVec) -> Vec<u8> {
    // SAFETY: the copies that used `h` have run; it is valid for `len()` reads.
    unsafe { std::slice::from_raw_parts(h.as_ptr(), h.len()).to_vec() }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Every direction matches the model, and a copy that does not fit is refused whole.
    #[test]
    fn copies_2d_match_the_model(
        width in 0u64..20, height in 0u64..6, dpad in 0u64..8, spad in 0u64..8,
        dst_off in 0u64..10, src_off in 0u64..10, dlen in 0u64..160, slen in 0u64..160,
    ) {
        let rt = runtime_core::runtime::init(&runtime_core::config::ConfigBuilder {
            device_count: Some(1),
            memory: Some(runtime_core::Bytes::mib(64)),
            profile: None,
        })
        .unwrap();
        let dev = rt.device(0).unwrap();
        let r = rect(dst_off, width + dpad, src_off, width + spad, width, height);
        let src: Vec<u8> = (0..slen).map(|i| (i * 7 + 1) as u8).collect();
        let fits = fits_model(r, dlen, slen);
        prop_assert_eq!(r.check(dlen, "dst", slen, "src").is_ok(), fits);
        let mut want = vec![0u8; dlen as usize];
        if fits {
            model(&mut want, &src, r);
        }
        // host -> host
        let (hd, hs) = (HostVec::new(vec![0u8; dlen as usize]), HostVec::new(src.clone()));
        match copy::h2h_2d(hd.clone(), hs.clone(), r) {
            Ok(op) => { prop_assert!(fits); op.run().unwrap(); }
            Err(_) => prop_assert!(!fits),
        }
        prop_assert_eq!(bytes(&hd), want.clone());
        // host -> device -> device -> host
        let d1 = dev.memory().allocate(dlen).unwrap();
        let d2 = dev.memory().allocate(dlen).unwrap();
        let ds = dev.memory().allocate(slen).unwrap();
        ds.write(0, &src).unwrap();
        // Each copy is accepted exactly when the model says it fits, and a refused one
        // writes nothing (the destinations stay zero, which `want` is then).
        match copy::h2d_2d(&d1, hs.clone(), r) {
            Ok(op) => { prop_assert!(fits); op.run().unwrap(); }
            Err(_) => prop_assert!(!fits),
        }
        match copy::d2d_2d(&d2, &ds, r) {
            Ok(op) => { prop_assert!(fits); op.run().unwrap(); }
            Err(_) => prop_assert!(!fits),
        }
        let back = HostVec::new(vec![0u8; dlen as usize]);
        let staged = HostVec::new(src.clone());
        match copy::h2d_2d_async(&d1, staged, r) {
            Ok(op) => { prop_assert!(fits); op.run().unwrap(); }
            Err(_) => prop_assert!(!fits),
        }
        let mut got = vec![0u8; dlen as usize];
        d1.read(0, &mut got).unwrap();
        prop_assert_eq!(&got, &want);
        d2.read(0, &mut got).unwrap();
        prop_assert_eq!(&got, &want);
        // device -> host, with the source rectangle read from the device copy of `src`
        match copy::d2h_2d(back.clone(), &ds, r) {
            Ok(op) => { prop_assert!(fits); op.run().unwrap(); }
            Err(_) => prop_assert!(!fits),
        }
        prop_assert_eq!(bytes(&back), want);
        let _ = Arc::strong_count(&hd);
    }
}

fn one_device() -> Arc<runtime_core::runtime::Runtime> {
    runtime_core::runtime::init(&runtime_core::config::ConfigBuilder {
        device_count: Some(1),
        memory: Some(runtime_core::Bytes::mib(64)),
        profile: None,
    })
    .unwrap()
}

/// Host memory that is a view of a device buffer's bytes (what the Python package's numpy
/// views of a `DeviceBuffer` are): only handed to `copy`/`copy_2d`, which must refuse it
/// where it overlaps the device end, or read it in stream order.
struct DeviceAlias(runtime_core::memory::Buffer);

// SAFETY: valid for reads and writes of `len()` bytes while the buffer lives (it is held);
// it *is* device memory, against the trait's contract, which is the point: the tests only
// give it to the planner, which refuses the overlapping copies, and run the others after
// ordering them.
unsafe impl HostMemory for DeviceAlias {
    fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
    fn as_mut_ptr(&self) -> Option<*mut u8> {
        Some(self.0.as_ptr())
    }
    fn len(&self) -> usize {
        self.0.size() as usize
    }
}

/// The copy-overlap rule (moved from the Python bindings' `copy.rs`): a host-device copy
/// whose host side is a view of the device bytes it copies is refused, 1-D and 2-D, before
/// anything is queued; disjoint ranges of the same allocation copy normally.
#[test]
fn copies_refuse_a_host_view_of_their_own_device_bytes() {
    use copy::{End, Submit};
    let rt = one_device();
    let dev = rt.device(0).unwrap();
    let buf = dev.memory().allocate(256).unwrap();
    buf.write(0, &(0..=255u8).collect::<Vec<_>>()).unwrap();
    let alias = || -> Arc<dyn HostMemory> { Arc::new(DeviceAlias(buf.clone())) };
    for submit in [Submit::Queued, Submit::Blocking] {
        for (dst, src) in [
            (End::Device(buf.clone()), End::DeviceView(alias())),
            (End::Device(buf.clone()), End::Host(alias())),
            (End::Host(alias()), End::Device(buf.clone())),
        ] {
            let e = copy::copy(dst, 8, src, 16, 16, submit).err().unwrap();
            assert_eq!(
                e.to_string(),
                "src and dst overlap (the host side is a view of the same device memory); use memcpy_d2d for overlapping copies"
            );
        }
        let rows = rect(0, 32, 8, 32, 16, 4);
        let e = copy::copy_2d(End::Device(buf.clone()), End::Host(alias()), rows, submit)
            .err()
            .unwrap();
        assert!(
            e.to_string().ends_with("copy device to device instead"),
            "{e}"
        );
    }
    // Disjoint ranges of the same bytes: allowed, and copied in stream order.
    let s = runtime_core::stream::Stream::new(dev, 0).unwrap();
    let p = copy::copy(
        End::Device(buf.clone()),
        128,
        End::DeviceView(alias()),
        0,
        16,
        Submit::Queued,
    )
    .unwrap();
    assert_eq!((p.device, p.peer), (Some(0), None));
    s.launch(p.into_op().unwrap()).unwrap();
    s.synchronize(None).unwrap();
    let mut got = [0u8; 16];
    buf.read(128, &mut got).unwrap();
    assert_eq!(got.to_vec(), (0..16u8).collect::<Vec<_>>());
    // Zero bytes overlap nothing.
    assert!(copy::copy(
        End::Device(buf.clone()),
        0,
        End::Host(alias()),
        0,
        0,
        Submit::Queued
    )
    .is_ok());
}

/// A queued copy from pageable host memory runs at once, reading the source where it is, on
/// an idle stream (counted as submitted and completed, as a blocking copy is); on a busy or a
/// capturing stream it stages the source instead. Either way the source may be reused once
/// the call returns. 1-D, and 2-D (eight rows of 8 bytes, 16 bytes apart in a 128-byte
/// source).
#[test]
fn a_queued_pageable_copy_runs_at_once_on_an_idle_stream_and_is_staged_otherwise() {
    use copy::{End, Submit};
    for two_d in [false, true] {
        pageable_copy_runs_at_once_when_idle(|dst, host| {
            if two_d {
                copy::copy_2d(
                    End::Device(dst.clone()),
                    End::Host(host),
                    rect(0, 8, 0, 16, 8, 8),
                    Submit::Queued,
                )
            } else {
                copy::copy(
                    End::Device(dst.clone()),
                    0,
                    End::Host(host),
                    0,
                    64,
                    Submit::Queued,
                )
            }
            .unwrap()
        });
    }
}

/// The test above for one way of planning the copy of a 128-byte pageable source, all one
/// byte value, into 64 device bytes.
fn pageable_copy_runs_at_once_when_idle(
    plan_into: impl Fn(&runtime_core::memory::Buffer, Arc<HostVec>) -> copy::Planned,
) {
    use runtime_core::stream::{FnOp, OpKind, Stream};
    let rt = one_device();
    let dev = rt.device(0).unwrap();
    let s = Stream::new(dev, 0).unwrap();
    let dst = dev.memory().allocate(64).unwrap();
    let plan = |host: Arc<HostVec>| plan_into(&dst, host);
    let read = || {
        let mut got = [0u8; 64];
        dst.read(0, &mut got).unwrap();
        got
    };
    // Idle: it ran here.
    let (_, ran) = plan(HostVec::new(vec![1u8; 128]))
        .run_now_or_stage(&s)
        .unwrap();
    assert!(ran, "an idle stream runs the copy at once");
    assert_eq!(s.pending(), 0);
    assert_eq!(read(), [1; 64]);
    // Busy (a command holds the stream): staged, then queued behind the command.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    s.launch(FnOp::shared("gate", OpKind::Compute, move || {
        let _ = rx.lock().unwrap().recv();
        Ok(())
    }))
    .unwrap();
    let host = HostVec::new(vec![2u8; 128]);
    let (op, ran) = plan(host.clone()).run_now_or_stage(&s).unwrap();
    assert!(!ran, "a busy stream gets the staged copy to queue");
    // SAFETY: no op reads `host`: the queued copy reads its staged bytes; 128 bytes.
    unsafe { std::ptr::write_bytes(host.as_mut_ptr().unwrap(), 3, 128) };
    s.launch(op).unwrap();
    drop(tx);
    s.synchronize(None).unwrap();
    assert_eq!(
        read(),
        [2; 64],
        "the bytes of the source when the copy was queued"
    );
    // Capturing: recorded (staged), not run.
    s.begin_capture().unwrap();
    let (op, ran) = plan(HostVec::new(vec![4u8; 128]))
        .run_now_or_stage(&s)
        .unwrap();
    assert!(!ran, "a capturing stream records the copy");
    s.launch(op).unwrap();
    drop(s.end_capture().unwrap());
    assert_eq!(read(), [2; 64]);
}

/// The stage-or-stream-order choice (moved from the Python bindings): a queued copy from
/// pageable host memory reads it when queued (staged), a blocking one and one from a host
/// view of device memory read it when they run; the devices a blocking copy orders on.
#[test]
fn queued_copies_stage_pageable_sources_and_read_device_views_in_order() {
    use copy::{End, Submit};
    let rt = one_device();
    let dev = rt.device(0).unwrap();
    let dst = dev.memory().allocate(64).unwrap();
    let other = dev.memory().allocate(64).unwrap();
    other.fill(0, 64, 5).unwrap();
    let cases: [(Submit, bool, u8); 3] = [
        (Submit::Queued, false, 1),   // pageable, queued: the bytes at queue time
        (Submit::Blocking, false, 9), // blocking: the bytes when it runs
        (Submit::Queued, true, 9),    // a view of device memory: when it runs
    ];
    for (submit, view, want) in cases {
        let host = HostVec::new(vec![1u8; 64]);
        let src = if view {
            // The source is device memory seen through a host pointer: make it hold 1s and
            // write the later value through the buffer before the copy runs.
            other.fill(0, 64, 1).unwrap();
            End::DeviceView(Arc::new(DeviceAlias(other.clone())))
        } else {
            End::Host(host.clone())
        };
        // Planned and taken to queue (a pageable source is staged as it is taken).
        let op = copy::copy(End::Device(dst.clone()), 0, src, 0, 64, submit)
            .unwrap()
            .into_op()
            .unwrap();
        if view {
            other.fill(0, 64, 9).unwrap();
        } else {
            // SAFETY: no copy reads `host` now (the op is built, not running); 64 bytes.
            unsafe { std::ptr::write_bytes(host.as_mut_ptr().unwrap(), 9, 64) };
        }
        op.run().unwrap();
        let mut got = [0u8; 64];
        dst.read(0, &mut got).unwrap();
        assert_eq!(got, [want; 64], "{submit:?}, device view: {view}");
    }
    // Which devices a blocking copy is ordered on.
    let h = || End::Host(HostVec::new(vec![0u8; 8]));
    let d2h = copy::copy(h(), 0, End::Device(dst.clone()), 0, 8, Submit::Blocking).unwrap();
    assert_eq!((d2h.device, d2h.peer), (Some(0), None));
    let d2d = copy::copy(
        End::Device(dst.clone()),
        0,
        End::Device(other.clone()),
        0,
        8,
        Submit::Blocking,
    )
    .unwrap();
    assert_eq!((d2d.device, d2d.peer), (Some(0), Some(0)));
    let h2h = copy::copy(h(), 0, h(), 0, 8, Submit::Blocking).unwrap();
    assert_eq!((h2h.device, h2h.peer), (None, None));
    // Ranges are checked against each end, naming the argument.
    let e = copy::copy(End::Device(dst.clone()), 60, h(), 0, 8, Submit::Queued)
        .err()
        .unwrap();
    assert!(e.to_string().starts_with("dst_offset:"), "{e}");
}

/// The element value at multi-index `idx` of a model array of `shape` (C order), for the
/// layout-copy property below.
fn model_value(shape: &[usize], idx: &[usize]) -> u16 {
    idx.iter()
        .zip(shape)
        .fold(0usize, |acc, (&i, &d)| acc * d + i) as u16
        + 1
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// `copy::d2d_layout` is numpy's `copyto` between two layouts of one shape: every
    /// element reaches the same index (C, F and step-sliced layouts on either side, the
    /// source read whole first), the destination's gaps keep their bytes, and a shape
    /// mismatch or a layout leaving its buffer is refused when the op is built.
    #[test]
    fn layout_copies_match_the_model(
        shape in proptest::collection::vec(1usize..5, 1..4),
        src_f in any::<bool>(), dst_f in any::<bool>(), step in 1usize..3,
    ) {
        use runtime_core::memory::Layout;
        let rt = one_device();
        let dev = rt.device(0).unwrap();
        let item = 2usize;
        let n: usize = shape.iter().product();
        let make = |f: bool, s: Vec<usize>| if f { Layout::f(s, item) } else { Layout::c(s, item) };
        // Source: the model in C or F order.
        let src_l = make(src_f, shape.clone());
        let src = dev.memory().allocate(src_l.span()).unwrap();
        let mut bytes = vec![0u8; src_l.span() as usize];
        let mut idx = vec![0usize; shape.len()];
        for off in src_l.offsets() {
            bytes[off..off + item].copy_from_slice(&model_value(&shape, &idx).to_le_bytes());
            for a in (0..idx.len()).rev() {
                idx[a] += 1;
                if idx[a] < shape[a] { break; }
                idx[a] = 0;
            }
        }
        src.write(0, &bytes).unwrap();
        // Destination: a step slice of the first axis of a larger C or F array.
        let mut big = shape.clone();
        big[0] = shape[0] * step;
        let big_l = make(dst_f, big);
        let dst = dev.memory().allocate(big_l.span()).unwrap();
        dst.fill(0, big_l.span(), 0xEE).unwrap();
        let (delta, dst_l) = big_l.slice(0, 0, step, shape[0]).unwrap();
        copy::d2d_layout(&dst, delta, &dst_l, &src, 0, &src_l).unwrap().run().unwrap();
        let mut got = vec![0u8; big_l.span() as usize];
        dst.read(0, &mut got).unwrap();
        let mut covered = vec![false; got.len()];
        let mut idx = vec![0usize; shape.len()];
        for off in dst_l.offsets() {
            let at = delta as usize + off;
            let v = u16::from_le_bytes([got[at], got[at + 1]]);
            prop_assert_eq!(v, model_value(&shape, &idx));
            covered[at] = true;
            covered[at + 1] = true;
            for a in (0..idx.len()).rev() {
                idx[a] += 1;
                if idx[a] < shape[a] { break; }
                idx[a] = 0;
            }
        }
        for (b, c) in got.iter().zip(&covered) {
            if !c { prop_assert_eq!(*b, 0xEE); }
        }
        prop_assert_eq!(n, dst_l.len());
        // Refusals: another shape, and a layout reaching past its buffer.
        let other = Layout::c(vec![n + 1], item);
        prop_assert!(copy::d2d_layout(&dst, 0, &other, &src, 0, &src_l).is_err());
        prop_assert!(copy::d2d_layout(&dst, big_l.span(), &dst_l, &src, 0, &src_l).is_err());
    }
}

/// `copy::h2d_layout` puts staged host values (C order) into a strided destination element
/// by element, leaving its gaps alone, and refuses a source of the wrong length.
#[test]
fn host_values_go_into_a_strided_layout_and_its_gaps_keep_their_bytes() {
    use runtime_core::memory::Layout;
    let rt = one_device();
    let dev = rt.device(0).unwrap();
    // A 4 x 6 C array of u16; the view is every other row, every other column from 1.
    let big = Layout::c(vec![4, 6], 2);
    let dst = dev.memory().allocate(big.span()).unwrap();
    dst.fill(0, big.span(), 0xEE).unwrap();
    let (at, rows) = big.slice(0, 0, 2, 2).unwrap();
    let (at2, view) = rows.slice(1, 1, 2, 3).unwrap();
    let values: Vec<u8> = (1u16..=6).flat_map(|v| v.to_le_bytes()).collect();
    copy::h2d_layout(&dst, at + at2, &view, values)
        .unwrap()
        .run()
        .unwrap();
    let mut got = vec![0u8; big.span() as usize];
    dst.read(0, &mut got).unwrap();
    let got: Vec<u16> = got
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    let e = 0xEEEE;
    #[rustfmt::skip]
    let want = vec![
        e, 1, e, 2, e, 3,
        e, e, e, e, e, e,
        e, 4, e, 5, e, 6,
        e, e, e, e, e, e,
    ];
    assert_eq!(got, want);
    let err = copy::h2d_layout(&dst, at + at2, &view, vec![0; 11])
        .err()
        .expect("a source of the wrong length is refused");
    assert!(err.to_string().contains("src"), "{err}");
}

/// Plain host memory with no tracker of its own, over a leaked vector (so a registered range
/// can be found by address).
struct Plain(&'static mut [u8]);

// SAFETY: the slice is leaked, so valid for reads and writes of its length for ever; the tests
// register it, so the copies that use it are ordered by the registration's tracker.
unsafe impl HostMemory for Plain {
    fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
    fn as_mut_ptr(&self) -> Option<*mut u8> {
        Some(self.0.as_ptr().cast_mut())
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// Queued ops that use one piece of host memory take turns as ops on one device buffer do:
/// two streams each copy their own device buffer (all 0xA0+i bytes) into the same host memory
/// again and again, and after each copy an op on the same stream reads the host memory whole
/// (holding its tracker for reading) and copies it to a device buffer with `h2d`. Every state
/// either op sees is one copy's bytes, never half of one and half of the other; before host
/// memory had a tracker the copies ran at once, and 1 MiB copies tore in most rounds. The
/// host memory is a `HostVec`, a pinned block, and a registered range of plain memory.
#[test]
fn queued_copies_into_one_host_memory_on_two_streams_take_turns() {
    use runtime_core::memory::access::{Access, AccessSet};
    use runtime_core::memory::pinned;
    use runtime_core::stream::{FnOp, OpKind, Stream};
    use std::sync::atomic::{AtomicUsize, Ordering};
    const LEN: usize = 1 << 20;
    let rt = one_device();
    let dev = rt.device(0).unwrap();
    let plain: &'static mut [u8] = Box::leak(vec![0u8; LEN].into_boxed_slice());
    let plain_at = plain.as_ptr();
    let keep: pinned::KeepAlive = Arc::new(());
    pinned::register(plain_at, LEN, keep).unwrap();
    let pinned_block = pinned::allocate(LEN as u64).unwrap();
    let hosts: Vec<(&str, Arc<dyn HostMemory>)> = vec![
        ("HostVec", HostVec::new(vec![0u8; LEN])),
        ("pinned block", Arc::new(pinned_block.clone())),
        ("registered range", Arc::new(Plain(plain))),
    ];
    for (what, host) in hosts {
        let tracker = match host.tracker() {
            Some(t) => t.clone(),
            None => pinned::registered_tracker(host.as_ptr(), LEN).expect("registered"),
        };
        let torn = Arc::new(AtomicUsize::new(0));
        let streams: Vec<Stream> = (0..2).map(|_| Stream::new(dev, 0).unwrap()).collect();
        let sources: Vec<_> = (0..2u8)
            .map(|i| {
                let b = dev.memory().allocate(LEN as u64).unwrap();
                b.fill(0, LEN as u64, 0xA0 + i).unwrap();
                b
            })
            .collect();
        let seen = dev.memory().allocate(2 * LEN as u64).unwrap();
        for _ in 0..12 {
            for (i, s) in streams.iter().enumerate() {
                s.launch(copy::d2h(host.clone(), 0, &sources[i], 0, LEN as u64).unwrap())
                    .unwrap();
                let (h, torn) = (host.clone(), torn.clone());
                let check = AccessSet::default().with_host([(&tracker, Access::Read)]);
                s.launch(FnOp::with_accesses(
                    "check",
                    OpKind::Copy,
                    check,
                    move || {
                        // SAFETY: the op holds the host memory's tracker for reading, so no
                        // queued copy writes it meanwhile; it is valid for `LEN` bytes.
                        let bytes = unsafe { std::slice::from_raw_parts(h.as_ptr(), LEN) };
                        if bytes.iter().any(|&b| b != bytes[0]) {
                            torn.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(())
                    },
                ))
                .unwrap();
                s.launch(copy::h2d(&seen, (i * LEN) as u64, host.clone(), 0, LEN as u64).unwrap())
                    .unwrap();
            }
        }
        let mut back = vec![0u8; LEN];
        for (i, s) in streams.iter().enumerate() {
            s.synchronize(None).unwrap();
            seen.read((i * LEN) as u64, &mut back).unwrap();
            assert!(
                back.iter().all(|&b| b == back[0]) && (0xA0..0xA2).contains(&back[0]),
                "{what}: stream {i}'s last h2d read a torn copy"
            );
        }
        let torn = torn.load(Ordering::Relaxed);
        assert_eq!(torn, 0, "{what}: {torn} of 24 reads saw two copies at once");
    }
    pinned::unregister(plain_at).unwrap();
}

/// A queued copy from a `HostVec` stages it when queued (it is pageable), and staging is a
/// host access: it waits for the copy queued into the `HostVec` before it on another stream
/// and reads all of that copy's bytes. Before, staging read the vector while the earlier
/// copy was still writing it (ThreadSanitizer reported the race; the staged copies carried
/// a few MiB of the 32). Both the 1-D and the 2-D path stage.
#[test]
fn staging_a_host_vec_waits_for_the_copies_queued_into_it() {
    use runtime_core::stream::copy::{End, Submit};
    use runtime_core::stream::Stream;
    const LEN: usize = 8 << 20;
    let rt = one_device();
    let dev = rt.device(0).unwrap();
    let x = dev.memory().allocate(LEN as u64).unwrap();
    let y = dev.memory().allocate(LEN as u64).unwrap();
    x.fill(0, LEN as u64, 0xAB).unwrap();
    let (s1, s2) = (Stream::new(dev, 0).unwrap(), Stream::new(dev, 0).unwrap());
    for two_d in [false, true] {
        for _ in 0..3 {
            let hv = HostVec::new(vec![0u8; LEN]);
            y.fill(0, LEN as u64, 0).unwrap();
            s1.launch(copy::d2h(hv.clone(), 0, &x, 0, LEN as u64).unwrap())
                .unwrap();
            let (dst, src) = (End::Device(y.clone()), End::Host(hv.clone()));
            let planned = if two_d {
                let r = rect(0, 1 << 10, 0, 1 << 10, 1 << 10, (LEN >> 10) as u64);
                copy::copy_2d(dst, src, r, Submit::Queued)
            } else {
                copy::copy(dst, 0, src, 0, LEN as u64, Submit::Queued)
            };
            s2.launch(planned.unwrap().into_op().unwrap()).unwrap();
            s2.synchronize(None).unwrap();
            let got = y.to_vec::<u8>(0, LEN).unwrap();
            let copied = got.iter().filter(|&&b| b == 0xAB).count();
            assert_eq!(
                copied, LEN,
                "2-D: {two_d}: the staged copy carried {copied} bytes"
            );
            s1.synchronize(None).unwrap();
        }
    }
}
