//! Kernels: the [`Kernel`] trait, typed tensor arguments, and the process-wide registry that
//! other crates add to and the Python layer launches from by name.
//!
//! * [`dtype`]: [`DType`], the element types (numpy's fixed-size number types) and numpy's
//!   rule for viewing an array as another dtype.
//! * [`builtin`]: `noop`, `fill`, `copy`, `scale`, `axpy`, `add`, `mul`, `sum`, `matmul` for
//!   every dtype where numpy defines the operation.
//! * [`block`]: multi-block launches ([`RunContext`]: which instance of the launch runs).
//! * [`native`]: kernels behind the C ABI (`runtime/kernel.h`): C, C++, ctypes, numba.
//!
//! A launch checks the arguments on the caller's thread ([`Kernel::check`]: wrong shapes and
//! dtypes fail there, as `ValueError` in Python) and queues the run on the stream. The
//! arguments hold their buffers, so memory stays alive until the kernel has run. A launch
//! runs as `block_dim` instances ([`prepare_blocks`]); without one the kernel chooses
//! ([`Kernel::blocks`]: one, unless it says otherwise).

pub mod block;
pub mod builtin;
pub mod dtype;
pub mod native;

pub use block::{RunContext, MAX_BLOCK_DIM};
pub use dtype::DType;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use crate::error::{arg_error, ArgError, KernelFailure, Result};
use crate::memory::access::{Access, AccessSet};
use crate::memory::{Buffer, Element, MemorySpan};
use crate::stream::{Executor, Op, OpKind, Stream};

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
    shape: Shape,
}

/// A tensor's shape, inline up to four axes. A launch's tensors live in its op, which the
/// worker that ran it drops: a heap buffer of theirs would be freed there, across threads,
/// which glibc serves through its arena lock (`_int_malloc` and futex calls were a fifth of
/// a 3-buffer launch with one `Vec` per shape). The arguments' own `Vec` is one such free per
/// launch; holding them inline too made every op several cache lines larger, which cost a
/// no-op launch more than the free saves.
type Shape = smallvec::SmallVec<[usize; 4]>;

impl Tensor {
    /// A view of `shape` elements of `dtype` at byte `offset` of `buffer`; checks that it fits
    /// in the buffer (overflow included) and that its first element is aligned to the item
    /// size in memory (allocations start aligned; a view may not).
    ///
    /// # Errors
    /// `ArgError` naming `offset` (misaligned, or past the end) or `shape` (too large).
    pub fn new(
        buffer: Buffer,
        offset: u64,
        dtype: DType,
        shape: impl AsRef<[usize]>,
    ) -> Result<Tensor> {
        let shape = shape.as_ref();
        let count = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| arg_error("shape", format!("{shape:?} is too large")))?;
        buffer.check_range("offset", offset, count as u64)?;
        // Aligned in memory, not only within the view: a view (or a plugged allocator's
        // block) may start at any byte, and a native kernel gets the element pointer as it is.
        let misaligned = (buffer.as_ptr() as usize).wrapping_add(offset as usize) % dtype.size();
        if misaligned != 0 {
            let (name, size) = (dtype.name(), dtype.size());
            let what = if misaligned == offset as usize % size {
                format!("{offset} is not a multiple of the {name} item size {size}")
            } else {
                let start = (buffer.as_ptr() as usize) % size;
                let bytes = |n: usize| format!("{n} byte{}", if n == 1 { "" } else { "s" });
                format!(
                    "{offset} leaves the first element {} past a multiple of the {name} item \
                     size {size}: the view starts {} past one",
                    bytes(misaligned),
                    bytes(start)
                )
            };
            return Err(arg_error("offset", what));
        }
        Ok(Tensor {
            buffer,
            offset,
            dtype,
            shape: Shape::from_slice(shape),
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
    /// A scalar of one dtype, as its bytes in native order (a numpy scalar given to a
    /// native kernel, which receives a pointer to exactly this value). The built-ins refuse
    /// it.
    Typed(Scalar),
}

/// A value of one [`DType`], its bytes in native order (at most 16: complex128).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Scalar {
    dtype: DType,
    bytes: [u8; 16],
}

impl Scalar {
    /// The value whose bytes are `bytes` (exactly the dtype's size).
    ///
    /// # Errors
    /// `ArgError` naming `bytes` when the length is not the dtype's item size.
    pub fn from_bytes(dtype: DType, bytes: &[u8]) -> Result<Scalar, ArgError> {
        if bytes.len() != dtype.size() {
            return Err(ArgError::new(
                "bytes",
                format!(
                    "{} bytes for a {} scalar of {} bytes",
                    bytes.len(),
                    dtype.name(),
                    dtype.size()
                ),
            ));
        }
        let mut b = [0u8; 16];
        b[..bytes.len()].copy_from_slice(bytes);
        Ok(Scalar { dtype, bytes: b })
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The value's bytes (the dtype's size).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.dtype.size()]
    }
}

