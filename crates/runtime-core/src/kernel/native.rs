//! Native kernels: machine code behind one C ABI, written in C, C++, Rust, or made at run time
//! by numba's `@cfunc` or ctypes. The Python package ships the ABI as the header
//! `runtime/kernel.h` (under `runtime.get_include()`):
//!
//! ```c
//! int32_t kernel(uint32_t block_idx, uint32_t block_num, void **params);
//! ```
//!
//! Each block of a launch calls the function once, with its index, the launch's block count
//! and its own array of argument pointers: `params[i]` points to the first element of a
//! buffer argument (device memory is host memory here), to an `int64_t` for an integer, to a
//! `double` for a float, to two `double`s (real, imaginary) for a complex number, and to a
//! value of its dtype for a typed scalar ([`KernelArg::Typed`]). A non-zero return fails the
//! launch with that code ([`KernelFailure::code`]).
//!
//! The call runs on the device's workers without any lock of ours beyond the launch's
//! allocations (held as [`Kernel::access`] says: written unless the author declared an
//! argument read-only) and without Python's GIL. What the code does inside its buffers is
//! its author's contract, as in CUDA: the runtime checks the arguments (live buffers of the
//! launch's device, in bounds, the declared count), never the machine code, so registering a
//! raw function is `unsafe` ([`NativeKernel::from_raw`], [`NativeKernel::load`]).

use std::any::Any;
use std::ffi::{c_void, CStr, CString};
use std::sync::Arc;

use crate::error::{arg_error, ArgError, KernelFailure, Result};
use crate::kernel::{Args, Kernel, KernelArg, RunContext};
use crate::memory::access::Access;

/// The C ABI of a native kernel: `int32_t (uint32_t block_idx, uint32_t block_num, void
/// **params)`.
pub type RawKernelFn =
    unsafe extern "C" fn(block_idx: u32, block_num: u32, params: *mut *mut c_void) -> i32;

/// A kernel whose `run` calls a [`RawKernelFn`] once per block.
pub struct NativeKernel {
    name: String,
    func: RawKernelFn,
    /// Argument indices the code only reads (the others are held for writing).
    read_only: Vec<usize>,
    /// The number of arguments the code takes, when its author said.
    nargs: Option<usize>,
    /// Whatever keeps the code alive: the loaded library, or the object that owns code made
    /// at run time (a numba `@cfunc`). Dropped after the last launch that uses the kernel.
    _keep: Option<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for NativeKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeKernel")
            .field("name", &self.name)
            .field("func", &(self.func as *const c_void))
            .field("read_only", &self.read_only)
            .field("nargs", &self.nargs)
            .finish()
    }
}

impl NativeKernel {
    /// A kernel named `name` that calls `func`; `keep` is held as long as the kernel lives
    /// (the owner of `func`'s code, if anything must keep it alive).
    ///
    /// # Safety
    /// For as long as `keep` (and so the kernel) lives, `func` must be a function of the
    /// [`RawKernelFn`] ABI that may be called from any thread, concurrently for the blocks of
    /// one launch and for launches on different streams, and that touches only the memory
    /// its `params` point to (each buffer within its length, read-only arguments only read)
    /// and memory of its own; it must not unwind.
    pub unsafe fn from_raw(
        name: impl Into<String>,
        func: RawKernelFn,
        keep: Option<Box<dyn Any + Send + Sync>>,
    ) -> NativeKernel {
        NativeKernel {
            name: name.into(),
            func,
            read_only: Vec::new(),
            nargs: None,
            _keep: keep,
        }
    }

    /// [`NativeKernel::from_raw`] for a function given by its address (numba's
    /// `cfunc.address`, a ctypes function pointer's value).
    ///
    /// # Errors
    /// `ArgError` naming `address` when it is 0.
    ///
    /// # Safety
    /// As for [`NativeKernel::from_raw`], for the code at `address`.
    pub unsafe fn from_address(
        name: impl Into<String>,
        address: usize,
        keep: Option<Box<dyn Any + Send + Sync>>,
    ) -> Result<NativeKernel> {
        if address == 0 {
            return Err(arg_error(
                "address",
                "a kernel's address cannot be 0 (NULL)",
            ));
        }
        // SAFETY: `address` is not null, and the caller vouches that it is the entry of a
        // function of this ABI, alive while `keep` lives (function pointers and addresses
        // have the same size and representation on the platforms Rust supports here).
        let func = unsafe { std::mem::transmute::<usize, RawKernelFn>(address) };
        // SAFETY: the caller's contract is this function's.
        Ok(unsafe { NativeKernel::from_raw(name, func, keep) })
    }

