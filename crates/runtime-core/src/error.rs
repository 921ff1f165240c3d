//! Error types of the core, one `thiserror` enum per domain, joined by [`Error`].
//!
//! Every message names the argument and the numbers involved, so that the Python layer can
//! pass it through unchanged.

use std::sync::Arc;

use crate::size::Bytes;

/// Configuration errors: bad `init` arguments or environment variables.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A size string such as `"16GiB"` could not be parsed.
    #[error("{name}: cannot parse {value:?} as a byte size (examples: 1073741824, \"512MiB\", \"16GiB\", \"1.5GB\")")]
    BadSize {
        /// Which setting.
        name: String,
        /// The text given.
        value: String,
    },
    /// A number was out of the allowed range.
    #[error("{name} must be between {min} and {max}, got {value}")]
    OutOfRange {
        /// Which setting.
        name: String,
        /// The value given, as decimal text (it may be negative, or too large for `u64`).
        value: String,
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// An unknown device profile name.
    #[error("profile: unknown device profile {value:?}; valid profiles: {valid}")]
    UnknownProfile {
        /// The name given.
        value: String,
        /// The valid names, comma separated.
        valid: String,
    },
    /// An environment variable held text that is not a number.
    #[error("{name}: cannot parse {value:?} as an integer")]
    BadInteger {
        /// Which setting.
        name: String,
        /// The text given.
        value: String,
    },
    /// The host refused to reserve address space for the devices.
    #[error("cannot reserve {bytes} bytes of address space for device {device}: {reason}")]
    Reserve {
        /// Device index.
        device: usize,
        /// Bytes asked for.
        bytes: u64,
        /// The OS error.
        reason: String,
    },
}

/// Errors about the runtime's lifecycle, devices and handles.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// A call was made before `init` or after `shutdown`.
    #[error("the runtime is not initialised: call runtime.init() first")]
    NotInitialized,
    /// A device index outside `0..count`.
    #[error("device index {index} is out of range: valid devices are 0..={max} ({count} devices)", max = count.saturating_sub(1))]
    InvalidDevice {
        /// The index given.
        index: i64,
        /// Number of devices.
        count: usize,
    },
    /// A handle whose object is gone: freed, destroyed, or from before a shutdown.
    #[error("{what} is no longer valid: {why}")]
    InvalidHandle {
        /// What kind of handle, with its id (e.g. `DeviceBuffer#3`).
        what: String,
        /// Why (freed, destroyed, the runtime was shut down).
        why: String,
    },
    /// The OS refused to start one of the runtime's threads (an engine worker).
    #[error("cannot start {what}: {reason}")]
    ThreadSpawn {
        /// Which thread.
        what: String,
        /// The OS error.
        reason: String,
    },
}

/// Memory errors.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MemoryError {
    /// The device cannot satisfy an allocation.
    #[error(
        "out of memory on device {device}: tried to allocate {requested} bytes ({}); {free} bytes ({}) free of {total} ({}) total, largest free block {largest_free} bytes ({}), fragmentation {fragmentation:.3}, {allocated} bytes ({}) allocated, {cached} bytes ({}) cached",
        Bytes(*.requested), Bytes(*.free), Bytes(*.total), Bytes(*.largest_free), Bytes(*.allocated), Bytes(*.cached)
    )]
    OutOfMemory {
        /// Device index.
        device: usize,
        /// Bytes requested.
        requested: u64,
        /// Bytes not allocated (free space, including caches that were released).
        free: u64,
        /// Capacity of the device.
        total: u64,
        /// Largest block that could still be handed out.
        largest_free: u64,
        /// `1 - largest_free / free`.
        fragmentation: f64,
        /// Bytes in live allocations.
        allocated: u64,
        /// Bytes held in caches.
        cached: u64,
    },
    /// An allocation that fits in the device but not under the process's memory fraction.
    #[error("out of memory on device {device}: tried to allocate {requested} bytes; the per-process memory fraction {fraction:.3} allows {limit} of {total} bytes and {reserved} bytes are reserved")]
    OverFraction {
        /// Device index.
        device: usize,
        /// Bytes requested.
        requested: u64,
        /// Bytes reserved when it failed.
        reserved: u64,
        /// Bytes the fraction allows.
        limit: u64,
        /// Capacity of the device.
        total: u64,
        /// The fraction.
        fraction: f64,
    },
    /// The OS refused to map pinned host memory.
    #[error("cannot allocate {requested} bytes of pinned host memory: the OS refused to map a {block}-byte block")]
    HostAlloc {
        /// Bytes requested.
        requested: u64,
        /// Bytes of the block that was to serve it.
        block: u64,
    },
    /// A copy or view range outside an allocation.
    #[error("{arg}: range [{offset}, {offset} + {count}) is outside the {size}-byte {what}")]
    OutOfBounds {
        /// Which argument.
        arg: &'static str,
        /// Start offset.
        offset: u64,
        /// Byte count.
        count: u64,
        /// Size of the object.
        size: u64,
        /// What the object is.
        what: &'static str,
    },
    /// A copy between host and device memory whose host side is a view of the very device
    /// bytes it copies: the copy is a plain memcpy (maybe split across threads), for which
    /// overlap is undefined. A device-to-device copy moves overlapping ranges as `memmove`.
    #[error("src and dst overlap (the host side is a view of the same device memory); {hint}")]
    HostViewOverlap {
        /// What to do instead.
        hint: &'static str,
    },
    /// The allocator found an inconsistency (double free and the like); never expected.
    #[error("allocator error on device {device}: {message}")]
    Corrupt {
        /// Device index.
        device: usize,
        /// What happened.
        message: String,
    },
}

