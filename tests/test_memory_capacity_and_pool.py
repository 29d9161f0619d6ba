"""`salactl report memory`'s numbers: GPU capacities as nvidia-smi reports them (not datasheet GB read
as 10^9 bytes), the GPU engine's cache pools recorded by bench/sweep and used as the prediction of its
peak, and the full-attention column paged as the SALA KV is. CPU only; the GPU engine runs in
Triton's interpreter."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import micro_model, run_cli
from salactl.reports import memory as mem
from salactl.reports.memory_report import MemoryQuery, build
from salactl.runtime.presets import preset, sala_9b

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # before triton is first imported (GPU engine test)

CFG = sala_9b()
NANO = preset("sala-nano")


def salactl(*args):
    return subprocess.run([sys.executable, "-m", "salactl", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


# ---- 1: capacities --------------------------------------------------------------------------

def test_a_named_gpu_has_the_total_nvidia_smi_reports():
    p = salactl("report", "memory", "--model", "sala-9b", "--context", "4096,131072", "--kv-cache-dtype",
                "fp8_e4m3", "--weights", "bf16", "--gpu", "H100", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    h100 = 81559 * 2**20                            # nvidia-smi: 81559MiB, not 80 x 10^9 bytes
    fixed = d["server"]["bf16"]["fixed"]
    rows = d["concurrency"]
    assert [c["max_requests"] for c in rows] == [int((h100 * 0.9 - fixed) // r["total"])
                                                 for r in d["per_request"]] == [829, 91]      # were 756, 83
    assert [(c["gpu_bytes"], c["gpu_bytes_source"]) for c in rows] == [(h100, "nvidia-smi")] * 2
    assert "nvidia-smi" in d["assumptions"]["gpu_bytes"]


def test_gpu_mem_stays_decimal_gb_and_a_datasheet_capacity_says_so(capsys):
    code, out, err = run_cli(["report", "memory", "--model", "sala-9b", "--context", "4096", "--kv-cache-dtype",
                              "bf16", "--weights", "bf16", "--gpu", "H200,RTX PRO 6000D", "--json"], capsys)
    assert code == 0, err
    assert [(c["gpu"], c["gpu_bytes"], c["gpu_bytes_source"]) for c in json.loads(out)["concurrency"]] == [
        ("H200", 143771 * 2**20, "nvidia-smi"), ("RTX PRO 6000D", 84 * 10**9, "datasheet")]
    code, out, err = run_cli(["report", "memory", "--model", "sala-9b", "--context", "4096", "--kv-cache-dtype",
                              "bf16", "--weights", "bf16", "--gpu-mem", "80", "--json"], capsys)
    assert code == 0, err
    (c,) = json.loads(out)["concurrency"]
    assert (c["gpu"], c["gpu_bytes"], c["gpu_bytes_source"]) == ("80 GB", 80 * 10**9, "--gpu-mem")


# ---- 3: the full-attention column is paged as the SALA KV ------------------------------------

def test_full_attention_kv_holds_the_same_whole_pages_as_the_sala_kv():
    q = MemoryQuery(contexts=(1000, 1024), kv_dtypes=("bf16",), weights=("bf16",))
    short, aligned = build(CFG, q)["per_request"]
    assert short["kv_cache"] == 1024 * 8 * 1024                            # 16 pages of 64 tokens
    assert short["full_attention"] == 1024 * 32 * 1024                     # was 1000 tokens' (31.2 MiB)
    assert short["paged_tokens"] == aligned["paged_tokens"] == 1024
    assert short["full_attention"] / short["kv_cache"] == 32 / 8          # every layer vs the 8 sparse ones
    assert (short["full_attention"], short["total"]) == (aligned["full_attention"], aligned["total"])


# ---- 2: the GPU engine's cache pools in bench/sweep records and report memory --records ------

def gpu_target(free_bytes):
    """The embedded target as bench and sweep build it on the GPU engine (build_engine: no kv_tokens,
    no max_context), over the micro model on the CPU; free_bytes: the 'free GPU memory' its pools
    are sized from."""
    from salactl.bench.targets.embedded import EmbeddedTarget
    from salactl.bench.targets.engine_driver import EngineDriver, GpuStepper
    from salactl.runtime.gpu.engine import GPUEngine

    gpu = GPUEngine(micro_model(), "cpu", max_running_requests=2, chunk_size=32, free_bytes=free_bytes)
    return EmbeddedTarget(EngineDriver(GpuStepper(gpu), 2), "micro", 128, torch.device("cpu")), gpu


def measured(records, tmp_path, capsys, model="sala-nano"):
    f = tmp_path / "records.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out, err = run_cli(["report", "memory", "--model", model, "--records", f, "--gpu-mem", "80", "--json"],
                             capsys)
    assert code == 0, err
    return json.loads(out)["measured"], err


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="the GPU engine needs triton")
def test_the_gpu_engine_target_records_its_cache_pools_and_the_report_predicts_with_them(tmp_path, capsys):
    from salactl.bench.profiles import Phase
    from salactl.bench.records import make_record
    from salactl.bench.requests import BenchRequest
    from salactl.bench.runner import run_phase

    target, gpu = gpu_target(1_200_000_000)        # a few MiB of pools past the 1 GiB prefill reserve
    reqs = [BenchRequest(f"r{i}", 20, 2, tuple(range(3 + i, 23 + i))) for i in range(2)]
    try:
        outcome = run_phase(target, Phase("P", max_concurrency=2, warmup_requests=0, flush_cache=False), reqs)
    finally:
        target.close()
    assert all(r.success for r in outcome.results)
    plan = gpu.plan           # pages and slots sized from the free memory, plus one trash page and slot
    pools = ((plan.pages + 1) * plan.page_bytes + (plan.slots + 1) * plan.slot_bytes
             + (plan.slots + 1) * plan.max_pages_per_seq * 4                 # int32 page table
             + 2 * 2 * 2 * 4)                                                  # fp32 K/V scales: 2 layers x 2 heads
    assert plan.pages > 100 and outcome.device == {"cache_pool_bytes": pools}

    # a record as bench writes it from that phase, on CUDA (an allocator peak), its model's shapes readable
    ckpt = tmp_path / "micro"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(gpu.config.to_hf_dict()))
    target_knobs = {"engine": "gpu", "device": "cuda:0", "dtype": "float32", "weights": "float32",
                    "kv_cache_dtype": "float32", "chunk_size": 32, "max_running_requests": 2, "mem_fraction": 0.9}
    peak = pools + 3_000_000
    rec = make_record("bench", "b1", "gpu", "decode", "P", "embedded", str(ckpt),
                      {"completed": 2, "failed": 0, "peak_gpu_memory_bytes": peak, **outcome.device},
                      {"max_concurrency": 2, "input_len": 20, "output_len": 2, "target": target_knobs}, {})
    (row,) = measured([rec], tmp_path, capsys, str(ckpt))[0]
    weights = mem.weight_bytes(gpu.config, "bf16", 128, 4).total
    workspace = mem.prefill_workspace_bytes(gpu.config, 32, 4)          # 2 prompts of 20 packed into 32 tokens
    assert row["predicted"] == weights + workspace + pools
    assert row["ratio"] == pytest.approx(peak / row["predicted"])
    assert row["predicted_with"] == "cache_pool" and row["cache_pool_bytes"] == pools


def test_a_real_cpu_bench_record_keeps_the_per_request_prediction_and_a_gpu_shaped_one_uses_its_pool(
        tmp_path, capsys):
    out = tmp_path / "b"
    p = salactl("bench", "--profile", "decode", "--scale", "0.01", "--phases", "decode-bs1", "--device", "cpu",
                "--out", out)
    assert p.returncode == 0, p.stderr
    (rec,) = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert "cache_pool_bytes" not in rec            # the reference engine's cache grows with its request
    ctx = rec["knobs"]["input_len"] + rec["knobs"]["output_len"]
    weights = mem.weight_bytes(NANO, "bf16", 128, 4).total
    peak = 60_000_000
    (row,), _ = measured([{**rec, "peak_gpu_memory_bytes": peak}], tmp_path, capsys)
    assert row["predicted"] == (weights + mem.prefill_workspace_bytes(NANO, rec["knobs"]["input_len"], 4)
                                + mem.request_memory(NANO, ctx, "float32", key_bytes=4).total)
    assert row["predicted_with"] == "per_request" and row["cache_pool_bytes"] is None

    # the same phase on the GPU engine at batch 8: its pools took 70% of a 80 GB card, whatever 8
    # requests of 13 tokens needed; the prediction is what it held, not 8 x per-request
    pool, peak = 56_000_000_000, 56_400_000_000
    target = {**rec["knobs"]["target"], "engine": "gpu", "max_running_requests": 64, "mem_fraction": 0.9}
    gpu_rec = {**rec, "run_id": "g", "phase": "decode-bs8", "batch_size": 8, "peak_gpu_memory_bytes": peak,
               "cache_pool_bytes": pool, "knobs": {**rec["knobs"], "batch_size": 8, "target": target}}
    (row,), _ = measured([gpu_rec], tmp_path, capsys)
    workspace = mem.prefill_workspace_bytes(NANO, min(512, 8 * rec["knobs"]["input_len"]), 4)
    assert row["batch"] == 8 and row["predicted"] == weights + workspace + pool and 1 < row["ratio"] < 1.01
    assert (row["predicted_with"], row["cache_pool_bytes"]) == ("cache_pool", pool)

    # a hand-edited pool that is no number is dropped (with the other bad metrics' warning): per request
    (row,), err = measured([{**gpu_rec, "cache_pool_bytes": "56 GB"}], tmp_path, capsys)
    assert row["predicted_with"] == "per_request" and "cache_pool_bytes" in err


def test_bench_and_sweep_tables_show_the_cache_pool_next_to_the_peak():
    from salactl.bench.summary import table_rows as bench_table
    from salactl.cmd_sweep import table_rows as sweep_table

    phase = {"phase": "S8", "completed": 8, "peak_gpu_memory_bytes": 3 * 2**30, "cache_pool_bytes": 2**30}
    cols, rows = bench_table({"phases": [phase]})
    assert cols[-2:] == ["peak GiB", "cache pool GiB"] and rows[0][-2:] == [3.0, 1.0]
    cols, _ = bench_table({"phases": [{k: v for k, v in phase.items() if k != "cache_pool_bytes"}]})
    assert "cache pool GiB" not in cols
    point = {"phase": "p0", "point_key": "k", "peak_gpu_memory_bytes": 3 * 2**20, "cache_pool_bytes": 2**20}
    cols, rows = sweep_table({"points": [point], "pareto_point_keys": ["k"]})
    assert rows[0][cols.index("GPU peak MiB")] == 3.0 and rows[0][cols.index("cache pool MiB")] == 1.0
    cols, _ = sweep_table({"points": [{"phase": "p0"}], "pareto_point_keys": []})
    assert "cache pool MiB" not in cols
