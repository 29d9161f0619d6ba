"""Analytic bytes/FLOPs of one step split by scope — each decoder layer ("layer<i>"), the
"lm_head", and "embed_norm" (embedding + final norm) — so a profile of some layers only (an ncu
NVTX filter) is compared with exactly those layers. The scopes sum to runtime/roofline.py
call_costs of the whole step (tested). Each op's costs: bytes, flops and, where some of the flops
compute in bf16 whatever the model's dtype (quantized linears, OpCost.bf16_flops), bf16_flops."""

from __future__ import annotations

from salactl.runtime.roofline import OP_CLASSES, LinearCost, OpCost, call_costs, linear_costs

LM_HEAD, EMBED_NORM = "lm_head", "embed_norm"


def _zero() -> dict[str, dict]:
    return {op: {"bytes": 0.0, "flops": 0.0} for op in OP_CLASSES}


def _cost(c: OpCost) -> dict:
    """bf16_flops only where there are some: a manifest without them (every FLOP at the model
    dtype's rate, or one written before they were counted) is the manifest of before."""
    return {"bytes": c.bytes, "flops": c.flops, **({"bf16_flops": c.bf16_flops} if c.bf16_flops else {})}


def gates_in_qkv_layers(model) -> frozenset:
    """The layers whose gate projections (z_proj / o_gate) the GPU engine's fused attention runs inside
    its "qkv" timer: every re-classed (fuse_model) layer, its projections concatenated into one GEMM or
    (mixed quantized modules) run one after the other."""
    return frozenset(i for i, layer in enumerate(model.model.layers)
                     if hasattr(layer.self_attn, "_w_qkvz") or hasattr(layer.self_attn, "_w_qkvg"))


def scoped_costs(config, model, rows: list[tuple[int, int]], logit_rows: int, act_bytes: int,
                 kv_bytes: int, gates_in_qkv: frozenset = frozenset()) -> dict[str, dict[str, dict]]:
    """gates_in_qkv: layers whose gate projections (z_proj / o_gate) run inside the qkv GEMM (the
    GPU engine's fused model); their weight bytes count under qkv and "gates" keeps only the
    elementwise gating (read o and the gate, write the result)."""
    whole = call_costs(config, linear_costs(model), rows, logit_rows, act_bytes=act_bytes, kv_bytes=kv_bytes)
    n_tok = sum(n for n, _ in rows)
    n_sparse, n_light = len(config.sparse_layers), len(config.lightning_layers)
    out: dict[str, dict[str, dict]] = {}
    for i, layer in enumerate(model.model.layers):
        lin = linear_costs(layer)
        lin["lm_head"] = LinearCost()
        c = call_costs(config, lin, rows, 0, act_bytes=act_bytes, kv_bytes=kv_bytes)
        scope = _zero()
        for op in ("qkv", "gates", "o_proj", "mlp"):
            scope[op] = _cost(c[op])
        if i in gates_in_qkv:
            width = lin["o_proj"].macs_per_row // config.hidden_size      # o_proj input = gated width
            scope["qkv"] = _cost(OpCost(c["qkv"].bytes + c["gates"].bytes, c["qkv"].flops + c["gates"].flops,
                                        c["qkv"].bf16_flops + c["gates"].bf16_flops))
            scope["gates"] = {"bytes": 3.0 * n_tok * width * act_bytes, "flops": 4.0 * n_tok * width}
        mixer = "attention" if i in config.sparse_layers else "gla"
        share = n_sparse if mixer == "attention" else n_light
        scope[mixer] = {"bytes": whole[mixer].bytes / share, "flops": whole[mixer].flops / share}
        # two RMSNorms per layer, each reading and writing the hidden rows (call_costs "other")
        scope["other"] = {"bytes": 4.0 * n_tok * config.hidden_size * act_bytes,
                          "flops": 8.0 * n_tok * config.hidden_size}
        out[f"layer{i}"] = scope
    head = _zero()
    head["lm_head"] = _cost(whole["lm_head"])
    out[LM_HEAD] = head
    rest = _zero()
    layer_other = sum(s["other"]["bytes"] for k, s in out.items() if k.startswith("layer"))
    layer_other_f = sum(s["other"]["flops"] for k, s in out.items() if k.startswith("layer"))
    rest["other"] = {"bytes": whole["other"].bytes - layer_other, "flops": whole["other"].flops - layer_other_f}
    out[EMBED_NORM] = rest
    return out


def sum_scopes(scoped: dict[str, dict[str, dict]], scopes=None) -> dict[str, dict]:
    total = _zero()
    for name, costs in scoped.items():
        if scopes is not None and name not in scopes:
            continue
        for op in OP_CLASSES:
            t, c = total[op], costs[op]
            total[op] = _cost(OpCost(t["bytes"] + c["bytes"], t["flops"] + c["flops"],
                                     t.get("bf16_flops", 0) + c.get("bf16_flops", 0)))
    return total
