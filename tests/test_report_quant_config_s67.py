"""`salactl report memory` reads a checkpoint's GPTQ quantization_config as loading reads it
(quant/loading.py parse_quant_config). It used to read it loosely: `bits: 8.0` built a "w8.0a16"
label, so the w8a16 row silently went missing, and `group_size: 128.0` passed as a float. A config
that `salactl run --model` refuses is now the same one-line error and exit code here, nothing on
stdout; a good one (ours, GPTQModel-style, 8-bit, a standalone quantize_config.json) sizes exactly
as before. A record whose checkpoint loading would refuse gets no prediction."""

import json
import shutil
from pathlib import Path

import pytest

from salactl.errors import CheckpointError
from salactl.reports.memory import weight_bytes
from salactl.reports.memory_report import MemoryQuery, build
from salactl.runtime.loader import planning_config

from conftest import run_cli

MEMORY = ("report", "memory", "--context", "4096", "--gpu", "H100", "--kv-cache-dtype", "bf16", "--json")


def copy(src: Path, dst: Path, qc: dict | None = None, standalone: bool = False) -> Path:
    """A copy of the checkpoint with these quantization_config keys set; with `standalone`, the
    config moved to quantize_config.json without quant_method (AutoGPTQ's file)."""
    dst = Path(shutil.copytree(src, dst))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"].update(qc or {})
    if standalone:
        moved = cfg.pop("quantization_config")
        moved.pop("quant_method")
        (dst / "quantize_config.json").write_text(json.dumps(moved))
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def report(model: Path, capsys, *args) -> dict:
    code, out, err = run_cli([*MEMORY, "--model", model, *args], capsys)
    assert code == 0, err
    return json.loads(out)


def refusal(args, capsys) -> str:
    code, out, err = run_cli(args, capsys)
    assert code == CheckpointError.exit_code and out == "", (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def weights_total(r: dict, weights: str) -> int:
    return r["server"][weights]["weights"]["total"]


@pytest.mark.parametrize("qc,says", [
    ({"bits": 8.0}, "error: quantization_config.bits = 8.0; expected the integer 4 or 8"),
    ({"group_size": 128.0}, "error: quantization_config.group_size = 128.0; expected an integer"),
    ({"desc_act": "false"}, 'error: quantization_config.desc_act = "false"; expected true or false'),
    ({"quant_method": "awq"}, "error: quant_method 'awq' is not supported"),
])
def test_a_config_run_refuses_is_refused_in_run_s_own_line(nano_rtn_dir, tmp_path, capsys, qc, says):
    model = copy(nano_rtn_dir, tmp_path / "bad", qc)
    line = refusal([*MEMORY, "--model", model], capsys)
    assert line.startswith(says), line
    assert line == refusal(["run", "--model", model, "--prompt", "hi", "-n", "1", "--device", "cpu"], capsys)


def test_a_mistyped_standalone_quantize_config_json_is_refused(nano_rtn_dir, tmp_path, capsys):
    model = copy(nano_rtn_dir, tmp_path / "standalone", {"bits": 8.0}, standalone=True)
    assert refusal([*MEMORY[:-1], "--model", model], capsys).startswith(
        "error: quantization_config.bits = 8.0; expected the integer 4 or 8")


def test_given_weights_and_group_size_need_no_quantization_config(nano_rtn_dir, tmp_path, capsys):
    model = copy(nano_rtn_dir, tmp_path / "bad", {"bits": 8.0})
    assert list(report(model, capsys, "--weights", "w4a16", "--group-size", "64")["server"]) == ["w4a16"]


def test_good_configs_size_exactly_as_before(nano_rtn_dir, tmp_path, capsys):
    config = planning_config(str(nano_rtn_dir))
    ours = report(nano_rtn_dir, capsys)
    assert list(ours["server"]) == ["bf16", "w4a16"]
    assert weights_total(ours, "w4a16") == weight_bytes(config, "w4a16", 128).total
    gptqmodel = copy(nano_rtn_dir, tmp_path / "gptqmodel", {"quant_method": "GPTQ", "pack_dtype": "int32",
                                                            "dynamic": None, "desc_act": None, "damp_percent": 0.01,
                                                            "true_sequential": True})
    standalone = copy(nano_rtn_dir, tmp_path / "standalone", standalone=True)
    for model in (gptqmodel, standalone):
        assert {**report(model, capsys), "model": None} == {**ours, "model": None}, model


@pytest.mark.parametrize("qc,weights,group", [
    ({"bits": 8}, "w8a16", 128), ({"group_size": 64}, "w4a16", 64), ({"group_size": -1}, "w4a16", -1),
    ({"group_size": 16}, "w4a16", 16)])     # a group loading takes though quantize writes none such
def test_the_checkpoint_s_bits_and_group_set_the_rows(nano_rtn_dir, tmp_path, capsys, qc, weights, group):
    model = copy(nano_rtn_dir, tmp_path / "q", qc)
    r = report(model, capsys)
    assert list(r["server"]) == ["bf16", "w4a16", *(["w8a16"] if weights == "w8a16" else [])]
    assert weights_total(r, weights) == weight_bytes(planning_config(str(model)), weights, group).total


def run_record(model: Path) -> dict:
    """A `salactl run --out` record of `model` with a measured peak."""
    return {"schema_version": 1, "kind": "run", "phase": "decode", "target": "embedded", "model": str(model),
            "total_input_tokens": 100, "total_output_tokens": 28, "peak_memory_bytes": 60_000_000,
            "knobs": {"random_weights": False, "dtype": "bfloat16", "chunk_size": 64, "kv_cache_dtype": "bfloat16"}}


def test_a_record_of_a_checkpoint_loading_refuses_gets_no_prediction(nano_rtn_dir, tmp_path):
    config = planning_config(str(nano_rtn_dir))
    bad = copy(nano_rtn_dir, tmp_path / "bad", {"group_size": 128.0})
    standalone = copy(nano_rtn_dir, tmp_path / "standalone", {"bits": 8}, standalone=True)
    rows = build(config, MemoryQuery(contexts=(4096,)), [run_record(bad), run_record(standalone)])["measured"]
    assert [(r["weights"], r["predicted"] is None) for r in rows] == [("unknown", True), ("w8a16", False)]
