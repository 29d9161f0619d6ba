"""Analytic roofline bytes for the real MiniCPM-SALA shapes (built on the meta device: no memory)
against hand-computed values, and the per-scope split used by `salactl profile --layers`."""

import pytest
import torch

from salactl.profiling.analytic import scoped_costs, sum_scopes
from salactl.runtime.layers.model import SalaForCausalLM
from salactl.runtime.presets import sala_9b
from salactl.runtime.roofline import OP_CLASSES, call_costs, linear_costs

CFG = sala_9b()


@pytest.fixture(scope="module")
def model():
    with torch.device("meta"):
        m = SalaForCausalLM(CFG).to(torch.bfloat16)
    return m


def test_linear_bytes_of_the_9b_decode_step(model):
    lin = linear_costs(model)
    h, kv = 4096, 256
    assert lin["qkv"].stored_bytes == 2 * (8 * (h * h + 2 * kv * h) + 24 * 3 * h * h)
    assert lin["gates"].stored_bytes == 2 * 32 * h * h           # o_gate (8) + z_proj (24)
    assert lin["o_proj"].stored_bytes == 2 * 32 * h * h
    assert lin["mlp"].stored_bytes == 2 * 32 * 3 * h * 16384
    assert lin["lm_head"].stored_bytes == 2 * 73448 * h
    c = call_costs(CFG, lin, [(1, 4096)], 1)
    # weights + one token's activations in and out
    assert c["mlp"].bytes == 2 * 32 * 3 * h * 16384 + 2 * 32 * (2 * (h + 16384) + (16384 + h))
    assert c["lm_head"].bytes == 2 * 73448 * h + h * 2 + 73448 * 4
    # dense attention at 4096 cached: read 4097 tokens of K,V, write one, q in, o out; 8 layers
    per_layer = 4097 * 2 * 2 * 128 * 2 + 2 * 2 * 128 * 2 + 2 * 32 * 128 * 2
    assert c["attention"].bytes == 8 * per_layer
    # GLA: the fp32 [32,128,128] state read + written per lightning layer, q/k/v/o once
    assert c["gla"].bytes == 24 * (2 * 32 * 128 * 128 * 4 + 4 * 32 * 128 * 2)
    weights = sum(v.stored_bytes for v in lin.values())
    assert weights + 2 * 73448 * h + 2 * (32 * 2 * h + 24 * (128 + 128 + h) + h) == 9_477_203_968 * 2


@pytest.mark.parametrize("rows", [[(1, 4096)], [(1, 20000), (1, 100)], [(512, 7680)]])
def test_scopes_sum_to_the_whole_step(model, rows):
    whole = call_costs(CFG, linear_costs(model), rows, len(rows))
    scoped = scoped_costs(CFG, model, rows, len(rows), 2, 2)
    assert len(scoped) == 32 + 2
    total = sum_scopes(scoped)
    for op in OP_CLASSES:
        assert total[op]["bytes"] == pytest.approx(whole[op].bytes, rel=1e-12)
        assert total[op]["flops"] == pytest.approx(whole[op].flops, rel=1e-12)
    one = sum_scopes(scoped, ("layer1", "lm_head"))
    assert one["attention"]["bytes"] == 0 and one["gla"]["bytes"] == whole["gla"].bytes / 24
    assert one["lm_head"]["bytes"] == whole["lm_head"].bytes
    assert one["mlp"]["bytes"] == pytest.approx(whole["mlp"].bytes / 32)


def test_fused_engine_layers_count_gate_weights_under_qkv(model):
    """The GPU engine runs z_proj / o_gate inside the qkv GEMM: for those layers the weight bytes
    move from gates to qkv (the sum of weight bytes is unchanged) and gates keeps the
    elementwise read-o, read-gate, write-out of the 4096-wide gated output."""
    rows = [(1, 4096)]
    plain = sum_scopes(scoped_costs(CFG, model, rows, 1, 2, 2))
    fused = sum_scopes(scoped_costs(CFG, model, rows, 1, 2, 2, gates_in_qkv=frozenset(range(32))))
    h = 4096
    assert fused["gates"]["bytes"] == 32 * 3 * h * 2
    assert fused["qkv"]["bytes"] == plain["qkv"]["bytes"] + plain["gates"]["bytes"]
    assert fused["mlp"] == plain["mlp"] and fused["o_proj"] == plain["o_proj"]
