"""Fused forward of the reference model for the GPU engine, applied by swapping classes.

`fuse_model(model)` re-classes the live modules (module names, parameters and state_dict are
unchanged) so that a forward call does the same math with far fewer kernel launches:
- q/k/v/z (lightning), q/k/v/o_gate (minicpm4) and gate/up (MLP) run as one GEMM each over a
  concatenated weight; the original Linear weights become views into it (no extra memory).
  W4A16 projections (Triton layout, same group size and act-order permutation) are concatenated
  the same way along N into one W4A16Linear (its packed layout is tiled per 16 output rows, so
  concatenating tiles is the packing of the concatenated weight). Other modules keep their calls.
- residual add + RMSNorm, per-head qk-norm + RoPE, o_norm · sigmoid(z), o · sigmoid(o_gate) and
  silu·mul are single Triton kernels (runtime/ops/fused) with the reference rounding points.
The attention math still goes through batch.backend, like the reference layers.
"""

from __future__ import annotations

import torch
from torch import nn

from salactl.runtime.layers.lightning import LightningAttention
from salactl.runtime.layers.mlp import MLP
from salactl.runtime.layers.model import SalaForCausalLM
from salactl.runtime.layers.sparse_attention import SparseAttention
from salactl.runtime.ops.fused import triton as fused
from salactl.runtime.ops.gemv.triton import linear as dense_linear


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class _Unregistered:
    """Holds a fused module without registering it (state_dict keys stay the HF names)."""

    def __init__(self, module):
        self.module = module

    def __call__(self, x):
        return self.module(x)


def _concat_w4a16(linears, current):
    from salactl.quant.linear import W4A16Linear

    first = linears[0]
    if not all(type(m) is W4A16Linear and m.layout == "triton" for m in linears):
        return None
    def key(m):          # what must match to share one input and one kernel call
        perm = None if m.perm is None else tuple(m.perm.tolist())
        return m.in_features, m.group_size, m.bits, perm

    if any(key(m) != key(first) for m in linears[1:]):
        return None
    if isinstance(current, _Unregistered) and all(_same_storage(m.qweight, current.module.qweight)
                                                  for m in linears):
        return current
    qweight = torch.cat([m.qweight for m in linears], dim=1)       # [K/128, N/16, 256] tiles
    scales = torch.cat([m.scales for m in linears], dim=1)         # [groups, N]
    fused = W4A16Linear(first.in_features, sum(m.out_features for m in linears), first.bits,
                        first.group_size, "triton", {"qweight": qweight, "scales": scales})
    fused.perm = first.perm
    tiles = off = 0
    for m in linears:                  # the originals view the fused buffers: no extra memory
        nt = m.qweight.shape[1]
        m.qweight = qweight[:, tiles:tiles + nt]
        m.scales = scales[:, off:off + m.out_features]
        tiles, off = tiles + nt, off + m.out_features
    return _Unregistered(fused)


def _concat(linears, current=None):
    """One weight for several bias-free nn.Linear; the modules' weights become views of it.
    `current`: the concatenation made by an earlier fuse_model call, kept while the modules
    still view it (a module swapped since, e.g. quantized, drops it). W4A16 modules give a
    fused W4A16Linear (wrapped, unregistered) instead of a tensor."""
    if not all(type(m) is nn.Linear and m.bias is None for m in linears):
        return _concat_w4a16(linears, current)
    if not isinstance(current, torch.Tensor):
        current = None
    if current is not None and all(_same_storage(m.weight, current) for m in linears):
        return current
    w = torch.cat([m.weight.detach() for m in linears])
    off = 0
    for m in linears:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(w[off:off + rows], requires_grad=False)
        off += rows
    return w


def _out_proj(x, module):
    """o_proj / down_proj: the batch-1 GEMV route for plain bf16 Linear modules."""
    if type(module) is nn.Linear and module.bias is None:
        return dense_linear(x, module.weight)
    return module(x)


def _project(x, w, linears):
    if w is None:
        return torch.cat([m(x) for m in linears], dim=-1)
    return dense_linear(x, w) if isinstance(w, torch.Tensor) else w(x)


