"""A float32 model's quantized linears compute in bf16 (quant/linear.py: the int4/int8 kernels take
16-bit activations), so their FLOPs are floored at the bf16 matmul rate and the rest at the model
dtype's; the record names both rates where they differ, and the totals' FLOP floor is the sum of the
ops'. A model whose every FLOP runs at one rate keeps one ceiling (its record unchanged)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from salactl.quant.linear import GPTQLinear
from salactl.quant.packing import to_gptq_tensors
from salactl.quant.quantizer import QuantSpec
from salactl.quant.rtn import rtn_quantize
from salactl.run_job import run_phase_costs
from salactl.runtime.loader import load_model
from salactl.output import ceilings
from salactl.runtime.peaks import Peaks, device_name
from salactl.runtime.roofline import OP_CLASSES, OpCost, bf16_row_limit, computes_in_bf16, roofline_rows

CPU = torch.device("cpu")
MEM_GBPS, BF16, FP32 = 25.0, 0.4, 0.1
QUANTIZED_OPS = ("qkv", "gates", "o_proj", "mlp")      # every linear of the RTN checkpoint but lm_head


def salactl_run(model, cache, *args):
    env = {**os.environ, "SALACTL_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-m", "salactl", "run", "--model", str(model), "--device", "cpu",
                        "--dtype", "float32", "--prompt-ids", ",".join(str(5 + i) for i in range(64)),
                        "--chunk-size", "32", "-n", "2", "--no-op-profile", *args],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.fixture
def peaks_cache(tmp_path):
    entry = {"mem_gbps": MEM_GBPS, "bf16_tflops": BF16, "fp32_tflops": FP32}
    (tmp_path / "peaks.json").write_text(json.dumps({device_name(CPU): entry}))
    return tmp_path


def compute_s(flops, bf16_flops):
    return (flops - bf16_flops) / (FP32 * 1e12) + bf16_flops / (BF16 * 1e12)


def test_a_quantized_float32_run_floors_its_linears_at_the_bf16_rate(nano_rtn_dir, peaks_cache):
    d = json.loads(salactl_run(nano_rtn_dir, peaks_cache, "--json"))
    p = d["peaks"]
    assert (p["compute_tflops"], p["compute_rate"]) == (FP32, "fp32")
    assert (p["quantized_compute_tflops"], p["quantized_compute_rate"]) == (BF16, "bf16")
    for phase in ("prefill", "decode"):
        rows = {r["op"]: r for r in d["roofline"][phase]}
        for op in OP_CLASSES:
            rate = BF16 if op in QUANTIZED_OPS else FP32
            assert rows[op]["floor_s"] == pytest.approx(max(rows[op]["bytes"] / (MEM_GBPS * 1e9),
                                                            rows[op]["flops"] / (rate * 1e12)), rel=1e-9), op
        bf16_flops = sum(rows[op]["flops"] for op in QUANTIZED_OPS)
        total = rows["total"]
        assert total["floor_s"] == pytest.approx(max(total["bytes"] / (MEM_GBPS * 1e9),
                                                     compute_s(total["flops"], bf16_flops)), rel=1e-9)
    # the prefill here is FLOP-bound: the bf16 rate shortens its floor
    assert d["roofline"]["prefill"][-1]["floor_s"] < d["roofline"]["prefill"][-1]["flops"] / (FP32 * 1e12) / 2
    assert ("ceilings: 25 GB/s, 0.1 TFLOP/s (fp32 matmul, 0.4 TFLOP/s bf16 for the quantized linears; measured)"
            in salactl_run(nano_rtn_dir, peaks_cache))


def test_an_unquantized_float32_run_keeps_the_one_fp32_ceiling(peaks_cache):
    d = json.loads(salactl_run("sala-nano", peaks_cache, "--json"))
    assert "quantized_compute_tflops" not in d["peaks"] and d["peaks"]["compute_rate"] == "fp32"
    for r in d["roofline"]["prefill"]:
        assert r["floor_s"] == pytest.approx(max(r["bytes"] / (MEM_GBPS * 1e9), r["flops"] / (FP32 * 1e12)),
                                             rel=1e-9), r["op"]


def test_the_record_names_the_quantized_rate_only_where_it_differs():
    peaks = Peaks("cpu:x", MEM_GBPS, BF16, "measured", FP32)
    assert peaks.for_dtype(torch.float32, quantized=True) == {
        **peaks.to_dict(), "compute_tflops": FP32, "compute_rate": "fp32",
        "quantized_compute_tflops": BF16, "quantized_compute_rate": "bf16"}
    assert peaks.for_dtype(torch.bfloat16, quantized=True) == peaks.for_dtype(torch.bfloat16)
    assert peaks.for_dtype(torch.float32) == {**peaks.to_dict(), "compute_tflops": FP32, "compute_rate": "fp32"}
    no_fp32 = Peaks("cpu:x", MEM_GBPS, BF16, "cpu-default")        # one rate for every dtype
    assert no_fp32.for_dtype(torch.float32, quantized=True) == no_fp32.for_dtype(torch.float32)
    assert ceilings(peaks.for_dtype(torch.float32, quantized=True)) == \
        "25 GB/s, 0.1 TFLOP/s (fp32 matmul, 0.4 TFLOP/s bf16 for the quantized linears; measured)"
    assert ceilings(peaks.for_dtype(torch.float32)) == "25 GB/s, 0.1 TFLOP/s (fp32 matmul; measured)"


def test_the_total_flop_floor_is_the_sum_of_the_ops_parts():
    costs = {op: OpCost() for op in OP_CLASSES}
    costs["mlp"] = OpCost(bytes=10, flops=8 * 10**9, bf16_flops=8 * 10**9)
    costs["qkv"] = OpCost(bytes=10, flops=4 * 10**9, bf16_flops=10**9)
    costs["attention"] = OpCost(bytes=10, flops=2 * 10**9)
    rows = {r.op: r for r in roofline_rows(costs, None, 1.0, MEM_GBPS, FP32, BF16)}
    assert rows["mlp"].floor_s == pytest.approx(8e9 / (BF16 * 1e12))
    assert rows["qkv"].floor_s == pytest.approx(compute_s(4e9, 1e9))
    assert rows["attention"].floor_s == pytest.approx(2e9 / (FP32 * 1e12))
    assert rows["total"].floor_s == pytest.approx(sum(rows[op].floor_s for op in ("mlp", "qkv", "attention")))
    # the total's compute % is its FLOP floor over its time
    assert rows["total"].pct_of_peak == pytest.approx(100 * rows["total"].floor_s / 1.0)
    # without a bf16 rate (or an equal one) every FLOP takes the model's: the rows of before
    for bf16 in (None, FP32):
        same = {r.op: r for r in roofline_rows(costs, None, 1.0, MEM_GBPS, FP32, bf16)}
        assert same["total"].floor_s == 14e9 / (FP32 * 1e12)


def quantized_linear(bits: int, group: int, k: int) -> GPTQLinear:
    w = torch.randn(64, k, generator=torch.Generator().manual_seed(0))
    q = rtn_quantize(w, QuantSpec(bits, group))
    t = to_gptq_tensors(q.codes, q.scales, q.g_idx, bits)
    return GPTQLinear.from_gptq(t["qweight"], t["scales"], t["g_idx"], bits, group, CPU, torch.float32)


@pytest.mark.parametrize("bits, group, k, layout, limit", [(4, 128, 256, "cpu_int4", float("inf")),
                                                           (8, 128, 256, "int8", float("inf")),
                                                           (4, -1, 96, "dequant", 0)])
def test_cpu_layouts_that_compute_in_bf16(bits, group, k, layout, limit):
    """The CPU int4 and int8 kernels round the activations to bf16; the dequantizing reference
    computes in fp32, as does a float linear."""
    lin = quantized_linear(bits, group, k)
    assert lin.layout == layout and bf16_row_limit(lin) == limit
    x = torch.randn(3, k)
    # what the limit claims: the product is (or is not) the bf16-rounded activations'
    assert torch.equal(lin(x), lin(x.to(torch.bfloat16).float())) == bool(limit)
    assert bf16_row_limit(torch.nn.Linear(k, 64)) == 0


def test_fused_gate_projections_take_their_bf16_flops_into_qkv(nano_rtn_dir):
    lm = load_model(nano_rtn_dir, CPU, torch.float32)
    assert computes_in_bf16(lm.model)
    config, calls = lm.config, [[(32, 0)], [(32, 32)], [(1, 64)]]
    plain = run_phase_costs(config, lm.model, calls, 4, 4)
    fused = run_phase_costs(config, lm.model, calls, 4, 4, frozenset(range(config.num_hidden_layers)))
    assert plain["gates"].bf16_flops == plain["gates"].flops > 0
    assert fused["qkv"].bf16_flops == plain["qkv"].bf16_flops + plain["gates"].bf16_flops
    assert fused["gates"].bf16_flops == 0           # the elementwise gating runs in the model's dtype
    assert not computes_in_bf16(load_model("sala-nano", CPU, torch.float32).model)