impl std::fmt::Debug for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scalar({}, {:02x?})", self.dtype.name(), self.bytes())
    }
}

/// Arguments that passed a kernel's [`Kernel::check`]: the only value [`Kernel::run`]
/// accepts. Built only by [`Args::check`] (which [`prepare`] and [`launch`] call), and it
/// holds the kernel that checked it, so a kernel can rely on its own check:
///
/// ```compile_fail
/// # use runtime_core::kernel::Args;
/// let args = Args { args: vec![], checked_by: todo!() };
/// ```
///
/// Cloning keeps the kernel that checked them (the blocks of a launch share clones).
#[derive(Clone)]
pub struct Args {
    /// The arguments, and the access set of the launch they were checked for, in one heap
    /// block; `None` when there are no arguments. A launch's op holds these: kept out of it,
    /// they leave the op one cache line for the launching thread to write and the worker to
    /// read, with no allocation at all for a launch without arguments.
    list: Option<Box<ArgList>>,
    /// The multi-block launch these are the arguments of (0: none): set only by the launch
    /// itself, on its blocks' copy.
    launch: u64,
    /// The kernel whose `check` accepted `args`. Held, so no other kernel can be made at
    /// its address while these arguments live (identity by ownership, not by an address
    /// that a freed kernel's successor may reuse).
    checked_by: KernelRef,
}

/// What [`Args`] keeps on the heap.
#[derive(Clone)]
struct ArgList {
    /// Inline up to four (every built-in takes at most three): one allocation per launch.
    args: smallvec::SmallVec<[KernelArg; 4]>,
    /// The device memory the launch uses ([`KernelOp`]'s set); empty until a launch sets it.
    uses: AccessSet,
}

impl std::fmt::Debug for Args {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Args")
            .field("args", &self.as_slice())
            .field("checked_by", &self.checked_by.name())
            .finish()
    }
}

impl Args {
    /// Run `kernel.check(&args)` and, if it passes, wrap the arguments (holding `kernel`).
    ///
    /// # Errors
    /// The check's `ArgError`.
    pub fn check(kernel: impl Into<KernelRef>, args: Vec<KernelArg>) -> Result<Args, ArgError> {
        Args::check_owned(kernel.into(), args)
    }

    /// [`Args::check`], keeping the caller's handle on `kernel` (no second count on it).
    fn check_owned(kernel: KernelRef, args: Vec<KernelArg>) -> Result<Args, ArgError> {
        kernel.check(&args)?;
        Ok(Args {
            list: (!args.is_empty()).then(|| {
                Box::new(ArgList {
                    args: smallvec::SmallVec::from_vec(args),
                    uses: AccessSet::default(),
                })
            }),
            launch: 0,
            checked_by: kernel,
        })
    }

