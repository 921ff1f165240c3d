"""MPI communicators (``runtime._mpi``) across processes, run under ``mpiexec``.

Each case launches ``mpiexec -n N python mpi_collectives.py ...`` (every collective x op x
dtype x size, checked against numpy in every process) and checks that every process reported
success. Skipped, with the reason, where mpi4py or mpiexec is missing
(``pip install ".[mpi]"`` from a checkout installs both), except under ``RUNTIME_REQUIRE_MPI``
(``scripts/test.sh``, so CI), where that is an error.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "mpi_collectives.py"


def _mpiexec() -> str | None:
    """The mpiexec of the mpich wheel (installed beside the interpreter's scripts), else PATH's."""
    dirs = [pathlib.Path(sys.executable).parent, pathlib.Path(sysconfig.get_path("scripts"))]
    try:
        dirs.append(pathlib.Path(sysconfig.get_path("scripts", f"{os.name}_user")))
    except KeyError:
        pass
    for d in dirs:
        if (d / "mpiexec").exists():
            return str(d / "mpiexec")
    return shutil.which("mpiexec")


def _skip_reason() -> str | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install mpi4py mpich)"
    if _mpiexec() is None:
        return "no mpiexec on PATH or beside the interpreter (pip install mpi4py mpich)"
    return None


if os.environ.get("RUNTIME_REQUIRE_MPI") and _skip_reason() is not None:
    # scripts/test.sh (CI) installs mpi4py and mpich: their absence is a failure, not a skip.
    raise RuntimeError(f"RUNTIME_REQUIRE_MPI is set but {_skip_reason()}")

pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


def run_mpi(
    n: int, *args: str, timeout: float = 600, env: dict | None = None
) -> list[tuple[int, int]]:
    """Run the script on ``n`` processes; (process, checks) of each one's ``ok`` line."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    env.pop("RUNTIME_DEVICE_COUNT", None)
    out = subprocess.run(
        [_mpiexec(), "-n", str(n), sys.executable, str(SCRIPT), *args],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert out.returncode == 0, f"rc {out.returncode}\n{out.stdout}\n{out.stderr}"
    oks = [(int(p), int(k)) for p, k in re.findall(r"ok (\d+) (\d+)", out.stdout)]
    assert sorted(p for p, _ in oks) == list(range(n)), out.stdout
    return oks


@pytest.mark.parametrize(
    ("n", "devices"),
    [(1, "2"), (2, "1"), (2, "2"), (3, "1"), (3, "2"), (3, "1,2,1")],
    ids=["1proc-2dev", "2proc-1dev", "2proc-2dev", "3proc-1dev", "3proc-2dev", "3proc-1,2,1dev"],
)
def test_collectives_match_numpy(n, devices):
    oks = run_mpi(n, "check", devices)
    # every process checked every collective, op, dtype and size on each of its devices
    for process, checks in oks:
        assert checks > 400, (process, checks)


@pytest.mark.parametrize(
    ("n", "devices"),
    [(2, "1"), (2, "2"), (3, "1"), (3, "1,2,1")],
    ids=["2proc-1dev", "2proc-2dev", "3proc-1dev", "3proc-1,2,1dev"],
)
def test_second_round_shapes_match_numpy(n, devices):
    """Issue 25 across processes: bitwise and premul_sum reductions, gather, scatter,
    out-of-place broadcast, per-rank counts, coalesced all_reduce, torch's uneven
    all_to_all_single, split (a color spanning processes gets an MPI communicator of its own)."""
    oks = run_mpi(n, "shapes", devices)
    for process, checks in oks:
        assert checks > 100, (process, checks)


@pytest.mark.parametrize("n", [1, 2])
def test_errors_timeouts_abort(n):
    oks = run_mpi(n, "errors")
    for process, checks in oks:
        assert checks >= 20, (process, checks)


@pytest.mark.parametrize(
    ("n", "case"),
    [(2, "speeds"), (3, "speeds"), (2, "long_group"), (2, "dead"), (3, "dead")],
)
def test_collective_misuse_across_processes(n, case):
    """Issue 22's collective misuse battery under mpiexec: processes at different speeds with
    graph replays between direct collectives (a deadlock before numbering at launch), more
    than 1,024 collectives per rank in one group (blocked on back-pressure), a process that
    stops taking part (named in the timeout; the others go on with a new communicator)."""
    oks = run_mpi(n, "misuse", case, timeout=300)
    assert sum(k for _, k in oks) > 0


@pytest.mark.parametrize("mode", ["check", "errors"])
def test_thread_serialized_mpi(mode):
    """MPI initialised with MPI_THREAD_SERIALIZED: calls serialised by a lock, waits polled."""
    env = {"MPI4PY_RC_THREAD_LEVEL": "serialized"}
    oks = run_mpi(2, *(["check", "2"] if mode == "check" else ["errors"]), env=env)
    assert len(oks) == 2


@pytest.mark.parametrize("devices", ["1", "2"])
def test_data_parallel_example_under_mpiexec(devices):
    example = HERE.parent / "examples" / "data_parallel.py"
    out = subprocess.run(
        [_mpiexec(), "-n", "2", sys.executable, str(example), "--mpi", "--devices", devices],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    ranks = 2 * int(devices)
    assert f"{ranks} ranks (MPI" in out.stdout, out.stdout
    assert "weights match full-batch gradient descent" in out.stdout, out.stdout


def test_bench_mpi_quick(tmp_path):
    """``python -m runtime bench --mpi --quick`` runs both systems at every quick size."""
    out_json = tmp_path / "mpi.json"
    out = subprocess.run(
        [sys.executable, "-m", "runtime", "bench", "--mpi", "--quick", "--json", str(out_json)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    assert "| 64 MiB |" in out.stdout, out.stdout
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["bytes"] for r in rows] == [4 << 10, 1 << 20, 64 << 20]
    for r in rows:
        for system in ("runtime", "mpi4py"):
            assert len(r[system]["samples_us"]) == r["rounds"]
            assert r[system]["us"] > 0 and r[system]["busbw_GBps"] > 0
