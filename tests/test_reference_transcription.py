"""The runtime's forward on the embedded sala-nano weights against an independent fp32 transcription
of DESIGN.md §2 / reference/architecture.md §3 (dense: every length here is below dense_len), read
from the checkpoint's own config.json and safetensors, not through the runtime's modules."""

import json
import math

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from salactl.runtime.engine import Engine
from salactl.runtime.loader import EMBEDDED_DIR, load_model
from salactl.runtime.tokenizer import Tokenizer

PROMPT = ("import os\nimport sys\n\n\ndef main(argv):\n    for name in argv:\n"
          "        if os.path.exists(name):\n            print(name, len(name))\n")


def rms(x, w, eps):
    """RMSNorm: normalize in fp32, round to x's dtype, then × weight."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, pos, theta):
    """NeoX half rotation over all dims: x·cos + cat(−x[d/2:], x[:d/2])·sin, x [T, H, d]."""
    d = x.shape[-1]
    ang = pos[:, None].float() * theta ** (-torch.arange(0, d, 2).float() / d)    # [T, d/2]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
    return x * cos + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def forward(cfg, W, ids):
    """fp32 logits [T, vocab] of the token ids (T < dense_len: dense causal attention)."""
    T, eps, lin = len(ids), cfg["rms_norm_eps"], lambda x, name: x @ W[name].T
    assert T < cfg["sparse_config"]["dense_len"]
    pos = torch.arange(T)
    r = cfg["scale_depth"] / math.sqrt(cfg["num_hidden_layers"])           # residual scale
    h = W["model.embed_tokens.weight"][ids] * cfg["scale_emb"]
    for i, kind in enumerate(cfg["mixer_types"]):
        p = f"model.layers.{i}."
        x = rms(h, W[p + "input_layernorm.weight"], eps)
        a = p + "self_attn."
        if kind == "minicpm4":                 # GQA, no RoPE, no qk-norm, sigmoid(o_gate) output gate
            nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
            q = lin(x, a + "q_proj.weight").view(T, nh, d)
            k = lin(x, a + "k_proj.weight").view(T, nkv, d).repeat_interleave(nh // nkv, 1)
            v = lin(x, a + "v_proj.weight").view(T, nkv, d).repeat_interleave(nh // nkv, 1)
            s = torch.einsum("thd,uhd->htu", q, k) / math.sqrt(d)
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
            o = torch.einsum("htu,uhd->thd", s.softmax(-1), v).reshape(T, nh * d)
            m = lin(o * torch.sigmoid(lin(x, a + "o_gate.weight")), a + "o_proj.weight")
        else:                                  # Simple GLA: qk-norm, RoPE, decay −ALiBi slope, o_norm, z gate
            nh, d = cfg["lightning_nh"], cfg["lightning_head_dim"]
            q = rope(rms(lin(x, a + "q_proj.weight").view(T, nh, d), W[a + "q_norm.weight"], eps), pos,
                     cfg["rope_theta"])
            k = rope(rms(lin(x, a + "k_proj.weight").view(T, nh, d), W[a + "k_norm.weight"], eps), pos,
                     cfg["rope_theta"])
            v = lin(x, a + "v_proj.weight").view(T, nh, d)
            assert math.log2(nh).is_integer()
            decay = torch.tensor([math.exp(-2 ** (-8 * (j + 1) / nh)) for j in range(nh)])   # exp(g_h)
            S, outs = torch.zeros(nh, d, d), []
            for t in range(T):                 # S_t = exp(g)·S_{t−1} + k_tᵀ v_t;  o_t = (q_t / √d) · S_t
                S = decay[:, None, None] * S + k[t][:, :, None] * v[t][:, None, :]
                outs.append(torch.einsum("hk,hkv->hv", q[t] / math.sqrt(d), S))
            o = rms(torch.stack(outs).reshape(T, nh * d), W[a + "o_norm.weight"], eps)
            m = lin(o * torch.sigmoid(lin(x, a + "z_proj.weight")), a + "o_proj.weight")
        h = h + r * m
        x = rms(h, W[p + "post_attention_layernorm.weight"], eps)
        mp = p + "mlp."
        y = F.silu(lin(x, mp + "gate_proj.weight")) * lin(x, mp + "up_proj.weight")
        h = h + r * lin(y, mp + "down_proj.weight")
    h = rms(h, W["model.norm.weight"], eps) / (cfg["hidden_size"] / cfg["dim_model_base"])
    return lin(h, "lm_head.weight").float()


def test_runtime_forward_equals_the_transcription():
    cfg = json.loads((EMBEDDED_DIR / "config.json").read_text())
    W = {}
    for f in sorted(EMBEDDED_DIR.glob("*.safetensors")):
        W.update({k: v.float() for k, v in load_file(f).items()})
    ids = Tokenizer(EMBEDDED_DIR).encode(PROMPT)
    assert 35 <= len(ids) <= 60
    engine = Engine(load_model("sala-nano", "cpu", "float32").model, "cpu", chunk_size=16)
    seq = engine.new_sequence()
    got = engine.prefill(seq, ids, all_logits=True)              # three chunks: 16, 16, rest
    nxt = int(got[-1].argmax())
    got = torch.cat([got, engine.forward(seq, [nxt])])            # one decode step (recurrent GLA)
    with torch.no_grad():
        want = forward(cfg, W, ids + [nxt])
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
