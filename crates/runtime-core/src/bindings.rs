//! What only language bindings need: not part of the documented API (hidden from the docs),
//! and free to change with the bindings (`crates/runtime-py` is its one user).
//!
//! The documented API waits in one call (`Stream::synchronize(timeout)`, `runtime::init`);
//! a binding that holds an interpreter lock must instead wait in short slices, releasing the
//! lock and looking for signals (Ctrl-C) between them. Each function here is one such slice,
//! or a conversion of an argument as a dynamic language gives it (a signed device index),
//! over behaviour that lives in the module that owns it.

use crate::device::Device;
use crate::error::{DeviceError, Result};
use crate::runtime::Runtime;

/// Device `index` of `rt`, for an index as a dynamic language gives it (possibly negative).
///
/// # Errors
/// `InvalidDevice` naming `index` as given and the valid range.
pub fn device(rt: &Runtime, index: i64) -> Result<&Device> {
    match usize::try_from(index) {
        Ok(i) if i < rt.devices().len() => rt.device(i),
        _ => Err(DeviceError::InvalidDevice {
            index,
            count: rt.devices().len(),
        }
        .into()),
    }
}
