"""The README and the pages under docs/ say what the code does.

Every ```python block of README.md and docs/*.md runs (write ```py for a fragment that is
not meant to run on its own). Every docs page is linked from the README and every relative
link resolves. The claims a test can check are checked against the code here: the
distribution name in the install commands, the words a reader cannot follow, the dtypes MPI
collectives take, the device-count wording, the quick benchmark's recorded run time, the curve
plots shown in BENCHMARKS.md and the Rust crate's kernel table.
"""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import pytest

import runtime

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
BENCHMARKS = ROOT / "BENCHMARKS.md"
CRATE_README = ROOT / "crates" / "runtime-core" / "README.md"
PAGES = [README, *DOCS]
#: Pages that other work adds; linked from the README before they exist.
PENDING = {"docs/c.md", "docs/operators.md"}


def text(path: pathlib.Path) -> str:
    return path.read_text(encoding="utf-8")


def rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


BLOCKS = [
    (rel(page), i, code)
    for page in PAGES
    for i, code in enumerate(re.findall(r"^```python\n(.*?)^```", text(page), re.S | re.M))
]


def test_readme_has_python_blocks():
    assert sum(1 for page, _, _ in BLOCKS if page == "README.md") >= 4


@pytest.mark.parametrize(
    "page, index, code", BLOCKS, ids=[f"{page}-block{i}" for page, i, _ in BLOCKS]
)
def test_python_block_runs(page, index, code, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks may write files (trace.json)
    runtime.shutdown()
    try:
        exec(compile(code, str(ROOT / page), "exec"), {"__name__": "__docs__"})
    finally:
        runtime.shutdown()
        for name in runtime.option_names():
            runtime.set_option(name, name != "legacyDefaultStream")  # the defaults
    if page == "README.md":
        assert capsys.readouterr().out  # every README block shows something


# --- what the README is and links to ---------------------------------------------------------


def test_readme_is_short():
    words = len(text(README).split())  # as wc -w counts them
    assert words < 1800, words


def test_readme_keeps_the_two_commands():
    sh = "\n".join(re.findall(r"^```sh\n(.*?)^```", text(README), re.S | re.M))
    assert "pip install . && python -m runtime" in sh.splitlines()
    assert "bash scripts/test.sh" in sh.splitlines()


def test_every_docs_page_is_linked_from_the_readme():
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", text(README)))
    assert {rel(p) for p in DOCS} <= linked, {rel(p) for p in DOCS} - linked
    assert PENDING <= linked


LINKED = [
    (rel(page), target)
    for page in [*PAGES, BENCHMARKS, CRATE_README]
    for target in re.findall(r"\]\(([^)\s]+)\)", text(page))
    if not re.match(r"[a-z]+:", target) and not target.startswith("#")
]


@pytest.mark.parametrize("page, target", LINKED, ids=[f"{p}->{t}" for p, t in LINKED])
def test_relative_link_resolves(page, target):
    path = (ROOT / page).parent / target.split("#", 1)[0]
    if rel(path.resolve()) in PENDING and not path.exists():
        pytest.skip(f"{target} comes with the work that writes it")
    assert path.exists(), f"{page} links to {target}, which does not exist"


def test_benchmarks_show_every_curve_plot_inline():
    shown = set(re.findall(r"!\[[^\]]*\]\((docs/curves/[^)]+\.png)\)", text(BENCHMARKS)))
    plots = {rel(p) for p in (ROOT / "docs" / "curves").glob("*.png")}
    assert plots and plots <= shown, plots - shown


# --- words a reader cannot follow ------------------------------------------------------------

UNFOLLOWABLE = re.compile(r"\bseed\b|\btour\b|\bissues? \d+|peers-results", re.I)


@pytest.mark.parametrize(
    "path",
    [*PAGES, BENCHMARKS, CRATE_README, *sorted((ROOT / "examples").rglob("*.py"))],
    ids=rel,
)
def test_no_words_a_reader_cannot_follow(path):
    hits = [m.group(0) for m in UNFOLLOWABLE.finditer(text(path))]
    assert not hits, f"{rel(path)}: {hits}"


# --- the name to install ---------------------------------------------------------------------


def test_install_commands_name_this_distribution():
    pyproject = text(ROOT / "pyproject.toml")
    name = re.search(r'^name = "([^"]+)"', pyproject, re.M).group(1)
    assert name == "runtime-vdev"
    assert f"`{name}`" in text(README)
    for page in [*PAGES, BENCHMARKS]:
        for line in text(page).splitlines():
            for cmd in re.findall(r"pip install ([^#`\n;&|]*)", line):
                # the unrelated PyPI package "runtime", with or without an extra
                assert not re.search(r"(^|\s)[\"']?runtime([\[\s\"']|$)", cmd), (rel(page), line)
                if "runtime" in cmd:
                    assert name in cmd, (rel(page), line)


# --- specific claims -------------------------------------------------------------------------


def test_the_mpi_dtype_claim_is_the_one_the_code_takes():
    """docs/scale-out.md: every dtype works over MPI; MPI reduces the integers, float32,
    float64 and complex numbers (booleans as bytes), the runtime reduces float16. The values
    are checked under mpiexec (test_comm_mpi.py); this checks the sentence against the table
    the MPI transport answers the core with."""
    from runtime import _mpi

    page = text(ROOT / "docs" / "scale-out.md")
    m = re.search(r"\*\*Dtypes over MPI:\*\* every dtype\. MPI reduces ([^;]+) \(booleans", page)
    assert m, "the dtype sentence of docs/scale-out.md"
    reduced = {dt for dt, _ in _mpi._REDUCES}
    assert "float16" not in reduced and "bool" not in reduced
    assert {"float32", "float64", "complex64", "complex128"} <= reduced
    assert {np.dtype(d).kind for d in reduced} == {"i", "u", "f", "c"}
    assert " ".join(m.group(1).split()) == "the integers, float32, float64 and complex numbers"
    assert not any(op in ("max", "min") for dt, op in _mpi._REDUCES if dt.startswith("complex"))


def test_the_device_count_wording_quoted_in_the_configuration_page():
    page = text(ROOT / "docs" / "configuration.md")
    quoted = re.search(r"for example\s+`([^`]+)` for `init\(device_count=0\)`", page).group(1)
    runtime.shutdown()
    with pytest.raises(ValueError) as e:
        runtime.init(device_count=0)
    assert str(e.value) == quoted


def test_the_quick_run_time_is_the_recorded_one():
    recorded = json.loads(text(ROOT / "docs" / "bench-quick.json"))
    assert recorded["mode"] == "quick"
    m = re.search(
        r"took ([\d.]+) s in the recorded run \(`docs/bench-quick.json`", text(BENCHMARKS)
    )
    assert m, "BENCHMARKS.md states the quick run's time with its record"
    assert float(m.group(1)) == round(recorded["elapsed_s"], 1)


def test_the_quick_help_promises_what_the_record_shows():
    from runtime.bench import _parser

    help_text = " ".join(_parser().format_help().split())
    limit = int(re.search(r"smoke run \(under (\d+) s", help_text).group(1))
    recorded = json.loads(text(ROOT / "docs" / "bench-quick.json"))
    assert recorded["elapsed_s"] < limit


def _table_rows(md: str) -> list[tuple[str, str]]:
    return [
        (m.group(1), re.sub(r"[`\s]", "", m.group(2)))
        for m in re.finditer(r"^(?://! )?\| `(\w+)` \| ([^|]+) \|", md, re.M)
    ]


def test_the_crate_readme_lists_the_built_in_kernels_of_the_code():
    builtin = text(ROOT / "crates" / "runtime-core" / "src" / "kernel" / "builtin.rs")
    code_rows = _table_rows(builtin)
    doc_rows = _table_rows(text(CRATE_README))
    assert code_rows and doc_rows == code_rows
    names = [k.name for k in map(runtime.kernels.__dict__.get, [n for n, _ in code_rows]) if k]
    assert len(names) == len(code_rows), "every built-in kernel is in runtime.kernels"


def test_the_crate_readme_lists_every_module_layer():
    graph = text(ROOT / "crates" / "runtime-core" / "tests" / "module_graph.rs")
    layers = re.findall(r'^\s+"(\w+)",$', graph.split("const LAYERS", 1)[1].split("];", 1)[0], re.M)
    readme = " ".join(text(CRATE_README).split())
    listed = re.findall(r"`(\w+)`", readme.split("Layers, bottom to top", 1)[1])
    assert [x for x in listed if x in layers] == layers
