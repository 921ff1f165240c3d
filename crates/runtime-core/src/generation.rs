//! Which runtime is live: `init` starts a new *generation* and `shutdown` ends it. Handles
//! (streams through their executor, events, graphs) remember the generation they were made
//! under, so a handle from before a shutdown fails with `InvalidHandle` instead of touching
//! a newer runtime's objects.
//!
//! A bottom layer (it depends on nothing), so that events and streams can check it without
//! knowing about the runtime above them.

use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);
static LIVE: AtomicU64 = AtomicU64::new(0);

/// The generation of the runtime installed now, 0 when none.
pub fn live() -> u64 {
    LIVE.load(Ordering::Acquire)
}

/// Whether a handle made under `generation` belongs to the runtime installed now.
pub fn is_live(generation: u64) -> bool {
    generation != 0 && generation == live()
}

/// A fresh generation number for a runtime being built (1 for the first).
pub(crate) fn next() -> u64 {
    COUNTER.fetch_add(1, Ordering::SeqCst) + 1
}

/// Make `generation` the live one (`init`, once the runtime is installed).
pub(crate) fn install(generation: u64) {
    LIVE.store(generation, Ordering::Release);
}

/// No runtime is live any more (`shutdown`, once the runtime is taken out).
pub(crate) fn clear() {
    LIVE.store(0, Ordering::Release);
}

static FORKS: AtomicU64 = AtomicU64::new(0);

/// How many `fork()`s this process is away from the one that started: 0 in the original
/// process, one more in each child (see `runtime::after_fork_in_child`). Objects made before a
/// fork compare it with theirs and, in the child, leave their locks alone: a thread that held
/// one does not exist there.
pub fn forks() -> u64 {
    FORKS.load(Ordering::Acquire)
}

/// In a forked child: a new fork count, and no runtime is live.
pub(crate) fn after_fork_in_child() {
    FORKS.fetch_add(1, Ordering::SeqCst);
    clear();
}
