//! With the `acl-c-library` feature (on in the Python package's build, `pyproject.toml`):
//! build the ACL C library (`libascendcl.so`, crate `runtime-acl`) and put it, with its
//! headers, into the Python package (`python/runtime/acl/_c/`), so that the wheel carries
//! them and `python -m runtime.acl --prefix` can lay out a CANN-like directory.
//!
//! The library is a second `cdylib`, which one cargo invocation cannot produce for another
//! package; so this runs a nested `cargo build -p runtime-acl` in its own target directory
//! (the outer build holds the lock on its own), with the outer build's profile and target.
//! Inside the Python process the library does not keep a runtime of its own: it finds this
//! extension's (`runtime_acl_provider_v1`) and calls into it (see `runtime-acl`'s `dispatch`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the header directory");
    for entry in std::fs::read_dir(from).expect("read the headers") {
        let p = entry.expect("entry").path();
        let dest = to.join(p.file_name().expect("a name"));
        if p.is_dir() {
            copy_tree(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).expect("copy a header");
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_ACL_C_LIBRARY").is_none() {
        return;
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let root = manifest
        .parent()
        .and_then(Path::parent)
        .expect("workspace root");
    for p in [
        "crates/runtime-acl/src",
        "crates/runtime-acl/include",
        "crates/runtime-acl/Cargo.toml",
        "crates/runtime-acl/build.rs",
        "crates/runtime-core/src",
        "crates/runtime-core/Cargo.toml",
        "Cargo.lock",
        // The copy in the package: rebuilt when it is gone (a clean checkout keeps target/).
        "python/runtime/acl/_c/runtime/lib64/libascendcl.so",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    let profile = std::env::var("PROFILE").expect("PROFILE");
    let target = std::env::var("TARGET").expect("TARGET");
    let host = std::env::var("HOST").expect("HOST");
    let target_dir = root.join("target").join("acl-c");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .args(["-p", "runtime-acl", "--lib", "--locked"])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
    if profile == "release" {
        cmd.arg("--release");
    }
    let mut out_dir = target_dir.clone();
    if target != host {
        cmd.args(["--target", &target]);
        out_dir.push(&target);
    }
    out_dir.push(if profile == "release" {
        "release"
    } else {
        "debug"
    });
    // The build script's own environment describes the outer package; the nested build
    // starts clean (compiler, flags and jobserver stay).
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let keep = k == "CARGO_HOME"
            || k == "CARGO_ENCODED_RUSTFLAGS"
            || k == "CARGO_MAKEFLAGS"
            || k == "RUSTC"
            || k == "RUSTUP_HOME"
            || k == "RUSTUP_TOOLCHAIN";
        if !keep
            && (k.starts_with("CARGO_")
                || matches!(
                    k.as_str(),
                    "OUT_DIR" | "TARGET" | "HOST" | "PROFILE" | "OPT_LEVEL" | "DEBUG" | "NUM_JOBS"
                ))
        {
            cmd.env_remove(&k);
        }
    }
    let status = cmd
        .status()
        .expect("run the nested cargo build of runtime-acl");
    assert!(
        status.success(),
        "building libascendcl.so (runtime-acl) failed"
    );
    // Start from an empty folder: in a source checkout `python -m runtime.acl --prefix` adds
    // symbolic links beside these files, which the wheel must not carry.
    let top = root.join("python/runtime/acl/_c");
    let _ = std::fs::remove_dir_all(&top);
    let dest = top.join("runtime");
    let lib_dir = dest.join("lib64");
    std::fs::create_dir_all(&lib_dir).expect("create the library directory");
    std::fs::copy(
        out_dir.join("libascendcl.so"),
        lib_dir.join("libascendcl.so"),
    )
    .expect("copy libascendcl.so");
    copy_tree(
        &root.join("crates/runtime-acl/include"),
        &dest.join("include"),
    );
}
