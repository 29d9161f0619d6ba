"""`salactl profile` reads a GPTQ checkpoint's format as run/bench/eval/sweep do (--weights auto), refuses
only an explicit --weights that conflicts with it, before any weight is read; and a torch.profiler
profile's text tables leave out the columns it never fills (no DRAM bytes or counters) and say what
orders the top offenders."""

import gzip
import json
import shutil
from pathlib import Path

import pytest

from conftest import run_cli
from salactl.errors import ConfigError
from salactl.profiling.preflight import check_spec
from salactl.profiling.spec import ProfileSpec

PROFILE = ("profile", "--torch", "--context", 16, "--device", "cpu", "--phase", "decode", "--warmup", 0)


def test_a_gptq_checkpoint_profiles_as_its_own_format_without_weights_flag(nano_rtn_dir, tmp_path, capsys):
    code, out, err = run_cli([*PROFILE, "--model", nano_rtn_dir, "--out", tmp_path / "p", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["manifest"]["weights"] == "w4a16"
    assert ProfileSpec(model=str(nano_rtn_dir)).with_checkpoint_weights().weights == "w4a16"
    assert ProfileSpec(random_weights=True, device="cpu").with_checkpoint_weights().weights == "fp32"  # --dtype auto
    check_spec(ProfileSpec(model=str(nano_rtn_dir), device="cpu", context=16))      # a Python caller's "auto"


def test_a_conflicting_weights_flag_is_refused_before_any_weight_is_read(nano_rtn_dir, tmp_path, capsys):
    """The checkpoint's config is enough to refuse --weights bf16: the check reads
    quantization_config, not the tensors (a weights file that cannot be read is not reached; loading
    first said the file was bad)."""
    ckpt = tmp_path / "config-only"
    ckpt.mkdir()
    shutil.copy(nano_rtn_dir / "config.json", ckpt / "config.json")
    (ckpt / "model.safetensors").write_bytes(b"not a safetensors file")
    code, out, err = run_cli([*PROFILE, "--model", ckpt, "--weights", "bf16", "--out", tmp_path / "p"], capsys)
    assert code == ConfigError.exit_code and out == "", err
    (line,) = err.strip().splitlines()
    assert line == (f"error: {ckpt} is a W4A16 GPTQ checkpoint, which runs only as its own weights; drop "
                    "--weights bf16 (auto reads the checkpoint's format) or pass --weights w4a16")
    assert not (tmp_path / "p").exists()
    code, _, err = run_cli([*PROFILE, "--model", ckpt, "--weights", "w4a16", "--out", tmp_path / "p"], capsys)
    assert code == 4 and "model.safetensors" in err                # its own format passes on to loading


def test_torch_tables_leave_out_the_columns_torch_never_fills(tmp_path, capsys):
    code, out, err = run_cli([*PROFILE, "--random-weights", "--out", tmp_path / "p", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert all(r["dram_bytes"] is None and "bytes_ratio" in r for r in d["ops"])            # JSON keeps its keys
    assert all(r["dram_bytes"] is None and "sm_pct" in r for r in d["kernels"])
    from salactl.cmd_profile import render

    render(d)
    text = capsys.readouterr().out
    op_title = next(line for line in text.splitlines() if "per op" in line)
    assert "top offenders first: time ms − floor ms, largest first" in op_title
    assert "bytes = analytic" not in op_title and "GB/s and % peak come from the analytic bytes" in op_title
    op_header, kernel_header = [line for line in text.splitlines() if line.startswith("┃ op ") or
                                line.startswith("┃ aten op ")]
    op_columns = [c.strip() for c in op_header.strip("┃").split("┃")]
    assert op_columns == ["op", "aten ops", "time ms", "GB/s", "TFLOP/s", "% peak BW", "% peak", "analytic bytes",
                          "floor ms", "time/floor"]
    kernel_columns = [c.strip() for c in kernel_header.strip("┃").split("┃")]
    assert kernel_columns == ["aten op", "phase", "op", "n", "time ms"]
    assert "aten ops (top offenders: most time first" in text


def test_an_ncu_profile_keeps_its_measured_columns(tmp_path, monkeypatch, capsys):
    """The real H200 capture of tests/fixtures/ncu, re-rendered: its DRAM bytes and their gap stay."""
    monkeypatch.setenv("SALACTL_CACHE_DIR", str(tmp_path / "cache"))
    fixture = Path(__file__).parent / "fixtures" / "ncu"
    saved = tmp_path / "saved"
    saved.mkdir()
    shutil.copy(fixture / "step.json", saved / "step.json")
    (saved / "profile.csv").write_bytes(gzip.decompress((fixture / "profile.csv.gz").read_bytes()))
    code, text, err = run_cli(["profile", "--import", saved], capsys)
    assert code == 0, err
    header = next(line for line in text.splitlines() if line.startswith("┃ op "))
    assert [c.strip() for c in header.strip("┃").split("┃")] == [
        "op", "kernels", "time ms", "bytes", "GB/s", "TFLOP/s", "% peak BW", "% peak", "analytic bytes", "floor ms",
        "bytes gap", "time/floor"]
    assert "top offenders first: time ms − floor ms, largest first; bytes = DRAM;" in text
    kernel_header = next(line for line in text.splitlines() if line.startswith("┃ kernel "))
    assert "SM %" in kernel_header and "DRAM" in kernel_header
