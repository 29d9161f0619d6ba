"""`salactl sweep` review findings: the passkey runs with the point's KV cache dtype; accuracy proxies
that never reach a point's sparse path keep it off the front; points whose requests all fail are not
recorded; non-numeric accuracies on --resume; the reference engine's prefill workspace in the memory
check and out-of-memory as exit 11; FP8 scales resolved before the reference; tpot needs two output
tokens; the forced-blocks warning only where the sparse path runs, said once."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from salactl.bench.accuracy import passkey_accuracy
from salactl.bench.pareto import pareto_front
from salactl.bench.requests import RequestResult
from salactl.bench.sweep_job import SweepSettings, run_sweep, unmeasured
from salactl.bench.sweep_sizes import sweep_prefill_bytes
from salactl.errors import CapacityError, ConfigError, UsageError
from salactl.runtime import loader
from salactl.runtime.loader import load_model
from salactl.runtime.presets import sala_nano
from salactl.runtime.tokenizer import find_tokenizer

NANO_DIR = Path(loader.__file__).parent / "models" / "sala-nano"
# e4m3 keeps nothing below 2^-9: keys and values divided by this scale are stored as zeros
CRUSHING_KV_SCALE = 1e4
QUICK = dict(device="cpu", input_len=16, output_len=2, requests=1)
ONE_PASSKEY = dict(passkey_lengths="512", passkey_depths="0.5", passkey_trials=1)


def _nano_with_kv_scales(tmp_path: Path, scale: float) -> Path:
    """The embedded model's checkpoint plus calibrated-looking FP8 KV scales on its softmax layers."""
    out = tmp_path / "nano-kv"
    shutil.copytree(NANO_DIR, out)
    names = [f"model.layers.{i}.self_attn.{kv}_scale" for i in sala_nano().sparse_layers for kv in "kv"]
    save_file({n: torch.tensor(scale) for n in names}, str(out / "kv-scales.safetensors"), metadata={"format": "pt"})
    index = json.loads((out / "model.safetensors.index.json").read_text())
    index["weight_map"].update({n: "kv-scales.safetensors" for n in names})
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


def test_passkey_runs_with_the_points_kv_cache_dtype(tmp_path):
    """Scales that crush every key and value to zero in e4m3: the fp8_e4m3 point cannot find the key
    (its KL says so too), the bf16 point does; both passkeys used to run on a full-precision cache."""
    lm = load_model(str(_nano_with_kv_scales(tmp_path, CRUSHING_KV_SCALE)), "cpu")
    tok = find_tokenizer(None, lm.model_dir)
    for kv, accuracy in (("bf16", 1.0), ("fp8_e4m3", 0.0)):
        assert passkey_accuracy(lm.model, tok, [512], [0.25, 0.75], 1, 0, 512, lm.model_dir,
                                kv)["passkey_accuracy"] == accuracy
    run = run_sweep(SweepSettings(model=str(tmp_path / "nano-kv"), **QUICK, kl_len=64, kv_dtype="bf16,fp8_e4m3",
                                  **ONE_PASSKEY, out=tmp_path / "sw")).to_dict()
    pts = {p["knobs"]["kv_dtype"]: p for p in run["points"]}
    assert pts["bf16"]["passkey_accuracy"] == 1.0 and pts["fp8_e4m3"]["passkey_accuracy"] == 0.0
    assert pts["fp8_e4m3"]["logit_kl_mean"] > pts["bf16"]["logit_kl_mean"] == 0.0


def test_points_rebuilt_from_a_checkpoint_with_kv_scales_keep_them(tmp_path):
    """with_config and the --weight-dtype casts rebuild the model over its tensors; the strict build
    used to fail on the scales ("Unexpected key(s) ... k_scale"), which every sweep of such a checkpoint
    hits."""
    from salactl.bench.accuracy import dense_config, rebuild_model, with_config
    from salactl.runtime.kv_fp8 import model_kv_scales

    lm = load_model(str(_nano_with_kv_scales(tmp_path, 0.5)), "cpu")
    scales = model_kv_scales(lm.model)
    assert sorted(scales) == list(lm.config.sparse_layers)
    dense, cast = with_config(lm.model, dense_config(lm.config, 100)), rebuild_model(lm.model, lm.config, torch.bfloat16)
    for model in (dense, cast):
        assert {i: (k.item(), v.item(), k.dtype) for i, (k, v) in model_kv_scales(model).items()} == {
            i: (0.5, 0.5, torch.float32) for i in scales}
    assert cast.lm_head.weight.dtype == torch.bfloat16


