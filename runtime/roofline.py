"""Analytic bytes and FLOPs per op class and phase (DESIGN.md §3), joined with measured time.

Counting rules (minimum traffic: every operand read once per forward call, every result written
once):
- linear classes (qkv, gates, o_proj, mlp, lm_head): the module's stored bytes (so bf16, W4A16 +
  scales, ... count as they are) + input/output activations; FLOPs = 2 · rows · in · out. Of those,
  `bf16_flops` are the quantized linears' whose kernels compute in bf16 whatever the model's dtype
  (bf16_row_limit): their floor takes the bf16 matmul rate, the rest the model dtype's.
- attention (minicpm4 layers): per sequence, the K/V it attends (all cached tokens when dense, the
  union of selected blocks, bounded by topk+window blocks per query, when sparse) read once, the
  new K/V written, q read and o written; compressed-key scoring reads K1 once. FLOPs = 4·Hq·d per
  attended key per query (+ 2·Hq·d per visible compressed key for scoring).
- gla (lightning layers): fp32 state read + written once per call, q/k/v/o once. FLOPs: 4·H·dk·dv
  per token for the state path + 2·H·(dk+dv)·(in-chunk keys) for the intra-chunk part.
- other: embedding rows and RMSNorm reads/writes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from salactl.runtime.config import SalaConfig
from salactl.runtime.ops.selection import num_windows

OP_CLASSES = ("qkv", "attention", "gla", "gates", "o_proj", "mlp", "lm_head", "other")
_LINEAR_CLASS = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_gate": "gates",
                 "z_proj": "gates", "o_proj": "o_proj", "gate_proj": "mlp", "up_proj": "mlp",
                 "down_proj": "mlp", "lm_head": "lm_head"}


@dataclass
class LinearCost:
    stored_bytes: int = 0
    macs_per_row: int = 0        # Σ in·out over the class's linears (for one token through all layers)
    act_elems_per_row: int = 0   # Σ (in + out)
    # of macs_per_row, those computed in bf16 in calls of up to so many rows (bf16_row_limit): {limit: Σ in·out}
    bf16_macs_per_row: dict[float, int] = field(default_factory=dict)

    def bf16_macs(self, rows: int) -> int:
        """Of macs_per_row, those a call of `rows` rows computes in bf16."""
        return sum(macs for limit, macs in self.bf16_macs_per_row.items() if rows <= limit)


def bf16_row_limit(mod: nn.Module) -> float:
    """Up to how many rows a call of this linear computes in bf16 whatever the model's dtype
    (quant/linear.py GPTQLinear.bf16_rows); 0 for float linears (the model dtype's rate)."""
    rows = getattr(mod, "bf16_rows", None)
    return rows() if rows else 0


def computes_in_bf16(model: nn.Module) -> bool:
    """Whether some linear of `model` computes in bf16 whatever its dtype (bf16_row_limit)."""
    return any(bf16_row_limit(m) > 0 for m in model.modules())


def linear_costs(model: nn.Module) -> dict[str, LinearCost]:
    """Per op class, from the live modules (so quantized modules count their packed bytes)."""
    out = {c: LinearCost() for c in ("qkv", "gates", "o_proj", "mlp", "lm_head")}
    for name, mod in model.named_modules():
        cls = _LINEAR_CLASS.get(name.rsplit(".", 1)[-1])
        if cls is None or not hasattr(mod, "in_features"):
            continue
        c = out[cls]
        c.stored_bytes += sum(t.numel() * t.element_size() for t in
                              list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False)))
        c.macs_per_row += mod.in_features * mod.out_features
        c.act_elems_per_row += mod.in_features + mod.out_features
        limit = bf16_row_limit(mod)
        if limit:
            c.bf16_macs_per_row[limit] = c.bf16_macs_per_row.get(limit, 0) + mod.in_features * mod.out_features
    return out


@dataclass
class OpCost:
    bytes: int = 0
    flops: int = 0
    bf16_flops: int = 0     # of flops, those computed in bf16 whatever the model's dtype (quantized linears)