    /// A copy for the blocks of launch `launch`: the arguments, without the launch's
    /// access set (the op that runs the blocks holds it; each block's guard,
    /// [`Args::hold_for`], makes its own).
    fn for_launch(&self, launch: u64) -> Args {
        Args {
            list: self.list.as_ref().map(|l| {
                Box::new(ArgList {
                    args: l.args.clone(),
                    uses: AccessSet::default(),
                })
            }),
            launch,
            checked_by: self.checked_by.clone(),
        }
    }

    /// The multi-block launch these are the arguments of (0: none).
    pub(crate) fn launch(&self) -> u64 {
        self.launch
    }

    /// Run `compute` with these arguments' tensors held as `access(i)` says for argument `i`:
    /// the guard of every kernel the core defines that reaches tensor memory without the
    /// allocations' locks (the built-ins' typed views, a native kernel's raw pointers).
    /// Refused unless `kernel` checked these arguments (its accesses are the ones the check
    /// fixed). The calling thread may hold the tensors itself (the op of a launch of this
    /// kernel), or borrow them from the blocks of the launch these very arguments belong to
    /// (which share the work out by block index); called from anywhere else (a user's
    /// direct `run`), it takes the allocations as a host access does, waiting for their work.
    ///
    /// # Errors
    /// A `KernelFailure` naming `name`: arguments another kernel checked, or the host
    /// access's failure (a freed or shut-down allocation).
    pub(crate) fn hold_for<K: Kernel + ?Sized, R>(
        &self,
        kernel: &K,
        cx: &RunContext,
        access: impl Fn(usize) -> Access,
        compute: impl FnOnce() -> R,
    ) -> Result<R, KernelFailure> {
        if !self.checked_by(kernel) {
            return Err(KernelFailure::new(
                kernel.name(),
                "the arguments were checked by another kernel",
            ));
        }
        let launch = if self.launch() == cx.launch() {
            self.launch()
        } else {
            0
        };
        // Each tensor looked up where it is held, one at a time, without making an access set
        // of them (a set's entry for an allocation named twice is the stronger use: holding
        // for both uses is the same test).
        let held = self.iter().enumerate().all(|(i, a)| match a {
            KernelArg::Tensor(t) => t.buffer().held_here(access(i), launch),
            _ => true,
        });
        if held {
            Ok(compute())
        } else {
            self.tensor_uses(access)
                .host(compute)
                .map_err(|e| KernelFailure::new(kernel.name(), e.to_string()))
        }
    }

    /// Whether `kernel` (this very object) is the one whose check accepted these arguments.
    /// Sound as an identity test: the checking kernel is alive (held by these arguments),
    /// and two live objects do not share an address.
    pub fn checked_by<K: Kernel + ?Sized>(&self, kernel: &K) -> bool {
        std::ptr::addr_eq(self.checked_by.as_ptr(), kernel as *const K)
    }

    /// The arguments.
    pub fn as_slice(&self) -> &[KernelArg] {
        self.list.as_ref().map_or(&[], |l| &l.args)
    }

    /// The access set of the launch these arguments were checked for (empty for none).
    fn uses(&self) -> &AccessSet {
        self.list.as_ref().map_or(AccessSet::empty(), |l| &l.uses)
    }

    /// Make the access set of a launch of these arguments: each tensor's allocation, used
    /// as the checking kernel's `access` says for its index. Kept with the arguments, on the
    /// heap; nothing is made for a launch without arguments, which uses no device memory.
    fn set_uses(&mut self) {
        if self.list.is_none() {
            return;
        }
        let uses = self.tensor_uses(|i| self.checked_by.access(i));
        if let Some(l) = &mut self.list {
            l.uses = uses;
        }
    }

    /// The set of these arguments' tensors, argument `i` used as `access(i)` says.
    fn tensor_uses(&self, access: impl Fn(usize) -> Access) -> AccessSet {
        AccessSet::new(self.iter().enumerate().filter_map(|(i, a)| match a {
            KernelArg::Tensor(t) => Some((t.buffer(), access(i))),
            _ => None,
        }))
    }
}

