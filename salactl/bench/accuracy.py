"""Accuracy proxies for the sweep, measured on the embedded model with the same weights:

- logit KL: KL(dense ‖ point) of the next-token distributions at every prompt position, the
  reference being dense attention (dense_len beyond the prompt), the base weights and a bf16
  cache; reported as the mean over all positions, over the positions where the point's sparse
  path is active (t + 1 ≥ dense_len), and top-1 agreement. Computed in float64.
- passkey accuracy: `salactl.evaluation.passkey.run_passkey` (retrieval of a hidden number), with
  the point's KV cache dtype, as its KL.
"""

from __future__ import annotations

import copy
import random

import torch

from salactl.errors import SalactlError
from salactl.runtime.config import SalaConfig


def rebuild_model(model, config: SalaConfig, dtype: torch.dtype | None = None):
    """`build_model(config, ...)` over `model`'s tensors (shared; cast copies with `dtype`), its
    calibrated FP8 KV scales (fp32 buffers, which the strict build does not take) attached again."""
    from salactl.quant.loading import KV_SCALE_SUFFIXES
    from salactl.runtime.kv_fp8 import model_kv_scales
    from salactl.runtime.loader import build_model

    state = {k: v.to(dtype) if dtype is not None and v.is_floating_point() else v
             for k, v in model.state_dict().items() if not k.endswith(KV_SCALE_SUFFIXES)}
    rebuilt = build_model(config, state)
    for i, (k_scale, v_scale) in model_kv_scales(model).items():
        attn = rebuilt.model.layers[i].self_attn
        attn.register_buffer("k_scale", k_scale)
        attn.register_buffer("v_scale", v_scale)
    return rebuilt


def with_config(model, config: SalaConfig):
    """The same weights under another config (sparse knobs are read through `model.config` by
    the engine, cache and backend). A dense model is rebuilt over its own tensors (no copy); a
    quantized one is shallow-copied."""
    if not any(hasattr(m, "qweight") for m in model.modules()):
        return rebuild_model(model, config)
    view = copy.copy(model)
    view.config = config
    return view


def dense_config(config: SalaConfig, length: int) -> SalaConfig:
    import dataclasses

    return config.replace(sparse_config=dataclasses.replace(config.sparse_config,
                                                            dense_len=max(length + 1, 1 << 40)))


@torch.inference_mode()
def prompt_logits(model, prompt: list[int], chunk_size: int, kv_cache_dtype: str = "bf16") -> torch.Tensor:
    from salactl.runtime.engine import Engine

    eng = Engine(model, model.device, chunk_size=chunk_size, kv_cache_dtype=kv_cache_dtype)
    return eng.prefill(eng.new_sequence(), list(prompt), all_logits=True).double().cpu()


def logit_kl(reference: torch.Tensor, logits: torch.Tensor, dense_len: int) -> dict:
    """reference, logits: [T, V]. Per position KL(p_ref ‖ p) in nats."""
    lp_ref = torch.log_softmax(reference, -1)
    lp = torch.log_softmax(logits, -1)
    kl = (lp_ref.exp() * (lp_ref - lp)).sum(-1).clamp_min(0.0)
    sparse = kl[max(dense_len - 1, 0):]
    return {
        "logit_kl_mean": float(kl.mean()),
        "logit_kl_max": float(kl.max()),
        "logit_kl_sparse_mean": float(sparse.mean()) if sparse.numel() else None,
        "top1_agreement": float((reference.argmax(-1) == logits.argmax(-1)).double().mean()),
        "kl_positions": int(kl.numel()),
        "kl_sparse_positions": int(sparse.numel()),
    }


def kl_prompt(tokenizer, length: int, vocab_size: int, seed: int) -> list[int]:
    """Natural text when a tokenizer is at hand (a passkey prompt of exact length), else random ids."""
    if tokenizer is not None:
        from salactl.evaluation.passkey import make_passkey_prompt

        try:
            ids, _ = make_passkey_prompt(tokenizer, length, 0.5, random.Random(seed))
            if max(ids) < vocab_size:
                return ids
        except SalactlError:        # e.g. too short for the passkey text: random ids instead
            pass
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (length,), generator=g).tolist()


def passkey_accuracy(model, tokenizer, lengths, depths, trials, seed, chunk_size, model_dir=None,
                     kv_cache_dtype: str = "bf16") -> dict:
    from salactl.evaluation.passkey import passkey_trials, run_passkey

    rows = run_passkey(model, tokenizer, passkey_trials(tokenizer, list(lengths), list(depths), trials, seed),
                       chunk_size, model_dir=model_dir, kv_cache_dtype=kv_cache_dtype)
    correct = sum(r["correct"] for r in rows)
    total = sum(r["trials"] for r in rows)
    return {"passkey_accuracy": correct / total if total else None, "passkey_results": rows}