/// A kernel (or host function, or copy) failed on a stream.
#[derive(Debug, Clone, thiserror::Error)]
#[error("kernel {kernel:?} failed on stream {stream}: {message}")]
pub struct KernelFailure {
    /// Kernel name.
    pub kernel: String,
    /// Stream id.
    pub stream: u64,
    /// What went wrong.
    pub message: String,
    /// The original error object, if the kernel produced one (the Python bindings keep the
    /// Python exception here so that it becomes `__cause__`).
    pub payload: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// The block that failed, in a multi-block launch (the lowest one when several did).
    pub block: Option<u32>,
    /// The non-zero code a native (C ABI) kernel returned.
    pub code: Option<i32>,
}

impl KernelFailure {
    /// A failure with a message only.
    pub fn new(kernel: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kernel: kernel.into(),
            stream: 0,
            message: message.into(),
            payload: None,
            block: None,
            code: None,
        }
    }
}

/// Errors of streams, events and graphs.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StreamError {
    /// A kernel failed; reported at the next synchronisation of its stream.
    #[error(transparent)]
    Kernel(#[from] KernelFailure),
    /// A wait ran past its timeout.
    #[error("{what} did not complete within {timeout_ms} ms")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The timeout.
        timeout_ms: f64,
    },
    /// An event query that needs a completed event found it pending.
    #[error("{what} has not completed yet; synchronize it first")]
    NotReady {
        /// The event.
        what: String,
    },
    /// An operation that is not allowed in the current state.
    #[error("{0}")]
    Invalid(String),
    /// A call that would wait for a capturing stream's work (which is only being recorded):
    /// a synchronize, a barrier, a blocking copy or memset. CUDA's
    /// `cudaErrorStreamCaptureImplicit` / `cudaErrorStreamCaptureUnsupported`.
    #[error("{what} on Stream#{stream}, which is capturing: it would wait for work that is only being recorded (call end_capture() first)")]
    Capturing {
        /// The capturing stream.
        stream: u64,
        /// What was attempted.
        what: String,
    },
    /// A blocking call from a runtime thread (a kernel or host function) that would wait for
    /// work that may need that very thread. CUDA's `cudaErrorNotPermitted`.
    #[error("{what} is not permitted: it would wait for work that may need the runtime thread making the call (CUDA refuses such calls from callbacks too); do it from the host thread, or order the work with events")]
    NotPermitted {
        /// What was attempted, from where.
        what: String,
    },
    /// Several streams failed before one barrier (`synchronize_all`): every error, each
    /// reported once.
    #[error("{} streams failed: {}", .0.len(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Multiple(Vec<Error>),
}

/// Bad arguments (mapped to `ValueError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{arg}: {message}")]
pub struct ArgError {
    /// The argument's name.
    pub arg: String,
    /// What is wrong with it.
    pub message: String,
}

impl ArgError {
    /// Build an argument error.
    pub fn new(arg: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            arg: arg.into(),
            message: message.into(),
        }
    }
}

/// Any error of the core.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// See [`ConfigError`].
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// See [`DeviceError`].
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// See [`MemoryError`].
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// See [`StreamError`].
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// See [`ArgError`].
    #[error(transparent)]
    Arg(#[from] ArgError),
}

impl Error {
    /// No error for an empty list, the error itself for one, [`StreamError::Multiple`] for
    /// several.
    pub fn collect(mut errors: Vec<Error>) -> Result<()> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.pop().expect("one error")),
            _ => Err(StreamError::Multiple(errors).into()),
        }
    }
}

impl From<KernelFailure> for Error {
    fn from(e: KernelFailure) -> Self {
        Error::Stream(StreamError::Kernel(e))
    }
}

/// Result alias of the core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shorthand for an [`ArgError`] wrapped in [`Error`].
pub fn arg_error(arg: impl Into<String>, message: impl Into<String>) -> Error {
    Error::Arg(ArgError::new(arg, message))
}