impl std::ops::Deref for Args {
    type Target = [KernelArg];
    fn deref(&self) -> &[KernelArg] {
        self.as_slice()
    }
}

/// A kernel as the registry and launches hold it: a built-in, which is a `static` and held
/// without a reference count, or any other kernel, shared through its `Arc`. A launch of a
/// built-in then writes no count that the worker running it writes again when it drops the
/// launch (that shared count was one cache line moved between the two cores per launch).
///
/// Opaque: only the core makes the uncounted kind, so each kernel held that way is one of
/// the built-ins, distinct non-zero-sized statics, and [`Args::checked_by`]'s identity by
/// address holds for both kinds (a kernel held is alive, and two live objects do not share
/// an address).
#[derive(Clone)]
pub struct KernelRef(Held);

/// A built-in is held by a thin reference to its static, so that the two kinds fit in
/// two words (the shared kind's fat pointer, whose non-null data word tells them apart).
#[derive(Clone)]
enum Held {
    Static(&'static builtin::Builtin),
    Shared(Arc<dyn Kernel>),
}

impl KernelRef {
    /// A built-in kernel (the core's statics only; see the type's note).
    pub(crate) fn builtin(kernel: &'static builtin::Builtin) -> KernelRef {
        KernelRef(Held::Static(kernel))
    }

    /// The kernel's name for a launch's messages, asked where the launch runs: a built-in
    /// answers itself; any other kernel's `name` is its author's code, so it is asked under
    /// `catch_unwind` (a panic there gives a placeholder, and the worker asking goes on).
    fn launch_name(&self) -> &str {
        match &self.0 {
            Held::Static(k) => k.name(),
            Held::Shared(k) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| k.name()))
                .unwrap_or("<a kernel whose name() panicked>"),
        }
    }

    /// Whether it is one of the core's built-in kernels: Rust code of this crate, which
    /// calls no code of its users while it runs.
    fn is_builtin(&self) -> bool {
        matches!(self.0, Held::Static(_))
    }

    /// The kernel's address, for identity.
    fn as_ptr(&self) -> *const dyn Kernel {
        match &self.0 {
            Held::Static(k) => std::ptr::from_ref::<dyn Kernel>(*k),
            Held::Shared(k) => Arc::as_ptr(k),
        }
    }

    /// Whether `a` and `b` hold the very same kernel object.
    pub fn same(a: &KernelRef, b: &KernelRef) -> bool {
        std::ptr::addr_eq(a.as_ptr(), b.as_ptr())
    }
}

impl std::ops::Deref for KernelRef {
    type Target = dyn Kernel;
    fn deref(&self) -> &(dyn Kernel + 'static) {
        match &self.0 {
            Held::Static(k) => *k,
            Held::Shared(k) => &**k,
        }
    }
}

impl From<Arc<dyn Kernel>> for KernelRef {
    fn from(k: Arc<dyn Kernel>) -> KernelRef {
        KernelRef(Held::Shared(k))
    }
}

impl<K: Kernel + 'static> From<Arc<K>> for KernelRef {
    fn from(k: Arc<K>) -> KernelRef {
        KernelRef(Held::Shared(k))
    }
}

impl From<&Arc<dyn Kernel>> for KernelRef {
    fn from(k: &Arc<dyn Kernel>) -> KernelRef {
        KernelRef(Held::Shared(k.clone()))
    }
}

impl From<&KernelRef> for KernelRef {
    fn from(k: &KernelRef) -> KernelRef {
        k.clone()
    }
}

impl std::fmt::Debug for KernelRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({:?})", self.name())
    }
}

