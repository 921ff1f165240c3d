//! Kernels: the [`Kernel`] trait, typed tensor arguments, and the process-wide registry that
//! other crates add to and the Python layer launches from by name.
//!
//! * [`dtype`]: [`DType`], the element types (numpy's fixed-size number types) and numpy's
//!   rule for viewing an array as another dtype.
//! * [`builtin`]: `noop`, `fill`, `copy`, `scale`, `axpy`, `add`, `mul`, `sum`, `matmul` for
//!   every dtype where numpy defines the operation.
//!
//! A launch checks the arguments on the caller's thread ([`Kernel::check`]: wrong shapes and
//! dtypes fail there, as `ValueError` in Python) and queues the run on the stream. The
//! arguments hold their buffers, so memory stays alive until the kernel has run.

pub mod builtin;
pub mod dtype;

pub use dtype::DType;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use parking_lot::RwLock;

use crate::error::{arg_error, ArgError, KernelFailure, Result};
use crate::memory::access::{Access, AccessSet};
use crate::memory::{Buffer, Element, MemorySpan};
use crate::stream::{Op, OpKind, Stream};

/// A typed, C-contiguous view of part of a buffer: the only way a kernel sees device memory.
///
/// Built only by [`Tensor::new`], which checks that the view lies inside its allocation and
/// is aligned for its element type; the fields are private, so that holds for every `Tensor`:
///
/// ```compile_fail
/// # use runtime_core::kernel::{DType, Tensor};
/// # fn f(buffer: runtime_core::memory::Buffer) {
/// let t = Tensor { buffer, offset: 4096, dtype: DType::F32, shape: vec![16] };
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Tensor {
    buffer: Buffer,
    offset: u64,
    dtype: DType,
    shape: Vec<usize>,
}

impl Tensor {
    /// A view of `shape` elements of `dtype` at byte `offset` of `buffer`; checks alignment
    /// and that it fits in the buffer (overflow included).
    ///
    /// # Errors
    /// `ArgError` naming `offset` (misaligned, or past the end) or `shape` (too large).
    pub fn new(buffer: Buffer, offset: u64, dtype: DType, shape: Vec<usize>) -> Result<Tensor> {
        let count = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| arg_error("shape", format!("{shape:?} is too large")))?;
        if !offset.is_multiple_of(dtype.size() as u64) {
            return Err(arg_error(
                "offset",
                format!(
                    "{offset} is not a multiple of the {} item size {}",
                    dtype.name(),
                    dtype.size()
                ),
            ));
        }
        buffer.check_range("offset", offset, count as u64)?;
        Ok(Tensor {
            buffer,
            offset,
            dtype,
            shape,
        })
    }

    /// The buffer (kept alive by this argument).
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// Byte offset into the buffer.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape (C order).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> u64 {
        (self.len() * self.dtype.size()) as u64
    }

    /// The memory the tensor occupies (for overlap checks: compared by memory, never by
    /// address; see [`MemorySpan`]).
    pub fn span(&self) -> MemorySpan {
        self.buffer.memory_span(self.offset, self.nbytes())
    }

    /// Copy the elements out (synchronous, not stream ordered: call it from a kernel's `run`
    /// or after synchronising).
    ///
    /// # Errors
    /// `ArgError` naming `T` when its size is not the tensor's item size.
    pub fn to_vec<T: Element + Default>(&self) -> Result<Vec<T>> {
        self.same_size::<T>()?;
        let mut out = vec![T::default(); self.len()];
        self.buffer.read(self.offset, T::as_bytes_mut(&mut out))?;
        Ok(out)
    }

    /// Overwrite the elements with `values` (synchronous, not stream ordered).
    ///
    /// # Errors
    /// `ArgError` when the item size or the number of values does not match.
    pub fn write<T: Element>(&self, values: &[T]) -> Result<()> {
        self.same_size::<T>()?;
        if values.len() != self.len() {
            return Err(arg_error(
                "values",
                format!(
                    "{} values for a tensor of {} elements",
                    values.len(),
                    self.len()
                ),
            ));
        }
        self.buffer.write(self.offset, T::as_bytes(values))
    }

    fn same_size<T: Element>(&self) -> Result<()> {
        if size_of::<T>() == self.dtype.size() {
            Ok(())
        } else {
            Err(arg_error(
                "T",
                format!(
                    "{}-byte elements for a {} tensor",
                    size_of::<T>(),
                    self.dtype.name()
                ),
            ))
        }
    }
}

