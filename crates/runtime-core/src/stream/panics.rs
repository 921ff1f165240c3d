//! Panics inside ops: caught and reported as a [`KernelFailure`], without the default hook's
//! message on stderr.
//!
//! A kernel that panics is an error of that launch, surfaced at the next synchronisation
//! like any other (with the panic's message and location); printing "thread '...' panicked"
//! on stderr as well would duplicate it in every test log. The first op run installs a panic
//! hook that stays silent while the panicking thread is running ops (a thread-local flag,
//! set by an [`OpScope`]) and records the location for the error instead; every other panic
//! goes to the hook that was installed before. A graph replay runs its consecutive ops in one
//! scope, so the runtime's own code between them runs with the flag set too: a panic there
//! (a bug of the runtime's, never a kernel's) is not caught by any op, and the scope prints
//! it to stderr as the default hook would while it unwinds.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use crate::error::KernelFailure;

thread_local! {
    static IN_OP: Cell<bool> = const { Cell::new(false) };
    static CAUGHT: RefCell<Option<Caught>> = const { RefCell::new(None) };
}

/// What the hook noted of a panic on a thread running ops.
struct Caught {
    at: Option<String>,
    message: String,
}

static HOOK: Once = Once::new();

/// A panic's message: its `&str` or `String` payload.
fn payload_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".into())
}

fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_OP.with(Cell::get) {
                let caught = Caught {
                    at: info
                        .location()
                        .map(|l| format!("{}:{}", l.file(), l.line())),
                    message: payload_message(info.payload()),
                };
                CAUGHT.with(|slot| *slot.borrow_mut() = Some(caught));
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
    OpScope::enter().run(name, f)
}

/// This thread runs ops until the scope is dropped: the hook is installed and the thread
/// marked once for all of them (a graph replay's hundred nodes would otherwise reach the
/// thread-local flag twice each, through `__tls_get_addr` in a loaded library). Ops run in
/// it one by one ([`OpScope::run`]), each caught on its own.
pub(crate) struct OpScope {
    /// The mark before this scope: true when it is nested in another (an op that ran an op
    /// inline).
    outer: bool,
    /// Not `Send`: the mark is this thread's.
    _thread: std::marker::PhantomData<*const ()>,
}

impl OpScope {
    pub(crate) fn enter() -> OpScope {
        install_hook();
        OpScope {
            outer: IN_OP.with(|c| c.replace(true)),
            _thread: std::marker::PhantomData,
        }
    }

    /// Run `f` (an op named `name()`), turning a panic into a `KernelFailure` that names the
    /// panic's message and location.
    pub(crate) fn run<'a>(
        &self,
        name: impl FnOnce() -> &'a str,
        f: impl FnOnce() -> Result<(), KernelFailure>,
    ) -> Result<(), KernelFailure> {
        catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(caught(name(), &*p)))
    }

    /// [`OpScope::run`] for a graph replay's node: inlined into the loop over the nodes, the
    /// panic's report kept out of line (a replay runs a hundred of these per command).
    #[inline(always)]
    pub(crate) fn run_node(
        &self,
        op: &dyn crate::stream::command::Op,
    ) -> Result<(), KernelFailure> {
        match catch_unwind(AssertUnwindSafe(|| op.run())) {
            Ok(result) => result,
            Err(p) => Err(caught(op.name(), &*p)),
        }
    }
}

/// The failure an op named `name` reports for the panic whose payload is `p`.
#[cold]
#[inline(never)]
fn caught(name: &str, p: &(dyn std::any::Any + Send)) -> KernelFailure {
    let msg = payload_message(p);
    let at = CAUGHT
        .with(|slot| slot.borrow_mut().take())
        .and_then(|c| c.at);
    let msg = match at {
        Some(at) => format!("panicked at {at}: {msg}"),
        None => format!("panicked: {msg}"),
    };
    KernelFailure::new(name, msg)
}

impl Drop for OpScope {
    fn drop(&mut self) {
        IN_OP.with(|c| c.set(self.outer));
        // Unwinding through the scope: a panic between its ops, which no op caught and the
        // hook kept quiet (see the module's doc). Say it as the default hook would have.
        if std::thread::panicking() && !self.outer {
            if let Some(c) = CAUGHT.with(|slot| slot.borrow_mut().take()) {
                let thread = std::thread::current();
                eprintln!(
                    "thread '{}' panicked at {}:\n{}",
                    thread.name().unwrap_or("<unnamed>"),
                    c.at.as_deref().unwrap_or("<unknown>"),
                    c.message
                );
            }
        }
    }
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

    /// A graph replay's ops share one scope: each panic is caught on its own, with its own
    /// location (none left over from the one before), and the ops after it still run.
    #[test]
    fn ops_in_one_scope_fail_each_on_its_own() {
        let scope = OpScope::enter();
        let first = scope
            .run(|| "a", || panic!("first"))
            .unwrap_err()
            .to_string();
        assert!(scope.run(|| "b", || Ok(())).is_ok());
        let second = scope
            .run(|| "c", || panic!("second"))
            .unwrap_err()
            .to_string();
        assert!(
            first.contains("first") && first.contains("\"a\""),
            "{first}"
        );
        assert!(second.contains("second"), "{second}");
        // Each failure names the location of its own panic.
        fn at(text: &str) -> Option<&str> {
            text.split("panicked at ").nth(1)?.split(": ").next()
        }
        assert!(second.contains("panics.rs:"), "{second}");
        assert_ne!(at(&first), at(&second), "{first} / {second}");
        assert!(IN_OP.with(Cell::get));
        drop(scope);
        assert!(!IN_OP.with(Cell::get), "flag restored");
    }

    /// A nested scope (an op that ran another inline) leaves the outer one's mark in place.
    #[test]
    fn a_scope_restores_the_mark_it_found() {
        let outer = OpScope::enter();
        drop(OpScope::enter());
        assert!(IN_OP.with(Cell::get), "still inside the outer scope");
        drop(outer);
        assert!(!IN_OP.with(Cell::get));
    }

    /// A panic that no op caught unwinds through the scope: the scope takes the hook's note
    /// (it prints it) and clears the mark, so the thread is as before.
    #[test]
    fn a_panic_escaping_a_scope_leaves_nothing_behind() {
        let escaped = catch_unwind(|| {
            let _scope = OpScope::enter();
            panic!("between ops");
        });
        assert!(escaped.is_err());
        assert!(!IN_OP.with(Cell::get));
        assert!(CAUGHT.with(|c| c.borrow().is_none()), "the note was taken");
    }

    #[test]
    fn success_and_errors_pass_through() {
        assert!(run_caught("ok", || Ok(())).is_ok());
        let e = run_caught("err", || Err(KernelFailure::new("err", "bad input"))).unwrap_err();
        assert!(e.to_string().contains("bad input"));
    }
}
