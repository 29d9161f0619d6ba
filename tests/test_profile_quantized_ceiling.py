"""`salactl profile` floors a float32 model's quantized linears at the bf16 matmul rate they compute
at, as `salactl run` does (tests/test_roofline_quantized_ceiling.py): the manifest carries each op's
and scope's bf16_flops, the op and layer tables take runtime/roofline.py compute_tflops per row, and
--import of an ncu profile takes the rates from its manifest. A manifest without bf16_flops (an
unquantized model's, or one written before they were counted) keeps the one rate."""

import json
import os
import subprocess
import sys

import pytest
import torch

from salactl.cmd_profile import render
from salactl.profiling.analytic import scoped_costs, sum_scopes
from salactl.run_job import run_phase_costs
from salactl.runtime.loader import load_model
from salactl.runtime.roofline import OP_CLASSES

from test_profile_import import fixture_manifest, ncu_profile_dir
from test_roofline_quantized_ceiling import BF16, FP32, MEM_GBPS, QUANTIZED_OPS, compute_s, peaks_cache  # noqa: F401

BOTH_RATES = "(fp32 matmul, 0.4 TFLOP/s bf16 for the quantized linears; measured)"


def salactl_profile(cache, *args) -> dict:
    env = {**os.environ, "SALACTL_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-m", "salactl", "profile", *map(str, args), "--json"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def torch_profile(model, cache, out, *args) -> dict:
    return salactl_profile(cache, "--torch", "--model", model, "--device", "cpu", "--dtype", "float32",
                           "--context", 64, "--chunk-size", 32, "--warmup", 0, "--out", out, *args)


def check_floors(d: dict, mem_gbps: float) -> None:
    """Every op and layer row's floor and % of peak: its FLOPs at the model dtype's rate, those of
    its bf16_flops at the quantized rate where the peaks give one."""
    p = d["peaks"]
    tflops, bf16 = p["compute_tflops"], p.get("quantized_compute_tflops", p["compute_tflops"])
    steps = d["manifest"]["steps"]

    def seconds(costs) -> tuple[float, float]:
        """(bytes at peak bandwidth, FLOPs at their peak rates)"""
        flops, bf16_flops = sum(c["flops"] for c in costs), sum(c.get("bf16_flops", 0) for c in costs)
        return (sum(c["bytes"] for c in costs) / (mem_gbps * 1e9),
                (flops - bf16_flops) / (tflops * 1e12) + bf16_flops / (bf16 * 1e12))

    for r in d["ops"]:
        if r["op"] == "other (unattributed)":       # the wall time no op covers: no analytic cost
            assert (r["analytic_bytes"], r["analytic_flops"], r["floor_s"]) == (0, 0, 0)
            continue
        costs = steps[r["phase"]]["analytic"]
        bytes_s, flops_s = seconds(list(costs.values()) if r["op"] == "total" else [costs[r["op"]]])
        assert r["floor_s"] == pytest.approx(max(bytes_s, flops_s), rel=1e-9), r
        if r["time_s"] and flops_s:
            compute_pct = 100 * flops_s / r["time_s"]       # the FLOPs' time at peak over the time taken
            assert r["pct_of_peak"] == pytest.approx(max(r["pct_of_peak_bw"], compute_pct)), r
    for r in d["layers"]:
        costs = steps[r["phase"]]["analytic_by_scope"][r["scope"]].values()
        assert r["floor_s"] == pytest.approx(max(seconds(list(costs))), rel=1e-9), r


def test_a_quantized_float32_torch_profile_floors_its_linears_at_the_bf16_rate(nano_rtn_dir, peaks_cache,
                                                                                 tmp_path, capsys):
    d = torch_profile(nano_rtn_dir, peaks_cache, tmp_path / "p", "--phase", "both")
    p = d["peaks"]
    assert (p["compute_tflops"], p["quantized_compute_tflops"]) == (FP32, BF16)
    for phase, step in d["manifest"]["steps"].items():
        for op in OP_CLASSES:
            c = step["analytic"][op]
            assert c.get("bf16_flops") == (c["flops"] if op in QUANTIZED_OPS else None), (phase, op)
        for scope, costs in step["analytic_by_scope"].items():        # the lm_head is not quantized
            quantized = set(QUANTIZED_OPS) if scope.startswith("layer") else set()
            assert {op for op, c in costs.items() if "bf16_flops" in c} == quantized, (phase, scope)
    check_floors(d, MEM_GBPS)
    ops = {r["op"]: r for r in d["ops"] if r["phase"] == "prefill"}
    assert ops["mlp"]["floor_s"] == pytest.approx(ops["mlp"]["analytic_flops"] / (BF16 * 1e12))
    # the prefill is FLOP-bound here: the bf16 rate shortens its floor
    total = ops["total"]
    bf16_flops = sum(ops[op]["analytic_flops"] for op in QUANTIZED_OPS)
    assert total["floor_s"] == pytest.approx(compute_s(total["analytic_flops"], bf16_flops))
    assert total["floor_s"] < total["analytic_flops"] / (FP32 * 1e12) / 2
    render(d)
    assert f"ceilings 25 GB/s, 0.1 TFLOP/s {BOTH_RATES}" in capsys.readouterr().out


def test_an_unquantized_float32_profile_keeps_the_one_fp32_ceiling(peaks_cache, tmp_path):
    d = torch_profile("sala-nano", peaks_cache, tmp_path / "p", "--phase", "prefill")
    assert "quantized_compute_tflops" not in d["peaks"] and d["peaks"]["compute_rate"] == "fp32"
    assert "bf16_flops" not in json.dumps(d["manifest"])        # the manifest of before
    check_floors(d, MEM_GBPS)
    total = next(r for r in d["ops"] if r["op"] == "total")
    assert total["floor_s"] == pytest.approx(total["analytic_flops"] / (FP32 * 1e12))


@pytest.fixture
def h200_cache(tmp_path):
    """Ceilings for the ncu fixture's GPU at which its 9B decode step is FLOP-bound."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "peaks.json").write_text(json.dumps({"NVIDIA H200": {"mem_gbps": 1000.0, "bf16_tflops": BF16,
                                                                  "fp32_tflops": FP32}}))
    return cache


def float32_w4a16(manifest: dict, bf16_flops: bool) -> dict:
    """The ncu fixture's manifest as of a float32 W4A16 model: with the bf16_flops a session now writes
    (its quantized linears'), or without them, as one written before they were counted."""
    manifest.update(dtype="float32", kv_dtype="float32", weights="w4a16")
    for step in manifest["steps"].values():
        for costs in [step["analytic"], *step["analytic_by_scope"].values()]:
            for op in QUANTIZED_OPS:
                if bf16_flops and costs[op]["flops"]:
                    costs[op]["bf16_flops"] = costs[op]["flops"]
    return manifest


@pytest.mark.parametrize("bf16_flops", [True, False])
def test_import_takes_the_rates_of_the_manifest(tmp_path, h200_cache, bf16_flops, capsys):
    saved = ncu_profile_dir(tmp_path / "p", float32_w4a16(fixture_manifest(), bf16_flops))
    d = salactl_profile(h200_cache, "--import", saved)
    assert ("quantized_compute_tflops" in d["peaks"]) == bf16_flops
    check_floors(d, 1000.0)
    total = next(r for r in d["ops"] if r["op"] == "total")
    one_rate = total["analytic_flops"] / (FP32 * 1e12)
    assert total["floor_s"] < one_rate / 2 if bf16_flops else total["floor_s"] == pytest.approx(one_rate)
    render(d)
    line = capsys.readouterr().out.splitlines()[0]
    assert line.endswith(f"ceilings 1000 GB/s, 0.1 TFLOP/s {BOTH_RATES if bf16_flops else '(fp32 matmul; measured)'}"
                         "; 420 kernels"), line



def test_the_gpu_engine_profile_counts_the_fused_gate_projections_bf16_flops_under_qkv(nano_rtn_dir):
    """The GPU engine's fused qkv GEMM runs the gate projections (profiling/engine_workload.py): their
    bf16 FLOPs move to qkv, as `salactl run`'s roofline moves them (run_job.run_phase_costs)."""
    lm = load_model(nano_rtn_dir, torch.device("cpu"), torch.float32)
    fused = frozenset(range(lm.config.num_hidden_layers))
    for rows in ([(32, 32)], [(1, 64)]):
        profiled = sum_scopes(scoped_costs(lm.config, lm.model, rows, 0, 4, 4, fused))
        run = run_phase_costs(lm.config, lm.model, [rows], 4, 4, fused)
        for op in OP_CLASSES:
            assert profiled[op].get("bf16_flops", 0) == run[op].bf16_flops, (rows, op)
        assert profiled["qkv"]["bf16_flops"] == profiled["qkv"]["flops"] and "bf16_flops" not in profiled["gates"]
