"""A damaged peaks cache ($SALACTL_CACHE_DIR/peaks.json) is ignored with a warning by every command
that reads it: nested too deeply for the JSON parser, it is no traceback; a FIFO in its place does
not block `info` or `run`."""

import json
import os
import subprocess
import sys

import pytest
import torch

from salactl.runtime.peaks import load_measured, peaks_for


def salactl(cache, *args):
    env = {**os.environ, "SALACTL_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True,
                          timeout=120, env=env)


RUN = ["run", "--prompt-ids", "1,2,3", "-n", "2", "--device", "cpu", "--json"]


def test_a_deeply_nested_cache_is_ignored_with_a_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path))
    (tmp_path / "peaks.json").write_text("[" * 100_000)
    assert load_measured() == {} and peaks_for(torch.device("cpu")).source == "cpu-default"
    warning, = capsys.readouterr().err.strip().splitlines()
    assert warning.startswith(f"warning: ignoring the peaks cache {tmp_path / 'peaks.json'}")


def test_run_with_a_deeply_nested_cache_uses_the_defaults(tmp_path):
    (tmp_path / "peaks.json").write_text("[" * 100_000)
    r = salactl(tmp_path, *RUN)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "ignoring the peaks cache" in r.stderr
    assert json.loads(r.stdout)["peaks"]["source"] == "cpu-default"


@pytest.mark.parametrize("args", [["info", "--json", "--device", "cpu"], RUN], ids=["info", "run"])
def test_a_fifo_cache_does_not_block(tmp_path, args):
    os.mkfifo(tmp_path / "peaks.json")
    r = salactl(tmp_path, *args)
    assert r.returncode == 0, r.stderr
    assert f"cannot read the peaks cache {tmp_path / 'peaks.json'} (not a regular file)" in r.stderr
    assert json.loads(r.stdout)["peaks"]["source"] == "cpu-default"


@pytest.mark.parametrize("args", [["info", "--json", "--device", "cpu"], RUN], ids=["info", "run"])
def test_an_entry_past_floats_range_is_ignored_with_a_warning(tmp_path, args):
    # a 400-digit integer parses as JSON but overflows math.isfinite; it sits under another device's name
    (tmp_path / "peaks.json").write_text('{"other gpu": {"mem_gbps": 1' + "0" * 400 + ', "bf16_tflops": 1}}')
    r = salactl(tmp_path, *args)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"ignoring 1 entry of the peaks cache {tmp_path / 'peaks.json'}" in r.stderr
    assert json.loads(r.stdout)["peaks"]["source"] == "cpu-default"


def loop(tmp_path):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    return tmp_path / "loop1"


@pytest.mark.parametrize("args", [["info", "--json", "--device", "cpu"], RUN], ids=["info", "run"])
def test_a_cache_dir_that_cannot_be_located_uses_the_defaults(tmp_path, args):
    # a symlink loop fails Path.resolve() as a missing home directory fails Path.home() (HOME unset, no passwd entry)
    r = salactl(loop(tmp_path), *args)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "cannot locate the peaks cache" in r.stderr and "the default ceilings apply" in r.stderr
    out = json.loads(r.stdout)
    assert out["peaks"]["source"] == "cpu-default"
    assert args[0] == "run" or out["peaks_cache"] is None


def test_measuring_into_a_cache_dir_that_cannot_be_located_is_a_usage_error(tmp_path):
    r = salactl(loop(tmp_path), "info", "--measure", "--device", "cpu")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: cannot locate the peaks cache")
    assert "set SALACTL_CACHE_DIR to a writable directory" in r.stderr