    /// Load `symbol` from the shared library at `path` (`dlopen`, resolving every symbol
    /// now); the library stays loaded while the kernel lives. The kernel is named `symbol`.
    ///
    /// # Errors
    /// `ArgError` naming `path` (a library that cannot be loaded, with the loader's reason)
    /// or `symbol` (not found in it, or not a valid C string).
    ///
    /// # Safety
    /// Loading runs the library's initialisers, and the symbol must be a function as
    /// [`NativeKernel::from_raw`] requires.
    pub unsafe fn load(path: &str, symbol: &str) -> Result<NativeKernel> {
        let cpath = CString::new(path)
            .map_err(|_| arg_error("path", format!("{path:?} contains a NUL byte")))?;
        let csym = CString::new(symbol)
            .map_err(|_| arg_error("symbol", format!("{symbol:?} contains a NUL byte")))?;
        // SAFETY: `cpath` is a valid C string; the caller accepts the library's initialisers.
        let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(arg_error(
                "path",
                format!("cannot load the shared library {path:?}: {}", dl_error()),
            ));
        }
        let lib = Library(handle);
        // Clear a stale error, then look the symbol up (NULL may be a valid address, so the
        // error slot, not the result, says whether it was found).
        dl_error();
        // SAFETY: `lib.0` is a live handle from `dlopen`; `csym` is a valid C string.
        let addr = unsafe { libc::dlsym(lib.0, csym.as_ptr()) };
        let err = dl_error();
        if addr.is_null() {
            let why = if err.is_empty() {
                "it resolves to NULL".to_string()
            } else {
                err
            };
            return Err(arg_error(
                "symbol",
                format!("no symbol {symbol:?} in {path:?}: {why}"),
            ));
        }
        // SAFETY: the caller vouches for the symbol (the library stays loaded: `lib` is kept).
        unsafe { NativeKernel::from_address(symbol, addr as usize, Some(Box::new(lib))) }
    }

    /// Declare the arguments at `indices` read-only: the launch holds them for reading, so
    /// other work reading them runs beside it (the code must then not write them).
    #[must_use]
    pub fn with_read_only(mut self, indices: impl IntoIterator<Item = usize>) -> NativeKernel {
        self.read_only = indices.into_iter().collect();
        self.read_only.sort_unstable();
        self.read_only.dedup();
        self
    }

    /// Declare the number of arguments: launches with another count are refused.
    #[must_use]
    pub fn with_nargs(mut self, nargs: usize) -> NativeKernel {
        self.nargs = Some(nargs);
        self
    }

    /// The argument indices declared read-only.
    pub fn read_only(&self) -> &[usize] {
        &self.read_only
    }

    /// The declared number of arguments, if any.
    pub fn nargs(&self) -> Option<usize> {
        self.nargs
    }

    /// Wrap as a launchable kernel.
    pub fn into_kernel(self) -> Arc<dyn Kernel> {
        Arc::new(self)
    }
}

/// The loader's message for the last failure on this thread (empty when none).
fn dl_error() -> String {
    // SAFETY: `dlerror` returns NULL or a thread-local NUL-terminated message, valid until
    // the next loader call on this thread; it is copied at once.
    unsafe {
        let p = libc::dlerror();
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// A library loaded by `dlopen`, closed when dropped.
struct Library(*mut c_void);

// SAFETY: a `dlopen` handle is a process-wide token; the loader's functions may be called with
// it from any thread (they lock internally).
unsafe impl Send for Library {}
// SAFETY: as for `Send`: no method of ours touches it but `drop`.
unsafe impl Sync for Library {}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the handle came from a successful `dlopen` and is closed once; no function
        // of the library is running (the kernel holding this is being dropped, so no launch
        // uses it).
        unsafe { libc::dlclose(self.0) };
    }
}

/// Storage for one scalar argument, aligned for any scalar type.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Slot([u8; 16]);

impl Kernel for NativeKernel {
    fn name(&self) -> &str {
        &self.name
    }

    fn check(&self, args: &[KernelArg]) -> Result<(), ArgError> {
        if let Some(n) = self.nargs {
            if args.len() != n {
                return Err(ArgError::new(
                    "args",
                    format!("{} takes {n} arguments, got {}", self.name, args.len()),
                ));
            }
        }
        Ok(())
    }

    fn access(&self, index: usize) -> Access {
        if self.read_only.binary_search(&index).is_ok() {
            Access::Read
        } else {
            Access::Write
        }
    }

    fn run(&self, args: &Args, cx: &RunContext) -> Result<(), KernelFailure> {
        // The function writes through raw pointers: only while nothing else touches them.
        args.hold_for(self, cx, |i| self.access(i), || self.call(args, cx))?
    }
}

impl NativeKernel {
    /// One call of the function on block `cx`, the tensors held (see `run`).
    fn call(&self, args: &Args, cx: &RunContext) -> Result<(), KernelFailure> {
        let mut slots = vec![Slot([0; 16]); args.len()];
        let mut params: Vec<*mut c_void> = Vec::with_capacity(args.len());
        for (arg, slot) in args.iter().zip(slots.iter_mut()) {
            let bytes = &mut slot.0;
            let p = match arg {
                KernelArg::Tensor(t) => {
                    // In bounds by `Tensor::new`; the allocation is alive (the arguments hold
                    // it) and held for this call (`Args::hold_for`).
                    t.buffer().as_ptr().wrapping_add(t.offset() as usize) as *mut c_void
                }
                KernelArg::Int(v) => {
                    bytes[..8].copy_from_slice(&v.to_ne_bytes());
                    bytes.as_mut_ptr().cast()
                }
                KernelArg::Float(v) => {
                    bytes[..8].copy_from_slice(&v.to_ne_bytes());
                    bytes.as_mut_ptr().cast()
                }
                KernelArg::Complex(re, im) => {
                    bytes[..8].copy_from_slice(&re.to_ne_bytes());
                    bytes[8..].copy_from_slice(&im.to_ne_bytes());
                    bytes.as_mut_ptr().cast()
                }
                KernelArg::Typed(s) => {
                    bytes[..s.bytes().len()].copy_from_slice(s.bytes());
                    bytes.as_mut_ptr().cast()
                }
            };
            params.push(p);
        }
        // SAFETY: `func` is a function of this ABI that may run concurrently
        // (`NativeKernel::from_raw`'s contract); `params` holds one valid pointer per
        // argument, to this block's own copies of the scalars or into a live, checked,
        // held allocation, and outlives the call.
        let code = unsafe { (self.func)(cx.block_idx(), cx.block_num(), params.as_mut_ptr()) };
        drop(slots);
        if code == 0 {
            return Ok(());
        }
        let mut f = KernelFailure::new(
            self.name.clone(),
            format!("native kernel {:?} returned {code}", self.name),
        );
        f.code = Some(code);
        Err(f)
    }
}
