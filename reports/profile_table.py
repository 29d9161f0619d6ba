"""Join measured kernels (Nsight Compute or torch.profiler) with the analytic roofline of the
same step: per model op and per kernel, time, DRAM bytes, achieved bandwidth, % of peak, the
analytic prediction and the gap; rows sorted by excess time over the floor (top offenders first)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from salactl.runtime.roofline import OP_CLASSES

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
    if scopes is None:
        return True
    if s.layer is not None:
        return f"layer{s.layer}" in scopes
    return s.op == "lm_head" and "lm_head" in scopes


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


def op_rows(samples: list[KernelSample], analytic: dict[str, dict[str, dict]], mem_gbps: float,
            tflops: float) -> list[OpRow]:
    rows = []
    has_bytes = any(s.dram_bytes is not None for s in samples)
    for phase, costs in analytic.items():
        mine = [s for s in samples if s.phase == phase]
        for op in (*OP_CLASSES, "total"):
            sel = mine if op == "total" else [s for s in mine if s.op == op]
            if op == "total":
                ab = sum(c["bytes"] for c in costs.values())
                af = sum(c["flops"] for c in costs.values())
            else:
                ab, af = costs[op]["bytes"], costs[op]["flops"]
            t = sum(s.time_s for s in sel)
            mb = sum(s.dram_bytes or 0.0 for s in sel) if has_bytes else None
            moved = mb if mb is not None else ab
            gbps = moved / t / 1e9 if t else None
            floor = max(ab / (mem_gbps * 1e9), af / (tflops * 1e12))
            rows.append(OpRow(phase, op, len(sel), t, mb, gbps, _pct(gbps, mem_gbps), ab, af, floor,
                              _ratio(mb, ab), _ratio(t, floor) if t else None))
    return sort_ops(rows)


def _pct(gbps, peak):
    return None if gbps is None else 100.0 * gbps / peak


def sort_ops(rows: list[OpRow]) -> list[OpRow]:
    """Per phase: ops by excess time over their floor (largest first), the total row last."""
    out = []
    for phase in dict.fromkeys(r.phase for r in rows):
        mine = [r for r in rows if r.phase == phase]
        ops = sorted((r for r in mine if r.op != "total"), key=lambda r: r.floor_s - r.time_s)
        out += ops + [r for r in mine if r.op == "total"]
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