def call_costs(config: SalaConfig, linears: dict[str, LinearCost], rows: list[tuple[int, int]],
               logit_rows: int, act_bytes: int = 2, kv_bytes: int = 2, gla_chunk: int = 64) -> dict[str, OpCost]:
    """Costs of ONE forward call over sequences given as (new_tokens, cached_tokens_before)."""
    costs = {c: OpCost() for c in OP_CLASSES}
    n_tok = sum(n for n, _ in rows)
    for cls in ("qkv", "gates", "o_proj", "mlp"):
        lc = linears[cls]
        costs[cls].bytes += lc.stored_bytes + n_tok * lc.act_elems_per_row * act_bytes
        costs[cls].flops += 2 * n_tok * lc.macs_per_row
        costs[cls].bf16_flops += 2 * n_tok * lc.bf16_macs(n_tok)
    lm = linears["lm_head"]
    costs["lm_head"].bytes += lm.stored_bytes + logit_rows * (config.hidden_size * act_bytes + config.vocab_size * 4)
    costs["lm_head"].flops += 2 * logit_rows * lm.macs_per_row
    costs["lm_head"].bf16_flops += 2 * logit_rows * lm.bf16_macs(logit_rows)

    sc = config.sparse_config
    hq, hkv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    n_sparse = len(config.sparse_layers)
    for n, ctx in rows:
        total = ctx + n
        keys = torch.arange(ctx + 1, total + 1, dtype=torch.int64)    # keys visible to each query
        sparse = keys >= sc.dense_len
        per_query = torch.where(sparse, keys.clamp(max=sc.selected_blocks * sc.block_size), keys)
        attended = int(per_query.sum())
        sparse_keys = int(per_query[sparse].max()) if bool(sparse.any()) else 0
        windows = ((keys - sc.kernel_size).div(sc.kernel_stride, rounding_mode="floor") + 1).clamp(min=0)
        k1_visible = int(windows[sparse].sum())
        # A decode query in sparse mode reads only its selected blocks; a prefill chunk's union
        # of selections is bounded by the whole context, which is what we count.
        kv_read_tokens = sparse_keys if (n == 1 and sparse_keys) else total
        per_layer_bytes = (kv_read_tokens * 2 * hkv * d * kv_bytes + n * 2 * hkv * d * kv_bytes
                           + n * 2 * hq * d * act_bytes
                           + (num_windows(total, sc) * hkv * d * act_bytes if k1_visible else 0))
        costs["attention"].bytes += n_sparse * per_layer_bytes
        costs["attention"].flops += n_sparse * (4 * hq * d * attended + 2 * hq * d * k1_visible)

        h, dk = config.lightning_nh, config.lightning_head_dim
        n_light = len(config.lightning_layers)
        intra2 = n * min(n, gla_chunk) if n > 1 else 0     # twice the intra-chunk (query, key) pairs
        costs["gla"].bytes += n_light * (2 * h * dk * dk * 4 + n * 4 * h * dk * act_bytes)
        costs["gla"].flops += n_light * (4 * h * dk * dk * n + 2 * h * dk * intra2)

    norms = 2 * config.num_hidden_layers + 1
    costs["other"].bytes += n_tok * config.hidden_size * act_bytes * (1 + 2 * norms)
    costs["other"].flops += n_tok * config.hidden_size * 4 * norms
    return costs


def add(into: dict[str, OpCost], more: dict[str, OpCost]) -> None:
    for k, v in more.items():
        into[k].bytes += v.bytes
        into[k].flops += v.flops
        into[k].bf16_flops += v.bf16_flops


def phase_costs(config, linears, calls: list[list[tuple[int, int]]], logit_rows_per_call: list[int],
                **kw) -> dict[str, OpCost]:
    total = {c: OpCost() for c in OP_CLASSES}
    for rows, lr in zip(calls, logit_rows_per_call):
        add(total, call_costs(config, linears, rows, lr, **kw))
    return total


@dataclass
class RooflineRow:
    op: str
    bytes: int
    flops: int
    time_s: float | None
    achieved_gbps: float | None
    achieved_tflops: float | None
    pct_of_peak: float | None      # the binding resource's % (bandwidth or compute)
    floor_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def fit_op_times(op_seconds: dict[str, float] | None, phase_seconds: float) -> tuple[dict[str, float] | None, float]:
    """Per-op times measured in another pass than the timed phase's (the GPU engine's eager pass),
    made to fit it: where they sum past `phase_seconds` (the timed pass replayed a CUDA graph, without
    the eager pass's launch gaps inside each op's span), all are scaled by one factor so that they sum
    to it ("other" 0); where they fit they stay as measured. Returns them and that factor (1 where
    they fit), so that the op rows and "other" add up to the phase's time."""
    named = sum((op_seconds or {}).values())
    if op_seconds is None or named <= phase_seconds:
        return op_seconds, 1.0
    scale = phase_seconds / named
    return {k: v * scale for k, v in op_seconds.items()}, scale


def roofline_rows(costs: dict[str, OpCost], op_seconds: dict[str, float] | None, phase_seconds: float,
                  mem_gbps: float, tflops: float, bf16_tflops: float | None = None) -> list[RooflineRow]:
    """One row per op class plus a 'total' row. Without per-op times only the total is timed;
    'other' gets the phase time not attributed to a named class. FLOPs take the model dtype's
    `tflops`, each op's bf16_flops `bf16_tflops` (None: the same), so the total's FLOP floor is the
    sum of the ops'."""
    rows = []
    named = sum((op_seconds or {}).values())
    for op in OP_CLASSES:
        c = costs[op]
        t = None
        if op_seconds is not None:
            t = op_seconds.get(op, 0.0) if op != "other" else max(phase_seconds - named, 0.0)
        rows.append(_row(op, c.bytes, c.flops, t, mem_gbps, compute_tflops(c, tflops, bf16_tflops)))
    total = OpCost(sum(c.bytes for c in costs.values()), sum(c.flops for c in costs.values()),
                   sum(c.bf16_flops for c in costs.values()))
    rows.append(_row("total", total.bytes, total.flops, phase_seconds, mem_gbps,
                     compute_tflops(total, tflops, bf16_tflops)))
    return rows


def compute_tflops(cost: OpCost, tflops: float, bf16_tflops: float | None) -> float:
    """The one rate at which all of `cost`'s FLOPs take as long as its bf16_flops at `bf16_tflops`
    and the rest at `tflops`: the row's FLOP floor and compute % of peak."""
    if not cost.bf16_flops or bf16_tflops is None or bf16_tflops == tflops:
        return tflops
    if cost.bf16_flops == cost.flops:
        return bf16_tflops
    return cost.flops / ((cost.flops - cost.bf16_flops) / tflops + cost.bf16_flops / bf16_tflops)


def _row(op, nbytes, flops, t, mem_gbps, tflops) -> RooflineRow:
    floor = max(nbytes / (mem_gbps * 1e9), flops / (tflops * 1e12))
    if not t:
        return RooflineRow(op, nbytes, flops, t, None, None, None, floor)
    gbps, tf = nbytes / t / 1e9, flops / t / 1e12
    pct = 100 * max(gbps / mem_gbps, tf / tflops)
    return RooflineRow(op, nbytes, flops, t, gbps, tf, pct, floor)