/// A kernel argument.
#[derive(Debug, Clone)]
pub enum KernelArg {
    /// Device memory.
    Tensor(Tensor),
    /// A float scalar.
    Float(f64),
    /// An integer scalar.
    Int(i64),
    /// A complex scalar `(re, im)` (for complex tensors only).
    Complex(f64, f64),
}

/// Arguments that passed a kernel's [`Kernel::check`]: the only value [`Kernel::run`]
/// accepts. Built only by [`Args::check`] (which [`prepare`] and [`launch`] call), and it
/// holds the kernel that checked it, so a kernel can rely on its own check:
///
/// ```compile_fail
/// # use runtime_core::kernel::Args;
/// let args = Args { args: vec![], checked_by: todo!() };
/// ```
pub struct Args {
    args: Vec<KernelArg>,
    /// The kernel whose `check` accepted `args`. Held, so no other kernel can be made at
    /// its address while these arguments live (identity by ownership, not by an address
    /// that a freed kernel's successor may reuse).
    checked_by: Arc<dyn Kernel>,
}

impl std::fmt::Debug for Args {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Args")
            .field("args", &self.args)
            .field("checked_by", &self.checked_by.name())
            .finish()
    }
}

impl Args {
    /// Run `kernel.check(&args)` and, if it passes, wrap the arguments (holding `kernel`).
    ///
    /// # Errors
    /// The check's `ArgError`.
    pub fn check(kernel: &Arc<dyn Kernel>, args: Vec<KernelArg>) -> Result<Args, ArgError> {
        kernel.check(&args)?;
        Ok(Args {
            args,
            checked_by: kernel.clone(),
        })
    }

    /// Whether `kernel` (this very object) is the one whose check accepted these arguments.
    /// Sound as an identity test: the checking kernel is alive (held by these arguments),
    /// and two live objects do not share an address.
    pub fn checked_by<K: Kernel + ?Sized>(&self, kernel: &K) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.checked_by), kernel as *const K)
    }

    /// The arguments.
    pub fn as_slice(&self) -> &[KernelArg] {
        &self.args
    }
}

impl std::ops::Deref for Args {
    type Target = [KernelArg];
    fn deref(&self) -> &[KernelArg] {
        &self.args
    }
}

/// A kernel that can be launched on a stream by name.
///
/// `check` runs on the launching thread; `run` gets the same arguments, wrapped in [`Args`],
/// on the stream's executor. A kernel whose `run` depends on its check for soundness (the
/// built-ins do: they build typed views that must not partly overlap) verifies
/// [`Args::checked_by`] first.
pub trait Kernel: Send + Sync {
    /// Registry name.
    fn name(&self) -> &str;
    /// Validate the arguments at launch time (on the caller's thread).
    fn check(&self, args: &[KernelArg]) -> Result<(), ArgError>;
    /// How `run` uses the tensor at `index` of the arguments. The default, `Write`, is
    /// always right; a kernel that only reads an input may say `Read`, so that work reading
    /// the same memory runs beside it. Writing through a tensor declared `Read` is refused
    /// (see [`crate::memory::access`]).
    fn access(&self, index: usize) -> Access {
        let _ = index;
        Access::Write
    }
    /// Run with arguments that passed a check. May panic; the executor catches it.
    fn run(&self, args: &Args) -> Result<(), KernelFailure>;
}

static REGISTRY: LazyLock<RwLock<HashMap<String, Arc<dyn Kernel>>>> = LazyLock::new(|| {
    let mut m: HashMap<String, Arc<dyn Kernel>> = HashMap::new();
    for k in builtin::all() {
        m.insert(k.name().to_string(), k);
    }
    RwLock::new(m)
});

static REGISTRY_FORK: crate::sync::ForkGuarded<RwLock<HashMap<String, Arc<dyn Kernel>>>> =
    crate::sync::ForkGuarded::new(|| &REGISTRY);

/// Around `fork()`: hold the registry's lock so no other thread is inside it when the
/// process is copied (see `runtime::install_fork_handlers`).
pub(crate) fn before_fork(wait: std::time::Duration) {
    REGISTRY_FORK.before_fork(wait);
}

/// After `fork()`, in the parent or the child: release what [`before_fork`] took (and in
/// the child a hold of a thread that vanished).
pub(crate) fn after_fork(child: bool) {
    REGISTRY_FORK.after_fork(child);
}

/// Register a kernel under its name, replacing any kernel of that name. Returns the one it
/// replaced.
pub fn register(kernel: Arc<dyn Kernel>) -> Option<Arc<dyn Kernel>> {
    // The name is asked before the lock is taken: `name` is user code, which must not run
    // while the registry is locked. The replaced kernel is dropped after the lock too.
    let name = kernel.name().to_string();
    REGISTRY.write().insert(name, kernel)
}

