"""`salactl run`'s roofline on the GPU engine: the fused attention runs z_proj / o_gate inside its
"qkv" GEMM, so their bytes and FLOPs count under qkv and "gates" keeps the elementwise gating (as
`salactl profile` splits them, profiling.analytic.scoped_costs); per-op times from the eager pass
are fitted to the timed phase, so the op rows and "other" add up to it; ceilings print as profile
prints them. Costs are checked on the meta device (the 9B's real shapes, no memory)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from salactl import output
from salactl.profiling.analytic import gates_in_qkv_layers, scoped_costs, sum_scopes
from salactl.run_job import RunRequest, _roofline, execute, run_phase_costs
from salactl.runtime.engine import Engine
from salactl.runtime.layers.model import SalaForCausalLM
from salactl.runtime.loader import load_model, model_config
from salactl.runtime.peaks import device_name
from salactl.runtime.presets import sala_9b
from salactl.runtime.roofline import OP_CLASSES, fit_op_times, roofline_rows
from salactl.runtime.sampling import SamplingParams

CPU = torch.device("cpu")


def meta_model(config, dtype):
    with torch.device("meta"):
        return SalaForCausalLM(config).to(dtype)


MODELS = {"sala-nano": (model_config("sala-nano"), torch.float32), "sala-9b": (sala_9b(), torch.bfloat16)}
# prefill chunks (a short last one) and decode steps, as run_job._roofline lists a run's calls
PHASES = {"prefill": [[(512, 0)], [(512, 512)], [(100, 1024)]], "decode": [[(1, 1124 + i)] for i in range(3)]}


def gated_width(model) -> int:
    """Σ over layers of the gated output's width (o_proj's input), computed from the modules."""
    return sum(layer.self_attn.o_proj.in_features for layer in model.model.layers)


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("name", MODELS)
def test_fused_layers_move_the_gate_projections_into_qkv(name, phase):
    config, dtype = MODELS[name]
    model = meta_model(config, dtype)
    act = dtype.itemsize
    calls = PHASES[phase]
    every = frozenset(range(config.num_hidden_layers))
    plain = run_phase_costs(config, model, calls, act, act)
    fused = run_phase_costs(config, model, calls, act, act, every)
    # nothing of the projections is lost: qkv now holds what qkv and gates held
    assert fused["qkv"].bytes == plain["qkv"].bytes + plain["gates"].bytes
    assert fused["qkv"].flops == plain["qkv"].flops + plain["gates"].flops
    assert plain["gates"].bytes > 0.1 * plain["qkv"].bytes
    # gates keeps the elementwise gating: read o and the gate, write the result, per token and layer
    n_tok, width = sum(n for rows in calls for n, _ in rows), gated_width(model)
    assert (fused["gates"].bytes, fused["gates"].flops) == (3 * n_tok * width * act, 4 * n_tok * width)
    for op in set(OP_CLASSES) - {"qkv", "gates"}:
        assert fused[op] == plain[op], op
    # the split is profile's: scoped_costs over the same calls gives the same qkv and gates
    for op in ("qkv", "gates"):
        profiled = sum(sum_scopes(scoped_costs(config, model, rows, 1, act, act, every))[op]["bytes"]
                       for rows in calls)
        assert fused[op].bytes == profiled


def test_the_fused_layers_are_those_fuse_model_reclassed():
    """The reference model has none; a fused one has every layer, also one whose projections could
    not be concatenated (the fused attention then runs the four one after the other, still under qkv).
    run's roofline and profile's engine workload both take their split from this."""
    pytest.importorskip("triton")
    from salactl.runtime.gpu.fast_model import fuse_model

    config = model_config("sala-nano")
    model = meta_model(config, torch.float32)
    assert gates_in_qkv_layers(model) == frozenset()
    fuse_model(model)
    model.model.layers[0].self_attn.__dict__["_w_qkvg" if 0 in config.sparse_layers else "_w_qkvz"] = None
    assert gates_in_qkv_layers(model) == frozenset(range(config.num_hidden_layers))


def test_run_roofline_of_a_fused_model_counts_gates_as_the_engine_times_them():
    """_roofline of a real generation: with the model fused (as the GPU engine leaves it) the gates
    rows hold the elementwise gating only and the qkv rows the gate projections' weights."""
    pytest.importorskip("triton")
    from salactl.runtime.gpu.fast_model import fuse_model

    lm = load_model("sala-nano", "cpu")
    ids = list(range(5, 45))
    req = RunRequest(prompt_ids=ids, chunk_size=16, max_new_tokens=3)
    engine = Engine(lm.model, CPU, chunk_size=req.chunk_size, time_ops=True)
    res = engine.generate(ids, SamplingParams(max_new_tokens=3, ignore_eos=True))
    ceilings = {"mem_gbps": 100.0, "compute_tflops": 1.0}
    plain = _roofline(req, lm, len(ids), engine, res, ceilings)
    width = gated_width(lm.model)
    fuse_model(lm.model)
    fused = _roofline(req, lm, len(ids), engine, res, ceilings)
    for phase, tokens in (("prefill", len(ids)), ("decode", res.decode.forward_calls)):
        before, after = ({r["op"]: r for r in rows[phase]} for rows in (plain, fused))
        assert after["gates"]["bytes"] == 3 * tokens * width * 4
        assert after["qkv"]["bytes"] == before["qkv"]["bytes"] + before["gates"]["bytes"]
        assert after["qkv"]["time_s"] == before["qkv"]["time_s"]        # the same measured times


