"""tools/gpu_tests.py: collects test ids, runs them in parallel shards, summarizes, and fails when
a shard fails or times out, a file fails to collect or nothing is collected (run here on CPU-passing
tests)."""

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "gpu_tests.py"


def _run(tmp_path, *args):
    return subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path / "logs"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_shards_run_every_collected_test(tmp_path):
    r = _run(tmp_path, "--shards", "3", "tests/test_memory_report.py")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split()[0] for ln in lines[:3]] == ["shard0", "shard1", "shard2"]
    per_shard = [int(ln.split("(")[1].split()[0]) for ln in lines[:3]]
    assert sum(per_shard) == int(lines[-1].split()[0]) > 3
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["shard0.txt", "shard1.txt", "shard2.txt"]


def test_nothing_collected_is_an_error(tmp_path):
    (tmp_path / "test_empty.py").write_text("X = 1\n")
    r = _run(tmp_path, str(tmp_path / "test_empty.py"))
    assert r.returncode != 0 and "no tests collected" in r.stderr + r.stdout
    assert "collecting the tests failed" not in r.stderr + r.stdout     # an empty file is no collection error


def test_a_missing_file_is_an_error(tmp_path):
    r = _run(tmp_path, "tests/no_such_file.py")
    assert r.returncode != 0 and "no_such_file.py" in r.stderr + r.stdout


def test_a_file_that_fails_to_import_stops_the_run_with_pytests_errors(tmp_path):
    """The good file's tests would run and pass; the broken file's must not vanish from the run."""
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_good.py").write_text("def test_ok():\n    pass\n")
    (tests / "test_broken.py").write_text("import no_such_module_here\n\n\ndef test_x():\n    pass\n")
    r = subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path / "logs"), str(tests / "test_good.py"),
                        str(tests / "test_broken.py")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "collecting the tests failed" in r.stderr
    assert "No module named 'no_such_module_here'" in r.stderr
    assert not (tmp_path / "logs").exists()           # no shard ran


def test_a_shard_that_ignores_sigint_is_killed_and_reported_timed_out(tmp_path):
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_hangs.py").write_text("import signal\nimport time\n\n\ndef test_hang():\n"
                                         "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    time.sleep(120)\n")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path / "logs"), "--timeout", "2",
                        "--kill-after", "1", str(tests / "test_hangs.py")], cwd=tmp_path, capture_output=True,
                       text=True, timeout=240)
    # killed, not waited for to the end of its sleep (a wide margin: collection alone takes seconds on a
    # loaded machine, e.g. beside the GPU suite's other shards)
    assert time.monotonic() - t0 < 90
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.startswith("shard0 (1 tests, rc ") and ": TIMED OUT after 2 s" in r.stdout.splitlines()[0]


def test_default_files_are_every_test_file_with_gpu_tests():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gpu_tests
    finally:
        sys.path.pop(0)
    files = gpu_tests.gpu_test_files(ROOT / "tests")
    names = {Path(f).name for f in files}
    assert {"test_gpu_kernels.py", "test_w4a16_triton.py", "test_w8a16_triton.py", "test_quant_packing.py",
            "test_gpu_engine.py", "test_flex_sparse_engine.py"} <= names
    # no GPU marker: they build the GPU engine on `"cuda" if torch.cuda.is_available() else "cpu"`
    assert {"test_python_api.py", "test_run_warm_up.py", "test_api_threads_gpu.py", "test_stop_strings.py"} <= names
    assert "test_memory_report.py" not in names


def test_a_failing_shard_prints_its_traceback(tmp_path):
    """The shard logs stay on the GPU machine, which may be handed back: the traceback reaches stdout."""
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_fails.py").write_text("def test_ok():\n    pass\n\n\ndef test_bad():\n"
                                         "    assert 1 == 2, 'the reason it failed'\n")
    r = subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path / "logs"), "--shards", "2",
                        str(tests / "test_fails.py")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED" in r.stdout and "test_bad" in r.stdout
    assert ">       assert 1 == 2, 'the reason it failed'" in r.stdout    # the traceback, not only the summary line
