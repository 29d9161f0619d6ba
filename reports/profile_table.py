"""Join measured kernels (Nsight Compute or torch.profiler) with the analytic roofline of the
same step: per model op, per layer and per kernel, time, DRAM bytes, achieved bandwidth and FLOP
rate, % of peak, the analytic prediction and the gap; op and kernel rows sorted by excess time over
the floor (top offenders first), layer rows in model order. FLOPs take the model dtype's matmul
rate, an op's bf16_flops (quantized linears that compute in bf16 whatever the model's dtype) the
bf16 rate where one is given: runtime/roofline.py compute_tflops, as `salactl run`'s roofline."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from salactl.runtime.roofline import OP_CLASSES, OpCost, compute_tflops

PHASES = ("prefill", "decode")


@dataclass
class KernelSample:
    name: str
    phase: str
    layer: int | None
    op: str
    time_s: float
    dram_bytes: float | None = None      # None when no counters (torch mode)
    sm_pct: float | None = None
    mem_pct: float | None = None
    dram_pct: float | None = None


def attribute(stack: list[str]) -> tuple[str | None, int | None, str]:
    """(phase, layer, op class) of a kernel from its range stack, outermost first."""
    from salactl.profiling.ranges import parse_layer

    phase = next((s for s in stack if s in PHASES), None)
    layer = next((parse_layer(s) for s in stack if parse_layer(s) is not None), None)
    op = next((s for s in reversed(stack) if s in OP_CLASSES), "other")
    return phase, layer, op


def from_ncu(kernels) -> list[KernelSample]:
    out = []
    for k in kernels:
        phase, layer, op = attribute(k.nvtx)
        mem = k.mem_pct if k.mem_pct is not None else k.dram_pct
        out.append(KernelSample(k.name, phase or "unranged", layer, op, k.time_s, k.dram_bytes,
                                k.sm_pct, mem, k.dram_pct))
    return out


def in_scopes(s: KernelSample, scopes) -> bool:
    """Whether a sample belongs to the analytic scopes a profile covers (None = everything)."""
    return scopes is None or sample_scope(s) in scopes


def _ratio(a, b):
    return (a / b) if (a is not None and b) else None


@dataclass
class OpRow:
    phase: str
    op: str
    kernels: int
    time_s: float
    dram_bytes: float | None
    achieved_gbps: float | None
    pct_of_peak_bw: float | None
    analytic_bytes: float
    analytic_flops: float
    floor_s: float
    bytes_ratio: float | None      # measured DRAM bytes / analytic bytes
    time_over_floor: float | None
    achieved_tflops: float | None = None    # the analytic FLOPs over the measured time
    pct_of_peak: float | None = None        # the binding resource's % (bandwidth or compute), as `run`'s

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class LayerRow:
    """One scope of a phase: a decoder layer ("layer<i>", kind sparse or lightning), the lm_head,
    or "embed_norm" (the embedding and the final norm)."""
    phase: str
    scope: str
    layer: int | None
    kind: str | None
    kernels: int
    time_s: float
    dram_bytes: float | None
    analytic_bytes: float
    analytic_flops: float
    floor_s: float
    pct_of_peak: float | None
    time_over_floor: float | None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class KernelRow:
    phase: str
    op: str
    name: str
    count: int
    time_s: float
    dram_bytes: float | None
    achieved_gbps: float | None
    pct_of_peak_bw: float | None
    sm_pct: float | None
    mem_pct: float | None
    floor_s: float | None          # the bytes it moved at peak bandwidth
    excess_s: float | None

    def to_dict(self) -> dict:
        return asdict(self)


# the op row of a step's wall time that no op's time covers (launch gaps, Python, the profiler's own
# work between ops): as `salactl run`'s roofline gives it to "other", but "other" is an op class here
UNATTRIBUTED = "other (unattributed)"


def op_rows(samples: list[KernelSample], analytic: dict[str, dict[str, dict]], mem_gbps: float,
            tflops: float, bf16_tflops: float | None = None,
            wall_s: dict[str, float | None] | None = None) -> list[OpRow]:
    """Per phase, one row per op class and the total. With the phase's wall time (wall_s; a
    torch.profiler step, timed in the same run as its ops) the total is that time, and an
    UNATTRIBUTED row (no op, no analytic cost) holds what the ops' times leave of it; without
    (Nsight Compute, which replays every kernel), the total is the ops' sum."""
    rows = []
    has_bytes = any(s.dram_bytes is not None for s in samples)
    for phase, costs in analytic.items():
        mine = [s for s in samples if s.phase == phase]
        wall = (wall_s or {}).get(phase)
        for op in (*OP_CLASSES, "total"):
            sel = mine if op == "total" else [s for s in mine if s.op == op]
            ab, af, rate = _summed(costs.values() if op == "total" else [costs[op]], tflops, bf16_tflops)
            t = sum(s.time_s for s in sel)
            if op == "total" and wall is not None:
                rows.append(_unattributed_row(phase, max(wall - t, 0.0)))
                t = wall
            rows.append(_op_row(phase, op, sel, t, ab, af, rate, has_bytes, mem_gbps))
    return sort_ops(rows)


