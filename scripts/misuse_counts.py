"""Count the misuse battery (tests/reliability/) per feature, for RELIABILITY.md.

Every collected test of tests/reliability/ is one check (a bad-input case, a fault test, a
misuse scenario), and so is every rule of the stateful model; each is put under the first
feature whose pattern its name matches, the rest under "older API".

Usage (from the repository root, with the package installed):

    python scripts/misuse_counts.py               # this checkout
    python scripts/misuse_counts.py --root DIR    # another checkout (e.g. an older commit)
"""

from __future__ import annotations

import argparse
import ast
import collections
import pathlib
import re
import subprocess
import sys

FEATURES = [
    ("pyACL face", r"^acl-|acl_|\bacl\b"),
    ("interpreter exit", r"^exit-|atexit|at_exit|interpreter_exit|exit_time|finali[sz]"),
    ("collectives", r"comm|collective|allreduce|all_reduce|broadcast|reduce_scatter"),
    ("IPC", r"ipc|interprocess|pickl|zombie|exporter|importer"),
    ("asyncio", r"async_done|await|asyncio|event_loop|\baio\b"),
    (
        "pinned/managed memory",
        r"malloc_host|free_host|pinned|host_memory_stats|host_empty_cache|managed|prefetch"
        r"|mem_advise|mem_range|host_view",
    ),
    ("plugged allocators", r"set_allocator|get_allocator|memorypool|memory_pool|allocator"),
    ("user events", r"userevent|event\.user|event\.set|user_event|set_status"),
    ("record_stream", r"record_stream"),
    ("2-D copies", r"memcpy_2d|_2d\b|2-d|pitch"),
    ("views", r"^view|buffer-|^ptr-|slice|pointer|views?\b|offset_view"),
]


def feature(name: str) -> str:
    low = name.lower()
    for feat, pattern in FEATURES:
        if re.search(pattern, low):
            return feat
    return "older API"


def collected(tests: pathlib.Path) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "."],
        cwd=tests / "reliability",
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    names = []
    for line in out.splitlines():
        if "::" not in line or "test_zz_" in line:
            continue
        test = line.split("::")[-1]
        m = re.fullmatch(r"test_bad_input\[(.*)\]", test)
        names.append(m.group(1) if m else line.split("/")[-1])
    return names


def stateful_rules(tests: pathlib.Path) -> list[str]:
    tree = ast.parse((tests / "reliability" / "test_stateful.py").read_text())
    rules = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                f = d.func if isinstance(d, ast.Call) else d
                if isinstance(f, ast.Name) and f.id in ("rule", "invariant", "initialize"):
                    rules.append(f"stateful rule {node.name}")
    return rules


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".", help="repository checkout to count (default: .)")
    ap.add_argument("--list", metavar="FEATURE", help="print the checks counted for FEATURE")
    a = ap.parse_args()
    tests = pathlib.Path(a.root).resolve() / "tests"
    items = collected(tests) + stateful_rules(tests)
    if a.list:
        for n in items:
            if feature(n) == a.list:
                print(n)
        return 0
    counts = collections.Counter(feature(n) for n in items)
    order = [f for f, _ in FEATURES] + ["older API"]
    width = max(len(f) for f in order)
    for f in order:
        print(f"{f:{width}s} {counts.get(f, 0):6d}")
    print(f"{'total':{width}s} {sum(counts.values()):6d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
