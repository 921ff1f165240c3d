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
    #![proptest_config(ProptestConfig::with_cases(64))]
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
        let fits = r.check(dlen, "dst", slen, "src").is_ok();
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
        if let Ok(op) = copy::h2d_2d(&d1, hs.clone(), r) { op.run().unwrap(); }
        if let Ok(op) = copy::d2d_2d(&d2, &ds, r) { op.run().unwrap(); }
        let back = HostVec::new(vec![0u8; dlen as usize]);
        let staged = HostVec::new(src.clone());
        if let Ok(op) = copy::h2d_2d_async(&d1, staged, r) { op.run().unwrap(); }
        let mut got = vec![0u8; dlen as usize];
        d1.read(0, &mut got).unwrap();
        prop_assert_eq!(&got, &want);
        d2.read(0, &mut got).unwrap();
        prop_assert_eq!(&got, &want);
        // device -> host, with the source rectangle read from the device copy of `src`
        if let Ok(op) = copy::d2h_2d(back.clone(), &ds, r) { op.run().unwrap(); }
        prop_assert_eq!(bytes(&back), want);
        let _ = Arc::strong_count(&hd);
    }
}
