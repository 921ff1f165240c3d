//! The exported symbols (`aclInit`, `aclrtMalloc`, ...) and the choice, made once per process
//! at the first call, of which copy of the implementation serves them: one runtime per
//! process.
//!
//! Every Rust `cdylib` carries its own copy of the runtime's statics, so the Python extension
//! (`runtime._runtime`) and this library loaded into the same process would be two runtimes
//! with two sets of devices. The extension is the owner wherever it is loaded: it exports a
//! function, [`PROVIDER_SYMBOL`], that returns its [`Table`]. At its first call this library
//! looks for that symbol among the objects loaded in the process (`dl_iterate_phdr`, then
//! `dlopen(RTLD_NOLOAD)` and `dlsym` on each: the extension is loaded `RTLD_LOCAL`, so a
//! global lookup would not see it); when the process runs Python but has not imported
//! `runtime` yet, it imports `runtime._runtime` first (through the Python C API, resolved
//! with `dlsym`). If a provider is found, every call goes to its table: the C caller and
//! Python share devices, allocator, streams, handles and the pointer table. Otherwise (a plain
//! C or C++ program) this library's own copy serves.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

use crate::capi::{Table, TABLE, TABLE_VERSION};

/// The symbol the owner of the runtime (the Python extension) exports: `extern "C" fn() ->
/// *const Table`.
pub const PROVIDER_SYMBOL: &CStr = c"runtime_acl_provider_v1";

static CHOSEN: OnceLock<&'static Table> = OnceLock::new();

/// The table every exported function calls through.
fn table() -> &'static Table {
    CHOSEN.get_or_init(|| find_provider().unwrap_or(&TABLE))
}

/// Whether this library serves the calls itself (no provider was found). Chooses if no call
/// chose yet.
pub fn is_standalone() -> bool {
    std::ptr::eq(table(), &TABLE)
}

type ProviderFn = unsafe extern "C" fn() -> *const Table;

/// A provider's table, if `sym` (the address of [`PROVIDER_SYMBOL`]) gives a matching one.
fn accept(sym: *mut c_void) -> Option<&'static Table> {
    if sym.is_null() {
        return None;
    }
    // SAFETY: the symbol is the provider function this crate's `provider` module defines in
    // the extension (same signature by construction).
    let f: ProviderFn = unsafe { std::mem::transmute::<*mut c_void, ProviderFn>(sym) };
    // SAFETY: calling it has no preconditions; it returns a pointer to a static table.
    let t = unsafe { f() };
    if t.is_null() || std::ptr::eq(t, &TABLE) {
        return None;
    }
    // SAFETY: a non-null pointer to the provider's `static TABLE`, which lives as long as
    // its library, which stays loaded (the handle is never closed).
    let t: &'static Table = unsafe { &*t };
    (t.version == TABLE_VERSION && t.size as usize == std::mem::size_of::<Table>()).then_some(t)
}

/// Paths of the shared objects loaded in the process.
fn loaded_objects() -> Vec<CString> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the Vec passed below; `info` is valid for this call.
        let (out, name) = unsafe { (&mut *(data as *mut Vec<CString>), (*info).dlpi_name) };
        if !name.is_null() {
            // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
            let n = unsafe { CStr::from_ptr(name) };
            if !n.is_empty() {
                out.push(n.to_owned());
            }
        }
        0
    }
    let mut out: Vec<CString> = Vec::new();
    // SAFETY: the callback only reads `info` and pushes into `out`, which outlives the call;
    // no loader function is called from inside it.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut out as *mut Vec<CString> as *mut c_void) };
    out
}

/// The provider's table among the loaded objects.
fn search() -> Option<&'static Table> {
    // SAFETY: dlsym with the pseudo-handle RTLD_DEFAULT and a NUL-terminated name.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, PROVIDER_SYMBOL.as_ptr()) };
    if let Some(t) = accept(global) {
        return Some(t);
    }
    for path in loaded_objects() {
        // SAFETY: NOLOAD only returns a handle to an object already loaded (never loads one).
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if handle.is_null() {
            continue;
        }
        // SAFETY: a valid handle and a NUL-terminated name.
        let sym = unsafe { libc::dlsym(handle, PROVIDER_SYMBOL.as_ptr()) };
        if let Some(t) = accept(sym) {
            return Some(t); // the handle stays open: the provider stays loaded
        }
        // SAFETY: the handle from dlopen above, closed once.
        unsafe { libc::dlclose(handle) };
    }
    None
}

/// The address of a global symbol `name`, if any object exports it.
fn global(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// In a process that runs Python, import `runtime._runtime` (the provider) if it is not
/// imported yet, so that C calls made before `import runtime` join the Python runtime.
fn import_runtime_if_python() {
    type IntFn = unsafe extern "C" fn() -> c_int;
    type ImportFn = unsafe extern "C" fn(*const c_char) -> *mut c_void;
    type ObjFn = unsafe extern "C" fn(*mut c_void);
    type ReleaseFn = unsafe extern "C" fn(c_int);
    type VoidFn = unsafe extern "C" fn();
    let is_init = global(c"Py_IsInitialized");
    let ensure = global(c"PyGILState_Ensure");
    let release = global(c"PyGILState_Release");
    let import = global(c"PyImport_ImportModule");
    let decref = global(c"Py_DecRef");
    let clear = global(c"PyErr_Clear");
    if [is_init, ensure, release, import, decref, clear]
        .iter()
        .any(|p| p.is_null())
    {
        return;
    }
    // SAFETY: each pointer is the CPython C API function of that name (resolved above from
    // the running interpreter), called with the signature CPython documents.
    unsafe {
        let is_init: IntFn = std::mem::transmute::<*mut c_void, IntFn>(is_init);
        if is_init() == 0 {
            return;
        }
        for fin in [c"Py_IsFinalizing", c"_Py_IsFinalizing"] {
            let f = global(fin);
            if !f.is_null() {
                let f: IntFn = std::mem::transmute::<*mut c_void, IntFn>(f);
                if f() != 0 {
                    return;
                }
                break;
            }
        }
        let ensure: IntFn = std::mem::transmute::<*mut c_void, IntFn>(ensure);
        let release: ReleaseFn = std::mem::transmute::<*mut c_void, ReleaseFn>(release);
        let import: ImportFn = std::mem::transmute::<*mut c_void, ImportFn>(import);
        let decref: ObjFn = std::mem::transmute::<*mut c_void, ObjFn>(decref);
        let clear: VoidFn = std::mem::transmute::<*mut c_void, VoidFn>(clear);
        let gil = ensure();
        let m = import(c"runtime._runtime".as_ptr());
        if m.is_null() {
            clear(); // not installed for this interpreter: this library serves alone
        } else {
            decref(m);
        }
        release(gil);
    }
}

fn find_provider() -> Option<&'static Table> {
    if let Some(t) = search() {
        return Some(t);
    }
    import_runtime_if_python();
    search()
}

macro_rules! export {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            /// CANN's function of this name (see the headers in `include/acl/`).
            ///
            /// # Safety
            /// CANN's contract: pointer arguments are NULL or valid for what the function
            /// reads or writes through them.
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                // SAFETY: the chosen table holds this very function of one copy of this
                // library, with the same signature (one list generates both).
                unsafe { (table().$name)($($arg),*) }
            }
        )*
    };
}

crate::capi::acl_functions!(export);
