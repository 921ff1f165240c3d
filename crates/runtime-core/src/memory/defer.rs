//! Deferred deallocation (numba's `cuda.defer_cleanup()`): while a defer scope is open
//! anywhere in the process, buffers let go through [`release`] are held (their memory stays
//! allocated) and freed when the outermost scope closes. Code that must not see the
//! allocator run under it (a timed region, a callback) opens a scope around it.
//!
//! Scopes nest and count process-wide, as numba's count per context. Only what a caller
//! hands to [`release`] is deferred (the Python bindings do so for every `DeviceBuffer`
//! handle they drop or `device_free`); a `Buffer` dropped elsewhere frees as usual. A
//! release on another thread at the very moment the first scope opens may still free at
//! once: it happened before the scope, as far as anyone can tell.
//!
//! Scopes belong to the process that opened them: a forked child starts with none open
//! (`after_fork`), whichever thread of the parent held them, the forking one included. The
//! buffers held for the parent's scopes are the parent's runtime's, abandoned in the child:
//! they are leaked there, never freed. A scope opened before the fork closes in the child
//! without effect (it counts only in the process that opened it).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::Buffer;

/// Open scopes, and the buffers held until the last one closes.
static STATE: crate::sync::StaticMutex<(usize, Vec<Buffer>)> =
    crate::sync::StaticMutex::new((0, Vec::new()));

static FORK: crate::sync::ForkGuarded<crate::sync::StaticMutex<(usize, Vec<Buffer>)>> =
    crate::sync::ForkGuarded::new(|| &STATE);

/// Around `fork()`: hold the defer scopes' state (see `runtime::install_fork_handlers`).
pub(crate) fn before_fork(wait: std::time::Duration) {
    FORK.before_fork(wait);
}

/// After `fork()`: release what [`before_fork`] took (in the child also a hold of a thread
/// that vanished in the fork); in the child, close every scope of the parent. The buffers
/// they held are leaked, not dropped: freeing them would take the locks of the parent's
/// abandoned runtime, which a thread that vanished in the fork may hold. The state's lock is
/// only tried: if a vanished thread holds it past the fork handler's wait, its buffers stay
/// where they are (nothing here may block in the child).
pub(crate) fn after_fork(child: bool) {
    FORK.after_fork(child);
    if child {
        OPEN.store(0, Ordering::Release);
        if let Some(mut st) = STATE.try_lock() {
            st.0 = 0;
            std::mem::forget(std::mem::take(&mut st.1));
        }
    }
}

/// A copy of the open scope count (written under the lock), so that [`release`] outside any
/// scope, the common case on every handle drop, takes no lock.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// An open defer scope; closing it (drop) frees what was held if it was the outermost.
#[derive(Debug)]
#[must_use = "the scope closes when the guard is dropped"]
pub struct DeferGuard {
    /// [`crate::generation::forks`] when the scope opened: in a forked child the scope was
    /// closed by the fork ([`after_fork`]), and dropping the guard there changes nothing.
    forks: u64,
}

/// Open a defer scope.
pub fn enter() -> DeferGuard {
    let mut st = STATE.lock();
    st.0 += 1;
    OPEN.store(st.0, Ordering::Release);
    DeferGuard {
        forks: crate::generation::forks(),
    }
}

impl Drop for DeferGuard {
    fn drop(&mut self) {
        if self.forks != crate::generation::forks() {
            // Opened in the parent before a fork: not counted in this process.
            return;
        }
        let held = {
            let mut st = STATE.lock();
            st.0 -= 1;
            OPEN.store(st.0, Ordering::Release);
            if st.0 == 0 {
                std::mem::take(&mut st.1)
            } else {
                Vec::new()
            }
        };
        // Freed after the lock: returning blocks takes the allocator's locks.
        drop(held);
    }
}

/// Let go of `buffer`: held until the outermost open scope closes, or dropped now when none
/// is open.
pub fn release(buffer: Buffer) {
    if OPEN.load(Ordering::Acquire) == 0 {
        drop(buffer);
        return;
    }
    let mut st = STATE.lock();
    if st.0 > 0 {
        st.1.push(buffer);
        return;
    }
    drop(st);
    drop(buffer);
}

/// How many scopes are open, and how many buffers they hold.
pub fn state() -> (usize, usize) {
    let st = STATE.lock();
    (st.0, st.1.len())
}
