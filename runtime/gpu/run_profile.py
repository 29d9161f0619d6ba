"""One `salactl run` generation on the GPU engine with honest numbers: the timed generation
runs as in serving (CUDA-graph decode), and per-op times come from a second, eager pass over
the same prompt with CUDA events around every op (prefill in full, then a few decode steps whose
per-step op times are scaled to the timed run's step count). Graph replay hides op boundaries,
so per-op times can only come from the eager mode; the phase totals never do."""

from __future__ import annotations

from dataclasses import replace

from salactl.runtime.engine import GenerationResult
from salactl.runtime.sampling import SamplingParams

PROFILED_DECODE_STEPS = 8


def generate_with_op_profile(engine, ids: list[int], params: SamplingParams, eos_ids=(), on_token=None,
                             decode_steps: int = PROFILED_DECODE_STEPS) -> tuple[GenerationResult, dict]:
    """Returns the timed result, its prefill/decode `op_seconds` filled from the eager pass, and
    a note describing where each number comes from."""
    timed = engine.generate(ids, params, eos_ids=eos_ids, on_token=on_token)
    steps = min(decode_steps, timed.decode.forward_calls)
    graph, profile_ops = engine.runner.cuda_graph, engine.profile_ops
    engine.runner.cuda_graph, engine.profile_ops = False, True
    for t in engine.timers.values():
        t.reset()
    try:
        probe = engine.generate(ids, SamplingParams(max_new_tokens=steps + 1, ignore_eos=True))
    finally:
        engine.runner.cuda_graph, engine.profile_ops = graph, profile_ops
    scale = timed.decode.forward_calls / probe.decode.forward_calls if probe.decode.forward_calls else 0.0
    dec_ops = {k: v * scale for k, v in (probe.decode.op_seconds or {}).items()}
    result = replace(timed, prefill=replace(timed.prefill, op_seconds=probe.prefill.op_seconds),
                     decode=replace(timed.decode, op_seconds=dec_ops if steps else None))
    note = {"phase_times": "the timed generation (CUDA-graph decode)" if graph else "the timed generation (eager)",
            "op_times": f"eager pass with CUDA events: the whole prefill, {probe.decode.forward_calls} decode "
                        f"steps scaled to {timed.decode.forward_calls}"}
    return result, note
