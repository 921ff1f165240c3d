"""The command line (``python -m runtime``, ``bench``, ``trace-plot``) answers bad input with
one line on stderr and exit code 2, never a traceback; good input still works.

Each case runs the CLI in its own interpreter, from a scratch directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

# Runs main() with matplotlib made unimportable, whether or not it is installed.
NO_MATPLOTLIB = (
    "import sys; sys.modules['matplotlib'] = None; "
    "from runtime.__main__ import main; sys.exit(main(sys.argv[1:]))"
)

GOOD_TRACE = {
    "traceEvents": [
        {"name": "scale", "ph": "X", "pid": 0, "tid": 1, "ts": 10.0, "dur": 5.0},
        {"name": "memcpy_d2h", "ph": "X", "pid": 0, "tid": 2, "ts": 12.0, "dur": 3.0},
    ]
}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_")}
    env.update(extra)
    return env


def run_cli(cwd, *args: str, env=None, code: str | None = None) -> subprocess.CompletedProcess:
    head = [sys.executable, "-c", code] if code else [sys.executable, "-m", "runtime"]
    return subprocess.run(
        head + list(args),
        cwd=cwd,
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_usage_error(out: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit code 2, exactly one non-empty stderr line, no traceback; returns that line."""
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    line = lines[0]
    assert line.startswith("python -m runtime"), line
    assert ": error: " in line, line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


# --- python -m runtime: whatever runtime.init refuses ----------------------------------------


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--profile", "unknown"], ["unknown", "ascend910", "host"]),
        (["--memory", "lots"], ["lots"]),
        (["--device-count", "0"], ["device_count", "0"]),
        (["--device-count", "-1"], ["device_count", "-1"]),
        (["--device-count", "1000"], ["device_count", "1000"]),
        (["--device-count", "x"], ["--device-count", '"x"', "as an integer"]),
        (["--no-such-flag"], ["--no-such-flag"]),
    ],
)
def test_devices_bad_arguments(tmp_path, args, needles):
    assert_usage_error(run_cli(tmp_path, *args), *needles)


def test_devices_bad_environment(tmp_path):
    out = run_cli(tmp_path, env=_env(RUNTIME_DEVICE_COUNT="many"))
    assert_usage_error(out, "RUNTIME_DEVICE_COUNT", "many")


def _error_text(out: subprocess.CompletedProcess) -> str:
    return assert_usage_error(out).split(": error: ", 1)[1]


@pytest.mark.parametrize("value", ["-1", "0", "65", str(2**70), str(-(2**70))])
def test_every_device_count_out_of_range_gets_one_wording(tmp_path, value):
    """The flag, the keyword and the environment variable: one rule, one wording (the core's)."""
    flag = _error_text(run_cli(tmp_path, "--device-count", value))
    assert flag == f"device_count must be between 1 and 64, got {value}"
    env = _error_text(run_cli(tmp_path, env=_env(RUNTIME_DEVICE_COUNT=value)))
    assert env == f"RUNTIME_DEVICE_COUNT must be between 1 and 64, got {value}"


def test_a_device_count_that_is_not_an_integer_gets_the_environments_wording(tmp_path):
    flag = _error_text(run_cli(tmp_path, "--device-count", "two"))
    env = _error_text(run_cli(tmp_path, env=_env(RUNTIME_DEVICE_COUNT="two")))
    assert flag == '--device-count: cannot parse "two" as an integer'
    assert env == 'RUNTIME_DEVICE_COUNT: cannot parse "two" as an integer'


@pytest.mark.parametrize("args", [["--memory", "-5GiB"], ["--memory=-5GiB"]])
def test_a_negative_memory_reaches_the_size_check(tmp_path, args):
    """argparse would take "-5GiB" for a flag ("expected one argument"): the value is passed
    on, and the size parser refuses it in the wording every bad size gets."""
    text = _error_text(run_cli(tmp_path, *args))
    assert text.startswith('memory: cannot parse "-5GiB" as a byte size'), text
    env = _error_text(run_cli(tmp_path, env=_env(RUNTIME_DEVICE_MEMORY="-5GiB")))
    assert env.startswith('RUNTIME_DEVICE_MEMORY: cannot parse "-5GiB" as a byte size'), env


