//! Panics inside ops: caught and reported as a [`KernelFailure`], without the default hook's
//! message on stderr.
//!
//! A kernel that panics is an error of that launch, surfaced at the next synchronisation
//! like any other (with the panic's message and location); printing "thread '...' panicked"
//! on stderr as well would duplicate it in every test log. The first op run installs a panic
//! hook that stays silent while the panicking thread is running an op (a thread-local flag)
//! and records the location for the error instead; every other panic goes to the hook that
//! was installed before.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use crate::error::KernelFailure;

thread_local! {
    static IN_OP: Cell<bool> = const { Cell::new(false) };
    static LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_OP.with(Cell::get) {
                let at = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()));
                LOCATION.with(|slot| *slot.borrow_mut() = at);
                return;
            }
            previous(info);
        }));
    });
}

/// Run `f` (an op named `name`), turning a panic into a `KernelFailure` that names the
/// panic's message and location.
pub(crate) fn run_caught(
    name: &str,
    f: impl FnOnce() -> Result<(), KernelFailure>,
) -> Result<(), KernelFailure> {
    run_caught_named(|| name, f)
}

/// [`run_caught`], asking the op's name only when it panicked (an op's name may cost a
/// conversion, and a graph replay runs a hundred ops per command).
pub(crate) fn run_caught_named<'a>(
    name: impl FnOnce() -> &'a str,
    f: impl FnOnce() -> Result<(), KernelFailure>,
) -> Result<(), KernelFailure> {
    install_hook();
    let outer = IN_OP.with(|c| c.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    IN_OP.with(|c| c.set(outer));
    result.unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic with a non-string payload".into());
        let at = LOCATION.with(|slot| slot.borrow_mut().take());
        let msg = match at {
            Some(at) => format!("panicked at {at}: {msg}"),
            None => format!("panicked: {msg}"),
        };
        Err(KernelFailure::new(name(), msg))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_failure_with_message_and_location() {
        let e = run_caught("boom", || panic!("kernel exploded {}", 42)).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("boom"), "{text}");
        assert!(text.contains("kernel exploded 42"), "{text}");
        assert!(text.contains("panics.rs:"), "location missing: {text}");
        assert!(!IN_OP.with(Cell::get), "flag restored");
    }

    #[test]
    fn success_and_errors_pass_through() {
        assert!(run_caught("ok", || Ok(())).is_ok());
        let e = run_caught("err", || Err(KernelFailure::new("err", "bad input"))).unwrap_err();
        assert!(e.to_string().contains("bad input"));
    }
}
