//! `runtime-acl`: CANN's ACL runtime API over `runtime-core`, for C and C++ programs
//! (`libascendcl.so`, with our own headers in `include/acl/`) and for the Python face
//! (`runtime.acl`, through the Python bindings, which link this crate): one implementation of
//! ACL's conventions, so C and Python agree by construction.
//!
//! | layer (bottom to top) | module | owns |
//! |---|---|---|
//! | numbers | [`codes`] | every return code and enum value, by CANN's names |
//! | errors | [`error`] | a failure as a code and a message; the per-thread recent message; core errors to codes |
//! | host memory | `hostmem` | reaching host memory the runtime did not hand out (checked kernel copies) |
//! | objects | [`state`] | `aclInit`'s flag, handles (contexts, streams, events), default contexts, current context |
//! | memory | [`memory`] | the pointer → allocation table; malloc/free, copies, memsets, memory info |
//! | callbacks | [`report`] | subscriptions, `aclrtLaunchCallback`, `aclrtProcessReport` |
//! | lifecycle | [`lifecycle`] | `aclInit` (configuration file, runtime start), `aclFinalize` |
//! | fork | `fork` | the `pthread_atfork` handlers: locks held across `fork()`; the child starts over |
//! | C ABI | [`capi`] | the `extern "C"` functions: panics caught, messages recorded, output pointers |
//! | symbols | [`dispatch`] | the exported symbols; one runtime per process (the provider search) |
//!
//! The Rust API ([`state`], [`memory`], [`report`], [`lifecycle`]) returns
//! `Result<T, AclError>`; the C ABI turns that into CANN's return codes and output arguments,
//! the Python bindings into pyACL's `(value, ret)` tuples.
//!
//! ```
//! use ascendcl::{lifecycle, memory, state};
//! lifecycle::init(None).unwrap();
//! state::set_device(0).unwrap();
//! let p = memory::malloc(1024, memory::DeviceKind::Malloc).unwrap();
//! assert_eq!(p % 64, 0);
//! memory::free(p, memory::DeviceKind::Malloc).unwrap();
//! assert_eq!(memory::free(p, memory::DeviceKind::Malloc).unwrap_err().code(), 100000);
//! state::reset_device(0, false).unwrap();
//! lifecycle::finalize().unwrap();
//! ```

pub mod capi;
pub mod codes;
pub mod dispatch;
pub mod error;
mod fork;
mod hostmem;
pub mod lifecycle;
pub mod memory;
pub mod report;
pub mod state;

pub use error::{AclError, AclResult};

/// This library's own function table (the Python extension returns it from its provider
/// symbol, [`dispatch::PROVIDER_SYMBOL`], so that `libascendcl.so` loaded beside it calls
/// into the extension's runtime).
pub fn provider_table() -> *const capi::Table {
    &capi::TABLE
}