/// A kernel that can be launched on a stream by name.
///
/// `check` runs on the launching thread; `run` gets the same arguments, wrapped in [`Args`],
/// on the stream's executor, once per block of the launch (concurrently, on several threads,
/// when the launch has several: see [`block`]), with the block's [`RunContext`]. A kernel
/// whose `run` depends on its check for soundness (the built-ins do: they build typed views
/// that must not partly overlap) verifies [`Args::checked_by`] first.
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
    /// How many blocks a launch that names none runs as, given the arguments and the
    /// device's compute workers (called on the launching thread). One by default: a kernel
    /// runs as several blocks only when its author splits the work by
    /// [`RunContext::block_idx`].
    fn blocks(&self, args: &Args, workers: u32) -> u32 {
        let _ = (args, workers);
        1
    }
    /// Whether the blocks of a launch of `blocks` blocks that the kernel chose itself
    /// ([`Kernel::blocks`]) are worth waking sleeping compute workers for (called on the
    /// launching thread). A wake-up costs the op's thread a system call and brings the
    /// worker tens of microseconds later; blocks shorter than that are better run by the
    /// op's thread, by workers already awake and by host threads waiting for the stream,
    /// which take blocks without being woken. True by default; a launch that names its
    /// `block_dim` always wakes them.
    fn wakes_workers(&self, args: &Args, blocks: u32) -> bool {
        let _ = (args, blocks);
        true
    }
    /// Run block `cx` of a launch, with arguments that passed a check. May panic; the
    /// executor catches it.
    fn run(&self, args: &Args, cx: &RunContext) -> Result<(), KernelFailure>;
}

static REGISTRY: LazyLock<crate::sync::StaticRwLock<HashMap<String, KernelRef>>> =
    LazyLock::new(|| {
        let mut m: HashMap<String, KernelRef> = HashMap::new();
        for k in builtin::all() {
            m.insert(k.name().to_string(), k);
        }
        crate::sync::StaticRwLock::new(m)
    });

static REGISTRY_FORK: crate::sync::ForkGuarded<
    crate::sync::StaticRwLock<HashMap<String, KernelRef>>,
> = crate::sync::ForkGuarded::new(|| &REGISTRY);

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
pub fn register(kernel: Arc<dyn Kernel>) -> Option<KernelRef> {
    // The name is asked before the lock is taken: `name` is user code, which must not run
    // while the registry is locked. The replaced kernel is dropped after the lock too.
    let name = kernel.name().to_string();
    REGISTRY.write().insert(name, kernel.into())
}

/// Look a kernel up by name.
pub fn lookup(name: &str) -> Option<KernelRef> {
    REGISTRY.read().get(name).cloned()
}

/// Registered kernel names, sorted.
pub fn names() -> Vec<String> {
    let mut v: Vec<String> = REGISTRY.read().keys().cloned().collect();
    v.sort();
    v
}