def test_a_value_starting_with_a_dash_is_not_taken_for_a_flag_it_is_not(tmp_path):
    out = run_cli(tmp_path, "--profile", "--json")  # --json is a flag: --profile lacks a value
    assert_usage_error(out, "--profile", "expected one argument")


def test_usage_line_shows_the_sub_commands(tmp_path):
    out = run_cli(tmp_path, "--help")
    assert out.returncode == 0, out.stderr
    usage = out.stdout.split("\n\n", 1)[0]
    assert usage.startswith("usage: python -m runtime [--json]"), usage
    assert "python -m runtime bench" in usage and "python -m runtime trace-plot" in usage, usage


def test_devices_good_arguments(tmp_path):
    out = run_cli(tmp_path, "--device-count", "2", "--profile", "host", "--json")
    assert out.returncode == 0, out.stderr
    assert [d["index"] for d in json.loads(out.stdout)] == [0, 1]
    out = run_cli(tmp_path, "--version")
    assert out.returncode == 0 and out.stdout.startswith("runtime ")


def test_device_table_speaks_binary_units_and_marks_modelled_figures(tmp_path):
    out = run_cli(tmp_path, "--device-count", "2", "--memory", "3GiB")
    assert out.returncode == 0, out.stderr
    assert "0 B / 3 GiB" in out.stdout
    for column in ("Clock MHz*", "Cores*", "Peak TFLOPS*", "BW GB/s*"):
        assert column in out.stdout
    assert "* modelled" in out.stdout
    assert "GB " not in out.stdout.replace("BW GB/s*", "")


def test_device_table_under_the_runtime_smi_name(tmp_path):
    """Run as the ``runtime-smi`` entry point, errors name that program."""
    code = (
        "import sys; sys.argv[0] = '/usr/bin/runtime-smi'; "
        "from runtime.__main__ import main; sys.exit(main(sys.argv[1:]))"
    )
    out = run_cli(tmp_path, "--device-count", "zero", code=code)
    assert out.returncode == 2 and out.stderr.startswith("runtime-smi: error: "), out.stderr


# --- python -m runtime bench -----------------------------------------------------------------


def test_bench_unknown_row_lists_the_rows(tmp_path):
    line = assert_usage_error(run_cli(tmp_path, "bench", "--rows", "nosuchrow"), "'nosuchrow'")
    for key in ("stream_create", "copy_h2d_1m", "graph_replay_sync", "matmul_streams_4"):
        assert key in line


def test_bench_one_unknown_row_among_good_ones(tmp_path):
    line = assert_usage_error(run_cli(tmp_path, "bench", "--rows", "copy,NoSuchRow"), "NoSuchRow")
    assert "'copy'" not in line


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--peers", "nosuchpeer"], ["nosuchpeer", "numpy", "pyopencl", "torch", "stdlib"]),
        (["--reps", "0"], ["--reps", "'0'"]),
        (["--reps", "-3"], ["--reps", "'-3'"]),
        (["--reps", "many"], ["--reps", "'many'"]),
        (["--no-such-flag"], ["--no-such-flag"]),
    ],
)
def test_bench_bad_arguments(tmp_path, args, needles):
    assert_usage_error(run_cli(tmp_path, "bench", *args), *needles)


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_bench_output_in_a_missing_folder(tmp_path, flag):
    path = str(tmp_path / "nosuchdir" / "out")
    out = run_cli(tmp_path, "bench", "--quick", "--peers", "none", flag, path)
    assert_usage_error(out, flag, path, "no such directory")
    assert out.stdout == ""  # refused before anything was measured


def test_bench_json_path_is_a_folder(tmp_path):
    out = run_cli(tmp_path, "bench", "--quick", "--peers", "none", "--json", str(tmp_path))
    assert_usage_error(out, "--json", str(tmp_path), "directory")


def test_bench_bad_environment(tmp_path):
    out = run_cli(
        tmp_path,
        "bench",
        "--quick",
        "--peers",
        "none",
        "--rows",
        "stream create",
        env=_env(RUNTIME_DEVICE_PROFILE="nosuchprofile"),
    )
    assert_usage_error(out, "nosuchprofile")


