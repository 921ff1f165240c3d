//! Deferred deallocation (numba's `cuda.defer_cleanup()`): while a defer scope is open
//! anywhere in the process, buffers let go through [`release`] are held (their memory stays
//! allocated) and freed when the outermost scope closes. Code that must not see the
//! allocator run under it (a timed region, a callback) opens a scope around it.
//!
//! Scopes nest and count process-wide, as numba's count per context. Only what a caller
//! hands to [`release`] is deferred (the Python bindings do so for every `DeviceBuffer`
//! handle they drop or `device_free`); a `Buffer` dropped elsewhere frees as usual.

use parking_lot::Mutex;

use super::Buffer;

/// Open scopes, and the buffers held until the last one closes.
static STATE: Mutex<(usize, Vec<Buffer>)> = Mutex::new((0, Vec::new()));

/// An open defer scope; closing it (drop) frees what was held if it was the outermost.
#[derive(Debug)]
#[must_use = "the scope closes when the guard is dropped"]
pub struct DeferGuard(());

/// Open a defer scope.
pub fn enter() -> DeferGuard {
    STATE.lock().0 += 1;
    DeferGuard(())
}

impl Drop for DeferGuard {
    fn drop(&mut self) {
        let held = {
            let mut st = STATE.lock();
            st.0 -= 1;
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
