"""``python -m runtime.acl script.py [args...]``: ``import acl`` resolves to runtime.acl, the
script's folder comes first on sys.path, argv is passed as given, the exit status is kept, and
bad input is one line on stderr with exit code 2."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "runtime.acl", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def test_import_acl_argv_path_and_exit_code(tmp_path):
    (tmp_path / "helper.py").write_text("import acl\nVALUE = acl.ACL_ERROR_INVALID_PARAM\n")
    script = tmp_path / "main.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, acl, acl.rt
            from acl import rt
            import helper
            import runtime.acl
            assert acl is runtime.acl and rt is acl.rt and helper.VALUE == 100000
            print(sys.argv)
            print(sys.path[0])
            print(acl.init(), acl.rt.set_device(0), acl.rt.get_device())
            sys.exit(int(sys.argv[2]))
            """
        )
    )
    out = run(script, "--flag", "3", "x y", cwd="/")
    assert out.returncode == 3, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == repr([str(script), "--flag", "3", "x y"])
    assert lines[1] == str(tmp_path)
    assert lines[2] == "0 0 (0, 0)"


def test_uncaught_exception_exits_1(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("raise RuntimeError('boom')\n")
    out = run(script)
    assert out.returncode == 1 and "RuntimeError: boom" in out.stderr


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args in ([], [tmp_path / "missing.py"], ["--bogus"], [tmp_path]):
        out = run(*args)
        assert out.returncode == 2, args
        assert out.stdout == ""
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("python -m runtime.acl: error: "), out.stderr


def test_help():
    out = run("--help")
    assert out.returncode == 0 and "import acl" in out.stdout
