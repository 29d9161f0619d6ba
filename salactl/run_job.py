"""The `run` job as a function: load, tokenize, generate, account the roofline; returns the record."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from salactl import input_files, output
from salactl.bench.out_of_memory import out_of_memory_is_capacity
from salactl.errors import TokenizerError, UsageError
from salactl.options import refuse_unused
from salactl.quant.in_memory import quantized_as
from salactl.runtime.engine import Engine, check_prompt, ending_token_ids
from salactl.runtime.kv_fp8 import check_scales_before_loading, stored_kv_name
from salactl.runtime.loader import (generation_defaults, load_model, model_config, model_dir, resolve_device,
                                    resolve_dtype, unapplied_generation_settings)
from salactl.runtime.peaks import peaks_for
from salactl.runtime.roofline import OpCost, computes_in_bf16, linear_costs, phase_costs, roofline_rows
from salactl.runtime.sampling import SamplingParams, is_int
from salactl.runtime.stream_decoder import GeneratedText, check_stop_strings
from salactl.runtime.tokenizer import Tokenizer, check_chat_kwargs, check_fits, find_tokenizer

if TYPE_CHECKING:
    from pathlib import Path

    from salactl.runtime.config import SalaConfig
    from salactl.runtime.loader import LoadedModel


# what run samples with when neither a flag nor the checkpoint's generation_config.json says
SAMPLING_DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 64,
                     "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_new_tokens": 0, "min_p": 0.0}
# the warpers, which apply only when sampling: under greedy decoding the file's are not read, the flags refused
WARPERS = ("top_p", "top_k", "min_p")


@dataclass(frozen=True)
class RunRequest:
    """`salactl run`'s options; exactly one of prompt (text) and prompt_ids (token ids). A sampling
    option left None takes the checkpoint's generation_config.json value, else SAMPLING_DEFAULTS
    (see _sampling); seed None is 0, and not given (so greedy decoding does not refuse it)."""

    prompt: str | None = None
    prompt_ids: list[int] | None = None
    model: str = "sala-nano"
    random_weights: bool = False
    seed: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    tokenizer: str | None = None
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    min_new_tokens: int | None = None
    min_p: float | None = None
    chunk_size: int = 512
    chat: bool = False
    system: str | None = None               # chat: a system message before the prompt
    chat_template_kwargs: dict = field(default_factory=dict)    # chat: extra variables of the template
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()              # text that ends generation, left out of the output text
    stop_token_ids: tuple[int, ...] = ()    # ids that end generation, as EOS does
    kv_cache_dtype: str = "bf16"
    op_profile: bool = True         # per-op times (GPU engine: an eager pass after the timed generation)


def execute(req: RunRequest, stream=None, prefill_progress=None) -> dict:
    """Run the job; returns the `run --json` record. stream(text) gets the text as it is generated."""
    if (req.prompt is None) == (req.prompt_ids is None):
        raise UsageError("give exactly one of prompt (--prompt) and prompt_ids (--prompt-ids)")
    if not req.chat:
        refuse_unused([f for f, given in (("--system", req.system is not None),
                                          ("--chat-template-kwargs", bool(req.chat_template_kwargs))) if given],
                      "--chat (the chat template)", "add --chat, or drop {it}")
    check_chat_kwargs(req.chat_template_kwargs)
    # the given sampling values first: a bad one fails before the model is even looked up
    SamplingParams(**{k: v for k in (*SAMPLING_DEFAULTS, "seed") if (v := getattr(req, k)) is not None})
    # as the engines word it, but before _check_memory divides by it
    if not is_int(req.chunk_size) or req.chunk_size <= 0:
        raise UsageError(f"chunk_size (--chunk-size) must be a positive integer, got {req.chunk_size!r}")
    check_stop_strings(req.stop)
    directory = model_dir(req.model, req.random_weights)
    gen = generation_defaults(directory)
    _refuse_ignored_flags(req, gen)
    _warn_unapplied(directory)
    # the prompt is tokenized and sized before the weights load: a run that cannot fit loads nothing
    device = resolve_device(req.device)
    config = model_config(req.model, req.random_weights)
    check_scales_before_loading(config, directory, req.random_weights, req.kv_cache_dtype)
    act_dtype = resolve_dtype(req.dtype, device)
    ids, tok = _prompt_ids(req, directory)
    values, sources = _sampling(req, gen, len(ids))
    req = replace(req, seed=req.seed or 0, **values)
    params = SamplingParams(**{k: getattr(req, k) for k in SAMPLING_DEFAULTS}, seed=req.seed,
                            ignore_eos=req.ignore_eos, stop_token_ids=req.stop_token_ids)
    _check_prompt(req, config, ids, tok)
    _check_memory(req, config, device, act_dtype, len(ids))
    # only now: a run refused for memory would be told "it runs"
    _warn_model_limits(req, config, len(ids), _length_source(sources["max_new_tokens"], gen))
    lm = load_model(req.model, device, act_dtype, req.random_weights, req.seed)
    _note_checkpoint_sampling(req, gen, sources)
    with out_of_memory_is_capacity("run", "lower --chunk-size or shorten the prompt"):
        engine, res, text, timing_note = _generate(req, lm, ids, tok, params, stream, prefill_progress)
    return _record(req, lm, ids, text, engine, res, timing_note, sources)


def _file_temperature(gen: dict) -> float | None:
    """generation_config.json's temperature as HF generate() applies it: do_sample false is greedy
    (0), true samples at its temperature (1.0 when unset); None when it does not say."""
    if "do_sample" not in gen:
        return None
    return gen.get("temperature", 1.0) if gen["do_sample"] else 0.0


def _temperature(req: RunRequest, gen: dict) -> float | None:
    return req.temperature if req.temperature is not None else _file_temperature(gen)


def _refuse_ignored_flags(req: RunRequest, gen: dict) -> None:
    """Before loading: greedy decoding (a flag's or generation_config.json's) refuses the sampling
    flags it would ignore."""
    if _temperature(req, gen):
        return
    why = "" if req.temperature is not None or "do_sample" not in gen else \
        " (greedy from the checkpoint's generation_config.json)"
    refuse_unused([f"--{k.replace('_', '-')}" for k in WARPERS if getattr(req, k) is not None],
                  f"sampling (--temperature > 0), not greedy decoding{why}", "add --temperature T, or drop {it}")
    if not req.random_weights:
        refuse_unused(["--seed"] if req.seed is not None else [], "--random-weights and sampling "
                      f"(--temperature > 0), neither of which runs{why}", "drop {it}")


def _warn_unapplied(directory: Path | None) -> None:
    """One warning per generation_config.json setting HF generate() would apply and salactl does not."""
    for key, value in unapplied_generation_settings(directory).items():
        output.warn_once(f"the checkpoint's generation_config.json sets {key} {json.dumps(value)}, which "
                         "salactl does not apply; the run goes on without it")


def _sampling(req: RunRequest, gen: dict, prompt_tokens: int) -> tuple[dict, dict]:
    """The SAMPLING_DEFAULTS keys' values and where each came from: the flag ("cli"), else
    generation_config.json (`gen`: its temperature as _file_temperature; the WARPERS only when
    sampling; max_new_tokens, else max_length less the prompt's tokens, a UsageError where that leaves
    none; the logits processors' keys as they are), else "default"."""
    sampling = bool(_temperature(req, gen))
    budget = gen["max_length"] - prompt_tokens if "max_length" in gen else None
    if req.max_new_tokens is None and "max_new_tokens" not in gen and budget is not None and budget <= 0:
        # HF generate() refuses this too, rather than generate nothing
        raise UsageError(f"the checkpoint's generation_config.json has max_length {gen['max_length']}, but the "
                         f"prompt is {prompt_tokens} tokens, leaving none to generate; pass --max-new-tokens N")
    from_file = {name: gen.get(name) if sampling or name not in WARPERS else None for name in SAMPLING_DEFAULTS}
    from_file.update(temperature=_file_temperature(gen), max_new_tokens=gen.get("max_new_tokens", budget))
    values, sources = {}, {}
    for name, default in SAMPLING_DEFAULTS.items():
        for source, value in (("cli", getattr(req, name)), ("generation_config", from_file[name]),
                              ("default", default)):
            if value is not None:
                values[name], sources[name] = value, source
                break
    return values, sources


def _note_checkpoint_sampling(req: RunRequest, gen: dict, sources: dict) -> None:
    """A dim stderr line naming the values generation_config.json changed from SAMPLING_DEFAULTS."""
    def shown(name: str) -> str:
        from_length = name == "max_new_tokens" and name not in gen
        return f"{name} {getattr(req, name)}" + (f" (its max_length {gen['max_length']} less the prompt)"
                                                 if from_length else "")

    said = [shown(name) for name, source in sources.items()
            if source == "generation_config" and getattr(req, name) != SAMPLING_DEFAULTS[name]]
    if said:
        output.stderr.print(f"from the checkpoint's generation_config.json: {', '.join(said)}; flags override",
                            style="dim")


def _prompt_ids(req: RunRequest, directory: Path | None) -> tuple[list[int], Tokenizer | None]:
    """The prompt's token ids and the tokenizer (None where --prompt-ids come without one; `directory`:
    the model's, where its tokenizer is looked for)."""
    from salactl.input_files import check_tokenizer_memory
    from salactl.runtime.chat_template import CHATML_NOTE

    if req.prompt is None:
        if req.chat:
            raise UsageError("--chat needs a text prompt, not --prompt-ids")
        try:
            tok = find_tokenizer(req.tokenizer, directory)
        except Exception as e:
            if req.tokenizer is not None:       # only the model's own may be missing: ids need none
                raise
            if req.stop:
                raise TokenizerError(f"--stop matches the generated text, which needs a tokenizer: {e}") from None
            tok = None
        return req.prompt_ids, tok
    tok = find_tokenizer(req.tokenizer, directory)
    check_tokenizer_memory(req.prompt + (req.system or ""), "the prompt", "shorten the prompt")
    if req.chat:    # the checkpoint's template, tokenized without special tokens (HF apply_chat_template)
        ids = tok.chat_ids(req.prompt, system=req.system, template_kwargs=req.chat_template_kwargs)
        if not tok.has_chat_template:
            output.warn_once(CHATML_NOTE)
        return ids, tok
    return tok.encode(req.prompt), tok


def _length_source(source: str, gen: dict) -> str:
    """What set the run's length (the prompt plus max_new_tokens), as the sampling_source `source` says."""
    if source == "cli":
        return "the prompt plus --max-new-tokens"
    if source == "default":
        return f"the prompt plus the default {SAMPLING_DEFAULTS['max_new_tokens']} new tokens (--max-new-tokens)"
    if "max_new_tokens" in gen:
        return "the prompt plus generation_config.json's max_new_tokens (--max-new-tokens overrides it)"
    return "generation_config.json's max_length (--max-new-tokens overrides it)"


def _warn_model_limits(req: RunRequest, config: SalaConfig, prompt_tokens: int, length: str) -> None:
    """Warn where the prompt plus max_new_tokens (`length` says what set it) leaves what the model
    handles well."""
    sparse = config.sparse_config
    if sparse.forced_blocks_note and prompt_tokens + req.max_new_tokens >= sparse.dense_len:
        output.warn_once(sparse.forced_blocks_note)
    output.warn_past_trained_length(prompt_tokens + req.max_new_tokens, config.max_position_embeddings, length)


def _check_prompt(req: RunRequest, config: SalaConfig, ids: list[int], tok: Tokenizer | None) -> None:
    """Fail where the prompt's ids, the tokenizer's or --stop-token-ids do not fit the model's vocabulary:
    before the weights load, which the engine's own check of the prompt would wait for."""
    if tok is not None:
        check_fits(tok, config.vocab_size)
    try:
        check_prompt(ids, config.vocab_size)
    except UsageError as e:
        if req.prompt_ids is None:
            raise
        raise UsageError(f"--prompt-ids: {e}") from None
    outside = [t for t in req.stop_token_ids if not 0 <= t < config.vocab_size]
    if outside:
        raise UsageError(f"--stop-token-ids: {outside[0]} is outside the vocabulary (size "
                         f"{config.vocab_size}), so it could never end generation")


def _check_memory(req: RunRequest, config: SalaConfig, device: torch.device, act_dtype: torch.dtype,
                  prompt_tokens: int) -> None:
    """Before the weights load, as loading would check them alone: where the reference engine runs,
    the weights, the prompt's prefill and the KV cache (in --kv-cache-dtype) of max_new_tokens more
    must fit the device (exit 11, naming a --chunk-size and a --max-new-tokens that fit). The GPU
    engine sizes its own KV pool."""
    from salactl.bench.sweep_sizes import sweep_prefill_bytes
    from salactl.evaluation.perplexity import check_eval_memory, model_weight_bytes
    from salactl.profiling.preflight import largest_fitting
    from salactl.runtime.loader import available_bytes, check_host_memory, model_quantization
    from salactl.units import human_bytes

    quantization = model_quantization(req.model, req.random_weights)
    if quantization is None:
        check_host_memory(config, act_dtype, device, req.model)
    if _gpu_engine_will_run(device, config) or not prompt_tokens:
        return
    item = act_dtype.itemsize
    weights = model_weight_bytes(config, quantization, item)

    def need(chunk: int, new_tokens: int = req.max_new_tokens) -> int:
        total = prompt_tokens + max(new_tokens - 1, 0)      # the last token is never fed
        return sweep_prefill_bytes(config, prompt_tokens, total, 1, chunk, config.sparse_config.dense_len, item,
                                   req.kv_cache_dtype)

    room = available_bytes(device)
    alternatives = "a shorter prompt or fewer --max-new-tokens"
    if room is not None and weights + need(req.chunk_size) > room:
        most = largest_fitting(lambda n: weights + need(req.chunk_size, n) <= room, req.max_new_tokens)
        alternatives = (f"--max-new-tokens {most:,} or fewer (the most that fit after this prompt)" if most else
                        f"a shorter prompt (at --chunk-size {req.chunk_size:,} the prompt alone does not fit)")
    kv = stored_kv_name(req.kv_cache_dtype, act_dtype)
    what = (f"run (the prompt's prefill, {prompt_tokens:,} tokens at --chunk-size {req.chunk_size:,}, and "
            f"{req.max_new_tokens:,} new tokens: {human_bytes(need(req.chunk_size))} of KV cache in {kv}, states and "
            f"the reference engine's workspace and attention scores; the model's weights: {human_bytes(weights)})")
    check_eval_memory(device, what, 0, need, req.chunk_size, alternatives, weights)


def _generate(req: RunRequest, lm: LoadedModel, ids: list[int], tok: Tokenizer | None,
              params: SamplingParams, stream, prefill_progress):
    """Generate on the GPU engine (CUDA + Triton) or the reference one, streaming text as it comes
    and stopping at --stop strings; returns (engine, result, its GeneratedText or None without a
    tokenizer, what the phase and op times measured)."""
    from salactl.runtime.gpu.available import gpu_engine_available
    from salactl.runtime.loader import stop_token_ids

    eos = stop_token_ids(lm.config, lm.model_dir, tok)
    # decoded after the prompt, as vLLM does: the first token keeps its leading space
    text = GeneratedText(tok, req.stop, ending_token_ids(lm.config, params, eos), prompt_ids=ids,
                         min_new_tokens=params.min_new_tokens) if tok else None
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


def _gpu_engine_will_run(device: torch.device, config: SalaConfig) -> bool:
    """Whether _generate takes the GPU engine (without _gpu_engine_runs' note, said when it runs)."""
    from salactl.runtime.gpu.available import gpu_engine_available

    if not gpu_engine_available(device):
        return False
    from salactl.runtime.ops.selection.gpu import unsupported_shape       # imports triton

    return unsupported_shape(config) is None


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
    warm_up_s = _warm_up_gpu_engine(engine, ids, params, lm.config)
    if req.op_profile:
        res, timing_note = generate_with_op_profile(engine, ids, params, eos_ids=eos, on_token=on_token)
    else:
        res = engine.generate(ids, params, eos_ids=eos, on_token=on_token)
        timing_note = _without_op_times(res, "the timed generation (CUDA-graph decode)")
    timing_note["warm_up_s"] = warm_up_s
    return engine, res, timing_note


def _warm_up_gpu_engine(engine, ids: list[int], params: SamplingParams, config: SalaConfig) -> float:
    """Untimed generations that JIT-compile every Triton kernel and capture the decode CUDA graphs
    the timed one will use; returns their wall seconds. Without them a cold 9B run on an H100
    reported TTFT 38.6 s and 19 tok/s decode: Triton's compiler and graph capture, not the engine.
    The tokens do not matter, only the regimes: prompts below and past dense_len take different
    prefill and decode kernels, so a run whose decode crosses dense_len warms both (its second
    prompt, dense_len + 1 tokens, may prefill more than the timed run: the memory peak is reset)."""
    import time

    if not ids:
        return 0.0          # the timed generation refuses the empty prompt in one line
    dense_len = config.sparse_config.dense_len if config.sparse_layers else None
    warm = replace(params, max_new_tokens=min(3, params.max_new_tokens), ignore_eos=True, stop_token_ids=())
    prompts = [ids[:len(ids) if dense_len is None else min(len(ids), dense_len + 64)]]
    if dense_len is not None and len(ids) <= dense_len < len(ids) + params.max_new_tokens:
        prompts.append((ids * (dense_len // len(ids) + 2))[:dense_len + 1])     # decode past dense_len
    start = time.perf_counter()
    for prompt in prompts:
        engine.generate(prompt, warm)
    if engine.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(engine.device)   # the record's peak is the timed run's
    return time.perf_counter() - start


OP_TIMES_NOT_MEASURED = "not measured (--no-op-profile)"


def _without_op_times(res, phase_times: str) -> dict:
    """--no-op-profile: the roofline's op rows keep their analytic bytes and FLOPs, untimed; returns
    the timing note."""
    res.prefill.op_seconds = res.decode.op_seconds = None
    return {"phase_times": phase_times, "op_times": OP_TIMES_NOT_MEASURED}


def _record(req: RunRequest, lm: LoadedModel, ids: list[int], text: GeneratedText | None, engine, res,
            timing_note: dict, sampling_source: dict) -> dict:
    """The run's result: outputs, speeds, the roofline of both phases and what produced them."""
    from salactl.env import environment

    device = lm.model.device
    peak_memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    act_dtype = lm.model.model.embed_tokens.weight.dtype
    dtype_name = str(act_dtype).replace("torch.", "")
    ceilings = peaks_for(device).for_dtype(act_dtype, quantized=computes_in_bf16(lm.model))
    P = len(ids)
    return {
        "model": input_files.utf8_text(lm.source),       # the --model path as given, as UTF-8
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
        "sampling": {**{k: getattr(req, k) for k in SAMPLING_DEFAULTS}, "seed": req.seed, "ignore_eos": req.ignore_eos,
                     "stop": list(req.stop), "stop_token_ids": list(req.stop_token_ids)},
        "sampling_source": sampling_source,
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
    act_bytes = lm.model.model.embed_tokens.weight.element_size()
    pre_calls = [[(min(req.chunk_size, P - c), c)] for c in range(0, P, req.chunk_size)]
    dec_calls = [[(1, P + i)] for i in range(res.decode.forward_calls)]
    kv_bytes = 1 if engine.kv_scales is not None else act_bytes
    from salactl.profiling.analytic import gates_in_qkv_layers

    fused = gates_in_qkv_layers(lm.model)
    pre = run_phase_costs(lm.config, lm.model, pre_calls, act_bytes, kv_bytes, fused)
    dec = run_phase_costs(lm.config, lm.model, dec_calls, act_bytes, kv_bytes, fused)
    # the quantized linears' bf16 FLOPs take their own ceiling where it is not the model dtype's
    rates = ceilings["mem_gbps"], ceilings["compute_tflops"], ceilings.get("quantized_compute_tflops")
    return {
        "prefill": [dict(r.to_dict(), steps=len(pre_calls))
                    for r in roofline_rows(pre, res.prefill.op_seconds, res.prefill.seconds, *rates)],
        "decode": [dict(r.to_dict(), steps=len(dec_calls))
                   for r in roofline_rows(dec, res.decode.op_seconds, res.decode.seconds, *rates)]
        if dec_calls else [],
    }


def run_phase_costs(config: SalaConfig, model, calls: list[list[tuple[int, int]]], act_bytes: int, kv_bytes: int,
                    gates_in_qkv: frozenset = frozenset()) -> dict[str, OpCost]:
    """The analytic bytes and FLOPs of a phase's forward calls (each its (new, cached) rows and one
    logit row), with qkv and gates split as profiling.analytic.scoped_costs splits them for the
    `gates_in_qkv` layers: their gate projections under qkv, the elementwise gating under gates."""
    costs = phase_costs(config, linear_costs(model), calls, [1] * len(calls), act_bytes=act_bytes, kv_bytes=kv_bytes)
    if not gates_in_qkv:
        return costs
    from salactl.profiling.analytic import scoped_costs, sum_scopes

    # qkv and gates depend on a call's token count alone: one scoped_costs per distinct count
    counts = Counter(sum(n for n, _ in rows) for rows in calls)
    gate_projections = [linear_costs(model.model.layers[i])["gates"] for i in gates_in_qkv]
    bf16_flops = {op: costs[op].bf16_flops for op in ("qkv", "gates")}
    for op in ("qkv", "gates"):
        costs[op] = OpCost()
    for n_tok, times in counts.items():
        split = sum_scopes(scoped_costs(config, model, [(n_tok, 0)], 0, act_bytes, kv_bytes, gates_in_qkv))
        for op in ("qkv", "gates"):
            costs[op].bytes += times * int(split[op]["bytes"])
            costs[op].flops += times * int(split[op]["flops"])
        moved = times * 2 * n_tok * sum(g.bf16_macs(n_tok) for g in gate_projections)
        bf16_flops["qkv"], bf16_flops["gates"] = bf16_flops["qkv"] + moved, bf16_flops["gates"] - moved
    for op in ("qkv", "gates"):
        costs[op].bf16_flops = bf16_flops[op]
    return costs


def run_records(result: dict, req: RunRequest, label: str | None) -> list[dict]:
    """The run as two flat records (prefill, decode) in the bench schema, so `salactl report`
    renders runs next to bench/sweep records. Metric names follow SGLang's where one applies."""
    from salactl.bench.records import make_record, new_run_id

    run_id = new_run_id()
    n_in, n_out = len(result["prompt_token_ids"]), len(result["output_token_ids"])
    knobs = {k: v for k, v in asdict(req).items() if k not in ("prompt", "prompt_ids")}
    knobs.update(result["sampling"], sampling_source=result["sampling_source"], dtype=result["dtype"],
                 device=result["device"], kv_cache_dtype=result["kv_cache_dtype"], weights=result["weights"],
                 model=result["model"], tokenizer=req.tokenizer and input_files.utf8_text(req.tokenizer))
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