def _op_row(phase: str, op: str, sel: list[KernelSample], t: float, ab: float, af: float, rate: float,
            has_bytes: bool, mem_gbps: float) -> OpRow:
    mb = _measured_bytes(sel) if has_bytes else None
    gbps = _gbps(mb if has_bytes else ab, t)
    done_tflops = af / t / 1e12 if t else None
    floor = _floor(ab, af, mem_gbps, rate)
    return OpRow(phase, op, len(sel), t, mb, gbps, _pct(gbps, mem_gbps), ab, af, floor, _ratio(mb, ab),
                 _ratio(t, floor) if t else None, done_tflops, _pct_of_peak(gbps, done_tflops, mem_gbps, rate))


def _unattributed_row(phase: str, t: float) -> OpRow:
    """The UNATTRIBUTED row: time with no op, so no analytic cost and no floor; what moved or
    computed in it is not known, so its rates are unknown (None), not 0."""
    return OpRow(phase, UNATTRIBUTED, 0, t, None, None, None, 0.0, 0.0, 0.0, None, None)


def overcounted(rows: list[OpRow]) -> dict[str, tuple[float, float]]:
    """{phase: (the ops' summed time, the wall time)} where the ops' times add up to more than the
    step's wall time (its UNATTRIBUTED row is then 0)."""
    out = {}
    for phase in dict.fromkeys(r.phase for r in rows):
        mine = [r for r in rows if r.phase == phase]
        if not any(r.op == UNATTRIBUTED for r in mine):
            continue
        named = sum(r.time_s for r in mine if r.op not in ("total", UNATTRIBUTED))
        wall = next(r.time_s for r in mine if r.op == "total")
        if named > wall:
            out[phase] = (named, wall)
    return out


def layer_rows(samples: list[KernelSample], by_scope: dict[str, dict[str, dict]], scopes: dict[str, list | None],
               mixer_kinds: list[str], mem_gbps: float, tflops: float,
               bf16_tflops: float | None = None) -> list[LayerRow]:
    """Per phase, one row per analytic scope the profile covers (`scopes[phase]`, None = all), in
    model order. by_scope: the manifest's analytic_by_scope per phase; mixer_kinds: "sparse" or
    "lightning" per decoder layer. The floor is the total row's: the scope's bytes at peak
    bandwidth or its FLOPs at the peak matmul rates, whichever takes longer."""
    from salactl.profiling.ranges import parse_layer

    has_bytes = any(s.dram_bytes is not None for s in samples)
    rows = []
    for phase, costs in by_scope.items():
        covered = scopes.get(phase)
        mine = [s for s in samples if s.phase == phase]
        for scope, cost in costs.items():
            if covered is not None and scope not in covered:
                continue
            sel = [s for s in mine if sample_scope(s) == scope]
            ab, af, rate = _summed(cost.values(), tflops, bf16_tflops)
            t = sum(s.time_s for s in sel)
            mb = _measured_bytes(sel) if has_bytes else None
            layer = parse_layer(scope)
            kind = mixer_kinds[layer] if layer is not None and layer < len(mixer_kinds) else None
            floor = _floor(ab, af, mem_gbps, rate)
            gbps = _gbps(mb if has_bytes else ab, t)
            pct = _pct_of_peak(gbps, af / t / 1e12 if t else None, mem_gbps, rate)
            rows.append(LayerRow(phase, scope, layer, kind, len(sel), t, mb, ab, af, floor, pct,
                                 _ratio(t, floor) if t else None))
    return rows