class FusedMLP(MLP):
    def forward(self, x, timer):
        with timer("mlp"):
            gu = _project(x, self._w_gate_up, (self.gate_proj, self.up_proj))
            return _out_proj(fused.silu_mul(gu), self.down_proj)


class FusedLightningAttention(LightningAttention):
    def forward(self, x, batch):
        n, H, D = x.shape[0], self.heads, self.head_dim
        hd = H * D
        with batch.timer("qkv"):
            p = _project(x, self._w_qkvz, (self.q_proj, self.k_proj, self.v_proj, self.z_proj))
            q, k = p[:, :hd].view(n, H, D), p[:, hd:2 * hd].view(n, H, D)
            v, z = p[:, 2 * hd:3 * hd].view(n, H, D), p[:, 3 * hd:]
            if self.use_rope:
                q, k = fused.qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight,
                                          batch.rope_cos, batch.rope_sin, self.q_norm.eps)
            else:
                q, k = self.q_norm(q), self.k_norm(k)
        with batch.timer("gla"):
            o = batch.backend.linear_attention(self.layer_idx, q, k, v, self.g_gamma(x.device),
                                               self.scale, batch)
        with batch.timer("gates"):
            o = fused.rmsnorm_gate(o.reshape(n, hd), self.o_norm.weight, z, self.o_norm.eps, x.dtype)
        with batch.timer("o_proj"):
            return _out_proj(o, self.o_proj)


class FusedSparseAttention(SparseAttention):
    def forward(self, x, batch):
        n, d = x.shape[0], self.head_dim
        qd, kd = self.hq * d, self.hkv * d
        with batch.timer("qkv"):
            p = _project(x, self._w_qkvg, (self.q_proj, self.k_proj, self.v_proj, self.o_gate))
            q = p[:, :qd].view(n, self.hq, d)
            k = p[:, qd:qd + kd].view(n, self.hkv, d)
            v = p[:, qd + kd:qd + 2 * kd].view(n, self.hkv, d)
            g = p[:, qd + 2 * kd:]
        with batch.timer("attention"):
            o = batch.backend.softmax_attention(self.layer_idx, q, k, v, batch)
        with batch.timer("gates"):
            o = fused.sigmoid_gate(o.reshape(n, qd), g)
        with batch.timer("o_proj"):
            return _out_proj(o, self.o_proj)


class FusedSalaForCausalLM(SalaForCausalLM):
    def hidden_states(self, input_ids, batch):
        cfg = self.config
        rs = cfg.residual_scale
        h = self.model.embed_tokens(input_ids) * cfg.scale_emb
        delta = None
        for layer in self.model.layers:
            ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
            h, x = fused.add_rmsnorm(h, delta, rs, ln1.weight, ln1.eps)
            a = layer.self_attn(x, batch)
            h, x = fused.add_rmsnorm(h, a, rs, ln2.weight, ln2.eps)
            delta = layer.mlp(x, batch.timer)
        return fused.add_rmsnorm(h, delta, rs, self.model.norm.weight, self.model.norm.eps)[1]


def fuse_model(model: SalaForCausalLM) -> SalaForCausalLM:
    """Re-class `model` in place and return it. Idempotent; calling it again after modules were
    swapped (e.g. quantized in place) re-derives which projections can run as one GEMM."""
    for layer in model.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        if isinstance(att, LightningAttention):
            att.__class__ = FusedLightningAttention
            att._w_qkvz = _concat([att.q_proj, att.k_proj, att.v_proj, att.z_proj], getattr(att, "_w_qkvz", None))
        else:
            att.__class__ = FusedSparseAttention
            att._w_qkvg = _concat([att.q_proj, att.k_proj, att.v_proj, att.o_gate], getattr(att, "_w_qkvg", None))
        mlp.__class__ = FusedMLP
        mlp._w_gate_up = _concat([mlp.gate_proj, mlp.up_proj], getattr(mlp, "_w_gate_up", None))
    model.__class__ = FusedSalaForCausalLM
    return model
