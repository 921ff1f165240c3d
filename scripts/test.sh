#!/usr/bin/env bash
# Every test, Rust and Python: builds and installs the wheel, then runs cargo test and pytest.
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q "maturin>=1.5,<2" numpy pytest hypothesis
# Optional: atheris runs the 10 s argument fuzz; without it that one test is skipped.
python3 -m pip install -q atheris 2>/dev/null || echo "atheris not installable: its fuzz test will be skipped"
# Optional: mpi4py and the mpich wheel (its mpiexec) run the MPI tests under mpiexec -n 1/2/3;
# without them those tests are skipped with the reason.
python3 -m pip install -q mpi4py mpich 2>/dev/null || echo "mpi4py/mpich not installable: the MPI tests will be skipped"
# The ACL C library's tests build C programs with CMake, as the public Ascend samples do.
command -v cmake >/dev/null 2>&1 || python3 -m pip install -q cmake || echo "cmake not installable: the CMake builds of the C tests will be skipped"
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