/// Look `name` up, or fail naming the registered kernels.
pub fn find(name: &str) -> Result<KernelRef> {
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

/// A launch as its stream queues it. Built on the launching thread and dropped by the
/// worker that ran it, so it holds as few shared counters as it can: the kernel once (in
/// `args`), the executor only for a launch of several blocks.
///
/// 48 bytes, within one cache line ([`KernelOp::SIZE`] checks at compile time): the
/// launching thread writes every line of it into a box whose lines the worker last held,
/// and each line is one more transfer between their cores per launch. So the access set
/// lives with the arguments ([`Args::uses`]), and it keeps no copy of the kernel's name
/// ([`KernelRef::launch_name`]). Not aligned to a line: measured aligned (its box then
/// comes from `memalign`), a Rust loop of `add` launches on 64 floats took about 10%
/// longer (540-576 ns against 494-516) and the no-op launch was no faster.
struct KernelOp {
    /// The arguments, with the launch's access set.
    args: Args,
    /// Blocks of the launch (`1..=MAX_BLOCK_DIM`).
    blocks: u32,
    /// Whether sleeping compute workers are woken for the blocks ([`Kernel::wakes_workers`]).
    wake: bool,
    /// The device's executor, whose compute workers run the blocks (`blocks > 1` only).
    exec: Option<Arc<Executor>>,
}

impl KernelOp {
    /// Within one cache line (see the type).
    const SIZE: () = assert!(std::mem::size_of::<KernelOp>() == 48);
}

impl crate::stream::command::sealed::Sealed for KernelOp {}

impl Op for KernelOp {
    fn name(&self) -> &str {
        self.args.checked_by.launch_name()
    }
    fn kind(&self) -> OpKind {
        OpKind::Compute
    }
    fn accesses(&self) -> &AccessSet {
        self.args.uses()
    }
    fn run(&self) -> Result<(), KernelFailure> {
        if let (Some(exec), true) = (&self.exec, self.blocks > 1) {
            return self.run_blocks(exec);
        }
        let cx = RunContext::single();
        let kernel = &self.args.checked_by;
        if kernel.is_builtin() {
            // Only code a kernel calls reads the thread's current block
            // (`block::current`), and a built-in calls none of its users' code: no
            // thread-local to set and restore (a graph replay runs a hundred of these per
            // command).
            return kernel.run(&self.args, &cx);
        }
        block::as_block(cx, || kernel.run(&self.args, &cx))
    }
}

impl KernelOp {
    /// [`Op::run`] of a launch of several blocks, on `exec`'s compute workers. Out of line:
    /// inlined, its locals gave every run, one block or many, a 1.5 KiB stack frame.
    #[inline(never)]
    fn run_blocks(&self, exec: &Arc<Executor>) -> Result<(), KernelFailure> {
        let launch = block::new_launch();
        let args = self.args.for_launch(launch);
        block::run_blocks_on(
            exec,
            self.args.checked_by.launch_name(),
            self.blocks,
            Arc::new(move |cx| args.checked_by.run(&args, &cx)),
            launch,
            true,
            self.wake,
        )
    }
}

/// Check `args` against `kernel` now, then queue it on `stream`.
///
/// # Errors
/// `ArgError` from the check; stream errors (destroyed stream, shutdown; in synchronous mode
/// the kernel's own failure).
pub fn launch(stream: &Stream, kernel: impl Into<KernelRef>, args: Vec<KernelArg>) -> Result<()> {
    launch_blocks(stream, kernel, args, None)
}

/// [`launch`] as `block_dim` blocks (`None`: as many as the kernel chooses).
///
/// # Errors
/// As [`launch`]; `ArgError` naming `block_dim` outside `1..=MAX_BLOCK_DIM`.
pub fn launch_blocks(
    stream: &Stream,
    kernel: impl Into<KernelRef>,
    args: Vec<KernelArg>,
    block_dim: Option<u32>,
) -> Result<()> {
    let mut op = None;
    build_into(&mut op, stream, kernel.into(), args, block_dim)?;
    stream.launch_owned(&mut op)
}

/// [`launch_blocks`] without its wait for room in a full stream, for callers that wait
/// themselves after letting a lock go (the Python bindings release the interpreter's lock,
/// which queued Python kernels need): returns whether the launch was queued (false: captured
/// into a graph). In synchronous mode the caller waits for the kernel.
///
/// # Errors
/// As [`launch_blocks`].
pub fn enqueue_blocks(
    stream: &Stream,
    kernel: impl Into<KernelRef>,
    args: Vec<KernelArg>,
    block_dim: Option<u32>,
) -> Result<bool> {
    let mut op = None;
    build_into(&mut op, stream, kernel.into(), args, block_dim)?;
    stream.enqueue_owned(&mut op)
}

/// Check `args` against `kernel` for a launch on `stream` and build the stream op, without
/// queueing it; the kernel chooses how many blocks it runs as ([`Kernel::blocks`]).
///
/// # Errors
/// As [`prepare_blocks`].
pub fn prepare(
    stream: &Stream,
    kernel: impl Into<KernelRef>,
    args: Vec<KernelArg>,
) -> Result<Arc<dyn Op>> {
    prepare_blocks(stream, kernel, args, None)
}

/// [`prepare`] for a launch of `block_dim` blocks (`None`: the kernel chooses).
///
/// # Errors
/// `ArgError` from the check, for a tensor on another device, or naming `block_dim` outside
/// `1..=MAX_BLOCK_DIM` (also when the kernel's own choice is).
pub fn prepare_blocks(
    stream: &Stream,
    kernel: impl Into<KernelRef>,
    args: Vec<KernelArg>,
    block_dim: Option<u32>,
) -> Result<Arc<dyn Op>> {
    Ok(Arc::new(build(stream, kernel.into(), args, block_dim)?))
}

/// The op of a launch: [`prepare_blocks`] before it is put anywhere.
fn build(
    stream: &Stream,
    kernel: KernelRef,
    args: Vec<KernelArg>,
    block_dim: Option<u32>,
) -> Result<KernelOp> {
    let mut op = None;
    build_into(&mut op, stream, kernel, args, block_dim)?;
    Ok(op.expect("build_into builds the op when it succeeds"))
}

/// [`build`] into `out`, the slot the op is queued from ([`Stream::enqueue_owned`]): built
/// there, not returned, since each move of the op by value is a copy of all of it.
fn build_into(
    out: &mut Option<KernelOp>,
    stream: &Stream,
    kernel: KernelRef,
    args: Vec<KernelArg>,
    block_dim: Option<u32>,
) -> Result<()> {
    if let Some(n) = block_dim {
        block::check_block_dim(i64::from(n))?;
    }
    let mut args = Args::check_owned(kernel, args)?;
    let kernel = &args.checked_by;
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
    let exec = stream.executor();
    let (blocks, wake) = match block_dim {
        Some(n) => (n, true),
        None => {
            let workers = u32::try_from(exec.compute_workers()).unwrap_or(u32::MAX);
            let n = kernel.blocks(&args, workers);
            let n = block::check_block_dim(i64::from(n)).map_err(|e| {
                arg_error(
                    "block_dim",
                    format!("the kernel chose {n} blocks: {}", e.message),
                )
            })?;
            (n, n > 1 && kernel.wakes_workers(&args, n))
        }
    };
    args.set_uses();
    let () = KernelOp::SIZE;
    *out = Some(KernelOp {
        args,
        blocks,
        wake,
        exec: (blocks > 1).then(|| exec.clone()),
    });
    Ok(())
}

/// Launching a registered kernel by name: `stream.launch_kernel("scale", args)` with this
/// trait in scope. An extension trait of the kernel layer because streams, a layer below,
/// know nothing of kernels.
pub trait LaunchKernel {
    /// Check `args` against the kernel registered as `name` and queue it on this stream:
    /// the way to launch a kernel (same as [`launch`] with [`find`]).
    ///
    /// # Errors
    /// An unknown name (naming the registered ones); the kernel's argument check; stream
    /// errors as for [`Stream::launch`].
    fn launch_kernel(&self, name: &str, args: Vec<KernelArg>) -> Result<()>;

    /// [`LaunchKernel::launch_kernel`] as `block_dim` blocks.
    ///
    /// # Errors
    /// As [`LaunchKernel::launch_kernel`]; `ArgError` naming `block_dim` outside
    /// `1..=MAX_BLOCK_DIM`.
    fn launch_kernel_blocks(&self, name: &str, args: Vec<KernelArg>, block_dim: u32) -> Result<()>;
}

impl LaunchKernel for Stream {
    fn launch_kernel(&self, name: &str, args: Vec<KernelArg>) -> Result<()> {
        launch(self, find(name)?, args)
    }

    fn launch_kernel_blocks(&self, name: &str, args: Vec<KernelArg>, block_dim: u32) -> Result<()> {
        launch_blocks(self, find(name)?, args, Some(block_dim))
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
        fn run(&self, args: &super::Args, _cx: &super::RunContext) -> Result<(), KernelFailure> {
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
