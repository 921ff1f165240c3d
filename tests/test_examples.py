"""Every example in examples/ runs to completion (each in its own interpreter) and prints
what it should: its whole output is checked against the expectation below, values included
(01 and 03 are the seed's examples, verbatim: they check nothing themselves)."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_there_are_examples():
    assert len(EXAMPLES) >= 6


DEVICE = r"Device (\d): Virtual Ascend 910 \(host-backed\)\n  Memory: 32 GiB\n  Compute: 1000 MHz\n"


def _devices(m: re.Match) -> None:
    assert [int(i) for i in re.findall(r"Device (\d):", m.string)] == list(range(8))


def _elapsed(m: re.Match) -> None:
    assert 0.0 <= float(m.group(1)) < 60_000.0  # a real duration of a 4 MiB copy, in ms


def _round_trip(m: re.Match) -> None:
    assert len(m.group(1).split()) == 3  # the first three values of the host data


def _timings(m: re.Match) -> None:
    rows = m.group(1).splitlines()
    assert any("Python callable" in r for r in rows)  # the one form that needs nothing
    assert all(float(r.split()[-1]) > 0.0 for r in rows)  # real times of real launches


#: Each example's whole output (a regex) and a check of the values it matched.
EXPECT = {
    "01_devices": (r"Available devices: 8\n(?:" + DEVICE + r"){8}", _devices),
    "02_memory": (r"round trip ok: \[([-0-9.e ]+)\]\n", _round_trip),
    "03_streams_events": (r"Elapsed: (\d+\.\d{3}) ms\n", _elapsed),
    "04_batch": (r"three streams copied 12582912 bytes\n", None),
    "05_pipeline": (r"pipelined 8 chunks of 4 MiB on 2 streams\n", None),
    "06_producer_consumer": (r"consumer summed 16 buffers produced on another thread\n", None),
    "data_parallel": (
        r"8 ranks \(one process, 8 device\(s\) per process\): 20 steps, loss (0\.\d+), "
        r"weights match full-batch gradient descent\n",
        lambda m: float(m.group(1)) < 0.01,
    ),
    "ipc_producer_consumer": (
        r"consumer process summed 8 buffers shared by the producer process\n",
        None,
    ),
    "custom_operator": (
        r"(?:numba is not installed: skipping the @cfunc kernel \(pip install numba\)\n)?"
        r"(?:no C compiler \(cc\) found: skipping the C kernel\n)?"
        r"add_custom of 1,048,576 float32, checked against numpy; ms per launch:\n"
        r"((?:  \S.{39} +\d+\.\d{3}\n)+)"
        r"\(device runtime\.Device\(0\) has \d+ host cores to run blocks on\)\n",
        _timings,
    ),
}


def test_every_example_has_an_expectation():
    assert sorted(EXPECT) == sorted(p.stem for p in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    out = subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    pattern, check = EXPECT[path.stem]
    m = re.fullmatch(pattern, out.stdout)
    assert m, f"unexpected output of {path.name}:\n{out.stdout}"
    if check is not None:
        assert check(m) is not False, out.stdout


def test_pipeline_example_writes_a_trace(tmp_path):
    trace = tmp_path / "trace.json"
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "05_pipeline.py"), str(trace)],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=120,
    )
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["name"] for e in events}
    assert {"memcpy_h2d", "scale", "memcpy_d2h"} <= names


@pytest.mark.skipif(shutil.which("cargo") is None, reason="needs cargo")
def test_rust_example_runs():
    out = subprocess.run(
        ["cargo", "run", "-q", "-p", "runtime-core", "--example", "two_streams"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "x[1023] = 9" in out.stdout
