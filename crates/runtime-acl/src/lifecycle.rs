//! `aclInit` and `aclFinalize`: the configuration file, starting the runtime (when nothing
//! else started it), which runtime that was, and releasing everything ACL made.
//!
//! The virtual devices' settings are the runtime's: `RUNTIME_DEVICE_COUNT`,
//! `RUNTIME_DEVICE_MEMORY`, `RUNTIME_DEVICE_PROFILE` (see `runtime_core::config`), read when
//! `aclInit` starts the runtime. When the runtime is already running (the Python package
//! started it, with its own settings), `aclInit` uses it as it is and `aclFinalize` leaves it
//! running. `aclFinalize` shuts down only the runtime `aclInit` started (remembered by its
//! generation): when that one was shut down meanwhile and another started in its place, the
//! new one is not ACL's and stays running. The configuration file `aclInit` takes is checked
//! as CANN checks it (it must exist and hold a JSON object, or be empty); its keys (dump,
//! profiling, ...) configure tools this runtime does not have and are not applied.

use runtime_core::config::ConfigBuilder;
use runtime_core::runtime as rt;

use crate::codes::*;
use crate::error::{AclError, AclResult};
use crate::{memory, report, state};

struct Life {
    /// The generation of the runtime `aclInit` started (`aclFinalize` shuts it down if it is
    /// still the live one); `None` when `aclInit` found a runtime running.
    owned: Option<u64>,
    /// Whether `aclFinalize` ran since the last `aclInit` (a second one is
    /// `ACL_ERROR_REPEAT_FINALIZE`).
    finalized: bool,
}

static LIFE: crate::fork::Mutex<Life> = crate::fork::Mutex::new(Life {
    owned: None,
    finalized: false,
});

/// Check `aclInit`'s configuration file: it must exist and be empty or hold a JSON object.
pub fn check_config(path: &str) -> AclResult<()> {
    const NAME: &str = "aclInit";
    let text = std::fs::read(path).map_err(|e| {
        AclError::new(
            ACL_ERROR_INVALID_FILE,
            format!("{NAME}: cannot read the configuration file {path:?}: {e}"),
        )
    })?;
    if text.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    match serde_json::from_slice::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        Ok(other) => Err(AclError::new(
            ACL_ERROR_PARSE_FILE,
            format!(
                "{NAME}: the configuration file {path:?} holds a JSON {}, not an object",
                kind(&other)
            ),
        )),
        Err(e) => Err(AclError::new(
            ACL_ERROR_PARSE_FILE,
            format!("{NAME}: the configuration file {path:?} is not valid JSON: {e}"),
        )),
    }
}

fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

/// `aclInit`: check the configuration file (`None` or `""`: none), start the runtime if it
/// is not running, and mark ACL initialised.
pub fn init(config_path: Option<&str>) -> AclResult<()> {
    const NAME: &str = "aclInit";
    let mut life = LIFE.lock();
    if state::is_initialized() {
        return Err(AclError::new(
            ACL_ERROR_REPEAT_INITIALIZE,
            format!("{NAME}: already initialized (this can be ignored)"),
        ));
    }
    if let Some(p) = config_path.filter(|p| !p.is_empty()) {
        check_config(p)?;
    }
    life.owned = if rt::is_initialized() {
        None
    } else {
        let started = rt::init(&ConfigBuilder::default()).map_err(|e| AclError::core(NAME, &e))?;
        Some(started.generation())
    };
    life.finalized = false;
    state::set_initialized(true);
    crate::fork::install();
    Ok(())
}

/// `aclFinalize`: release everything ACL made (streams after their work, contexts, memory,
/// callback subscriptions) and shut the runtime down if `aclInit` started it and it is still
/// the live one (not one started after it was shut down).
pub fn finalize() -> AclResult<()> {
    const NAME: &str = "aclFinalize";
    let mut life = LIFE.lock();
    if !state::is_initialized() {
        return Err(if life.finalized {
            AclError::new(
                ACL_ERROR_REPEAT_FINALIZE,
                format!("{NAME}: ACL was finalized already"),
            )
        } else {
            AclError::new(
                ACL_ERROR_UNINITIALIZE,
                format!("{NAME}: aclInit has not been called"),
            )
        });
    }
    state::set_initialized(false);
    life.finalized = true;
    report::reset();
    let (streams, contexts) = state::take_all();
    let blocks = memory::take_all();
    state::destroy_all(streams, contexts);
    for b in &blocks {
        if let memory::Block::Pinned(p) = b.block() {
            let _ = p.free();
        }
    }
    drop(blocks);
    if life.owned.take().is_some_and(state::is_live) {
        rt::shutdown().map_err(|e| AclError::core(NAME, &e))?;
    }
    Ok(())
}

// --------------------------------------------------------------------------- fork

static LIFE_FORK: crate::fork::Guarded<Life> = crate::fork::Guarded::new(|| &LIFE);

pub(crate) fn before_fork() {
    LIFE_FORK.before_fork();
}

pub(crate) fn after_fork(child: bool) {
    LIFE_FORK.after_fork(child);
}

/// In a forked child: ACL starts over (the core abandoned the parent's runtime).
pub(crate) fn forget_in_child() {
    let mut life = LIFE.lock();
    life.owned = None;
    life.finalized = false;
}
