"""The Chrome trace of `salactl profile --torch` names no file: torch records the temporary file it
was given, which is renamed onto trace.json (and staged away from --out), so the key is dropped."""

import json

import torch
from torch.profiler import ProfilerActivity, profile

from conftest import run_cli
from salactl.profiling import torch_mode


def test_the_profiles_trace_names_no_temporary_file(tmp_path, capsys):
    out = tmp_path / "p"
    code, _, err = run_cli(["profile", "--torch", "--model", "sala-nano", "--random-weights", "--phase", "decode",
                            "--context", "16", "--device", "cpu", "--out", out, "--json"], capsys)
    assert code == 0, err
    text = (out / "trace.json").read_text()
    assert "traceName" not in text and ".tmp" not in text
    assert json.loads(text)["traceEvents"]


def test_only_the_trace_name_is_cut_from_torchs_trace(tmp_path):
    path = tmp_path / "t.json"
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(3).add(1)
    prof.export_chrome_trace(str(path))
    written = json.loads(path.read_text())
    assert written.pop("traceName") == str(path)
    torch_mode.drop_trace_name(path)
    assert json.loads(path.read_text()) == written


def test_a_trace_without_the_key_at_its_end_is_left_as_written(tmp_path):
    path = tmp_path / "t.json"
    text = '{"traceEvents": [{"name": "a"}], "args": {"n": 1,"traceName": "x" }}'      # not the top level's
    path.write_text(text)
    torch_mode.drop_trace_name(path)
    assert path.read_text() == text
