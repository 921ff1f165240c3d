"""The pyACL sample scripts in examples/acl/ run under ``python -m runtime.acl`` and print
what they print on an NPU: the same stages, the same data, ``run success!``.

The scripts are equivalents of the Ascend/samples memory-management and single-operator
samples (see each file's docstring). Set ``ASCEND_SAMPLES_DIR`` to a checkout of
https://github.com/Ascend/samples to run the originals, unmodified, too.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "acl"
SAMPLES = os.environ.get("ASCEND_SAMPLES_DIR")
ACL_DIR = "python/level1_single_api/1_acl"


def run_acl(script, *args, cwd=None):
    out = subprocess.run(
        [sys.executable, "-m", "runtime.acl", str(script), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "failed ret" not in out.stdout + out.stderr, out.stdout + out.stderr
    return out.stdout, out.stderr


def _check_memcpy_log(log, size, views):
    """Each view of the data shows the 7s the sample's memset wrote; memory is reported."""
    for label in views:
        shown = re.findall(re.escape(label) + r" is \[([^\]]*)\]", log)
        assert shown, f"no '{label}' line in:\n{log}"
        for s in shown:
            assert set(s.replace("...", " ").split()) == {"7"}
    hbm = re.findall(r"HBM free memory:(\d+) Byte, HBM total memory:(\d+) Byte", log)
    assert len(hbm) >= 2
    frees = [int(f) for f, _ in hbm]
    total = int(hbm[0][1])
    assert frees[0] == total  # nothing allocated yet
    assert min(frees) <= total - size  # the sample's buffers were counted
    assert frees[-1] == total  # all freed again
    assert re.search(r"DDR free memory:0 Byte, DDR total memory:0 Byte", log)


@pytest.mark.parametrize("size", [64, 10485760])
def test_memcpy_host_device(size):
    out, log = run_acl(
        EXAMPLES / "memcpy_host_device.py",
        "--release_cycle",
        "1",
        "--write_back_host",
        "--memory_size",
        str(size),
    )
    _check_memcpy_log(
        log, size, ["At first memset host data", "At memcpy device data", "Write back host data"]
    )
    assert f"memory size : {size} Bytes" in log


def test_memcpy_host_device_async():
    out, log = run_acl(
        EXAMPLES / "memcpy_host_device_async.py", "--release_cycle", "1", "--memory_size", "4096"
    )
    _check_memcpy_log(log, 4096, ["At first memset host data", "At memcpy device data"])
    assert out.strip().endswith("run success!")


def test_memcpy_host_dvpp():
    out, log = run_acl(
        EXAMPLES / "memcpy_host_dvpp.py",
        "--release_cycle",
        "1",
        "--memory_size",
        "4096",
        "--memory_reuse",
    )
    _check_memcpy_log(log, 4096, ["At first memset host data", "At memcpy device data"])
    assert out.strip().endswith("run success!")


def _matrix(text):
    return np.array([[int(v) for v in row.split()] for row in re.findall(r"\[([\d\s]+)\]", text)])


def _check_add_output(out):
    stages = [
        "init resource stage:",
        "init resource success",
        "gen input data stage:",
        "gen input data success",
        "gen output data stage:",
        "gen output data success",
        "execute stage:",
        "execute success",
        "get operator result stage:",
        "shape: (8, 16)",
        "get operator result success",
        "release source stage:",
        "release source success",
    ]
    pos = [out.index(s) for s in stages]
    assert pos == sorted(pos)
    a_text = out[out.index("factor_a:") : out.index("factor_b:")]
    b_text = out[out.index("factor_b:") : out.index("init resource stage:")]
    c_text = out[out.index("ACL output:") : out.index("get operator result success")]
    a, b, c = _matrix(a_text), _matrix(b_text), _matrix(c_text)
    assert a.shape == b.shape == c.shape == (8, 16)
    assert np.array_equal(c, a + b)


def test_execute_add(tmp_path):
    out, _ = run_acl(EXAMPLES / "acl_execute_add.py", cwd=tmp_path)
    _check_add_output(out)


@pytest.mark.skipif(
    not SAMPLES, reason="ASCEND_SAMPLES_DIR (a checkout of Ascend/samples) is not set"
)
def test_original_samples_unmodified():
    base = pathlib.Path(SAMPLES) / ACL_DIR
    mm = base / "2_memory_management"
    _, log = run_acl(
        mm / "memcpy_host_device_python/src/memcpy_host_device.py",
        "--release_cycle",
        "1",
        "--write_back_host",
        "--memory_size",
        "4096",
    )
    _check_memcpy_log(
        log, 4096, ["At first memset host data", "At memcpy device data", "Write back host data"]
    )
    out, log = run_acl(
        mm / "memcpy_host_device_async_python/src/memcpy_host_device_async_python.py",
        "--release_cycle",
        "1",
        "--memory_size",
        "4096",
    )
    _check_memcpy_log(log, 4096, ["At first memset host data", "At memcpy device data"])
    assert out.strip().endswith("run success!")
    out, log = run_acl(
        mm / "memcpy_host_DVPP_python/src/memcpy_host_dvpp.py",
        "--release_cycle",
        "1",
        "--memory_size",
        "4096",
    )
    _check_memcpy_log(log, 4096, ["At first memset host data", "At memcpy device data"])
    add = base / "4_blas/acl_operator_add/src/acl_execute_add.py"
    out, _ = run_acl(add, cwd=add.parent)
    _check_add_output(out)
