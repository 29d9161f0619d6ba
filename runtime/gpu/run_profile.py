"""One `salactl run` generation on the GPU engine with honest numbers: the timed generation
runs as in serving (CUDA-graph decode), and per-op times come from a second, eager pass over
the same prompt with CUDA events around every op (prefill in full, then a few decode steps whose
per-step op times are scaled to the timed run's step count). Graph replay hides op boundaries,
so per-op times can only come from the eager mode; the phase totals never do. Op times that sum
past their timed phase are scaled down together to fit it (roofline.fit_op_times), so that the
roofline's op rows and "other" add up to the timed phase."""

from __future__ import annotations

from dataclasses import replace

from salactl.runtime.engine import GenerationResult
from salactl.runtime.roofline import fit_op_times
from salactl.runtime.sampling import SamplingParams

PROFILED_DECODE_STEPS = 8


def generate_with_op_profile(engine, ids: list[int], params: SamplingParams, eos_ids=(), on_token=None,
                             decode_steps: int = PROFILED_DECODE_STEPS) -> tuple[GenerationResult, dict]:
    """Returns the timed result, its prefill/decode `op_seconds` filled from the eager pass, and
    a note describing where each number comes from (op_times_scale: each phase's fit_op_times factor)."""
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
    per_run = timed.decode.forward_calls / probe.decode.forward_calls if probe.decode.forward_calls else 0.0
    pre_ops, pre_scale = fit_op_times(probe.prefill.op_seconds, timed.prefill.seconds)
    dec_ops, dec_scale = fit_op_times({k: v * per_run for k, v in (probe.decode.op_seconds or {}).items()}
                                      if steps else None, timed.decode.seconds)
    result = replace(timed, prefill=replace(timed.prefill, op_seconds=pre_ops),
                     decode=replace(timed.decode, op_seconds=dec_ops))
    note = {"phase_times": "the timed generation (CUDA-graph decode)" if graph else "the timed generation (eager)",
            "op_times": f"eager pass with CUDA events: the whole prefill, {probe.decode.forward_calls} decode "
                        f"steps scaled to {timed.decode.forward_calls}; where a phase's op times sum past its "
                        "timed total they are scaled down by one factor (op_times_scale) to fit it, so the ops "
                        "and other add up to it",
            "op_times_scale": {"prefill": pre_scale, "decode": dec_scale}}
    return result, note
