"""Where the GPU engine's FP8-KV logits differ from the reference Engine's (tests/test_gpu_engine.py's
check, sala-nano shapes, random weights): for each weight seed and KV dtype, every step's logits of
the GPU engine (bf16) and the reference Engine (bf16) against an fp32 reference Engine with the same
KV cache dtype, and the decode steps' block selections of the three compared per (layer, KV head).

If the GPU engine is no further from the fp32 result than the bf16 reference is, and its large
steps come with a selection that differs from the bf16 reference's, the difference is bf16 noise
moved by FP8 rounding or top-k, not a kernel error.

    python benchmarks/fp8_kv_noise.py [--seeds 0-7] [--kv fp8_e4m3,bf16] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch

from salactl.runtime.checkpoint import random_state_dict
from salactl.runtime.gpu import backend as gpu_backend
from salactl.runtime.gpu.selfcheck import model_logits, rel_err
from salactl.runtime.loader import build_model
from salactl.runtime.presets import sala_nano
from salactl.runtime import backend_reference


@contextlib.contextmanager
def recorded_selections():
    """Every decode-row selection the engines make, as sorted block lists per KV head, in call order:
    {"gpu": [...], "reference": [...]} (one entry per (step, sparse layer), prefill excluded)."""
    log = {"gpu": [], "reference": []}
    ref_select, gpu_select = backend_reference.select_blocks, gpu_backend.select_decode

    def ref(q, k1, q_pos, sc, num_blocks):
        mask = ref_select(q, k1, q_pos, sc, num_blocks)              # [Hkv, n, blocks]
        if q.shape[0] == 1:
            log["reference"].append([sorted(torch.nonzero(m[0]).flatten().tolist()) for m in mask])
        return mask

    def gpu(q, *args, **kw):
        sel, cnt = gpu_select(q, *args, **kw)
        if q.shape[0] == 1:
            log["gpu"].append([sorted(sel[0, h, :int(cnt[0, h])].tolist()) for h in range(sel.shape[1])])
        return sel, cnt

    backend_reference.select_blocks, gpu_backend.select_decode = ref, gpu
    try:
        yield log
    finally:
        backend_reference.select_blocks, gpu_backend.select_decode = ref_select, gpu_select


def with_fp8_scales(model):
    """The test's scales: K 0.05, V 0.02-0.04 over the KV heads."""
    dev = next(model.parameters()).device
    for i in model.config.sparse_layers:
        attn = model.model.layers[i].self_attn
        attn.register_buffer("k_scale", torch.tensor(0.05, device=dev))
        attn.register_buffer("v_scale", torch.linspace(0.02, 0.04, model.config.num_key_value_heads, device=dev))
    return model


def differing(a: list, b: list) -> list:
    """(call, KV head, blocks only in a, blocks only in b) where two selection logs differ."""
    return [(c, h, sorted(set(x) - set(y)), sorted(set(y) - set(x)))
            for c, (ra, rb) in enumerate(zip(a, b)) for h, (x, y) in enumerate(zip(ra, rb)) if x != y]


def one_seed(seed: int, kv: str, steps: int, prompt: int = 400, device: str = "cuda") -> list[dict]:
    cfg = sala_nano(vocab_size=512)
    run = dict(prompt_len=prompt, decode_steps=steps, chunk=100, kv_cache_dtype=kv)
    with recorded_selections() as sel32:
        _, truth = model_logits(with_fp8_scales(build_model(cfg, random_state_dict(cfg, "cpu", torch.float32, seed))
                                                .to(device)), device, gpu=False, **run)
    with recorded_selections() as sel16:
        gpu, ref = model_logits(with_fp8_scales(build_model(cfg, random_state_dict(cfg, "cpu", torch.bfloat16, seed))
                                                .to(device)), device, **run)
    layers = len(cfg.sparse_layers)
    rows = []
    for i, (g, r, t) in enumerate(zip(gpu, ref, truth)):
        calls = range((i - 1) * layers, i * layers) if i else range(0)
        pick = lambda log: [log[c] for c in calls]                       # noqa: E731
        rows.append(dict(seed=seed, kv=kv, step="prefill" if i == 0 else f"decode{i - 1}",
                         gpu_vs_ref=rel_err(g, r), gpu_vs_fp32=rel_err(g, t), ref_vs_fp32=rel_err(r, t),
                         sel_gpu_vs_ref=differing(pick(sel16["gpu"]), pick(sel16["reference"])),
                         sel_ref_vs_fp32=differing(pick(sel16["reference"]), pick(sel32["reference"]))))
    return rows


def _seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0-7", help="weight seeds: 0-7 or 1,3,5")
    ap.add_argument("--kv", default="fp8_e4m3,bf16")
    ap.add_argument("--steps", type=int, default=3, help="decode steps after the 400-token prompt")
    ap.add_argument("--prompt", type=int, default=400, help="prompt tokens (the test's 400)")
    ap.add_argument("--device", default="cuda", help="cpu runs the GPU engine under TRITON_INTERPRET=1 (slow)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    rows = [row for seed in _seeds(args.seeds) for kv in args.kv.split(",") for row in one_seed(seed, kv, args.steps, args.prompt, args.device)]
    print("| seed | kv | step | gpu vs ref | gpu vs fp32 | ref vs fp32 | selections gpu != ref | ref != fp32 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['kv']} | {r['step']} | {r['gpu_vs_ref']:.3f} | {r['gpu_vs_fp32']:.3f} | "
              f"{r['ref_vs_fp32']:.3f} | {len(r['sel_gpu_vs_ref'])} | {len(r['sel_ref_vs_fp32'])} |")
    for r in rows:
        if r["sel_gpu_vs_ref"]:
            print(f"seed {r['seed']} {r['kv']} {r['step']}: gpu vs ref (call, head, only gpu, only ref) "
                  f"{r['sel_gpu_vs_ref']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