@pytest.mark.parametrize(
    "content, needles",
    [
        (None, ["No such file"]),
        ("not json {", ["not valid JSON"]),
        ('{"a": 1}', ["not a benchmark result"]),
        ("[1, 2]", ["not a benchmark result"]),
        ('{"rows": [{"title": "x"}], "targets": [], "machine": {}}', ["not a benchmark result"]),
    ],
    ids=["missing", "not-json", "not-a-run", "a-list", "malformed-row"],
)
def test_bench_bad_from_json(tmp_path, content, needles):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    out = run_cli(tmp_path, "bench", "--from-json", str(path))
    assert_usage_error(out, "--from-json", str(path), *needles)


def test_bench_round_trip_through_json(tmp_path):
    """A tiny real run writes JSON that --from-json renders again (table and markdown)."""
    path = str(tmp_path / "run.json")
    common = ["bench", "--quick", "--peers", "none", "--no-progress"]
    out = run_cli(tmp_path, *common, "--rows", "stream create", "--json", path)
    assert out.returncode == 0, out.stderr
    assert "stream create" in out.stdout and f"wrote {path}" in out.stdout
    doc = json.loads((tmp_path / "run.json").read_text())
    assert [r["key"] for r in doc["rows"]] == ["stream_create"]
    for extra in ([], ["--markdown"]):
        again = run_cli(tmp_path, "bench", "--from-json", path, *extra)
        assert again.returncode == 0, again.stderr
        assert "stream create" in again.stdout


def test_bench_progress_counts_only_installed_peers(tmp_path):
    """A peer that cannot be imported has no cells: the counter ends at its total."""
    code = (
        "import sys; sys.modules['torch'] = None; "
        "from runtime.__main__ import main; sys.exit(main(sys.argv[1:]))"
    )
    out = run_cli(
        tmp_path, "bench", "--quick", "--peers", "torch", "--rows", "stream create", code=code
    )
    assert out.returncode == 0, out.stderr
    counters = re.findall(r"\[(\d+)/(\d+)\]", out.stderr)
    assert counters, out.stderr
    assert counters[-1][0] == counters[-1][1] == "1", out.stderr


def test_bench_curves_writes_json_for_the_chosen_sweeps(tmp_path):
    """A tiny real sweep: every series has a positive figure at every x of the plan."""
    out_dir = tmp_path / "curves"
    out = run_cli(
        tmp_path,
        "bench",
        "--curves",
        str(out_dir),
        "--quick",
        "--peers",
        "none",
        "--no-progress",
        "--sweeps",
        "events_depth,alloc",
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads((out_dir / "curves.json").read_text())
    keys = [c["key"] for c in doc["curves"]]
    assert keys == ["alloc_live", "events_depth"]
    for c in doc["curves"]:
        xs = {tuple(p)[0] for pts in c["series"].values() for p in pts}
        assert len(xs) == 3, c
        for pts in c["series"].values():
            assert all(y > 0 for _, y in pts), c
    assert any(ch["target"].startswith("alloc_live") for ch in doc["checks"])
    assert "targets:" in out.stdout


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--sweeps", "nope"], ["--sweeps", "'nope'", "launch_threads"]),
        (["--sweeps", ","], ["--sweeps"]),
    ],
)
def test_bench_curves_bad_arguments(tmp_path, args, needles):
    out = run_cli(tmp_path, "bench", "--curves", str(tmp_path / "c"), *args)
    assert_usage_error(out, *needles)


def test_bench_curves_directory_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert_usage_error(run_cli(tmp_path, "bench", "--curves", str(f)), "--curves")


def test_bench_list_selects_rows(tmp_path):
    out = run_cli(tmp_path, "bench", "--quick", "--list", "--rows", "copy")
    assert out.returncode == 0, out.stderr
    keys = [line.split()[0] for line in out.stdout.splitlines()]
    assert keys and all(k.startswith("copy_") for k in keys)


# --- python -m runtime trace-plot ------------------------------------------------------------


