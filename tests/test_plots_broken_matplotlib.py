"""A matplotlib that fails to import (here: MPLCONFIGDIR is a symlink loop, so its import raises
RuntimeError, not ImportError) costs only the plots: one warning line naming why, and every other
file is written. Real CLI runs in a fresh process each, since a half-failed import leaves part of
matplotlib in sys.modules."""

import json
import os
import subprocess
import sys

import matplotlib  # noqa: F401  (the [test] extra installs it: missing is a failure, not a skip)

WHY = "warning: plots skipped: matplotlib failed to import: RuntimeError: Symlink loop from "


def _run(tmp_path, *args):
    """python *args in tmp_path with MPLCONFIGDIR a symlink loop (loop1 -> loop2 -> loop1)."""
    loop = tmp_path / "loop1"
    if not loop.is_symlink():
        loop.symlink_to(tmp_path / "loop2")
        (tmp_path / "loop2").symlink_to(loop)
    env = dict(os.environ, MPLCONFIGDIR=str(loop), SALACTL_CACHE_DIR=str(tmp_path / "cache"), PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)


def _only_warning_is_why(tmp_path, stderr: str) -> bool:
    warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
    return "Traceback" not in stderr and warnings == [f"{WHY}'{tmp_path / 'loop1'}'"]


def test_bench_and_report_latency_skip_plots_with_one_warning_line_when_matplotlib_fails_to_import(tmp_path):
    bench = _run(tmp_path, "-m", "salactl", "bench", "--device", "cpu", "--random-weights", "--num-requests", "1",
                 "--phases", "S1", "--scale", "0.01", "-o", "bout", "--json")
    assert bench.returncode == 0, bench.stderr
    assert _only_warning_is_why(tmp_path, bench.stderr), bench.stderr
    run = json.loads(bench.stdout)
    assert run["files"]["plots"] == []
    assert all((tmp_path / run["files"][k]).is_file() for k in ("summary_json", "summary_md"))

    report = _run(tmp_path, "-m", "salactl", "report", "latency", "bout/records.jsonl", "-o", "rep", "--json")
    assert report.returncode == 0, report.stderr
    assert _only_warning_is_why(tmp_path, report.stderr), report.stderr
    assert json.loads(report.stdout)["phases"] == ["S1"]
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == ["report.csv", "report.html", "report.md"]
    assert "<img" not in (tmp_path / "rep" / "report.html").read_text()


def test_the_sweep_pareto_plot_is_skipped_with_one_warning_line_when_matplotlib_fails_to_import(tmp_path):
    code = ("from salactl.bench.pareto import pareto_front, plot_front\n"
            "pts = [{'phase': 'a', 'x': 1.0, 'y': 2.0}, {'phase': 'b', 'x': 2.0, 'y': 1.0}]\n"
            "print(plot_front(pts, pareto_front(pts, 'x', 'y'), 'x', 'y', 'front.png'))\n")
    done = _run(tmp_path, "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "None\n"
    assert _only_warning_is_why(tmp_path, done.stderr), done.stderr
    assert not (tmp_path / "front.png").exists()