def _gbps(nbytes: float | None, t: float) -> float | None:
    """The bandwidth of a row: its measured DRAM bytes where the profile has counters (unknown where a
    kernel of it has none, never the analytic bytes under a measured header), else its analytic bytes."""
    return nbytes / t / 1e9 if (nbytes is not None and t) else None


def _summed(costs, tflops: float, bf16_tflops: float | None) -> tuple[float, float, float]:
    """The analytic bytes and FLOPs of `costs` (a manifest's per-op costs) and the one matmul rate
    their FLOP floor takes; a manifest written before bf16_flops were counted has none: one rate."""
    costs = list(costs)
    total = OpCost(sum(c["bytes"] for c in costs), sum(c["flops"] for c in costs),
                   sum(c.get("bf16_flops", 0) for c in costs))
    return total.bytes, total.flops, compute_tflops(total, tflops, bf16_tflops)


def _measured_bytes(sel: list[KernelSample]) -> float | None:
    """The DRAM bytes the samples moved; None (unknown, not a smaller sum) when any lacks counters."""
    if any(s.dram_bytes is None for s in sel):
        return None
    return sum(s.dram_bytes for s in sel)


def sample_scope(s: KernelSample) -> str:
    """The analytic scope (salactl/profiling/analytic.py) a sample's time counts under."""
    if s.layer is not None:
        return f"layer{s.layer}"
    return "lm_head" if s.op == "lm_head" else "embed_norm"


def _floor(nbytes: float, flops: float, mem_gbps: float, tflops: float) -> float:
    return max(nbytes / (mem_gbps * 1e9), flops / (tflops * 1e12))


def _pct(gbps, peak):
    return None if gbps is None else 100.0 * gbps / peak


def _pct_of_peak(gbps, done_tflops, mem_gbps, tflops):
    """The higher of bandwidth % and compute %: a FLOP-bound prefill op is judged by its matmul rate."""
    if gbps is None or done_tflops is None:
        return None
    return 100.0 * max(gbps / mem_gbps, done_tflops / tflops)


def sort_ops(rows: list[OpRow]) -> list[OpRow]:
    """Per phase: ops by excess time over their floor (largest first), then the unattributed time,
    the total row last."""
    out = []
    last = (UNATTRIBUTED, "total")
    for phase in dict.fromkeys(r.phase for r in rows):
        mine = [r for r in rows if r.phase == phase]
        ops = sorted((r for r in mine if r.op not in last), key=lambda r: r.floor_s - r.time_s)
        out += ops + [r for op in last for r in mine if r.op == op]
    return out


def kernel_rows(samples: list[KernelSample], mem_gbps: float, top: int | None = 20) -> list[KernelRow]:
    groups: dict[tuple, list[KernelSample]] = {}
    for s in samples:
        groups.setdefault((s.phase, s.op, s.name), []).append(s)
    rows = []
    for (phase, op, name), ks in groups.items():
        t = sum(k.time_s for k in ks)
        b = None if any(k.dram_bytes is None for k in ks) else sum(k.dram_bytes for k in ks)
        gbps = b / t / 1e9 if (b is not None and t) else None
        floor = b / (mem_gbps * 1e9) if b is not None else None
        rows.append(KernelRow(phase, op, name, len(ks), t, b, gbps, _pct(gbps, mem_gbps),
                              _weighted(ks, "sm_pct"), _weighted(ks, "mem_pct"), floor,
                              (t - floor) if floor is not None else None))
    rows.sort(key=lambda r: -(r.excess_s if r.excess_s is not None else r.time_s))
    return rows[:top] if top else rows


def _weighted(ks, attr) -> float | None:
    vals = [(getattr(k, attr), k.time_s) for k in ks if getattr(k, attr) is not None]
    tot = sum(t for _, t in vals)
    return sum(v * t for v, t in vals) / tot if tot else None
