"""The `run` job as a function: load, tokenize, generate, account the roofline; returns the record."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch

from salactl import output
from salactl.errors import TokenizerError, UsageError
from salactl.quant.in_memory import quantized_as
from salactl.runtime.engine import Engine, ending_token_ids
from salactl.runtime.kv_fp8 import stored_kv_name
from salactl.runtime.loader import load_model
from salactl.runtime.peaks import peaks_for
from salactl.runtime.roofline import linear_costs, phase_costs, roofline_rows
from salactl.runtime.sampling import SamplingParams
from salactl.runtime.stream_decoder import GeneratedText, check_stop_strings

if TYPE_CHECKING:
    from salactl.runtime.loader import LoadedModel
    from salactl.runtime.tokenizer import Tokenizer


@dataclass(frozen=True)
class RunRequest:
    """`salactl run`'s options; exactly one of prompt (text) and prompt_ids (token ids)."""

    prompt: str | None = None
    prompt_ids: list[int] | None = None
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
    stop: tuple[str, ...] = ()              # text that ends generation, left out of the output text
    stop_token_ids: tuple[int, ...] = ()    # ids that end generation, as EOS does
    kv_cache_dtype: str = "bf16"
    op_profile: bool = True         # per-op times (GPU engine: an eager pass after the timed generation)


def execute(req: RunRequest, stream=None, prefill_progress=None) -> dict:
    """Run the job; returns the `run --json` record. stream(text) gets the text as it is generated."""
    if (req.prompt is None) == (req.prompt_ids is None):
        raise UsageError("give exactly one of prompt (--prompt) and prompt_ids (--prompt-ids)")
    params = _sampling_params(req)
    check_stop_strings(req.stop)
    lm = load_model(req.model, req.device, req.dtype, req.random_weights, req.seed)
    ids, tok = _prompt_ids(req, lm)
    _check_prompt(req, lm, ids, tok)
    engine, res, text, timing_note = _generate(req, lm, ids, tok, params, stream, prefill_progress)
    return _record(req, lm, ids, text, engine, res, timing_note)


def _sampling_params(req: RunRequest) -> SamplingParams:
    params = SamplingParams(max_new_tokens=req.max_new_tokens, temperature=req.temperature,
                            top_p=req.top_p, top_k=req.top_k, seed=req.seed, ignore_eos=req.ignore_eos,
                            stop_token_ids=req.stop_token_ids)
    if params.temperature == 0 and (params.top_p < 1 or params.top_k):
        output.warn_once("--top-p/--top-k apply only with --temperature > 0; greedy decoding ignores them")
    return params


def _prompt_ids(req: RunRequest, lm: LoadedModel) -> tuple[list[int], Tokenizer | None]:
    """The prompt's token ids and the tokenizer (None where --prompt-ids come without one)."""
    from salactl.runtime.chat_template import CHATML_NOTE
    from salactl.runtime.tokenizer import find_tokenizer

    if req.prompt is None:
        if req.chat:
            raise UsageError("--chat needs a text prompt, not --prompt-ids")
        try:
            tok = find_tokenizer(req.tokenizer, lm.model_dir)
        except Exception as e:
            if req.stop:
                raise TokenizerError(f"--stop matches the generated text, which needs a tokenizer: {e}") from None
            tok = None
        return req.prompt_ids, tok
    tok = find_tokenizer(req.tokenizer, lm.model_dir)
    if req.chat:    # the checkpoint's template, tokenized without special tokens (HF apply_chat_template)
        if not tok.has_chat_template:
            output.warn_once(CHATML_NOTE)
        return tok.chat_ids(req.prompt), tok
    return tok.encode(req.prompt), tok


def _check_prompt(req: RunRequest, lm: LoadedModel, ids: list[int], tok: Tokenizer | None) -> None:
    """Warn where the prompt plus --max-new-tokens leaves what the model handles well; fail where the
    tokenizer's ids do not fit the model's vocabulary."""
    from salactl.runtime.tokenizer import check_fits

    sparse = lm.config.sparse_config
    if sparse.forced_blocks_note and len(ids) + req.max_new_tokens >= sparse.dense_len:
        output.warn_once(sparse.forced_blocks_note)
    output.warn_past_trained_length(len(ids) + req.max_new_tokens, lm.config.max_position_embeddings,
                                    "the prompt plus --max-new-tokens")
    if tok is not None:
        check_fits(tok, lm.config.vocab_size)
    outside = [t for t in req.stop_token_ids if not 0 <= t < lm.config.vocab_size]
    if outside:
        raise UsageError(f"--stop-token-ids: {outside[0]} is outside the vocabulary (size "
                         f"{lm.config.vocab_size}), so it could never end generation")


