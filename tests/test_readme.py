"""Every Python block in README.md runs and prints what it says.

A block is checked by its own ``assert`` statements, by the expected output written after a
``print(...)`` on the same line (``print(x)  # 0 4 1048576``; ``...`` stands for any text),
and, for blocks that print without asserting, by a check of their output below (found by a
line of the block, so that blocks may move). A block that checks nothing fails.
"""

from __future__ import annotations

import pathlib
import re
import sys

import pytest

import runtime

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
PRINT_WITH_EXPECTATION = re.compile(r"^\s*print\(.*\)\s+#\s+(.+?)\s*$")


def _options(out: str) -> None:
    assert out.strip() == repr(runtime.option_names())


def _profile(out: str) -> None:
    first = out.splitlines()[0]
    m = re.fullmatch(r"(\d+) trace records; (\[.*\])", first)
    assert m, first
    assert int(m.group(1)) > 0
    assert {"run", "alloc"} <= set(eval(m.group(2)))  # noqa: S307 - a list of names printed above
    assert "Device 0" in out or "device 0" in out.lower()  # the memory summary follows


def _devices(out: str) -> None:
    lines = out.splitlines()
    assert len(lines) == 8
    for i, line in enumerate(lines):
        assert re.fullmatch(rf"Device {i}: Virtual .+, \d+ GiB, \d+ MHz, \d+ cores", line), line


#: Output checks of blocks, keyed by a line that identifies the block.
OUTPUT_CHECKS = {
    "print(runtime.option_names())": _options,
    'print(len(records), "trace records;", sorted({r["phase"] for r in records}))': _profile,
    "num_devices = runtime.get_device_count()         # 8 by default": _devices,
}


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 4


def _expectations(code: str) -> dict[int, str]:
    """Line number (1-based) -> the expected output written after a print on that line."""
    lines = code.splitlines()
    return {
        i + 1: m.group(1)
        for i, line in enumerate(lines)
        if (m := PRINT_WITH_EXPECTATION.match(line)) is not None
    }


def _matches(expected: str, printed: str) -> bool:
    """Whether `printed` is `expected`, each "..." in it standing for any text."""
    pattern = ".*?".join(re.escape(part.strip()) for part in expected.split("..."))
    return re.fullmatch(pattern, printed.strip(), re.S) is not None


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_block_runs(code, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks may write files (trace.json)
    printed: dict[int, list[str]] = {}
    builtin_print = print

    def recording_print(*args, **kw):
        line = sys._getframe(1).f_lineno
        text = " ".join(str(a) for a in args)
        printed.setdefault(line, []).append(text)
        builtin_print(*args, **kw)

    runtime.shutdown()
    try:
        exec(
            compile(code, str(README), "exec"),
            {"__name__": "__readme__", "print": recording_print},
        )
    finally:
        runtime.shutdown()
        for name in runtime.option_names():
            runtime.set_option(name, name != "legacyDefaultStream")  # the defaults
    out = capsys.readouterr().out
    expectations = _expectations(code)
    for line, expected in expectations.items():
        got = "\n".join(printed.get(line, []))
        assert _matches(expected, got), f"README line {line}: printed {got!r}, says {expected!r}"
    checks = [f for key, f in OUTPUT_CHECKS.items() if key in code]
    for check in checks:
        check(out)
    asserts = re.search(r"^\s*assert\b", code, re.M) is not None
    assert asserts or expectations or checks, "this README block checks nothing"
