//! The shared library's SONAME is `libascendcl.so` whichever name it is linked by (the
//! CANN-like prefix also offers it as `libacl_rt.so`), so a process loads one copy: one runtime.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libascendcl.so");
    println!("cargo:rerun-if-changed=build.rs");
}