def _generate(req: RunRequest, lm: LoadedModel, ids: list[int], tok: Tokenizer | None,
              params: SamplingParams, stream, prefill_progress):
    """Generate on the GPU engine (CUDA + Triton) or the reference one, streaming text as it comes
    and stopping at --stop strings; returns (engine, result, its GeneratedText or None without a
    tokenizer, what the phase and op times measured)."""
    from salactl.runtime.gpu.available import gpu_engine_available
    from salactl.runtime.loader import stop_token_ids

    eos = stop_token_ids(lm.config, lm.model_dir, tok)
    text = GeneratedText(tok, req.stop, ending_token_ids(lm.config, params, eos)) if tok else None
    # the timed generation detokenizes only where it must: to stream, or to find a stop string
    watch_text = text is not None and (stream is not None or bool(req.stop))
    on_token = _text_callback(text, stream) if watch_text else None
    if gpu_engine_available(lm.model.device) and _gpu_engine_runs(lm.config):
        engine, res, timing_note = _generate_gpu(req, lm, ids, params, eos, on_token)
    else:
        engine = Engine(lm.model, lm.model.device, chunk_size=req.chunk_size, time_ops=req.op_profile,
                        kv_cache_dtype=req.kv_cache_dtype)
        res = engine.generate(ids, params, eos_ids=eos, on_token=on_token, prefill_progress=prefill_progress)
        timing_note = ({"phase_times": "the timed generation", "op_times": "the same generation (a timer "
                        "around every op)"} if req.op_profile else _without_op_times(res, "the timed generation"))
    if text is not None:
        if not watch_text:
            for t in res.output_token_ids:
                text.push(t)
        tail = text.flush()             # held back, or a character cut by --max-new-tokens
        if tail and stream:
            stream(tail)
    return engine, res, text, timing_note


def _text_callback(text: GeneratedText, stream):
    """on_token for the engines: the text each id settles to `stream`, True (stop) at a stop string."""
    def on_token(token_id: int) -> bool:
        shown = text.push(token_id)
        if shown and stream:
            stream(shown)
        return text.stopped
    return on_token


def _gpu_engine_runs(config) -> bool:
    """Whether the GPU engine's kernels take the model's shapes; else a note, and the reference engine
    runs it on the same device."""
    from salactl.runtime.ops.selection.gpu import unsupported_shape

    problem = unsupported_shape(config)
    if problem:
        output.warn_once(f"{problem}: running the reference engine (plain PyTorch) on the GPU")
    return problem is None


def _generate_gpu(req: RunRequest, lm: LoadedModel, ids: list[int], params: SamplingParams, eos,
                  on_token):
    from salactl.runtime.gpu.engine import GPUEngine
    from salactl.runtime.gpu.run_profile import generate_with_op_profile

    engine = GPUEngine(lm.model, lm.model.device, chunk_size=req.chunk_size, max_running_requests=1,
                       kv_tokens=len(ids) + req.max_new_tokens + 64, kv_cache_dtype=req.kv_cache_dtype)
    for note in engine.fallback_notes():
        output.warn_once(note)
    if req.op_profile:
        res, timing_note = generate_with_op_profile(engine, ids, params, eos_ids=eos, on_token=on_token)
    else:
        res = engine.generate(ids, params, eos_ids=eos, on_token=on_token)
        timing_note = _without_op_times(res, "the timed generation (CUDA-graph decode)")
    return engine, res, timing_note


OP_TIMES_NOT_MEASURED = "not measured (--no-op-profile)"


def _without_op_times(res, phase_times: str) -> dict:
    """--no-op-profile: the roofline's op rows keep their analytic bytes and FLOPs, untimed; returns
    the timing note."""
    res.prefill.op_seconds = res.decode.op_seconds = None
    return {"phase_times": phase_times, "op_times": OP_TIMES_NOT_MEASURED}


def _record(req: RunRequest, lm: LoadedModel, ids: list[int], text: GeneratedText | None, engine, res,
            timing_note: dict) -> dict:
    """The run's result: outputs, speeds, the roofline of both phases and what produced them."""
    from salactl.env import environment

    device = lm.model.device
    peak_memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    act_dtype = lm.model.model.embed_tokens.weight.dtype
    dtype_name = str(act_dtype).replace("torch.", "")
    ceilings = peaks_for(device).for_dtype(act_dtype)
    P = len(ids)
    return {
        "model": lm.source,
        "device": str(device),
        "dtype": dtype_name,
        "prompt_token_ids": list(ids),
        "output_token_ids": res.output_token_ids,
        "text": text.text if text else None,
        "finish_reason": "stop" if text and text.stopped else res.finish_reason,
        "stop_reason": _stop_reason(req, res, text),
        "ttft_s": res.ttft_s,
        "prefill_s": res.prefill.seconds,
        "prefill_tok_s": P / res.prefill.seconds if res.prefill.seconds else None,
        "decode_tok_s": res.decode.tokens / res.decode.seconds if res.decode.seconds else None,
        "roofline": _roofline(req, lm, P, engine, res, ceilings),
        "timing": timing_note,
        "peaks": ceilings,
        "peak_memory_bytes": peak_memory,
        "sampling": {"temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
                     "seed": req.seed, "max_new_tokens": req.max_new_tokens, "ignore_eos": req.ignore_eos,
                     "stop": list(req.stop), "stop_token_ids": list(req.stop_token_ids)},
        "chunk_size": req.chunk_size,
        "kv_cache_dtype": stored_kv_name(req.kv_cache_dtype, act_dtype),
        "weights": quantized_as(lm.model) or dtype_name,
        "gla_prefill": getattr(engine, "gla_prefill", "reference"),
        "env": environment(),
    }


