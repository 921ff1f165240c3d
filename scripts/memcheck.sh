#!/usr/bin/env bash
# Native memory checking (issue 6):
#   1. runtime-core's Rust tests under valgrind memcheck: the lib (unit) tests and the
#      integration test binaries listed in BINARIES, each with
#      `valgrind --error-exitcode=1 --leak-check=no <test binary>`;
#   2. the Python test suite under `python -X faulthandler -m pytest` (a fatal signal in the
#      extension prints every thread's Python traceback instead of dying silently).
#
# Usage: bash scripts/memcheck.sh [extra pytest args]
#   SKIP_PYTHON=1 / SKIP_VALGRIND=1 skip a half. The Python half expects the package to be
#   installed (bash scripts/test.sh builds and installs it).
#
# Under valgrind (about 20-50x slower):
#   * PROPTEST_CASES defaults to 16 (proptest models run 256 cases otherwise);
#   * FUZZ_SECONDS defaults to 3 for the fixed-time allocator fuzz run;
#   * memory::host::tests::huge_reservations_cost_no_ram is skipped: valgrind refuses a 64 GiB
#     address-space reservation (EINVAL) - a valgrind limit, not a runtime error;
#   * tests/threads.rs is not run: its 60 s deadlock guards fire under valgrind's serialised
#     threads (it runs, without valgrind, in `cargo test`).
set -uo pipefail
cd "$(dirname "$0")/.."

export PROPTEST_CASES="${PROPTEST_CASES:-16}"
export FUZZ_SECONDS="${FUZZ_SECONDS:-3}"
BINARIES="lib memory kernels kernel_errors stream_ordering events capture copy lifecycle custom_kernel fuzz_allocator reliability_regressions reliability_shutdown"
failed=()

if [ "${SKIP_VALGRIND:-0}" != "1" ]; then
    command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 2; }
    echo "== building runtime-core test binaries"
    paths=$(cargo test -p runtime-core --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        kind = m["target"]["kind"][0]
        name = "lib" if kind == "lib" else m["target"]["name"]
        print(name, m["executable"])
')
    [ -n "$paths" ] || { echo "cargo test --no-run produced no test binaries" >&2; exit 2; }
    for name in $BINARIES; do
        exe=$(awk -v n="$name" '$1 == n {print $2}' <<<"$paths")
        if [ -z "$exe" ]; then
            echo "== $name: no such test binary" >&2
            failed+=("$name (missing)")
            continue
        fi
        skip=()
        [ "$name" = lib ] && skip=(--skip huge_reservations_cost_no_ram)
        echo "== valgrind memcheck: $name"
        start=$SECONDS
        # Run from the crate directory, as cargo test does (the corpus paths are relative).
        (cd crates/runtime-core && valgrind --error-exitcode=1 --leak-check=no "$exe" --test-threads=2 "${skip[@]}") \
            > "/tmp/memcheck-$name.log" 2>&1
        rc=$?
        summary=$(grep -E "^test result:" "/tmp/memcheck-$name.log" | tail -1)
        errors=$(grep -E "ERROR SUMMARY" "/tmp/memcheck-$name.log" | tail -1)
        echo "   rc=$rc in $((SECONDS - start)) s; ${summary:-no test summary}; ${errors:-(no valgrind error summary line: 0 errors)}"
        if [ "$rc" -ne 0 ]; then
            failed+=("valgrind $name (rc $rc, log /tmp/memcheck-$name.log)")
            grep -E "^==[0-9]+== " "/tmp/memcheck-$name.log" | head -40
        fi
    done
fi

if [ "${SKIP_PYTHON:-0}" != "1" ]; then
    echo "== python -X faulthandler -m pytest"
    (cd tests && python3 -X faulthandler -m pytest -q -p no:cacheprovider "$@" .)
    rc=$?
    [ "$rc" -ne 0 ] && failed+=("pytest (rc $rc)")
fi

if [ "${#failed[@]}" -ne 0 ]; then
    echo "memcheck: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "memcheck: all clean"
