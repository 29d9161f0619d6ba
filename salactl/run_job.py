"""The `run` job as a function: load, tokenize, generate, account the roofline; returns the record."""

from __future__ import annotations

from dataclasses import dataclass

from salactl.errors import UsageError
from salactl.runtime.engine import Engine
from salactl.runtime.loader import load_model
from salactl.runtime.peaks import peaks_for
from salactl.runtime.roofline import linear_costs, phase_costs, roofline_rows
from salactl.runtime.sampling import SamplingParams


@dataclass(frozen=True)
class RunRequest:
    prompt: str | None
    prompt_ids: list[int] | None
    model: str = "sala-nano"
    random_weights: bool = False
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    tokenizer: str | None = None
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    chunk_size: int = 512
    chat: bool = False
    ignore_eos: bool = False
    kv_cache_dtype: str = "bf16"


def execute(req: RunRequest, stream=None) -> dict:
    from salactl.env import environment
    from salactl.runtime.tokenizer import StreamDecoder, find_tokenizer

    params = SamplingParams(max_new_tokens=req.max_new_tokens, temperature=req.temperature,
                            top_p=req.top_p, top_k=req.top_k, seed=req.seed, ignore_eos=req.ignore_eos)
    lm = load_model(req.model, req.device, req.dtype, req.random_weights, req.seed)
    device = lm.model.model.embed_tokens.weight.device
    tok = None
    if req.prompt is not None:
        tok = find_tokenizer(req.tokenizer, lm.model_dir)
        text = tok.chat_prompt(req.prompt) if req.chat else req.prompt
        ids = tok.encode(text)
    else:
        if req.chat:
            raise UsageError("--chat needs a text prompt, not --prompt-ids")
        ids = req.prompt_ids
        try:
            tok = find_tokenizer(req.tokenizer, lm.model_dir)
        except Exception:
            tok = None
    if tok is not None and tok.vocab_size > lm.config.vocab_size:
        raise UsageError(f"tokenizer has {tok.vocab_size} tokens but the model only {lm.config.vocab_size}; "
                         "pass the model's own --tokenizer")
    from salactl.runtime.gpu.available import gpu_engine_available

    if gpu_engine_available(device):           # CUDA + Triton: the GPU engine (eager, per-op timed)
        from salactl.runtime.gpu.engine import GPUEngine
        from salactl.runtime.kv_fp8 import fp8_dtype

        engine = GPUEngine(lm.model, device, chunk_size=req.chunk_size, max_running_requests=1,
                           kv_tokens=len(ids) + req.max_new_tokens + 64, profile_ops=True,
                           kv_dtype=fp8_dtype(req.kv_cache_dtype))
        generate = engine.generate_one
    else:
        engine = Engine(lm.model, device, chunk_size=req.chunk_size, time_ops=True,
                        kv_cache_dtype=req.kv_cache_dtype)
        generate = engine.generate
    eos = tuple(lm.config.eos_token_id) + (tok.eos_ids if tok else ())
    decoder = StreamDecoder(tok) if (tok and stream) else None
    on_token = (lambda t: stream(decoder.push(t))) if decoder else None
    res = generate(ids, params, eos_ids=eos, on_token=on_token)

    peaks = peaks_for(device)
    linears = linear_costs(lm.model)
    act_bytes = lm.model.model.embed_tokens.weight.element_size()
    P = len(ids)
    pre_calls = [[(min(req.chunk_size, P - c), c)] for c in range(0, P, req.chunk_size)]
    dec_calls = [[(1, P + i)] for i in range(res.decode.forward_calls)]
    kw = dict(act_bytes=act_bytes, kv_bytes=1 if engine.kv_scales is not None else act_bytes)
    pre = phase_costs(lm.config, linears, pre_calls, [1] * len(pre_calls), **kw)
    dec = phase_costs(lm.config, linears, dec_calls, [1] * len(dec_calls), **kw)
    roof = {
        "prefill": [r.to_dict() for r in roofline_rows(pre, res.prefill.op_seconds, res.prefill.seconds,
                                                       peaks.mem_gbps, peaks.bf16_tflops)],
        "decode": [r.to_dict() for r in roofline_rows(dec, res.decode.op_seconds, res.decode.seconds,
                                                      peaks.mem_gbps, peaks.bf16_tflops)] if dec_calls else [],
    }
    return {
        "model": lm.source,
        "device": str(device),
        "dtype": str(lm.model.model.embed_tokens.weight.dtype).replace("torch.", ""),
        "prompt_token_ids": list(ids),
        "output_token_ids": res.output_token_ids,
        "text": tok.decode(res.output_token_ids) if tok else None,
        "finish_reason": res.finish_reason,
        "ttft_s": res.ttft_s,
        "prefill_tok_s": P / res.prefill.seconds if res.prefill.seconds else None,
        "decode_tok_s": res.decode.tokens / res.decode.seconds if res.decode.seconds else None,
        "roofline": roof,
        "peaks": peaks.to_dict(),
        "sampling": {"temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
                     "seed": req.seed, "max_new_tokens": req.max_new_tokens},
        "chunk_size": req.chunk_size,
        "kv_cache_dtype": req.kv_cache_dtype,
        "env": environment(),
    }
