#!/usr/bin/env bash
# Every test, Rust and Python: builds and installs the wheel, then runs cargo test and pytest.
# Usage: bash scripts/test.sh [extra pytest args]
#
# It installs into the Python that `python3` runs (the active virtualenv, if any): the test
# tools (maturin, numpy, pytest, hypothesis), the optional atheris, numba and ml_dtypes, the required
# mpi4py and mpich, and this package's wheel (runtime-vdev, replacing any installed one).
# Activate a virtualenv first to keep them out of the system Python:
# python3 -m venv .venv && . .venv/bin/activate.
# CI (.ci/run) relies on the wheel being installed there afterwards.
#
# Build products stay in target/ (cargo's cache, so the next run is fast): 1.2 GB in a fresh
# clone with the workspace's dev profile (line tables only, no debug info for dependencies).
# `cargo clean` removes it.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(python3 -c 'import sys; print(sys.executable)')
if python3 -c 'import sys; sys.exit(sys.prefix != sys.base_prefix)'; then
  echo "scripts/test.sh: installing the test tools and the wheel into $py (no virtualenv is active)"
else
  echo "scripts/test.sh: installing the test tools and the wheel into the virtualenv of $py"
fi
python3 -m pip install -q "maturin>=1.5,<2" numpy pytest hypothesis
# Required, not optional: the per-test timeout (a deadlock fails the run instead of hanging
# it) and matplotlib (trace-plot drawing is tested). A failed install fails the run here.
python3 -m pip install -q pytest-timeout matplotlib
# Optional: atheris runs the 10 s argument fuzz; without it that one test is skipped.
python3 -m pip install -q atheris 2>/dev/null || echo "atheris not installable: its fuzz test will be skipped"
# Optional: numba (the [numba] extra) runs the @cfunc kernel tests; without it they are skipped.
python3 -m pip install -q numba 2>/dev/null || echo "numba not installable: the @cfunc kernel tests will be skipped"
# Optional: ml_dtypes (the [bfloat16] extra, a small wheel) gives numpy bfloat16; without it
# tests/test_bfloat16.py is skipped.
python3 -m pip install -q ml_dtypes 2>/dev/null || echo "ml_dtypes not installable: the bfloat16 tests will be skipped"
# Required: mpi4py and the mpich wheel (its mpiexec) run the MPI tests under mpiexec -n 1/2/3
# (runtime._mpi is tested nowhere else), so a failed install fails the run, and
# RUNTIME_REQUIRE_MPI makes those tests fail rather than skip if MPI is still missing.
python3 -m pip install -q mpi4py mpich || { echo "error: mpi4py/mpich failed to install; the MPI tests cannot run" >&2; exit 1; }
export RUNTIME_REQUIRE_MPI=1
# The runtime's settings from the environment (the ENV_* constants of the core's config module)
# change what the tests see (RUNTIME_LAUNCH_BLOCKING=1 makes every launch synchronous): the
# suite tests the defaults, so values exported in this shell are dropped, saying so.
for v in $(sed -n 's/^pub const ENV_[A-Z_]*: &str = "\([A-Z_]*\)";$/\1/p' crates/runtime-core/src/config/mod.rs); do
  if [ -n "${!v+set}" ]; then
    echo "scripts/test.sh: ignoring $v=${!v} from the environment: the tests check the defaults"
    unset "$v"
  fi
done
# The ACL C library's tests build C programs with CMake, as the public Ascend samples do.
command -v cmake >/dev/null 2>&1 || python3 -m pip install -q cmake || echo "cmake not installable: the CMake builds of the C tests will be skipped"
# A hung Rust test fails the run within 40 minutes instead of using up CI's whole budget.
timeout --signal=KILL 2400 cargo test --workspace
rm -rf target/wheels
maturin build --release -q -o target/wheels
# The distribution is runtime-vdev (import name: runtime); wheel files spell it runtime_vdev.
wheels=(target/wheels/runtime_vdev-*.whl)
if [ "${#wheels[@]}" -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
  echo "scripts/test.sh: expected one wheel target/wheels/runtime_vdev-*.whl, found: ${wheels[*]}" >&2
  exit 1
fi
# This project was once installed under the distribution name "runtime" (taken on PyPI by an
# unrelated package): drop such an install of ours, recognised by its extension module, so that
# two distributions do not claim the same files.
python3 - <<'EOF'
import importlib.metadata as md
import subprocess
import sys

try:
    files = md.distribution("runtime").files or []
except md.PackageNotFoundError:
    files = []
if any(str(f).startswith("runtime/_runtime") for f in files):
    subprocess.check_call([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "runtime"])
EOF
python3 -m pip install -q --force-reinstall --no-deps "${wheels[0]}"
# Run from tests/ so that the installed package, not the source tree, is imported.
set +e
(cd tests && python3 -m pytest -q -p no:cacheprovider "$@" .)
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