/// Look a kernel up by name.
pub fn lookup(name: &str) -> Option<Arc<dyn Kernel>> {
    REGISTRY.read().get(name).cloned()
}

/// Registered kernel names, sorted.
pub fn names() -> Vec<String> {
    let mut v: Vec<String> = REGISTRY.read().keys().cloned().collect();
    v.sort();
    v
}

/// Look `name` up, or fail naming the registered kernels.
pub fn find(name: &str) -> Result<Arc<dyn Kernel>> {
    lookup(name).ok_or_else(|| {
        arg_error(
            "kernel",
            format!(
                "no kernel named {name:?}; registered: {}",
                names().join(", ")
            ),
        )
    })
}

struct KernelOp {
    kernel: Arc<dyn Kernel>,
    /// The kernel's name, asked once on the launching thread (`Kernel::name` is user code:
    /// the engines never call it).
    name: String,
    args: Args,
    accesses: AccessSet,
}

impl crate::stream::command::sealed::Sealed for KernelOp {}

impl Op for KernelOp {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> OpKind {
        OpKind::Compute
    }
    fn accesses(&self) -> &AccessSet {
        &self.accesses
    }
    fn run(&self) -> Result<(), KernelFailure> {
        self.kernel.run(&self.args)
    }
}

/// Check `args` against `kernel` now, then queue it on `stream`.
///
/// # Errors
/// `ArgError` from the check; stream errors (destroyed stream, shutdown; in synchronous mode
/// the kernel's own failure).
pub fn launch(stream: &Stream, kernel: Arc<dyn Kernel>, args: Vec<KernelArg>) -> Result<()> {
    stream.launch(prepare(stream, kernel, args)?)
}

/// Check `args` against `kernel` for a launch on `stream` and build the stream op, without
/// queueing it.
pub fn prepare(
    stream: &Stream,
    kernel: Arc<dyn Kernel>,
    args: Vec<KernelArg>,
) -> Result<Arc<dyn Op>> {
    let args = Args::check(&kernel, args)?;
    for a in args.iter() {
        if let KernelArg::Tensor(t) = a {
            if t.buffer.device() != stream.device_index() {
                return Err(arg_error(
                    "args",
                    format!(
                        "{:?} lives on device {}, but the stream runs on device {}",
                        t.buffer,
                        t.buffer.device(),
                        stream.device_index()
                    ),
                ));
            }
        }
    }
    let accesses = AccessSet::new(args.iter().enumerate().filter_map(|(i, a)| match a {
        KernelArg::Tensor(t) => Some((&t.buffer, kernel.access(i))),
        _ => None,
    }));
    Ok(Arc::new(KernelOp {
        name: kernel.name().to_string(),
        kernel,
        args,
        accesses,
    }))
}

impl Stream {
    /// Check `args` against the kernel registered as `name` and queue it on this stream:
    /// the way to launch a kernel (same as [`launch`] with [`find`]).
    ///
    /// # Errors
    /// An unknown name (naming the registered ones); the kernel's argument check; stream
    /// errors as for [`Stream::launch`].
    pub fn launch_kernel(&self, name: &str, args: Vec<KernelArg>) -> Result<()> {
        launch(self, find(name)?, args)
    }
}

/// Fault-injection kernels for tests, registered on demand by `testing::register` (cargo
/// feature `testing`).
#[cfg(feature = "testing")]
pub mod testing {
    use std::sync::Arc;

    use super::{Kernel, KernelArg};
    use crate::error::{ArgError, KernelFailure};

    struct Fault {
        name: &'static str,
        panic: bool,
    }

    impl Kernel for Fault {
        fn name(&self) -> &str {
            self.name
        }
        fn check(&self, _args: &[KernelArg]) -> Result<(), ArgError> {
            Ok(())
        }
        fn run(&self, args: &super::Args) -> Result<(), KernelFailure> {
            let what = format!("injected fault ({} args)", args.len());
            if self.panic {
                panic!("{what}");
            }
            Err(KernelFailure::new(self.name, what))
        }
    }

    /// Register `test_panic` (panics when run) and `test_error` (returns an error when run).
    pub fn register() {
        super::register(Arc::new(Fault {
            name: "test_panic",
            panic: true,
        }));
        super::register(Arc::new(Fault {
            name: "test_error",
            panic: false,
        }));
    }
}