@pytest.mark.parametrize(
    "content, needles",
    [
        (None, ["cannot read"]),
        ("not json {", ["not valid JSON"]),
        ('{"a": 1}', ["not a trace"]),
        ('{"traceEvents": []}', ["no command spans"]),
        (
            '{"traceEvents": [{"ph": "X", "name": "k", "pid": 0, "tid": 1}]}',
            ["not a runtime trace"],
        ),
    ],
    ids=["missing", "not-json", "no-events", "no-spans", "span-without-times"],
)
def test_trace_plot_bad_trace(tmp_path, content, needles):
    path = tmp_path / "trace.json"
    if content is not None:
        path.write_text(content)
    out = run_cli(tmp_path, "trace-plot", str(path), str(tmp_path / "out.png"))
    assert_usage_error(out, str(path), *needles)


def test_trace_plot_without_matplotlib(tmp_path):
    trace = write(tmp_path / "trace.json", json.dumps(GOOD_TRACE))
    out = run_cli(tmp_path, "trace-plot", trace, str(tmp_path / "out.png"), code=NO_MATPLOTLIB)
    assert_usage_error(out, "matplotlib", "pip install matplotlib")
    assert not (tmp_path / "out.png").exists()


@pytest.mark.parametrize("name", ["out.txt", "out"])
def test_trace_plot_refuses_a_picture_format_matplotlib_cannot_write(tmp_path, name):
    pytest.importorskip("matplotlib")
    trace = write(tmp_path / "trace.json", json.dumps(GOOD_TRACE))
    path = str(tmp_path / name)
    assert_usage_error(run_cli(tmp_path, "trace-plot", trace, path), path, ".png", ".svg")
    assert not (tmp_path / name).exists()


def test_trace_plot_legend_leaves_the_spans_uncovered():
    """The legend sits right of the axes, so it cannot hide the spans that end last."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from runtime.trace import timeline_figure

    fig = timeline_figure(GOOD_TRACE["traceEvents"], "t")
    try:
        fig.canvas.draw()
        (ax,) = fig.axes
        legend = ax.get_legend().get_window_extent()
        axes = ax.get_window_extent()
        assert legend.x0 >= axes.x1, (legend, axes)
        assert legend.x1 <= fig.bbox.x1 + 1, (legend, fig.bbox)  # and inside the picture
    finally:
        plt.close(fig)


def test_trace_plot_output_in_a_missing_folder(tmp_path):
    trace = write(tmp_path / "trace.json", json.dumps(GOOD_TRACE))
    path = str(tmp_path / "nosuchdir" / "out.png")
    assert_usage_error(run_cli(tmp_path, "trace-plot", trace, path), path, "no such directory")


def test_trace_plot_missing_arguments(tmp_path):
    assert_usage_error(run_cli(tmp_path, "trace-plot"), "trace", "out")


def test_trace_plot_draws_a_good_trace(tmp_path):
    # Not skipped without matplotlib: scripts/test.sh installs it, so its absence is a
    # broken test environment and must fail, not turn the drawing path silently untested.
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.fail(
            "matplotlib is not installed (scripts/test.sh installs it): pip install matplotlib"
        )
    trace = write(tmp_path / "trace.json", json.dumps(GOOD_TRACE))
    out = run_cli(tmp_path, "trace-plot", trace, str(tmp_path / "out.png"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "out.png").stat().st_size > 0


@pytest.mark.parametrize("user_value", [None, "12"])
def test_bench_as_a_program_tells_openblas_and_openmp_not_to_spin(tmp_path, user_value):
    """`python -m runtime bench` restarts once with OPENBLAS_THREAD_TIMEOUT and GOMP_SPINCOUNT
    set (numpy's OpenBLAS threads and torch's OpenMP threads otherwise spin after each call
    into the next cell), keeps a value the user set, and records both with the machine."""
    path = str(tmp_path / "run.json")
    quiet = ("OPENBLAS_THREAD_TIMEOUT", "GOMP_SPINCOUNT")
    env = {k: v for k, v in _env().items() if k not in quiet}
    if user_value is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = user_value
    args = ["bench", "--quick", "--peers", "none", "--no-progress", "--rows", "stream create"]
    out = run_cli(tmp_path, *args, "--json", path, env=env)
    assert out.returncode == 0, out.stderr
    want = user_value or "4"
    assert f"OPENBLAS_THREAD_TIMEOUT={want}" in out.stdout
    assert "GOMP_SPINCOUNT=10000" in out.stdout
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["machine"]["openblas_thread_timeout"] == want
    assert doc["machine"]["gomp_spincount"] == "10000"
