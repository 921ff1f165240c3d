//! The C test programs in `tests/c/` (memory round trips, streams and events, callbacks with a
//! report thread, every error path, fork while threads use ACL, the device and event
//! queries), compiled with `cc` against `include/` and the
//! `libascendcl.so` this test build made, then run; and the header-drift check: every
//! function declared in the headers is exported by the library, taken into a pointer of
//! CANN's documented type (`header_drift.c`), and every constant the headers define has the
//! value of `ascendcl::codes`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding the `libascendcl.so` of this build.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    for d in [
        deps.clone(),
        deps.parent().expect("profile dir").to_path_buf(),
    ] {
        if d.join("libascendcl.so").exists() {
            return d;
        }
    }
    panic!("libascendcl.so not found next to {}", exe.display());
}

fn cc() -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    Command::new(&cc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| cc)
}

/// Compile `tests/c/<name>.c` into the test's scratch directory.
fn build(cc: &str, name: &str) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("acl-{name}"));
    let lib = lib_dir();
    let o = Command::new(cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(manifest().join("tests/c").join(format!("{name}.c")))
        .arg(format!("-I{}", manifest().join("include").display()))
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lascendcl", "-lpthread"])
        .output()
        .expect("run the C compiler");
    assert!(
        o.status.success(),
        "{name}.c does not compile:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Run a built program; its stdout.
fn run(exe: &Path) -> String {
    let o = Command::new(exe)
        .env("RUNTIME_DEVICE_COUNT", "2")
        .env("RUNTIME_DEVICE_MEMORY", "2GiB")
        .output()
        .expect("run the program");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{} failed ({}):\n{stdout}\n{}",
        exe.display(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

fn program(name: &str) {
    let Some(cc) = cc() else {
        eprintln!("SKIPPED {name}.c: no C compiler (set CC or install cc)");
        return;
    };
    let out = run(&build(&cc, name));
    assert!(out.contains("run success!"), "{name}: {out}");
}

#[test]
fn memory_round_trips() {
    program("memory");
}

#[test]
fn streams_and_events() {
    program("streams_events");
}

#[test]
fn callbacks_on_a_report_thread() {
    program("callbacks");
}

#[test]
fn every_error_path() {
    program("errors");
}

#[test]
fn fork_while_threads_use_acl() {
    program("fork");
}

#[test]
fn device_and_event_queries() {
    program("device_status");
}

/// Names of the functions the headers declare (`ACL_FUNC_VISIBILITY <type> name(`).
fn declared_functions() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(manifest().join("include/acl")).expect("include/acl") {
        let p = entry.expect("entry").path();
        if p.extension().is_none_or(|e| e != "h") {
            continue;
        }
        let text = std::fs::read_to_string(&p).expect("read header");
        for decl in text.split("ACL_FUNC_VISIBILITY").skip(1) {
            let head = decl.split('(').next().expect("a declaration");
            if let Some(name) = head.split_whitespace().last() {
                let name = name.trim_start_matches('*');
                if name.starts_with("acl") {
                    out.insert(name.to_string());
                }
            }
        }
    }
    out
}

#[test]
fn headers_declare_exactly_the_exported_functions() {
    let declared = declared_functions();
    let exported: BTreeSet<String> = ascendcl::capi::NAMES
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(declared, exported);
    let drift = std::fs::read_to_string(manifest().join("tests/c/header_drift.c")).unwrap();
    for name in &exported {
        assert!(
            drift.contains(&format!(", {name},")) || drift.contains(&format!(", {name});")),
            "header_drift.c does not take the address of {name}"
        );
    }
}

#[test]
fn header_types_and_values_match_the_library() {
    let Some(cc) = cc() else {
        eprintln!("SKIPPED header_drift.c: no C compiler (set CC or install cc)");
        return;
    };
    let out = run(&build(&cc, "header_drift"));
    let mut seen: BTreeMap<String, i64> = BTreeMap::new();
    let mut functions = BTreeSet::new();
    for line in out.lines() {
        let mut parts = line.split_whitespace();
        match (parts.next(), parts.next(), parts.next()) {
            (Some("fn"), Some(name), Some("1")) => {
                functions.insert(name.to_string());
            }
            (Some(name), Some(value), None) => {
                seen.insert(name.to_string(), value.parse().expect("a number"));
            }
            _ => panic!("unexpected line {line:?}"),
        }
    }
    let exported: BTreeSet<String> = ascendcl::capi::NAMES
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(functions, exported);
    assert_eq!(seen["sizeof_aclError"], 4);
    assert_eq!(
        seen["sizeof_aclrtStream"],
        std::mem::size_of::<usize>() as i64
    );
    assert_eq!(seen["sizeof_aclrtMemcpyKind"], 4);
    // aclrtUtilizationInfo as the library writes it (capi::AclrtUtilizationInfo).
    assert_eq!(
        seen["sizeof_aclrtUtilizationInfo"],
        std::mem::size_of::<ascendcl::capi::AclrtUtilizationInfo>() as i64
    );
    assert_eq!(
        seen["offsetof_utilizationExtend"],
        std::mem::offset_of!(ascendcl::capi::AclrtUtilizationInfo, utilization_extend) as i64
    );
    use ascendcl::codes::*;
    let want: &[(&str, i64)] = &[
        ("ACL_SUCCESS", ACL_SUCCESS as i64),
        ("ACL_ERROR_INVALID_PARAM", ACL_ERROR_INVALID_PARAM as i64),
        ("ACL_ERROR_UNINITIALIZE", ACL_ERROR_UNINITIALIZE as i64),
        (
            "ACL_ERROR_REPEAT_INITIALIZE",
            ACL_ERROR_REPEAT_INITIALIZE as i64,
        ),
        ("ACL_ERROR_INVALID_FILE", ACL_ERROR_INVALID_FILE as i64),
        ("ACL_ERROR_WRITE_FILE", ACL_ERROR_WRITE_FILE as i64),
        (
            "ACL_ERROR_INVALID_FILE_SIZE",
            ACL_ERROR_INVALID_FILE_SIZE as i64,
        ),
        ("ACL_ERROR_PARSE_FILE", ACL_ERROR_PARSE_FILE as i64),
        (
            "ACL_ERROR_FILE_MISSING_ATTR",
            ACL_ERROR_FILE_MISSING_ATTR as i64,
        ),
        (
            "ACL_ERROR_FILE_ATTR_INVALID",
            ACL_ERROR_FILE_ATTR_INVALID as i64,
        ),
        (
            "ACL_ERROR_REPEAT_SUBSCRIBE",
            ACL_ERROR_REPEAT_SUBSCRIBE as i64,
        ),
        (
            "ACL_ERROR_STREAM_NOT_SUBSCRIBE",
            ACL_ERROR_STREAM_NOT_SUBSCRIBE as i64,
        ),
        (
            "ACL_ERROR_THREAD_NOT_SUBSCRIBE",
            ACL_ERROR_THREAD_NOT_SUBSCRIBE as i64,
        ),
        (
            "ACL_ERROR_WAIT_CALLBACK_TIMEOUT",
            ACL_ERROR_WAIT_CALLBACK_TIMEOUT as i64,
        ),
        (
            "ACL_ERROR_REPEAT_FINALIZE",
            ACL_ERROR_REPEAT_FINALIZE as i64,
        ),
        ("ACL_ERROR_BAD_ALLOC", ACL_ERROR_BAD_ALLOC as i64),
        (
            "ACL_ERROR_API_NOT_SUPPORT",
            ACL_ERROR_API_NOT_SUPPORT as i64,
        ),
        ("ACL_ERROR_INVALID_DEVICE", ACL_ERROR_INVALID_DEVICE as i64),
        (
            "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED",
            ACL_ERROR_MEMORY_ADDRESS_UNALIGNED as i64,
        ),
        (
            "ACL_ERROR_RESOURCE_NOT_MATCH",
            ACL_ERROR_RESOURCE_NOT_MATCH as i64,
        ),
        (
            "ACL_ERROR_INVALID_RESOURCE_HANDLE",
            ACL_ERROR_INVALID_RESOURCE_HANDLE as i64,
        ),
        (
            "ACL_ERROR_FEATURE_UNSUPPORTED",
            ACL_ERROR_FEATURE_UNSUPPORTED as i64,
        ),
        (
            "ACL_ERROR_STORAGE_OVER_LIMIT",
            ACL_ERROR_STORAGE_OVER_LIMIT as i64,
        ),
        ("ACL_ERROR_INTERNAL_ERROR", ACL_ERROR_INTERNAL_ERROR as i64),
        ("ACL_ERROR_FAILURE", ACL_ERROR_FAILURE as i64),
        ("ACL_RT_SUCCESS", ACL_RT_SUCCESS as i64),
        (
            "ACL_ERROR_RT_PARAM_INVALID",
            ACL_ERROR_RT_PARAM_INVALID as i64,
        ),
        (
            "ACL_ERROR_RT_INVALID_DEVICEID",
            ACL_ERROR_RT_INVALID_DEVICEID as i64,
        ),
        (
            "ACL_ERROR_RT_CONTEXT_NULL",
            ACL_ERROR_RT_CONTEXT_NULL as i64,
        ),
        (
            "ACL_ERROR_RT_STREAM_CONTEXT",
            ACL_ERROR_RT_STREAM_CONTEXT as i64,
        ),
        (
            "ACL_ERROR_RT_STREAM_SUBSCRIBE",
            ACL_ERROR_RT_STREAM_SUBSCRIBE as i64,
        ),
        (
            "ACL_ERROR_RT_THREAD_SUBSCRIBE",
            ACL_ERROR_RT_THREAD_SUBSCRIBE as i64,
        ),
        (
            "ACL_ERROR_RT_STREAM_NO_CB_REG",
            ACL_ERROR_RT_STREAM_NO_CB_REG as i64,
        ),
        (
            "ACL_ERROR_RT_WAIT_TIMEOUT",
            ACL_ERROR_RT_WAIT_TIMEOUT as i64,
        ),
        (
            "ACL_ERROR_RT_FEATURE_NOT_SUPPORT",
            ACL_ERROR_RT_FEATURE_NOT_SUPPORT as i64,
        ),
        (
            "ACL_ERROR_RT_MEMORY_ALLOCATION",
            ACL_ERROR_RT_MEMORY_ALLOCATION as i64,
        ),
        ("ACL_ERROR_RT_MEMORY_FREE", ACL_ERROR_RT_MEMORY_FREE as i64),
        ("ACL_ERROR_RT_NO_DEVICE", ACL_ERROR_RT_NO_DEVICE as i64),
        (
            "ACL_ERROR_RT_RESOURCE_ALLOC_FAIL",
            ACL_ERROR_RT_RESOURCE_ALLOC_FAIL as i64,
        ),
        (
            "ACL_ERROR_RT_INTERNAL_ERROR",
            ACL_ERROR_RT_INTERNAL_ERROR as i64,
        ),
        (
            "ACL_ERROR_RT_EVENT_NOT_COMPLETE",
            ACL_ERROR_RT_EVENT_NOT_COMPLETE as i64,
        ),
        (
            "ACL_ERROR_RT_REPORT_TIMEOUT",
            ACL_ERROR_RT_REPORT_TIMEOUT as i64,
        ),
        (
            "ACL_ERROR_RT_AICORE_EXCEPTION",
            ACL_ERROR_RT_AICORE_EXCEPTION as i64,
        ),
        (
            "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT",
            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT as i64,
        ),
        (
            "ACL_ERROR_RT_EVENT_SYNC_TIMEOUT",
            ACL_ERROR_RT_EVENT_SYNC_TIMEOUT as i64,
        ),
        ("ACL_DEVICE", ACL_DEVICE as i64),
        ("ACL_HOST", ACL_HOST as i64),
        ("ACL_MEMCPY_HOST_TO_HOST", ACL_MEMCPY_HOST_TO_HOST as i64),
        (
            "ACL_MEMCPY_HOST_TO_DEVICE",
            ACL_MEMCPY_HOST_TO_DEVICE as i64,
        ),
        (
            "ACL_MEMCPY_DEVICE_TO_HOST",
            ACL_MEMCPY_DEVICE_TO_HOST as i64,
        ),
        (
            "ACL_MEMCPY_DEVICE_TO_DEVICE",
            ACL_MEMCPY_DEVICE_TO_DEVICE as i64,
        ),
        ("ACL_MEMCPY_DEFAULT", ACL_MEMCPY_DEFAULT as i64),
        (
            "ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE",
            ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE as i64,
        ),
        (
            "ACL_MEMCPY_INNER_DEVICE_TO_DEVICE",
            ACL_MEMCPY_INNER_DEVICE_TO_DEVICE as i64,
        ),
        (
            "ACL_MEMCPY_INTER_DEVICE_TO_DEVICE",
            ACL_MEMCPY_INTER_DEVICE_TO_DEVICE as i64,
        ),
        (
            "ACL_MEM_MALLOC_HUGE_FIRST",
            ACL_MEM_MALLOC_HUGE_FIRST as i64,
        ),
        ("ACL_MEM_MALLOC_HUGE_ONLY", ACL_MEM_MALLOC_HUGE_ONLY as i64),
        (
            "ACL_MEM_MALLOC_NORMAL_ONLY",
            ACL_MEM_MALLOC_NORMAL_ONLY as i64,
        ),
        ("ACL_DDR_MEM", ACL_DDR_MEM as i64),
        ("ACL_HBM_MEM", ACL_HBM_MEM as i64),
        ("ACL_DDR_MEM_HUGE", ACL_DDR_MEM_HUGE as i64),
        ("ACL_DDR_MEM_NORMAL", ACL_DDR_MEM_NORMAL as i64),
        ("ACL_HBM_MEM_HUGE", ACL_HBM_MEM_HUGE as i64),
        ("ACL_HBM_MEM_NORMAL", ACL_HBM_MEM_NORMAL as i64),
        ("ACL_DDR_MEM_P2P_HUGE", ACL_DDR_MEM_P2P_HUGE as i64),
        ("ACL_DDR_MEM_P2P_NORMAL", ACL_DDR_MEM_P2P_NORMAL as i64),
        ("ACL_HBM_MEM_P2P_HUGE", ACL_HBM_MEM_P2P_HUGE as i64),
        ("ACL_HBM_MEM_P2P_NORMAL", ACL_HBM_MEM_P2P_NORMAL as i64),
        ("ACL_HBM_MEM_HUGE1G", ACL_HBM_MEM_HUGE1G as i64),
        ("ACL_HBM_MEM_P2P_HUGE1G", ACL_HBM_MEM_P2P_HUGE1G as i64),
        ("ACL_MEM_NORMAL", ACL_MEM_NORMAL as i64),
        ("ACL_MEM_HUGE", ACL_MEM_HUGE as i64),
        ("ACL_MEM_HUGE1G", ACL_MEM_HUGE1G as i64),
        ("ACL_MEM_P2P_NORMAL", ACL_MEM_P2P_NORMAL as i64),
        ("ACL_MEM_P2P_HUGE", ACL_MEM_P2P_HUGE as i64),
        ("ACL_MEM_P2P_HUGE1G", ACL_MEM_P2P_HUGE1G as i64),
        ("ACL_CALLBACK_NO_BLOCK", ACL_CALLBACK_NO_BLOCK as i64),
        ("ACL_CALLBACK_BLOCK", ACL_CALLBACK_BLOCK as i64),
        (
            "ACL_EVENT_STATUS_COMPLETE",
            ACL_EVENT_STATUS_COMPLETE as i64,
        ),
        (
            "ACL_EVENT_STATUS_NOT_READY",
            ACL_EVENT_STATUS_NOT_READY as i64,
        ),
        (
            "ACL_EVENT_STATUS_RESERVED",
            ACL_EVENT_STATUS_RESERVED as i64,
        ),
        (
            "ACL_EVENT_RECORDED_STATUS_NOT_READY",
            ACL_EVENT_RECORDED_STATUS_NOT_READY as i64,
        ),
        (
            "ACL_EVENT_RECORDED_STATUS_COMPLETE",
            ACL_EVENT_RECORDED_STATUS_COMPLETE as i64,
        ),
        (
            "ACL_EVENT_WAIT_STATUS_COMPLETE",
            ACL_EVENT_WAIT_STATUS_COMPLETE as i64,
        ),
        (
            "ACL_EVENT_WAIT_STATUS_NOT_READY",
            ACL_EVENT_WAIT_STATUS_NOT_READY as i64,
        ),
        (
            "ACL_EVENT_WAIT_STATUS_RESERVED",
            ACL_EVENT_WAIT_STATUS_RESERVED as i64,
        ),
        (
            "ACL_RT_DEVICE_STATUS_NORMAL",
            ACL_RT_DEVICE_STATUS_NORMAL as i64,
        ),
        (
            "ACL_RT_DEVICE_STATUS_ABNORMAL",
            ACL_RT_DEVICE_STATUS_ABNORMAL as i64,
        ),
        ("ACL_RT_DEVICE_STATUS_END", ACL_RT_DEVICE_STATUS_END as i64),
        (
            "ACL_STREAM_STATUS_COMPLETE",
            ACL_STREAM_STATUS_COMPLETE as i64,
        ),
        (
            "ACL_STREAM_STATUS_NOT_READY",
            ACL_STREAM_STATUS_NOT_READY as i64,
        ),
        ("ACL_EVENT_SYNC", ACL_EVENT_SYNC as i64),
        (
            "ACL_EVENT_CAPTURE_STREAM_PROGRESS",
            ACL_EVENT_CAPTURE_STREAM_PROGRESS as i64,
        ),
        ("ACL_EVENT_TIME_LINE", ACL_EVENT_TIME_LINE as i64),
        (
            "ACL_EVENT_DEVICE_USE_ONLY",
            ACL_EVENT_DEVICE_USE_ONLY as i64,
        ),
        ("ACL_EVENT_EXTERNAL", ACL_EVENT_EXTERNAL as i64),
        ("ACL_EVENT_IPC", ACL_EVENT_IPC as i64),
    ];
    for (name, value) in want {
        assert_eq!(seen.get(*name), Some(value), "{name}");
    }
    assert_eq!(
        seen.len(),
        want.len() + 5,
        "header_drift.c prints constants the test does not check"
    );
}