def test_proxies_that_end_before_dense_len_keep_sparse_points_off_the_front(tmp_path):
    """--kl-len 64 and passkeys of 128 tokens never reach dense_len 256, while the 300-token speed
    prompts do: the points' KL of 0 measures dense attention, so they are left off the front, with
    a note naming them (they used to win it on speed alone)."""
    proxies = dict(kl_len=64, passkey_lengths="128", passkey_depths="0.5", passkey_trials=1)
    run = run_sweep(SweepSettings(**{**QUICK, "input_len": 300}, topk="2,4", **proxies, out=tmp_path / "a")).to_dict()
    assert [p["logit_kl_mean"] for p in run["points"]] == [0.0, 0.0]          # kept as measured
    assert [p["kl_sparse_positions"] for p in run["points"]] == [0, 0]
    assert run["pareto"] == []
    kl_note, passkey_note = [n for n in run["notes"] if n.startswith("tk2, tk4:")]
    assert "KL prompt's 64 tokens end before dense_len (256)" in kl_note and "raise --kl-len to 256 or more" in kl_note
    assert "Pareto front leaves them out" in kl_note
    assert "passkey accuracy measures dense attention only" in passkey_note
    assert "raise --passkey-lengths to 256 or more" in passkey_note


def test_a_point_that_runs_dense_attention_everywhere_keeps_its_exact_kl_on_the_front(tmp_path):
    """dense_len 100000: the speed workload runs dense attention too, so its KL of 0 is exact."""
    run = run_sweep(SweepSettings(**{**QUICK, "input_len": 300}, dense_len="100000", kl_len=64, passkey=False,
                                  out=tmp_path)).to_dict()
    assert run["pareto"] == ["default"] and not any("dense_len" in n for n in run["notes"])


def _result(ok: bool, error: str = "") -> RequestResult:
    r = RequestResult("r", "tk2", 300, 4)
    r.success, r.error = ok, error
    return r


def test_a_point_whose_requests_all_fail_measured_nothing(capsys):
    """No failure mode of the CPU engines makes the timed requests fail after a successful warmup, so
    the decision _measure takes is checked on real results: all failed -> the reason (the point goes
    to invalid_points, unrecorded); some failed -> recorded, with a warning."""
    assert unmeasured("tk2", [_result(True), _result(True)]) is None
    assert capsys.readouterr().err == ""
    why = unmeasured("tk2", [_result(False, "RuntimeError: boom")] * 2)
    assert why == "phase tk2: all 2 requests failed (2x: RuntimeError: boom)"
    assert unmeasured("tk2x", [_result(True), _result(False, "RuntimeError: boom")]) is None
    err = capsys.readouterr().err
    assert "phase tk2x: 1 of 2 requests failed (1x: RuntimeError: boom)" in err and "--details" not in err


