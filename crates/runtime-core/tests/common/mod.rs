//! Helpers shared by the integration tests (each test file is its own binary and includes
//! this module with `mod common;`).
#![allow(dead_code)] // each binary uses a different subset

use std::sync::Arc;

use runtime_core::config::ConfigBuilder;
use runtime_core::runtime::{self, Runtime};

/// The settings most test binaries share: 2 devices of 256 MiB.
pub fn settings() -> ConfigBuilder {
    ConfigBuilder {
        device_count: Some(2),
        memory: Some("256MiB".into()),
        profile: None,
    }
}

/// The runtime shared by the tests of one binary (initialised by the first, never shut
/// down: `init` with the same settings is idempotent).
pub fn init() -> Arc<Runtime> {
    runtime::init(&settings()).expect("init the runtime")
}

/// Whether `r` is the error of a wait that ran out of time.
pub fn timed_out<T: std::fmt::Debug>(r: runtime_core::Result<T>) -> bool {
    matches!(
        r,
        Err(runtime_core::Error::Stream(
            runtime_core::error::StreamError::Timeout { .. }
        ))
    )
}
