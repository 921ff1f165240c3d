//! Pluggable allocation: an [`Allocator`] installed on a device's memory serves every
//! allocation made through [`DeviceMemory::malloc`] (what the Python API's `device_malloc`,
//! `empty`, `to_device` use), in the manner of CuPy's `cupy.cuda.set_allocator` and torch's
//! `CUDAPluggableAllocator`. Without one, `malloc` is the built-in pool
//! ([`DeviceMemory::allocate`]).
//!
//! Soundness: a plugged allocator never hands the core an address. It hands back a
//! [`Block`] holding a [`Buffer`], and a `Buffer` can only be made by the core: an allocation
//! of the built-in pool, or a bounds-checked view of one ([`Buffer::view`]). So whatever a
//! plugged allocator does, the memory the core then reads and writes is a range of a live
//! allocation it made itself, kept alive by the block. This is CuPy's pattern, where a user
//! allocator returns a `MemoryPointer` obtained from the pool or a sub-range of one. The core
//! checks the block before using it: the buffer must belong to this device's memory and be
//! live, and hold at least the requested bytes; the block handed to the caller is its first
//! `size` bytes, zeroed (as every allocation reads as zero).
//!
//! The allocation made over a block is an allocation of its own (own id, own
//! `record_stream` list); when its last handle drops (or, with recorded streams, when they
//! completed their work), [`Allocator::free`] receives the block back, exactly once per
//! block [`Allocator::allocate`] returned, including a block the core refused. The block's
//! bytes count in the built-in pool's statistics as the buffer they are part of; the
//! allocation over them adds nothing there.
//!
//! An allocation made on a thread that is already inside the plugged allocator's `allocate`
//! goes to the built-in pool, so an allocator may allocate from the runtime (as CuPy
//! allocators call the pool's `malloc`) without recursing into itself.

use std::any::Any;
use std::cell::Cell;
use std::sync::Arc;

use super::{Allocation, Arena, Buffer, DeviceMemory, Place};
use crate::error::{ArgError, Result};

/// A device allocator that can be plugged into a device's memory
/// ([`DeviceMemory::set_allocator`]).
pub trait Allocator: Send + Sync {
    /// Serve a request for `size` bytes on `mem`'s device: return a block whose buffer
    /// belongs to `mem` and holds at least `size` bytes (from [`DeviceMemory::allocate`], or a
    /// view of a larger buffer this allocator keeps).
    ///
    /// # Errors
    /// Whatever the allocator fails with; it is returned to the caller of `malloc`.
    fn allocate(&self, mem: &Arc<DeviceMemory>, size: u64) -> Result<Block>;

    /// Take back a block `allocate` returned, once nothing uses it any more. Blocks given
    /// back are queued by the core and passed here by [`DeviceMemory::return_blocks`]: at
    /// the next [`DeviceMemory::malloc`], `set_allocator`, `empty_cache` and shutdown, on
    /// that caller's thread, with no runtime lock held; a panic here is contained there.
    fn free(&self, block: Block);
}

/// A block a plugged allocator hands out: a buffer the core made, and what the allocator
/// wants back with it in [`Allocator::free`].
pub struct Block {
    /// The memory.
    pub buffer: Buffer,
    /// The allocator's own tag for the block (for example the object it came from).
    pub token: Option<Box<dyn Any + Send + Sync>>,
}

impl Block {
    /// A block of `buffer` with no token.
    pub fn new(buffer: Buffer) -> Block {
        Block {
            buffer,
            token: None,
        }
    }

    /// A block of `buffer` carrying `token`.
    pub fn with_token(buffer: Buffer, token: Box<dyn Any + Send + Sync>) -> Block {
        Block {
            buffer,
            token: Some(token),
        }
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Block({:?})", self.buffer)
    }
}

/// A plugged block in use: given back to its allocator when dropped.
pub(super) struct Lease {
    allocator: Arc<dyn Allocator>,
    block: Option<Block>,
}

impl Lease {
    /// Where the block's bytes are.
    pub(super) fn at(&self) -> (&Arena, u64) {
        self.block
            .as_ref()
            .expect("a lease holds its block until it is given back")
            .buffer
            .at()
    }

    /// Hand the block back to its allocator (queued: see [`DeviceMemory::return_blocks`]).
    pub(super) fn give_back(self) {
        drop(self);
    }
}

impl Drop for Lease {
    /// Whichever thread drops the last handle (a stream worker, a thread holding a runtime
    /// lock) only queues the block: the allocator's `free` is user code.
    fn drop(&mut self) {
        if let Some(b) = self.block.take() {
            let mem = b.buffer.memory().clone();
            mem.pool.returned.lock().push((self.allocator.clone(), b));
        }
    }
}

