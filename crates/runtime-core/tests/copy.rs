//! Stream-ordered copies between host memory and device buffers (`stream::copy`).

/// Typed, stream-ordered copies: `copy_from_host` stages (the source may be reused at once),
/// `copy_to_host` waits for the work queued before it.
#[test]
fn typed_stream_copies_follow_stream_order() {
    let rt = runtime_core::runtime::init(&runtime_core::config::ConfigBuilder {
        device_count: Some(1),
        memory: Some("64MiB".into()),
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
