"""`salactl sweep`: accuracy proxies against the dense reference, the Pareto front, grid
validation, resume, and the CLI end to end on the embedded model (CPU, tiny workload)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import tiny_config, tiny_model
from salactl.bench.accuracy import dense_config, logit_kl, prompt_logits, with_config
from salactl.bench.grid_memory import cache_bytes_per_request
from salactl.bench.pareto import pareto_front
from salactl.bench.sweep_grid import build_points, parse_names, point_key, SweepPoint, KV_DTYPES, WEIGHT_DTYPES
from salactl.bench.sweep_job import SweepSettings, run_sweep
from salactl.errors import ConfigError, OutputExistsError, UsageError
from salactl.runtime.presets import sala_9b


def test_logit_kl_against_dense_reference():
    # block 32, window 64 (2 blocks), topk 1: 3 blocks = 96 tokens per query, sparse from t = 63
    model = tiny_model(tiny_config(dense_len=64, topk=1))
    cfg = model.config
    prompt = torch.randint(3, cfg.vocab_size, (160,), generator=torch.Generator().manual_seed(0)).tolist()
    ref = prompt_logits(with_config(model, dense_config(cfg, len(prompt))), prompt, 512)
    q = prompt_logits(model, prompt, 512)
    own = logit_kl(ref, q, cfg.sparse_config.dense_len)
    assert own["logit_kl_mean"] > 0 and own["kl_sparse_positions"] == 160 - 63
    # queries that still see every block (t < 96) agree with the dense reference
    early = logit_kl(ref[:96], q[:96], 10**9)
    assert early["logit_kl_max"] < 1e-7 and early["top1_agreement"] == 1.0      # fp32 summation order only
    assert own["logit_kl_sparse_mean"] == pytest.approx(own["logit_kl_mean"] * 160 / 97)
    # KL matches torch's definition
    want = torch.nn.functional.kl_div(torch.log_softmax(q, -1), torch.log_softmax(ref, -1), log_target=True,
                                      reduction="none").sum(-1).mean()
    assert own["logit_kl_mean"] == pytest.approx(float(want), rel=1e-9)
    # a tighter selection (window of 1 block) diverges more
    import dataclasses
    tight = cfg.replace(sparse_config=dataclasses.replace(cfg.sparse_config, window_size=32))
    worse = logit_kl(ref, prompt_logits(with_config(model, tight), prompt, 512), 64)
    assert worse["logit_kl_mean"] > own["logit_kl_mean"]


def test_with_config_shares_weights():
    model = tiny_model()
    view = with_config(model, dense_config(model.config, 100))
    assert view.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()
    assert view.config.sparse_config.dense_len > 100 and model.config.sparse_config.dense_len == 256


def test_pareto_front():
    pts = [{"phase": "a", "x": 1.0, "y": 5.0}, {"phase": "b", "x": 2.0, "y": 1.0},
           {"phase": "c", "x": 3.0, "y": 1.0}, {"phase": "d", "x": 1.5, "y": 6.0},
           {"phase": "e", "x": 0.5, "y": None}, {"phase": "f", "x": 1.0, "y": 5.0}]
    assert [p["phase"] for p in pareto_front(pts, "x", "y")] == ["a", "f", "b"]


def test_cache_bytes_match_the_architecture_notes():
    cfg = sala_9b()
    gla = 48 * 2**20                                     # 24 layers x 32 heads x 128^2 x fp32
    per_token_bf16 = 8 * 1024                            # 8 sparse layers x 2 x 2 heads x 128 x 2 B
    no_k1 = cache_bytes_per_request(cfg, 1, 2, 2)        # one token: no full compression window
    assert no_k1 == per_token_bf16 + gla
    assert cache_bytes_per_request(cfg, 1, 1, 2) == per_token_bf16 // 2 + gla


def test_grid_validation():
    base = tiny_config().sparse_config
    axes = {"dense_len": [0, 256], "topk": [4], "window": [64, 48], "block": [32], "chunk_size": [64],
            "batch_size": [1], "kv_dtype": ["bf16"], "weight_dtype": ["fp32"]}
    points, varying, invalid = build_points(axes, base)
    assert varying == ["dense_len", "window"] and len(points) == 2 and len(invalid) == 2
    assert "not a multiple of block_size" in invalid[0][1]
    assert points[0].label(varying) == "dl0-w64"
    with pytest.raises(UsageError, match="supported today: bf16, fp8_e5m2, fp8_e4m3"):
        parse_names("fp8", "kv-dtype", "bf16", KV_DTYPES)
    p = points[0]
    assert point_key(p, {"m": 1}) == point_key(SweepPoint(**p.knobs()), {"m": 1}) != point_key(p, {"m": 2})


def salactl(*args, timeout=600):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "salactl", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


COMMON = ("--device", "cpu", "--dtype", "float32", "--input-len", "24", "--output-len", "3",
          "--requests", "1", "--kl-len", "192", "--passkey-lengths", "64", "--passkey-depths", "0.5",
          "--passkey-trials", "1", "--topk", "2")


def test_sweep_cli_end_to_end_and_resume(tmp_path):
    out = tmp_path / "sw"
    r = salactl("sweep", *COMMON, "--dense-len", "32,4096", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    pts = {p["phase"]: p for p in run["points"]}
    assert set(pts) == {"dl32", "dl4096"}
    dense, sparse = pts["dl4096"], pts["dl32"]
    assert dense["logit_kl_mean"] == 0.0 and dense["top1_agreement"] == 1.0   # the reference itself
    assert sparse["logit_kl_mean"] > 0 and sparse["kl_sparse_positions"] == 192 - 31
    for p in pts.values():
        assert p["kind"] == "sweep" and p["schema_version"] == 1 and p["completed"] == 1
        assert p["mean_ttft_ms"] > 0 and p["mean_tpot_ms"] > 0 and p["output_throughput"] > 0
        assert 0.0 <= p["passkey_accuracy"] <= 1.0 and p["cache_bytes_per_request"] > 0
        assert p["knobs"]["topk"] == 2 and p["knobs"]["kv_dtype"] == "bf16" and p["env"]["torch"]
        # what ran, as run/bench records name it: "bf16" KV on a float32 model stores float32
        assert p["knobs"]["kv_cache_dtype"] == "float32" and p["knobs"]["weights"] == "float32"
    assert run["pareto"] and set(run["pareto"]) <= set(pts)
    assert len((out / "records.jsonl").read_text().splitlines()) == 2

    with pytest.raises(OutputExistsError, match="--resume"):
        run_sweep(SweepSettings(out=out, device="cpu"))

    # resume in-process (same settings as COMMON): the recorded dense_len 32 point is skipped
    run2 = run_sweep(SweepSettings(device="cpu", dtype="float32", input_len=24, output_len=3, requests=1,
                                   kl_len=192, passkey_lengths="64", passkey_depths="0.5", passkey_trials=1,
                                   topk="2", dense_len="32", kv_dtype="bf16,fp8_e5m2", out=out,
                                   resume=True)).to_dict()
    assert run2["resumed_points"] == 1 and len(run2["points"]) == 2
    fp8 = [p for p in run2["points"] if p["knobs"]["kv_dtype"] == "fp8_e5m2"]
    assert len(fp8) == 1 and fp8[0]["logit_kl_mean"] > 0          # fp8 KV rounds keys/values
    assert len((out / "records.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize("kw, err, message", [
    ({"batch_size": "1,4"}, UsageError, "supported today: 1 with the reference engine"),
    ({"weight_dtype": "int3"}, UsageError, "supported today: bf16, fp16, fp32, w4a16"),
    ({"kv_dtype": "fp8"}, UsageError, "supported today: bf16, fp8_e5m2, fp8_e4m3"),
    ({"topk": "2,x"}, UsageError, "comma-separated integers"),
    ({"topk": "2,,4"}, UsageError, "comma-separated integers"),
    ({"kl_len": 0}, UsageError, "--kl-len must be positive, got 0"),
    ({"mem_fraction": 0.0}, UsageError, "mem_fraction \\(--mem-fraction\\) must be in \\(0, 1\\]"),
    ({"passkey_depths": "0.5,1.5"}, UsageError, "--passkey-depths must lie in \\[0, 1\\]"),
    ({"kl": False, "kl_len": 64}, UsageError, "^--kl-len applies to the logit KL, which --no-kl skips; drop it, or drop --no-kl$"),
    ({"passkey": False, "passkey_lengths": "512"}, UsageError,
     "^--passkey-lengths configures the passkey test, which --no-passkey skips; drop it, or drop --no-passkey$"),
    ({"passkey": False, "passkey_depths": "0.5", "passkey_trials": 2}, UsageError,
     "^--passkey-depths, --passkey-trials configure the passkey test, which --no-passkey skips; drop them"),
    ({"max_running_requests": 64}, UsageError, "^--max-running-requests sizes the GPU engine; the reference engine"),
    ({"mem_fraction": 0.9}, UsageError, "^--mem-fraction sizes the GPU engine; the reference engine serves one"),
    ({"max_running_requests": 0}, UsageError, "--max-running-requests must be positive, got 0"),
    ({"window": "48", "random_weights": True}, UsageError,
     "^--window 48 is not a multiple of the block size 32; use a multiple of 32$"),
    ({"kv_dtype": "fp8_e4m3", "kl": False, "passkey": False, "requests": 1, "input_len": 8, "output_len": 2},
     ConfigError, "no point could be measured .*needs calibrated k/v scales"),   # every point fails to build
])
def test_sweep_rejects_unsupported_knobs(tmp_path, kw, err, message):
    with pytest.raises(err, match=message):
        run_sweep(SweepSettings(device="cpu", out=tmp_path / "o", **kw))
    assert not (tmp_path / "o").exists()


def test_sweep_cli_error_is_one_line(tmp_path):
    r = salactl("sweep", "--device", "cpu", "--batch-size", "4", "--out", str(tmp_path / "a"))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "--batch-size 4 is not supported" in r.stderr


def test_sweep_weight_dtype_w4a16_and_w8a16_in_memory(tmp_path):
    run = run_sweep(SweepSettings(device="cpu", dtype="float32", input_len=16, output_len=2, requests=1,
                                  kl_len=64, passkey=False, dense_len="4096", weight_dtype="fp32,w4a16,w8a16",
                                  out=tmp_path)).to_dict()
    pts = {p["knobs"]["weight_dtype"]: p for p in run["points"]}
    assert pts["fp32"]["logit_kl_mean"] == 0.0                   # dense attention, same weights: the reference
    assert 0 < pts["w4a16"]["logit_kl_mean"] < 1.0                 # RTN 4-bit group 128 moves the logits a little
    assert 0 < pts["w8a16"]["logit_kl_mean"] < pts["w4a16"]["logit_kl_mean"]     # 8-bit moves them less
    assert pts["w4a16"]["top1_agreement"] > 0.5 and pts["w8a16"]["completed"] == 1
    assert pts["w4a16"]["completed"] == 1
    assert [pts[w]["knobs"]["weights"] for w in ("fp32", "w4a16", "w8a16")] == ["float32", "w4a16", "w8a16"]


def test_no_kl_says_why_there_is_no_pareto_front(tmp_path):
    run = run_sweep(SweepSettings(device="cpu", input_len=8, output_len=2, requests=1, kl=False, passkey=False,
                                  out=tmp_path)).to_dict()
    assert run["pareto"] == [] and len(run["points"]) == 1
    assert any("no Pareto front" in n and "--no-kl" in n for n in run["notes"])
    knobs = run["points"][0]["knobs"]        # the passkey options left out keep their stated defaults
    assert (knobs["passkey_lengths"], knobs["passkey_depths"], knobs["passkey_trials"]) == ([512], [0.25, 0.75], 2)


def test_sweep_weight_dtype_casts_name_and_size_what_ran(tmp_path):
    """bf16 on a float32 model casts the whole model: its record names bfloat16 activations, and its
    cache bytes count the KV and K1 at 2 bytes (the fp32 point's at 4)."""
    run = run_sweep(SweepSettings(device="cpu", dtype="float32", input_len=32, output_len=2, requests=1,
                                  kl=False, passkey=False, weight_dtype="bf16,fp32", out=tmp_path)).to_dict()
    pts = {p["knobs"]["weight_dtype"]: p for p in run["points"]}
    bf16, fp32 = pts["bf16"], pts["fp32"]
    assert [bf16["knobs"][k] for k in ("dtype", "weights", "kv_cache_dtype")] == ["bfloat16"] * 3
    assert [fp32["knobs"][k] for k in ("dtype", "weights", "kv_cache_dtype")] == ["float32"] * 3
    from salactl.runtime.presets import preset
    cfg = preset("sala-nano")
    assert bf16["cache_bytes_per_request"] == cache_bytes_per_request(cfg, 34, 2, 2) == 214784
    assert fp32["cache_bytes_per_request"] == cache_bytes_per_request(cfg, 34, 4, 4) == 232960


def test_an_interrupted_sweep_says_so_in_its_summary(tmp_path):
    """Ctrl-C after the first point: the summary written on the way out is marked interrupted (its
    points and front cover the finished points only), and --resume then runs only the rest."""
    import json

    class StopAfterFirstPoint:
        def begin(self, name, total): ...

        def end(self): ...

        def advance_point(self):
            raise KeyboardInterrupt

    settings = dict(device="cpu", input_len=8, output_len=2, requests=1, kl=False, passkey=False,
                    topk="1,2", out=tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(SweepSettings(**settings), progress=StopAfterFirstPoint())
    (summary,) = tmp_path.glob("*-sweep.json")
    first = json.loads(summary.read_text())
    assert first["interrupted"] is True and len(first["points"]) == 1
    rest = run_sweep(SweepSettings(**settings, resume=True)).to_dict()
    assert rest["interrupted"] is False and rest["resumed_points"] == 1 and len(rest["points"]) == 2


def test_cpu_cache_check_sizes_the_widest_weight_dtype_cast(monkeypatch):
    """--dtype bf16 with a --weight-dtype fp32 point runs that point's caches in fp32."""
    import torch

    from salactl.bench import sweep_sizes
    from salactl.bench.sweep_job import SweepSettings
    from salactl.errors import CapacityError
    from salactl.runtime import loader
    from salactl.runtime.presets import sala_nano

    s = SweepSettings(dtype="bf16", input_len=100_000, output_len=0, requests=1, kl=False, passkey=False)
    bf16, fp32 = (sweep_sizes.prefill_bytes(sala_nano(), 100_000, 100_000, 1, 512, 256, b) for b in (2, 4))
    monkeypatch.setattr(loader, "available_host_bytes", lambda: (bf16 + fp32) // 2)
    sweep_sizes.check_sizes_fit(s, torch.device("cpu"))                   # bf16 caches fit
    with pytest.raises(CapacityError, match="1 request\\(s\\) of 100,000 tokens.*KV cache in --kv-cache-dtype bf16 and states"):
        sweep_sizes.check_sizes_fit(SweepSettings(**{**s.__dict__, "weight_dtype": "bf16,fp32"}),
                                    torch.device("cpu"))


def test_sweep_names_take_the_aliases_of_the_other_commands():
    """KV "auto" is "bf16" (the model's dtype, as run, eval and bench read it); the casts take --dtype's
    long names. Aliases fold into one point."""
    assert parse_names("auto,bf16,fp8_e5m2", "kv-cache-dtype", "bf16", KV_DTYPES) == ["bf16", "fp8_e5m2"]
    assert parse_names("float32,fp32,bfloat16,float16,w4a16", "weight-dtype", "bf16", WEIGHT_DTYPES) == \
        ["fp32", "bf16", "fp16", "w4a16"]
    with pytest.raises(UsageError, match="^--weight-dtype 'auto' is not supported; supported today: bf16, fp16, "
                                         "fp32, w4a16, w8a16 \\(also bfloat16 for bf16, float16 for fp16, "
                                         "float32 for fp32\\)$"):
        parse_names("auto", "weight-dtype", "bf16", WEIGHT_DTYPES)


def test_sweep_cli_takes_auto_kv_the_weights_alias_and_short_out(tmp_path):
    out = tmp_path / "sw"
    r = salactl("sweep", "--device", "cpu", "--dtype", "float32", "--kv-cache-dtype", "auto", "--weights", "float32",
                "--input-len", "24", "--output-len", "2", "--requests", "1", "--no-kl", "--no-passkey",
                "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    (point,) = json.loads(r.stdout)["points"]
    knobs = point["knobs"]
    assert (knobs["kv_dtype"], knobs["weight_dtype"]) == ("bf16", "fp32")
    assert knobs["kv_cache_dtype"] == knobs["weights"] == "float32"       # the stored names, as run records them
    assert (out / "records.jsonl").is_file()
