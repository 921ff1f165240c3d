"""Every Python block in README.md runs."""

from __future__ import annotations

import pathlib
import re

import pytest

import runtime

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_block_runs(code, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks may write files (trace.json)
    runtime.shutdown()
    try:
        exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
    finally:
        runtime.shutdown()
        for name in runtime.option_names():
            runtime.set_option(name, name != "legacyDefaultStream")  # the defaults
    assert capsys.readouterr().out  # every block prints something
