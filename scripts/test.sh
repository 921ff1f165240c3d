#!/usr/bin/env bash
# Every test, Rust and Python: builds and installs the wheel, then runs cargo test and pytest.
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q "maturin>=1.5,<2" numpy pytest hypothesis
# Optional: atheris runs the 10 s argument fuzz; without it that one test is skipped.
python3 -m pip install -q atheris 2>/dev/null || echo "atheris not installable: its fuzz test will be skipped"
# Required: mpi4py and the mpich wheel (its mpiexec) run the MPI tests under mpiexec -n 1/2/3
# (runtime._mpi is tested nowhere else), so a failed install fails the run, and
# RUNTIME_REQUIRE_MPI makes those tests fail rather than skip if MPI is still missing.
python3 -m pip install -q mpi4py mpich || { echo "error: mpi4py/mpich failed to install; the MPI tests cannot run" >&2; exit 1; }
export RUNTIME_REQUIRE_MPI=1
cargo test --workspace
rm -rf target/wheels
maturin build --release -q -o target/wheels
python3 -m pip install -q --force-reinstall --no-deps target/wheels/runtime-*.whl
# Run from tests/ so that the installed package, not the source tree, is imported.
set +e
(cd tests && python3 -m pytest -q -p no:cacheprovider "$@" .)
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
