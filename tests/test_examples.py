"""Every example in examples/ runs to completion (each in its own interpreter)."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_there_are_examples():
    assert len(EXAMPLES) >= 6


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path, tmp_path):
    out = subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


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