def test_the_table_has_a_failed_column(tmp_path):
    r = subprocess.run([sys.executable, "-m", "salactl", "sweep", "--device", "cpu", "--input-len", "16",
                        "--output-len", "2", "--requests", "1", "--no-kl", "--no-passkey", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if "point" in line)
    assert [c.strip() for c in header.strip("┃│ ").split("┃")][:3] == ["point", "failed", "TTFT ms"]
    assert r.stderr.count("no Pareto front") == 1            # each note said once


@pytest.mark.parametrize("value", ["nan", "inf", float("nan"), float("inf"), True, None])
def test_pareto_front_skips_accuracies_that_are_not_finite_numbers(value):
    pts = [{"phase": "a", "x": 1.0, "y": value}, {"phase": "b", "x": 2.0, "y": 0.1},
           {"phase": "c", "x": 3.0, "y": 0.2}, {"phase": "d", "x": 0.5, "y": 1}]
    assert [p["phase"] for p in pareto_front(pts, "x", "y")] == ["d", "b"]


def test_resume_over_a_record_whose_kl_is_stored_as_nan_writes_its_summary(tmp_path):
    settings = dict(**QUICK, kl_len=64, passkey=False, topk="2,4", out=tmp_path)
    run_sweep(SweepSettings(**settings))
    records = tmp_path / "records.jsonl"
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    rows[0]["logit_kl_mean"] = "nan"          # what jsonable stores for a NaN
    records.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = run_sweep(SweepSettings(**settings, resume=True)).to_dict()
    assert run["resumed_points"] == 2 and run["pareto"] == [rows[1]["phase"]]
    assert Path(run["files"]["summary_json"]).is_file()


def test_a_prefill_workspace_past_host_memory_is_refused_before_loading_saying_what_fits(tmp_path, monkeypatch):
    """6,000 dense queries over 6,000 keys in one chunk hold three fp32 [8, 6000, 6000] score tensors
    (measured: 3.9 GB peak against 0.8 GB at chunk 512). With room for chunk 512 but not 6000, the
    sweep is refused with exit 11 and the largest chunk size that fits."""
    cfg = sala_nano()
    small, big = (sweep_prefill_bytes(cfg, 6000, 6002, 1, c, 8192, 4) for c in (512, 6000))
    assert big > 3e9 and small < 0.4e9
    avail = (small + big) // 2
    monkeypatch.setattr(loader, "available_host_bytes", lambda: avail)
    with pytest.raises(CapacityError) as e:
        run_sweep(SweepSettings(**{**QUICK, "input_len": 6000}, kl=False, passkey=False, dense_len="8192",
                                chunk_size="6000", dtype="float32", out=tmp_path / "o"))
    fits = int(str(e.value).split("use --chunk-size ")[1].split(" ")[0].replace(",", ""))
    need = [sweep_prefill_bytes(cfg, 6000, 6002, 1, c, 8192, 4) for c in (fits, fits + 1)]
    assert need[0] <= avail < need[1]
    assert "the speed workload: 1 request(s) of 6,002 tokens, prefilled 6,000 at a time" in str(e.value)
    assert CapacityError.exit_code == 11 and not (tmp_path / "o").exists()


def _refuses_allocations_past_ram_and_swap() -> bool:
    """Linux's heuristic (0) or strict (2) overcommit; with 1 a huge allocation succeeds and the OOM
    killer ends the process when its pages are touched."""
    mode = Path("/proc/sys/vm/overcommit_memory")
    return mode.exists() and mode.read_text().strip() in ("0", "2")


@pytest.mark.skipif(not _refuses_allocations_past_ram_and_swap(), reason="needs an allocator that refuses 1.3 TB")
@pytest.mark.filterwarnings("ignore::salactl.errors.ModelLimitWarning")       # past the trained length, on purpose
def test_a_warmup_that_runs_out_of_memory_is_a_capacity_error_not_the_endpoints(tmp_path, monkeypatch):
    """Where the machine does not say how much memory is free, the check cannot refuse; the scores of
    200,000 dense queries (1.3 TB) then fail to allocate in the warmup: exit 11, not exit 8."""
    monkeypatch.setattr(loader, "available_host_bytes", lambda: None)
    with pytest.raises(CapacityError, match="warmup request of phase default failed: the embedded engine ran out "
                                            "of memory .*can't allocate memory.*; lower --chunk-size"):
        run_sweep(SweepSettings(**{**QUICK, "input_len": 200_000}, kl=False, passkey=False, dense_len="300000",
                                chunk_size="200000", dtype="float32", out=tmp_path / "o"))
    assert not (tmp_path / "o").exists()


class _Progress:
    def __init__(self):
        self.begun = False

    def begin(self, name, total):
        self.begun = True

    def advance_point(self): ...

    def end(self): ...


def test_fp8_e4m3_without_scales_is_refused_before_the_dense_reference(tmp_path):
    progress = _Progress()
    with pytest.raises(ConfigError, match="no point could be measured .*needs calibrated k/v scales"):
        run_sweep(SweepSettings(**QUICK, kl_len=64, passkey=False, kv_dtype="fp8_e4m3", out=tmp_path / "o"),
                  progress)
    assert not progress.begun and not (tmp_path / "o").exists()
    run = run_sweep(SweepSettings(**QUICK, kl_len=64, passkey=False, kv_dtype="bf16,fp8_e4m3",
                                  out=tmp_path / "p")).to_dict()
    assert [p["knobs"]["kv_dtype"] for p in run["points"]] == ["bf16"]
    assert [p["knobs"]["kv_dtype"] for p in run["invalid_points"]] == ["fp8_e4m3"]


def test_pareto_x_tpot_needs_two_output_tokens(tmp_path):
    with pytest.raises(UsageError, match="--pareto-x tpot needs --output-len 2 or more"):
        run_sweep(SweepSettings(**{**QUICK, "output_len": 1}, pareto_x="tpot", out=tmp_path / "o"))
    assert not (tmp_path / "o").exists()


def test_forced_blocks_warning_only_for_points_that_run_sparse_and_only_once(tmp_path):
    r = subprocess.run([sys.executable, "-m", "salactl", "sweep", "--device", "cpu", "--topk", "1",
                        "--dense-len", "64,4096", "--input-len", "24", "--output-len", "2", "--requests", "1",
                        "--kl-len", "100", "--no-passkey", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("init_blocks 1") == 1 and "warning: point dl64: sparse_config.topk 1" in r.stderr
    summary = json.loads(next(tmp_path.glob("*-sweep.json")).read_text())
    assert [n for n in summary["notes"] if "init_blocks" in n] == [
        n for n in summary["notes"] if n.startswith("dl64: sparse_config.topk 1")]
    assert len([n for n in summary["notes"] if "init_blocks" in n]) == 1
