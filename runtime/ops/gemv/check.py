"""Correctness of the folded batch-1 GEMVs (gemv/fused.py) against their plain-PyTorch references
(gemv/reference.py) on fresh random inputs, for tests (GPU; CPU under TRITON_INTERPRET=1 in fp32)
and benchmarks/gemv_fold_bench.py. Returns [(name, err, tol)] like runtime/gpu/selfcheck.py."""

from __future__ import annotations

import torch

from salactl.runtime.gpu.selfcheck import _tol, rel_err


def fold_inputs(kind: str, n: int, k: int, device, dtype, seed: int = 0) -> dict:
    """Random inputs of one folded GEMV; activations at the 9B model's scales (residual stream
    O(10), δ O(1), RMSNorm weights around 1)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, device=device, generator=g) * s).to(dtype)

    w = rnd(n, k, s=0.02)
    if kind == "norm":
        return dict(w=w, x=rnd(1, k, s=10.0), x2=rnd(1, 2 * k)[:, :k], gamma=1 + rnd(k, s=0.1),
                    scale=0.247, eps=1e-6)
    if kind == "norm_gate":
        return dict(w=w, x=rnd(1, k), x2=rnd(1, 2 * k)[:, k:], gamma=1 + rnd(k, s=0.1), eps=1e-6)
    if kind == "glu":
        return dict(w=w, x=rnd(1, 2 * k, s=2.0))
    return dict(w=w, x=rnd(1, k), x2=rnd(1, 2 * k)[:, :k])


def check_fold_gemv(device, dtype, shapes, configs=None, tol=None) -> list:
    """shapes: (N, K, kind) triples; configs: block shapes to try (default: each shape's
    FOLD_CONFIGS entry or the first candidate). "norm" also checks the δ-less case, the written
    residual (δ-less with the first config only: one compile less each), and out_scale/fp32
    output (lm_head's use)."""
    from salactl.runtime.ops.gemv import fused as F
    from salactl.runtime.ops.gemv import reference as R

    tol = tol or _tol(dtype)
    out = []
    for n, k, kind in shapes:
        a = fold_inputs(kind, n, k, device, dtype, seed=n + k)
        w, x = a.pop("w"), a.pop("x")
        for ci, cfg in enumerate(configs or (F.config_for(n, k, kind) or F.CANDIDATE_CONFIGS[0],)):
            tag = f"fold_gemv.{kind}.{n}x{k}.{cfg}"
            if kind != "norm":
                a2 = dict(a)
                x2 = a2.pop("x2", None)
                gamma = a2.pop("gamma", None)
                out.append((tag, rel_err(F.fold_gemv(kind, w, x, x2, gamma, config=cfg, **a2),
                                         R.fold_gemv(kind, w, x, x2, gamma, **a2)), tol))
                continue
            for delta in (a["x2"], None) if ci == 0 else (a["x2"],):     # δ-less: first config only
                kw = dict(scale=a["scale"], eps=a["eps"], out_scale=1 / 16, out_dtype=torch.float32)
                y, h = F.fold_gemv(kind, w, x, delta, a["gamma"], config=cfg, **kw)
                yr, hr = R.fold_gemv(kind, w, x, delta, a["gamma"], **kw)
                d = "+delta" if delta is not None else ""
                out += [(f"{tag}{d}.y", rel_err(y, yr), tol), (f"{tag}{d}.residual", rel_err(h, hr), tol)]
            y = F.fold_gemv(kind, w, x, a["x2"], a["gamma"], scale=a["scale"], eps=a["eps"], config=cfg)[0]
            out.append((f"{tag}.y_bf16out", rel_err(y, R.fold_gemv(kind, w, x, a["x2"], a["gamma"],
                                                                    scale=a["scale"], eps=a["eps"])[0]), tol))
    return out
