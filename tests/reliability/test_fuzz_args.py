"""Fuzzing the argument decoding of the Python API.

One input (a byte string) is decoded into a call: a target (``memcpy_*``, ``memset``,
``device_malloc``, ``empty``, ``to_device``, ``DeviceBuffer.view``, ``Stream.launch_kernel``,
native kernel calls, ``Stream`` / ``Event`` constructors, event and stream methods, waits)
and arguments drawn from a zoo of Python objects: ints at the edges (0, -1, 2**63, 2**64 - 1,
2**200), floats (nan, inf, -0.0, 1e300), strings, bytes, bytearrays, read-only memoryviews,
numpy arrays of every dtype and layout (non-contiguous, Fortran, read-only, 0-d), nested
lists, live / freed / pre-shutdown device buffers and typed views, live / destroyed /
pre-shutdown streams, live / destroyed events, devices, kernels, Python callables and plain
objects. The only outcomes allowed are success or ``TypeError`` / ``ValueError`` /
``runtime.Error`` (``BufferError`` from ``__dlpack__``, as the DLPack protocol requires);
anything else — another exception type, a PanicException, a crash, a hang — is a finding.
After each call a global barrier runs (``KernelError`` from a Python kernel that rejected its
arguments is fine).

Engines:

* atheris (libFuzzer) when it is installed: ``python tests/reliability/test_fuzz_args.py
  -max_total_time=SECONDS CORPUS_OUT tests/reliability/corpus/fuzz_args`` (the test below runs it for
  ``FUZZ_SECONDS``, default 10, in a subprocess, and prints libFuzzer's execution count);
* Hypothesis feeding the same decoder (always, a few hundred inputs);
* the committed corpus ``tests/reliability/corpus/fuzz_args/`` and ``SEEDS`` below, replayed every run.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings

import numpy as np

import runtime
from runtime import kernels

try:
    import atheris
except ImportError:  # pragma: no cover - the Hypothesis engine still runs
    atheris = None

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus", "fuzz_args")
DEVICES = 2
MEMORY = "64MiB"
ALLOWED = (TypeError, ValueError, runtime.Error)
STATS = {"inputs": 0, "calls": 0, "ok": 0, "refused": 0}


class Provider:
    """Reads choices from a byte string (zeros once it is used up)."""

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        b = self.data[self.pos]
        self.pos += 1
        return b

    def int(self, n: int) -> int:
        """0 <= value < n."""
        v = self.byte() | (self.byte() << 8) if n > 256 else self.byte()
        return v % n if n else 0

    def pick(self, seq):
        return seq[self.int(len(seq))]


class World:
    """Objects the decoder can hand out; rebuilt from time to time."""

    def __init__(self):
        self.stale_buf = None
        self.stale_stream = None
        self.reset()

    def reset(self):
        if not runtime.is_initialized():
            runtime.init(device_count=DEVICES, memory=MEMORY)
        self.bufs = [
            runtime.device_malloc(0, 64),
            runtime.device_malloc(1, 256),
            runtime.to_device(np.arange(16, dtype=np.float32)),
            runtime.to_device(np.arange(12, dtype=np.int64).reshape(3, 4)),
            runtime.empty((4, 4), "float64", device=1),
            runtime.device_malloc(0, 0),
        ]
        self.bufs.append(self.bufs[0].view("int32", (4,), 16))
        self.freed = runtime.device_malloc(0, 16)
        runtime.device_free(self.freed)
        self.streams = [runtime.Stream(0), runtime.Stream(1), runtime.default_stream(0)]
        self.dead_stream = runtime.Stream(0)
        self.dead_stream.destroy()
        self.events = [runtime.Event(), runtime.Event(enable_timing=False)]
        self.dead_event = runtime.Event()
        self.dead_event.destroy()

    def make_stale(self):
        """Handles from before a shutdown (made once)."""
        if self.stale_buf is None:
            self.stale_buf = runtime.device_malloc(0, 32)
            self.stale_stream = runtime.Stream(1)
            runtime.shutdown()
            runtime.init(device_count=DEVICES, memory=MEMORY)
            self.reset()


INTS = [
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    16,
    63,
    64,
    65,
    255,
    256,
    4096,
    -1,
    -2,
    2**31,
    2**32,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**63),
    2**200,
    -(2**200),
]
FLOATS = [0.0, -0.0, 0.5, 1.0, 1.5, -1.0, 1e300, -1e300, math.inf, -math.inf, math.nan, 1e-300]
STRS = [
    "",
    "a",
    "0",
    "float32",
    "int64",
    "uint8",
    "float16",
    "noop",
    "fill",
    "copy",
    "add",
    "nope",
    "enableAsync",
    "\x00",
    "é" * 3,
]
DTYPES = [
    np.uint8,
    np.int8,
    np.int32,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.bool_,
    object,
]


def py_noop(*args, **kwargs):
    return None


def py_raise(*args, **kwargs):
    raise ValueError("fuzz kernel rejects its arguments")


def py_touch(*args):
    for a in args:
        if isinstance(a, np.ndarray) and a.size and a.flags.writeable:
            a.reshape(-1)[:1] = 0


def gen_array(p: Provider):
    dt = p.pick(DTYPES)
    shape = tuple(p.int(5) for _ in range(p.int(4)))
    try:
        a = np.zeros(shape, dtype=dt)
    except (TypeError, ValueError):
        a = np.zeros(3, np.uint8)
    k = p.int(6)
    if k == 1 and a.ndim and a.shape[0] > 1:
        a = a[::2]
    elif k == 2 and a.ndim >= 2:
        a = np.asfortranarray(a)
    elif k == 3:
        a.flags.writeable = False
    elif k == 4:
        a = a.T
    return a


def gen(p: Provider, w: World, depth: int = 0):
    """A Python object for an argument."""
    k = p.int(24)
    if k == 0:
        return None
    if k == 1:
        return bool(p.int(2))
    if k in (2, 3, 4):
        return p.pick(INTS)
    if k == 5:
        return p.pick(FLOATS)
    if k == 6:
        return p.pick(STRS)
    if k == 7:
        return bytes(p.int(80))
    if k == 8:
        return bytearray(p.int(80))
    if k == 9:
        mv = memoryview(bytearray(p.int(80)))
        return mv.toreadonly() if p.int(2) else mv
    if k in (10, 11):
        return gen_array(p)
    if k in (12, 13, 14):
        return p.pick(w.bufs)
    if k == 15:
        return p.pick([w.freed, w.stale_buf or w.freed])
    if k == 16:
        return p.pick(w.streams)
    if k == 17:
        return p.pick([w.dead_stream, w.stale_stream or w.dead_stream])
    if k == 18:
        return p.pick(w.events + [w.dead_event])
    if k == 19:
        return runtime.Device(p.int(DEVICES))
    if k == 20:
        return p.pick(
            [
                kernels.noop,
                kernels.fill,
                kernels.copy,
                kernels.add,
                kernels.scale,
                kernels.sum,
                kernels.matmul,
            ]
        )
    if k == 21:
        return p.pick([py_noop, py_raise, py_touch, object(), len])
    if k == 22 and depth < 2:
        items = [gen(p, w, depth + 1) for _ in range(p.int(4))]
        return tuple(items) if p.int(2) else items
    if k == 23:
        return np.float64(p.pick(FLOATS)) if p.int(2) else np.int64(p.pick(INTS[:19]))
    return object()


def call_target(p: Provider, w: World):
    g = lambda: gen(p, w)  # noqa: E731

    def kw(*names):
        return {n: g() for n in names if p.int(2)}

    targets = [
        lambda: runtime.memcpy_host_to_device(
            g(), g(), *([g()] if p.int(2) else []), **kw("count", "dst_offset", "src_offset")
        ),
        lambda: runtime.memcpy_device_to_host(
            g(), g(), *([g()] if p.int(2) else []), **kw("count", "dst_offset", "src_offset")
        ),
        lambda: runtime.memcpy_d2d(
            g(), g(), *([g()] if p.int(2) else []), **kw("count", "dst_offset", "src_offset")
        ),
        lambda: runtime.memset(g(), g(), *([g()] if p.int(2) else []), **kw("offset", "stream")),
        lambda: runtime.device_malloc(g(), g()),
        lambda: runtime.device_free(g()),
        lambda: runtime.empty(g(), *([g()] if p.int(2) else []), **kw("device")),
        lambda: runtime.zeros(g(), *([g()] if p.int(2) else []), **kw("device")),
        lambda: runtime.to_device(g(), **kw("device", "stream")),
        lambda: p.pick(w.bufs + [w.freed]).view(g(), *([g()] if p.int(2) else []), **kw("offset")),
        lambda: p.pick(w.streams + [w.dead_stream]).launch_kernel(g(), g()),
        lambda: p.pick(w.streams).launch_kernel(
            p.pick(
                [
                    kernels.fill,
                    kernels.add,
                    kernels.copy,
                    kernels.scale,
                    kernels.matmul,
                    kernels.sum,
                    "axpy",
                    "mul",
                ]
            ),
            [g() for _ in range(p.int(4))],
        ),
        lambda: p.pick([kernels.fill, kernels.add, kernels.noop])(
            *[g() for _ in range(p.int(4))], **kw("stream")
        ),
        lambda: p.pick(w.streams).launch_host_func(g(), *[g() for _ in range(p.int(3))]),
        lambda: runtime.Stream(*[g() for _ in range(p.int(3))]),
        lambda: runtime.Event(*[g() for _ in range(p.int(3))]),
        lambda: p.pick(w.events + [w.dead_event]).record(*[g() for _ in range(p.int(2))]),
        lambda: p.pick(w.streams + [w.dead_stream]).wait_event(g()),
        lambda: p.pick(w.streams).wait_stream(g()),
        lambda: p.pick(w.events).elapsed_time(g()),
        lambda: p.pick(w.events).synchronize(g()),
        lambda: p.pick(w.streams).synchronize(g()),
        lambda: runtime.stream_synchronize(g()),
        lambda: runtime.Device(g()),
        lambda: runtime.memory_stats(g()),
        lambda: runtime.set_device(g()),
        lambda: runtime.get_device_properties(g()),
        lambda: p.pick(w.bufs).__dlpack__(**kw("max_version", "dl_device", "copy")),
        lambda: p.pick(w.bufs).__array__(*[g() for _ in range(p.int(3))]),
        lambda: runtime.Kernel(g()),
        lambda: runtime.current_stream(g()),
        lambda: runtime.empty_cache(g()),
    ]
    return p.int(len(targets)), targets


def one_input(data: bytes) -> None:
    """Decode and run one input; raise only for a finding."""
    w = WORLD
    p = Provider(data)
    STATS["inputs"] += 1
    for _ in range(1 + p.int(3)):
        i, targets = call_target(p, w)
        STATS["calls"] += 1
        try:
            with warnings.catch_warnings():
                # numpy deprecations for odd dtype names ("a") are numpy's business
                warnings.simplefilter("ignore", DeprecationWarning)
                targets[i]()
            STATS["ok"] += 1
        except ALLOWED:
            STATS["refused"] += 1
        except BufferError:  # __dlpack__ (DLPack protocol)
            STATS["refused"] += 1
        finally:
            runtime.set_device(0)
    try:
        runtime.stream_synchronize(timeout=60)
    except runtime.KernelError:
        pass  # a Python kernel that rejected its fuzzed arguments
    if STATS["inputs"] % 200 == 0:
        for b in w.bufs:
            if not b.freed:
                runtime.device_free(b)
        w.reset()


WORLD: World  # set by setup()


def setup() -> None:
    global WORLD
    runtime.shutdown()
    runtime.init(device_count=DEVICES, memory=MEMORY)
    WORLD = World()
    WORLD.make_stale()


# Seeds always replayed (besides the corpus files): hand-picked byte strings.
SEEDS = [
    b"",
    b"\x00" * 8,
    b"\xff" * 32,
    bytes(range(64)),
    bytes(range(255, 0, -3)),
    b"\x01\x0c\x0c\x03\x03\x03",
    b"\x09\x0d\x0f\x02\x10\x02\x11",
    b"\x0b\x10\x01\x0c\x0c\x04\x05",
]


def corpus_inputs() -> list[bytes]:
    out = list(SEEDS)
    if os.path.isdir(CORPUS):
        for name in sorted(os.listdir(CORPUS)):
            with open(os.path.join(CORPUS, name), "rb") as f:
                out.append(f.read())
    return out


# ------------------------------------------------------------------------------ pytest

pytest = None
if __name__ != "__main__":  # under pytest (the atheris subprocess does not need these)
    import pytest
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

if pytest is not None:

    @pytest.fixture(scope="module", autouse=True)
    def _runtime():
        setup()
        yield
        runtime.shutdown()

    def test_corpus_and_seeds_replay():
        inputs = corpus_inputs()
        assert len(inputs) >= 20, "the fuzz_args corpus is missing"
        for data in inputs:
            one_input(data)

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.binary(max_size=96))
    def test_fuzz_args_hypothesis(data):
        one_input(data)

    @pytest.mark.skipif(atheris is None, reason="atheris is not installed")
    def test_fuzz_args_atheris():
        seconds = int(float(os.environ.get("FUZZ_SECONDS", "10")))
        out = tempfile.mkdtemp(prefix="fuzz_args_corpus_")
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    f"-max_total_time={seconds}",
                    "-rss_limit_mb=4096",
                    "-timeout=60",
                    "-print_final_stats=1",
                    f"-artifact_prefix={out}/",
                    out,
                    CORPUS,
                ],
                capture_output=True,
                text=True,
                timeout=seconds + 300,
            )
            log = proc.stdout + proc.stderr
            runs = re.search(r"Done (\d+) runs in (\d+) second", log)
            tail = "\n".join(log.splitlines()[-40:])
            assert proc.returncode == 0, (
                f"atheris found a failing input (exit {proc.returncode}):\n{tail}"
            )
            assert runs, f"no libFuzzer summary:\n{tail}"
            print(f"\nfuzz_args (atheris): {runs.group(1)} executions in {runs.group(2)} s")
        finally:
            shutil.rmtree(out, ignore_errors=True)


def main() -> None:  # pragma: no cover - the atheris entry point
    # Coverage feedback from the decoder and the runtime's Python layer (instrumenting every
    # loaded module, numpy included, takes minutes).
    for f in (one_input, call_target, gen, gen_array, Provider.int, Provider.pick):
        atheris.instrument_func(f)
    for name in ("zeros", "synchronize", "memset_async", "memory_summary"):
        atheris.instrument_func(getattr(runtime, name))
    setup()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
