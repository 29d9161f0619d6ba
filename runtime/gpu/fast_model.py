"""Fused forward of the reference model for the GPU engine, applied by swapping classes.

`fuse_model(model)` re-classes the live modules (module names, parameters and state_dict are
unchanged) so that a forward call does the same math with far fewer kernel launches:
- q/k/v/z (lightning), q/k/v/o_gate (minicpm4) and gate/up (MLP) run as one GEMM each over a
  concatenated weight; the original Linear weights become views into it (no extra memory).
  W4A16 projections (Triton layout, same group size and act-order permutation) are concatenated
  the same way along N into one GPTQLinear (its packed layout is tiled per 16 output rows, so
  concatenating tiles is the packing of the concatenated weight); so are W8A16 ones (triton8 and
  int8 layouts). Other modules keep their calls.
- residual add + RMSNorm, per-head qk-norm + RoPE, o_norm · sigmoid(z), o · sigmoid(o_gate) and
  silu·mul are single Triton kernels (runtime/ops/fused) with the reference rounding points.
- at one row (batch-1 decode), when `model.fold_into_gemv` (default: env SALACTL_GEMV_FOLD, on)
  and gemv.fused.FOLD_CONFIGS lists the shape, the add + RMSNorm before q/k/v/z, q/k/v/o_gate,
  gate/up and lm_head, and the gates / silu·mul before o_proj and down_proj, run inside the
  projection's GEMV instead (one kernel fewer each; the norms differ from the reference by
  rounding only). The pending add + norm travels as a NormInput from the layer loop to the
  projection that consumes it. Not done for W4A16 (session 11, H200): silu·mul computed in the
  down projection's activation loads made the W4A16 b1 step 3.07-3.12 instead of 2.50-2.55 ms;
  its [128, 16]-row activation tiles evaluate the sigmoid for all 16 rows of one real row, in every
  one of the 32 column tiles. W4A16 instead stores silu(gate)·up from the gate/up GEMM's epilogue
  (GPTQLinear.forward_glu; SALACTL_W4A16_GLU=0 turns it off), bit for bit the separate kernel's.
The attention math still goes through batch.backend, like the reference layers.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from salactl.runtime.layers.lightning import LightningAttention
from salactl.runtime.layers.mlp import MLP
from salactl.runtime.layers.model import SalaForCausalLM
from salactl.runtime.layers.sparse_attention import SparseAttention
from salactl.runtime.ops.fused import triton as fused
from salactl.runtime.ops.gemv import fused as fold
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
    from salactl.quant.linear import GPTQLinear

    first = linears[0]
    if not all(type(m) is GPTQLinear and m.layout == first.layout for m in linears) \
            or first.layout not in ("triton", "triton8", "int8"):
        return None
    def key(m):          # what must match to share one input and one kernel call
        perm = None if m.perm is None else tuple(m.perm.tolist())
        return m.in_features, m.group_size, m.bits, perm

    if any(key(m) != key(first) for m in linears[1:]) or any(m.padded_rows() for m in linears):
        return None
    if isinstance(current, _Unregistered) and all(_same_storage(m.qweight, current.module.qweight)
                                                  for m in linears):
        return current
    # every layout keeps output rows on dim 1: triton [K/128, N/16, 256] and triton8 [K/64, N/16, 256]
    # tiles, int8 [groups, N, group]
    qweight = torch.cat([m.qweight for m in linears], dim=1)
    scales = torch.cat([m.scales for m in linears], dim=1)         # [groups, N]
    fused = GPTQLinear(first.in_features, sum(m.out_features for m in linears), first.bits,
                        first.group_size, first.layout, {"qweight": qweight, "scales": scales})
    fused.perm = first.perm
    rows = off = 0
    for m in linears:                  # the originals view the fused buffers: no extra memory
        n = m.qweight.shape[1]
        m.qweight = qweight[:, rows:rows + n]
        m.scales = scales[:, off:off + m.out_features]
        rows, off = rows + n, off + m.out_features
    return _Unregistered(fused)


def _concat(linears, current=None):
    """One weight for several bias-free nn.Linear; the modules' weights become views of it.
    `current`: the concatenation made by an earlier fuse_model call, kept while the modules
    still view it (a module swapped since, e.g. quantized, drops it). W4A16 modules give a
    fused GPTQLinear (wrapped, unregistered) instead of a tensor."""
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


def _plain(module) -> bool:
    return type(module) is nn.Linear and module.bias is None


def _fold_config(fold_on: bool, x: torch.Tensor, w, kind: str):
    """The folded GEMV's block shape when `kind` can run inside the projection w, else None."""
    if not (fold_on and x.shape[0] == 1 and isinstance(w, torch.Tensor) and w.stride(1) == 1):
        return None
    return fold.config_for(w.shape[0], w.shape[1], kind)