/// Run `f`, a call into a plugged allocator (user code), turning a panic into an error that
/// names the method.
fn contained<R>(what: &str, f: impl FnOnce() -> R) -> Result<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string payload".into());
        ArgError::new(
            "allocator",
            format!("the plugged allocator's {what} panicked: {msg}"),
        )
        .into()
    })
}

thread_local! {
    /// Whether this thread is inside a plugged allocator's `allocate`.
    static IN_PLUG: Cell<bool> = const { Cell::new(false) };
}

/// Clears `IN_PLUG` when the plugged call returns or unwinds.
struct PlugGuard;

impl Drop for PlugGuard {
    fn drop(&mut self) {
        IN_PLUG.with(|f| f.set(false));
    }
}

impl DeviceMemory {
    /// Plug `allocator` in (or, `None`, go back to the built-in pool) for the allocations
    /// made through [`DeviceMemory::malloc`] from now on. Live allocations keep the allocator
    /// that made them.
    pub fn set_allocator(&self, allocator: Option<Arc<dyn Allocator>>) {
        // The old one is dropped after the lock is released.
        let old = std::mem::replace(&mut *self.pool.plug.lock(), allocator);
        drop(old);
        self.return_blocks();
    }

    /// The plugged allocator, if any.
    pub fn allocator(&self) -> Option<Arc<dyn Allocator>> {
        self.pool.plug.lock().clone()
    }

    /// Pass the blocks given back since the last call to their allocators' `free`, on this
    /// thread, with no runtime lock held; returns how many. A panicking `free` is contained
    /// (the panic hook reports it; the block is dropped). [`DeviceMemory::malloc`],
    /// `set_allocator`, `empty_cache` and shutdown call it; callers that want blocks back
    /// sooner (a pool's statistics, `device_free`) may too.
    pub fn return_blocks(&self) -> usize {
        let mut n = 0;
        loop {
            let batch = std::mem::take(&mut *self.pool.returned.lock());
            if batch.is_empty() {
                return n;
            }
            n += batch.len();
            for (allocator, block) in batch {
                let _ = contained("free", || allocator.free(block));
            }
        }
    }

    /// Allocate `size` zeroed bytes through the plugged allocator, or the built-in pool when
    /// none is plugged (or this thread is inside the plugged allocator already).
    ///
    /// # Errors
    /// The plugged allocator's error; `ArgError` (argument `allocator`) when the block it
    /// returned is not a live buffer of this device holding `size` bytes (the block is then
    /// given back to it); as [`DeviceMemory::allocate`] for the built-in pool.
    pub fn malloc(self: &Arc<Self>, size: u64) -> Result<Buffer> {
        let plug = self.pool.plug.lock().clone();
        let Some(allocator) = plug else {
            return self.allocate(size);
        };
        if IN_PLUG.with(Cell::get) {
            return self.allocate(size);
        }
        self.process_deferred_frees();
        self.return_blocks();
        let block = {
            IN_PLUG.with(|f| f.set(true));
            let _guard = PlugGuard;
            contained("allocate", || allocator.allocate(self, size))??
        };
        if let Err(e) = self.accept(&block, size) {
            let _ = contained("free", || allocator.free(block));
            return Err(e);
        }
        let (id, tracker) = (block.buffer.id(), block.buffer.alloc.tracker.clone());
        let place = Place::Plugged(Lease {
            allocator,
            block: Some(block),
        });
        let buf = Buffer {
            alloc: Arc::new(Allocation {
                mem: self.clone(),
                place,
                size,
                block: 0,
                id,
                recorded: parking_lot::Mutex::new(Vec::new()),
                export: std::sync::OnceLock::new(),
                // The block is a range of a buffer the core made: one memory, one lock.
                tracker,
            }),
            offset: 0,
            len: size,
        };
        buf.fill(0, size, 0)?;
        Ok(buf)
    }

    /// Check a block a plugged allocator returned for a request of `size` bytes.
    fn accept(self: &Arc<Self>, block: &Block, size: u64) -> Result<()> {
        let b = &block.buffer;
        if !Arc::ptr_eq(b.memory(), self) {
            return Err(ArgError::new(
                "allocator",
                format!(
                    "the plugged allocator returned {b:?} for device {}, which is not memory of that device (or of this runtime)",
                    self.device
                ),
            )
            .into());
        }
        b.check()?;
        if b.size() < size {
            return Err(ArgError::new(
                "allocator",
                format!(
                    "the plugged allocator returned {} bytes for a request of {size} bytes",
                    b.size()
                ),
            )
            .into());
        }
        Ok(())
    }
}