def nano_decode_costs():
    config, dtype = MODELS["sala-nano"]
    return run_phase_costs(config, meta_model(config, dtype), PHASES["decode"], 4, 4)


def test_eager_op_times_past_the_timed_phase_are_fitted_to_it():
    """The GPU engine's op times come from an eager pass, which a CUDA-graph phase can beat: they
    are scaled by one factor to sum to the timed phase, so the rows add up ("other" 0, not '-')."""
    eager = {"qkv": 3.0, "mlp": 5.0, "gates": 1.0}
    phase = 6.0
    fitted, scale = fit_op_times(eager, phase)
    assert scale == pytest.approx(6 / 9) and sum(fitted.values()) == pytest.approx(phase)
    assert fitted["mlp"] / fitted["qkv"] == pytest.approx(5 / 3)
    costs = nano_decode_costs()
    for ops in (eager, fitted):
        rows = {r.op: r for r in roofline_rows(costs, ops, phase, 100.0, 1.0)}
        parts = sum(r.time_s for op, r in rows.items() if op != "total")
        assert (parts == pytest.approx(phase)) == (ops is fitted)      # the eager times overshoot
    assert rows["other"].time_s == 0.0


def test_op_times_that_fit_stay_as_measured():
    measured = {"qkv": 1.0, "mlp": 2.0}
    assert fit_op_times(measured, 6.0) == (measured, 1.0)
    assert fit_op_times(None, 6.0) == (None, 1.0)
    rows = {r.op: r for r in roofline_rows(nano_decode_costs(), measured, 6.0, 100.0, 1.0)}
    assert rows["other"].time_s == pytest.approx(3.0) and rows["qkv"].time_s == 1.0


def test_render_says_which_phases_op_times_were_scaled(capsys):
    from salactl.cmd_run import render

    result = execute(RunRequest(prompt_ids=[1, 2, 3], max_new_tokens=2, device="cpu"))
    render({**result, "timing": {**result["timing"], "op_times_scale": {"prefill": 1.0, "decode": 0.5}}})
    times = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("times: "))
    assert times.endswith("; op times scaled to fit the phase: decode x0.50")


def test_ceilings_print_whole_numbers_as_profile_does(tmp_path):
    """A GPU's 989 TFLOP/s, not 9.9e+02 (a measured-peaks cache holding an H100's ceilings)."""
    (tmp_path / "peaks.json").write_text(json.dumps({device_name(CPU): {"mem_gbps": 3350.0, "bf16_tflops": 989.0}}))
    r = subprocess.run([sys.executable, "-m", "salactl", "run", "--prompt-ids", "1,2,3", "-n", "2", "--device",
                        "cpu"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "SALACTL_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "ceilings: 3350 GB/s, 989 TFLOP/s (bf16 matmul; measured)" in r.stdout, r.stdout
    assert [output.rate(v) for v in (0.2, 0.125, 9.5, 10.4, 989.0)] == ["0.2", "0.12", "9.5", "10", "989"]