def _stop_reason(req: RunRequest, res, text: GeneratedText | None) -> str | int | None:
    """vLLM's stop_reason: the --stop string or --stop-token-ids id that ended generation; None
    for EOS or the length limit."""
    if text is not None and text.stopped:
        return text.stop_reason
    last = res.output_token_ids[-1] if res.output_token_ids else None
    return last if res.finish_reason == "stop" and last in req.stop_token_ids else None


def _roofline(req: RunRequest, lm: LoadedModel, P: int, engine, res, ceilings: dict) -> dict:
    """Per phase (P prompt tokens), the measured times against the byte and FLOP floors of the calls
    the engine made: totals over the phase's `steps` (prefill chunks, decode steps), in every row."""
    linears = linear_costs(lm.model)
    act_bytes = lm.model.model.embed_tokens.weight.element_size()
    pre_calls = [[(min(req.chunk_size, P - c), c)] for c in range(0, P, req.chunk_size)]
    dec_calls = [[(1, P + i)] for i in range(res.decode.forward_calls)]
    kw = dict(act_bytes=act_bytes, kv_bytes=1 if engine.kv_scales is not None else act_bytes)
    pre = phase_costs(lm.config, linears, pre_calls, [1] * len(pre_calls), **kw)
    dec = phase_costs(lm.config, linears, dec_calls, [1] * len(dec_calls), **kw)
    mem_gbps, tflops = ceilings["mem_gbps"], ceilings["compute_tflops"]
    return {
        "prefill": [dict(r.to_dict(), steps=len(pre_calls))
                    for r in roofline_rows(pre, res.prefill.op_seconds, res.prefill.seconds, mem_gbps, tflops)],
        "decode": [dict(r.to_dict(), steps=len(dec_calls))
                   for r in roofline_rows(dec, res.decode.op_seconds, res.decode.seconds, mem_gbps, tflops)]
        if dec_calls else [],
    }


def run_records(result: dict, req: RunRequest, label: str | None) -> list[dict]:
    """The run as two flat records (prefill, decode) in the bench schema, so `salactl report`
    renders runs next to bench/sweep records. Metric names follow SGLang's where one applies."""
    from salactl.bench.records import make_record, new_run_id

    run_id = new_run_id()
    n_in, n_out = len(result["prompt_token_ids"]), len(result["output_token_ids"])
    knobs = {k: v for k, v in asdict(req).items() if k not in ("prompt", "prompt_ids")}
    knobs.update(dtype=result["dtype"], device=result["device"], kv_cache_dtype=result["kv_cache_dtype"],
                 weights=result["weights"])
    common = dict(completed=1, failed=0, total_input_tokens=n_in, total_output_tokens=n_out,
                  peak_memory_bytes=result["peak_memory_bytes"])
    ttft_ms = result["ttft_s"] and result["ttft_s"] * 1e3        # None when no token was generated
    tpot_ms = 1e3 / result["decode_tok_s"] if result["decode_tok_s"] else None

    def floor(phase):
        rows = result["roofline"][phase]
        return {"floor_s": rows[-1]["floor_s"], "time_over_floor": (rows[-1]["time_s"] or 0) / rows[-1]["floor_s"]} \
            if rows else {}

    prefill = dict(common, duration=result["prefill_s"], mean_ttft_ms=ttft_ms, median_ttft_ms=ttft_ms,
                   input_throughput=result["prefill_tok_s"], **floor("prefill"))
    # SGLang's duration and output_throughput cover the whole request (TTFT included), so they are
    # not the decode phase's time and rate (decode_tok_s); its e2e latency fields name that span
    e2e_s = result["prefill_s"] + (n_out - 1) / result["decode_tok_s"] if result["decode_tok_s"] else result["prefill_s"]
    decode = dict(common, mean_tpot_ms=tpot_ms, median_tpot_ms=tpot_ms, duration=e2e_s,
                  mean_e2e_latency_ms=e2e_s * 1e3, median_e2e_latency_ms=e2e_s * 1e3,
                  output_throughput=n_out / e2e_s if e2e_s else None, decode_tok_s=result["decode_tok_s"],
                  **floor("decode"))
    return [make_record("run", run_id, label, "run", phase, "embedded", result["model"], metrics, knobs,
                        result["env"]) for phase, metrics in (("prefill", prefill), ("decode", decode))]
