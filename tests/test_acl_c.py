"""The ACL C library (``libascendcl.so``) from C and C++, as installed in the package.

The C programs of ``crates/runtime-acl/tests/c`` (memory round trips, streams and events with
timing, callbacks with a report thread, every error path, the header-drift check) are built the
way the public Ascend samples build — CMake with ``INSTALL_DIR=$(python -m runtime.acl
--prefix)`` — and with plain ``cc $(python -m runtime.acl --cflags --libs)``, then run, and run
again under valgrind where it is installed. One runtime per process: a Python process that
calls the library through ``ctypes`` shares devices, memory, handles and error messages with
``runtime`` and ``runtime.acl``, whichever comes first. The C example of ``docs/c.md`` compiles
and runs as shown. With ``ASCEND_SAMPLES_DIR`` set to a checkout of
https://github.com/Ascend/samples (Apache-2.0), the C++ sample
``memcpy_host_device_async_cpp`` builds with its own CMakeLists, unchanged, and runs to its
success message.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from runtime.acl import clib

ROOT = pathlib.Path(__file__).resolve().parent.parent
CDIR = ROOT / "crates" / "runtime-acl" / "tests" / "c"
PROGRAMS = [
    "memory",
    "streams_events",
    "callbacks",
    "errors",
    "fork",
    "header_drift",
    "device_status",
]
#: small virtual devices: the programs need little, and valgrind limits the address space
ENV = {**os.environ, "RUNTIME_DEVICE_COUNT": "2", "RUNTIME_DEVICE_MEMORY": "1GiB"}
SAMPLES = os.environ.get("ASCEND_SAMPLES_DIR")
SAMPLE = "cplusplus/level1_single_api/1_acl/2_memory_management/memcpy_host_device_async_cpp"


def _compiler(names: tuple[str, ...]) -> str | None:
    for n in names:
        path = shutil.which(n)
        if path:
            return path
    return None


CC = _compiler((os.environ.get("CC", "cc"), "cc", "gcc", "clang"))
CXX = _compiler((os.environ.get("CXX", "c++"), "c++", "g++", "clang++"))
needs_cc = pytest.mark.skipif(
    CC is None, reason="no C compiler (cc, gcc or clang) on PATH: the C library's tests need one"
)


def test_required_tools_are_there():
    # CI sets RUNTIME_ACL_REQUIRE_TOOLS=1: there the C tests must not skip for lack of a tool.
    if os.environ.get("RUNTIME_ACL_REQUIRE_TOOLS") != "1":
        pytest.skip("RUNTIME_ACL_REQUIRE_TOOLS is not set (CI sets it)")
    missing = [
        name
        for name, found in (
            ("a C compiler", CC),
            ("a C++ compiler", CXX),
            ("cmake", shutil.which("cmake")),
            ("valgrind", shutil.which("valgrind")),
        )
        if not found
    ]
    assert not missing, f"missing: {', '.join(missing)}"


def run(cmd, **kw):
    kw.setdefault("env", ENV)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)


def check_program(out, name):
    assert out.returncode == 0, f"{name}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    if name == "header_drift":
        assert "fn aclInit 1" in out.stdout and "ACL_ERROR_REPEAT_FINALIZE 100037" in out.stdout
    else:
        assert "run success!" in out.stdout, out.stdout


@pytest.fixture(scope="module")
def prefix():
    return pathlib.Path(clib.prefix())


def test_prefix_is_laid_out_like_cann(prefix):
    lib = prefix / "runtime/lib64/libascendcl.so"
    assert lib.is_file()
    for name in ("runtime/lib64/stub/libascendcl.so", "lib64/libacl_rt.so", "lib64/libascendcl.so"):
        assert (prefix / name).resolve() == lib.resolve(), name
    for d in ("runtime/include/acl", "include/acl"):
        assert {p.name for p in (prefix / d).glob("*.h")} >= {
            "acl.h",
            "acl_base.h",
            "acl_rt.h",
            "acl_op.h",
            "acl_mdl.h",
        }
    out = run([sys.executable, "-m", "runtime.acl", "--cflags", "--libs"])
    assert out.returncode == 0
    assert out.stdout.split() == [
        f"-I{prefix}/runtime/include",
        f"-L{prefix}/runtime/lib64",
        f"-Wl,-rpath,{prefix}/runtime/lib64",
        "-lascendcl",
    ]
    assert run([sys.executable, "-m", "runtime.acl", "--prefix"]).stdout.strip() == str(prefix)
    bad = run([sys.executable, "-m", "runtime.acl", "--prefix", "--libs"])
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


@pytest.fixture(scope="module")
def cmake_build(prefix, tmp_path_factory):
    if CC is None:
        pytest.skip("no C compiler on PATH")
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not installed (pip install cmake): the CMake builds are skipped")
    build = tmp_path_factory.mktemp("acl-c-cmake")
    env = {**ENV, "INSTALL_DIR": str(prefix), "CC": CC}
    out = run([cmake, "-S", CDIR, "-B", build], env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    out = run([cmake, "--build", build, "-j", "2"], env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return build


@pytest.mark.parametrize("name", PROGRAMS)
def test_cmake_built_program_runs(name, prefix, cmake_build):
    # As the samples run: the library found through LD_LIBRARY_PATH=<prefix>/runtime/lib64.
    env = {**ENV, "LD_LIBRARY_PATH": str(prefix / "runtime/lib64")}
    check_program(run([cmake_build / name], env=env), name)


@pytest.fixture(scope="module")
def cc_build(prefix, tmp_path_factory):
    if CC is None:
        pytest.skip("no C compiler on PATH")
    flags = run([sys.executable, "-m", "runtime.acl", "--cflags", "--libs"]).stdout.split()
    build = tmp_path_factory.mktemp("acl-c-cc")
    for name in PROGRAMS:
        cmd = [CC, "-std=c11", "-Wall", "-Wextra", "-Werror", CDIR / f"{name}.c"]
        out = run([*cmd, *flags, "-lpthread", "-o", build / name])
        assert out.returncode == 0, f"{name}.c:\n{out.stderr}"
    return build


@needs_cc
@pytest.mark.parametrize("name", PROGRAMS)
def test_cc_built_program_runs(name, cc_build):
    # --libs carries an rpath: no LD_LIBRARY_PATH needed.
    check_program(run([cc_build / name]), name)


@needs_cc
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
@pytest.mark.parametrize(
    "name", ["memory", "streams_events", "callbacks", "errors", "device_status"]
)
def test_program_under_valgrind(name, cc_build):
    # errors.c hands the library unmapped and read-only host addresses on purpose: the library
    # lets the kernel check them (process_vm_readv), which valgrind reports as syscall
    # parameters; valgrind.supp names exactly those.
    cmd = [
        "valgrind",
        "-q",
        "--error-exitcode=99",
        f"--suppressions={CDIR / 'valgrind.supp'}",
        cc_build / name,
    ]
    out = run(cmd)
    check_program(out, name)
    assert "==" not in out.stderr, out.stderr  # no valgrind report at all


@needs_cc
def test_link_by_libacl_rt_name(prefix, tmp_path):
    # Newer CANN examples link <prefix>/lib64/libacl_rt.so; its SONAME is libascendcl.so, so a
    # process that names both still loads one copy (one runtime).
    exe = tmp_path / "memory"
    inc = f"-I{prefix}/runtime/include"
    out = run([CC, "-std=c11", inc, CDIR / "memory.c", prefix / "lib64/libacl_rt.so", "-o", exe])
    assert out.returncode == 0, out.stderr
    env = {**ENV, "LD_LIBRARY_PATH": str(prefix / "runtime/lib64")}
    check_program(run([exe], env=env), "memory")


@pytest.mark.skipif(CXX is None, reason="no C++ compiler on PATH")
def test_headers_compile_as_cxx_with_cann_types(prefix, tmp_path):
    # The samples are C++: enum-typed arguments (aclrtRunMode *, aclrtMemcpyKind) must match.
    src = tmp_path / "types.cpp"
    src.write_text(
        textwrap.dedent(
            """
            #include <cstdio>
            #include "acl/acl.h"
            int main() {
                aclrtRunMode mode = ACL_DEVICE;
                if (aclrtGetRunMode(&mode) != ACL_SUCCESS || mode != ACL_HOST) return 1;
                aclrtEventRecordedStatus st = ACL_EVENT_RECORDED_STATUS_NOT_READY;
                aclError (*q)(aclrtEvent, aclrtEventRecordedStatus *) = aclrtQueryEventStatus;
                (void)q; (void)st;
                std::printf("run success!\\n");
                return 0;
            }
            """
        )
    )
    flags = run([sys.executable, "-m", "runtime.acl", "--cflags", "--libs"]).stdout.split()
    out = run([CXX, "-std=c++11", "-Wall", "-Werror", src, *flags, "-o", tmp_path / "types"])
    assert out.returncode == 0, out.stderr
    check_program(run([tmp_path / "types"]), "types")


# --------------------------------------------------------------------------- one runtime


def python(code: str, *args: str):
    out = run([sys.executable, "-c", textwrap.dedent(code), *args])
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_one_runtime_python_first():
    out = python(
        """
        import ctypes, threading, time
        import numpy as np
        import runtime
        import runtime.acl as acl
        from runtime.acl import clib, _state

        runtime.init(device_count=2, memory="1GiB")
        lib = ctypes.CDLL(clib.library())
        lib.aclGetRecentErrMsg.restype = ctypes.c_char_p
        assert acl.init() == 0 and acl.rt.set_device(0) == 0
        # ACL is one: already initialised for C, same device count, same current context
        assert lib.aclInit(None) == acl.ACL_ERROR_REPEAT_INITIALIZE
        assert b"already initialized" in lib.aclGetRecentErrMsg()
        n = ctypes.c_uint32()
        assert lib.aclrtGetDeviceCount(ctypes.byref(n)) == 0 and n.value == 2
        ctx = ctypes.c_void_p()
        assert lib.aclrtGetCurrentContext(ctypes.byref(ctx)) == 0
        assert ctx.value == acl.rt.get_context()[0]

        # memory allocated through C is the runtime's: memory_allocated sees it
        before = runtime.memory_allocated(0)
        dev = ctypes.c_void_p()
        assert lib.aclrtMalloc(ctypes.byref(dev), 1 << 20, 0) == 0
        assert runtime.memory_allocated(0) >= before + (1 << 20)

        # an event recorded from Python is waited on from C
        stream, _ = acl.rt.create_stream()
        event, _ = acl.rt.create_event()
        done = []

        def slow():
            time.sleep(0.2)
            done.append(1)

        _state.stream_of(stream, "test").launch_host_func(slow)
        assert acl.rt.memset_async(dev.value, 1 << 20, 7, 1 << 20, stream) == 0
        assert acl.rt.record_event(event, stream) == 0
        cstream = ctypes.c_void_p()
        assert lib.aclrtCreateStream(ctypes.byref(cstream)) == 0
        assert lib.aclrtStreamWaitEvent(cstream, ctypes.c_void_p(event)) == 0
        back = (ctypes.c_uint8 * (1 << 20))()
        assert lib.aclrtMemcpyAsync(back, 1 << 20, dev, 1 << 20, 2, cstream) == 0
        assert lib.aclrtSynchronizeEvent(ctypes.c_void_p(event)) == 0
        assert done == [1]
        assert lib.aclrtSynchronizeStream(cstream) == 0
        assert set(bytes(back)) == {7}

        # C's pointer is known to Python's table, and the other way round
        host, _ = acl.rt.malloc_host(16)
        assert acl.rt.memcpy(host, 16, dev.value, 16, 2) == 0
        assert acl.util.ptr_to_bytes(host, 16) == bytes([7]) * 16
        assert lib.aclrtFreeHost(ctypes.c_void_p(host)) == 0
        # a C failure's message is this thread's, read from Python
        assert lib.aclrtFree(None) == acl.ACL_ERROR_INVALID_PARAM
        assert "aclrtFree" in acl.get_recent_err_msg()
        assert lib.aclrtDestroyStream(cstream) == 0
        # Python's finalize releases what C allocated
        assert acl.finalize() == 0
        assert runtime.memory_allocated(0) == before
        assert lib.aclrtSetDevice(0) == acl.ACL_ERROR_UNINITIALIZE
        print("one runtime")
        """
    )
    assert out.strip() == "one runtime"


def test_one_runtime_c_first():
    # The library is loaded and called before anything imported runtime: it imports the
    # extension itself, so `import runtime` afterwards finds the same runtime.
    out = python(
        """
        import ctypes, sys
        lib = ctypes.CDLL(sys.argv[1])
        assert "runtime" not in sys.modules
        assert lib.aclInit(None) == 0 and lib.aclrtSetDevice(0) == 0
        assert "runtime._runtime" in sys.modules
        dev = ctypes.c_void_p()
        assert lib.aclrtMalloc(ctypes.byref(dev), 4096, 0) == 0
        import runtime, runtime.acl as acl
        assert runtime.is_initialized() and runtime.get_device_count() == 2
        assert runtime.memory_allocated(0) >= 4096
        assert acl.rt.get_device() == (0, 0)
        assert acl.rt.free(dev.value) == 0
        assert lib.aclrtFree(dev) == acl.ACL_ERROR_INVALID_PARAM
        assert lib.aclFinalize() == 0 and not runtime.is_initialized()
        print("one runtime")
        """,
        clib.library(),
    )
    assert out.strip() == "one runtime"


def test_device_and_event_queries_agree_between_c_and_python():
    # aclrtQueryEventWaitStatus, aclrtQueryDeviceStatus, aclrtGetDeviceUtilizationRate and
    # aclrtGet/PeekAtLastError called through the C library in a Python process answer from
    # the same runtime as acl.rt's query_event_wait_status, query_device_status,
    # get_device_utilization_rate and get/peek_at_last_error: same values, same windows,
    # same per-thread last error.
    out = python(
        """
        import ctypes, time
        import runtime
        import runtime.acl as acl
        from runtime.acl import clib, _state

        class Info(ctypes.Structure):
            _fields_ = [
                ("cube", ctypes.c_int32),
                ("vector", ctypes.c_int32),
                ("aicpu", ctypes.c_int32),
                ("memory", ctypes.c_int32),
                ("extend", ctypes.c_void_p),
            ]

        runtime.init(device_count=2, memory="1GiB")
        lib = ctypes.CDLL(clib.library())
        assert acl.init() == 0 and acl.rt.set_device(0) == 0

        # device status: C and Python agree, for good and bad ids
        st = ctypes.c_int(-7)
        for d in (0, 1):
            assert lib.aclrtQueryDeviceStatus(d, ctypes.byref(st)) == 0
            assert (st.value, 0) == acl.rt.query_device_status(d)
            assert st.value == acl.ACL_RT_DEVICE_STATUS_NORMAL
        bad = lib.aclrtQueryDeviceStatus(2, ctypes.byref(st))
        assert bad == acl.rt.query_device_status(2)[1] == acl.ACL_ERROR_RT_INVALID_DEVICEID
        # the C failure is this thread's last error, read from Python (peek keeps it)
        assert lib.aclrtQueryDeviceStatus(0, None) == acl.ACL_ERROR_INVALID_PARAM
        assert acl.rt.peek_at_last_error(0) == acl.ACL_ERROR_INVALID_PARAM
        assert lib.aclrtGetLastError(0) == acl.ACL_ERROR_INVALID_PARAM
        assert acl.rt.get_last_error(0) == 0 and lib.aclrtPeekAtLastError(0) == 0
        # ... and a Python failure is C's
        assert acl.rt.query_event_wait_status(12345)[1] == acl.ACL_ERROR_INVALID_RESOURCE_HANDLE
        assert lib.aclrtPeekAtLastError(0) == acl.ACL_ERROR_INVALID_RESOURCE_HANDLE
        assert lib.aclrtGetLastError(0) == acl.ACL_ERROR_INVALID_RESOURCE_HANDLE

        # utilisation: one window per device, whichever face asks
        info = Info()
        acl.rt.get_device_utilization_rate(1)  # Python opens the window
        s = runtime.Stream(1)
        for _ in range(3):
            s.launch_host_func(time.sleep, 0.03)
        s.synchronize()
        assert lib.aclrtGetDeviceUtilizationRate(1, ctypes.byref(info)) == 0  # C closes it
        assert 1 <= info.cube <= 100, info.cube
        assert (info.vector, info.aicpu, info.memory, info.extend) == (-1, -1, -1, None)
        py, ret = acl.rt.get_device_utilization_rate(1)  # nothing ran since C's query
        assert ret == 0 and py["cube_utilization"] == 0
        assert (py["vector_utilization"], py["aicpu_utilization"]) == (info.vector, info.aicpu)
        assert py["memory_utilization"] == info.memory

        # event wait status: a Python-made event queried from C, before and after the wait
        a, _ = acl.rt.create_stream()
        b, _ = acl.rt.create_stream()
        ev, _ = acl.rt.create_event()
        gate = runtime.UserEvent()
        _state.stream_of(a, "test").wait_event(gate)  # a runs nothing until the gate opens
        assert acl.rt.record_event(ev, a) == 0
        assert acl.rt.stream_wait_event(b, ev) == 0
        assert lib.aclrtQueryEventWaitStatus(ctypes.c_void_p(ev), ctypes.byref(st)) == 0
        assert st.value == acl.ACL_EVENT_WAIT_STATUS_NOT_READY
        assert acl.rt.query_event_wait_status(ev) == (st.value, 0)
        gate.set()
        assert acl.rt.synchronize_stream(b) == 0
        assert lib.aclrtQueryEventWaitStatus(ctypes.c_void_p(ev), ctypes.byref(st)) == 0
        assert st.value == acl.ACL_EVENT_WAIT_STATUS_COMPLETE
        assert acl.rt.query_event_wait_status(ev) == (st.value, 0)
        for h in (a, b):
            assert acl.rt.destroy_stream(h) == 0
        assert acl.rt.destroy_event(ev) == 0
        assert acl.finalize() == 0
        print("agree")
        """
    )
    assert out.strip() == "agree"


# --------------------------------------------------------------------------- docs, samples


def first_c_block(page):
    blocks = re.findall(r"```c\n(.*?)```", (ROOT / page).read_text(encoding="utf-8"), re.S)
    assert blocks, f"{page} has a ```c block"
    return blocks[0]


@needs_cc
@pytest.mark.parametrize("page", ["docs/c.md", "README.md"])
def test_docs_c_example_compiles_and_runs(page, tmp_path):
    src = tmp_path / "example.c"
    src.write_text(first_c_block(page))
    flags = run([sys.executable, "-m", "runtime.acl", "--cflags", "--libs"]).stdout.split()
    out = run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", src, *flags, "-o", tmp_path / "ex"])
    assert out.returncode == 0, out.stderr
    res = run([tmp_path / "ex"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "back[255] = 255.0"


@pytest.mark.skipif(
    not SAMPLES, reason="ASCEND_SAMPLES_DIR (a checkout of Ascend/samples) is not set"
)
def test_public_sample_builds_unchanged_and_runs(prefix, tmp_path):
    cmake = shutil.which("cmake")
    if cmake is None or CXX is None:
        pytest.skip("cmake and a C++ compiler are needed")
    src = pathlib.Path(SAMPLES) / SAMPLE
    # The sample puts its program in ../../../out from the build's src/: tmp_path/out here.
    build = tmp_path / "x" / "build"
    env = {**ENV, "INSTALL_DIR": str(prefix), "CPU_ARCH": os.uname().machine, "CXX": CXX}
    out = run([cmake, "-S", src, "-B", build, "-DCMAKE_SKIP_RPATH=TRUE"], env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    out = run([cmake, "--build", build], env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    exe = next(p for p in tmp_path.rglob("main") if p.is_file() and os.access(p, os.X_OK))
    env = {**ENV, "LD_LIBRARY_PATH": str(prefix / "runtime/lib64")}
    args = ["--release_cycle", "2", "--number_of_cycles", "2", "--device_id", "0"]
    res = run([exe, *args, "--memory_size", "10485760"], env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "run success!" in res.stdout
    assert "At write back memcpy host data is 7" in res.stdout


@needs_cc
def test_c_abi_benchmark_runs(tmp_path):
    # BENCHMARKS.md's C-ABI rows come from this command; one short round here.
    path = tmp_path / "bench.json"
    out = run(
        [sys.executable, "-m", "runtime.bench.acl_c", "--rounds", "1", "--batch", "20"]
        + ["--json", path]
    )
    assert out.returncode == 0, out.stdout + out.stderr
    import json

    rows = json.loads(path.read_text())["rows"]
    assert [r["op"] for r in rows] == [
        "malloc_free_1MiB",
        "create_stream",
        "record_event",
        "memcpy_async_1MiB_sync",
        "callback_round_trip",
    ]
    for r in rows:
        assert r["c_us"] > 0 and r["acl_us"] > 0 and r["native_us"] > 0
    table_rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert len(table_rows) == len(rows) + 1  # the header and one row per operation