class NormInput:
    """A sublayer's input before its RMSNorm: the residual stream h, plus delta * scale when the
    previous sublayer's output is still to be added. `project(w)` folds the add + norm into the
    batch-1 GEMV when it can; otherwise (and for `normed()`) one add+RMSNorm kernel materialises
    it once. `residual()` is the updated stream for the next layer (written by either)."""

    def __init__(self, h, delta, scale: float, norm, fold_on: bool = False):
        self.h, self.delta, self.scale, self.norm, self.fold_on = h, delta, scale, norm, fold_on
        self._h_out = h if delta is None else None
        self._x = None

    @classmethod
    def of(cls, x):
        """An already normalised tensor (callers outside the fused layer loop)."""
        if isinstance(x, NormInput):
            return x
        inp = cls(x, None, 1.0, None)
        inp._x = x
        return inp

    @property
    def rows(self) -> int:
        return self.h.shape[0]

    def normed(self) -> torch.Tensor:
        if self._x is None:
            self._h_out, self._x = fused.add_rmsnorm(self.h, self.delta, self.scale, self.norm.weight,
                                                     self.norm.eps)
        return self._x

    def residual(self) -> torch.Tensor:
        if self._h_out is None:
            self.normed()
        return self._h_out

    def project(self, w, out_scale: float = 1.0, out_dtype=None) -> torch.Tensor | None:
        """norm(x) @ w.T * out_scale in one folded GEMV; None when it cannot be folded."""
        cfg = _fold_config(self.fold_on and self._x is None, self.h, w, "norm")
        if cfg is None:
            return None
        y, self._h_out = fold.fold_gemv("norm", w, self.h, self.delta, self.norm.weight,
                                        scale=self.scale, eps=self.norm.eps, out_scale=out_scale,
                                        out_dtype=out_dtype, config=cfg)
        return y


def _out_proj(x, module):
    """o_proj / down_proj: the batch-1 GEMV route for plain bf16 Linear modules."""
    if _plain(module):
        return dense_linear(x, module.weight)
    return module(x)


def _out_proj_folded(kind: str, fold_on: bool, module, x, x2=None, gamma=None, eps=0.0):
    """o_proj / down_proj with the op producing its input (`kind`, see gemv.fused) folded into its
    batch-1 GEMV; None when it cannot be (the caller runs the separate kernel)."""
    w = module.weight if _plain(module) else None
    cfg = _fold_config(fold_on, x, w, kind)
    if cfg is None or x.stride(-1) != 1:
        return None
    return fold.fold_gemv(kind, w, x, x2, gamma, eps=eps, config=cfg)


def _project(inp: NormInput, w, linears):
    if w is None:
        x = inp.normed()
        return torch.cat([m(x) for m in linears], dim=-1)
    if isinstance(w, torch.Tensor):
        y = inp.project(w)
        return y if y is not None else dense_linear(inp.normed(), w)
    return w(inp.normed())


def _glu_epilogue_on() -> bool:
    """SALACTL_W4A16_GLU=0 turns the W4A16 gate/up GEMM's silu·mul epilogue off (for A/B timing)."""
    return os.environ.get("SALACTL_W4A16_GLU", "1") != "0"


class FusedMLP(MLP):
    def forward(self, x, timer):
        inp = NormInput.of(x)
        with timer("mlp"):
            w = self._w_gate_up
            if isinstance(w, _Unregistered) and _glu_epilogue_on():
                return _out_proj(w.module.forward_glu(inp.normed()), self.down_proj)
            gu = _project(inp, w, (self.gate_proj, self.up_proj))
            y = _out_proj_folded("glu", inp.fold_on, self.down_proj, gu)
            return y if y is not None else _out_proj(fused.silu_mul(gu), self.down_proj)


class FusedLightningAttention(LightningAttention):
    def forward(self, x, batch):
        inp = NormInput.of(x)
        n, H, D = inp.rows, self.heads, self.head_dim
        hd = H * D
        dtype = inp.h.dtype
        with batch.timer("qkv"):
            p = _project(inp, self._w_qkvz, (self.q_proj, self.k_proj, self.v_proj, self.z_proj))
            q, k = p[:, :hd].view(n, H, D), p[:, hd:2 * hd].view(n, H, D)
            v, z = p[:, 2 * hd:3 * hd].view(n, H, D), p[:, 3 * hd:]
            if self.use_rope:
                q, k = fused.qk_norm_rope(q, k, self.q_norm.weight, self.k_norm.weight,
                                          batch.rope_cos, batch.rope_sin, self.q_norm.eps)
            else:
                q, k = self.q_norm(q), self.k_norm(k)
        with batch.timer("gla"):
            o = batch.backend.linear_attention(self.layer_idx, q, k, v, self.g_gamma(p.device),
                                               self.scale, batch)
        o = o.reshape(n, hd)
        with batch.timer("o_proj"):
            y = _out_proj_folded("norm_gate", inp.fold_on, self.o_proj, o, z, self.o_norm.weight,
                                 self.o_norm.eps)
            if y is not None:
                return y
        with batch.timer("gates"):
            o = fused.rmsnorm_gate(o, self.o_norm.weight, z, self.o_norm.eps, dtype)
        with batch.timer("o_proj"):
            return _out_proj(o, self.o_proj)


class FusedSparseAttention(SparseAttention):
    def forward(self, x, batch):
        inp = NormInput.of(x)
        n, d = inp.rows, self.head_dim
        qd, kd = self.hq * d, self.hkv * d
        with batch.timer("qkv"):
            p = _project(inp, self._w_qkvg, (self.q_proj, self.k_proj, self.v_proj, self.o_gate))
            q = p[:, :qd].view(n, self.hq, d)
            k = p[:, qd:qd + kd].view(n, self.hkv, d)
            v = p[:, qd + kd:qd + 2 * kd].view(n, self.hkv, d)
            g = p[:, qd + 2 * kd:]
        with batch.timer("attention"):
            o = batch.backend.softmax_attention(self.layer_idx, q, k, v, batch)
        o = o.reshape(n, qd)
        with batch.timer("o_proj"):
            y = _out_proj_folded("gate", inp.fold_on, self.o_proj, o, g)
            if y is not None:
                return y
        with batch.timer("gates"):
            o = fused.sigmoid_gate(o, g)
        with batch.timer("o_proj"):
            return _out_proj(o, self.o_proj)


class FusedSalaForCausalLM(SalaForCausalLM):
    fold_into_gemv = True

    def _final_input(self, input_ids, batch) -> NormInput:
        """Every layer; returns the final norm's pending input."""
        cfg = self.config
        rs = cfg.residual_scale
        fold_on = self.fold_into_gemv and input_ids.shape[0] == 1
        h = self.model.embed_tokens(input_ids) * cfg.scale_emb
        delta = None
        for layer in self.model.layers:
            inp = NormInput(h, delta, rs, layer.input_layernorm, fold_on)
            a = layer.self_attn(inp, batch)
            inp = NormInput(inp.residual(), a, rs, layer.post_attention_layernorm, fold_on)
            delta = layer.mlp(inp, batch.timer)
            h = inp.residual()
        return NormInput(h, delta, rs, self.model.norm, fold_on)

    def hidden_states(self, input_ids, batch):
        return self._final_input(input_ids, batch).normed()

    def forward(self, input_ids, batch, logit_rows=None):
        inp = self._final_input(input_ids, batch)
        if logit_rows is None and _plain(self.lm_head):
            with batch.timer("lm_head"):
                y = inp.project(self.lm_head.weight, 1.0 / self.config.logit_divisor, torch.float32)
            if y is not None:
                return y
        h = inp.normed()
        return self.logits(h if logit_rows is None else h[logit_rows], batch)


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
    if "fold_into_gemv" not in model.__dict__:
        model.fold_into_gemv = os.environ.get("SALACTL_GEMV_FOLD", "1") != "0"
    return model
