"""`salactl run`: generate from a prompt and print speed next to the bandwidth/compute roofline."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from salactl import input_files, out_dirs, output
from salactl.units import human_bytes
from salactl.errors import UsageError
from salactl.streams import StdoutWriteError
from salactl.lists import parse_list
from salactl.options import (ChunkOpt, DeviceOpt, DtypeOpt, JsonOpt, KvCacheDtypeOpt, ModelOpt, RandomWeightsOpt,
                             TokenizerOpt, non_empty_path, passed, refuse_unused, seed_option)


def _filed(kind: type, flag: str, what: str, default) -> type:
    """A sampling option whose default is the checkpoint's generation_config.json value, else `default`."""
    return Annotated[Optional[kind], typer.Option(flag, help=f"{what} Default: generation_config.json's, "
                                                  f"else {default}.")]


def run(
    ctx: typer.Context,
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="Prompt text.")] = None,
    prompt_ids: Annotated[Optional[str], typer.Option("--prompt-ids", help="Token ids, e.g. 1,2,3, used as "
                                                      "given (no BOS is added, unlike --prompt).")] = None,
    prompt_file: Annotated[Optional[Path], typer.Option("--prompt-file", metavar="<path>", parser=non_empty_path("--prompt-file", "a UTF-8 text file"), help="Read the prompt from a file.")] = None,
    model: ModelOpt = "sala-nano",
    random_weights: RandomWeightsOpt = False,
    seed: seed_option("--random-weights and sampling (with a temperature > 0)") = 0,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    tokenizer: TokenizerOpt = None,
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", "-n", help="Tokens to generate at "
                              "most. Default: the checkpoint's generation_config.json max_new_tokens (or its "
                              "max_length less the prompt), else 64.")] = None,
    temperature: Annotated[Optional[float], typer.Option("--temperature", "-t", help="Sampling temperature, a "
                           "finite number >= 0; 0 = greedy. Default: generation_config.json's (do_sample true: "
                           "its temperature, 1 if unset), else 0.")] = None,
    top_p: _filed(float, "--top-p", "Nucleus sampling, in (0, 1]: keep the smallest set of tokens reaching this "
                  "probability (1 = off). Only when sampling.", 1) = None,
    top_k: _filed(int, "--top-k", "Keep the k most likely tokens (0 = off). Only when sampling.", 0) = None,
    min_p: _filed(float, "--min-p", "Min-p sampling, in [0, 1]: drop the tokens less likely than this times the "
                  "most likely one, after --top-p (0 = off). Only when sampling.", 0) = None,
    repetition_penalty: _filed(float, "--repetition-penalty", "HF's repetition penalty, > 0 (1 = off): the logits "
                               "of the ids in the prompt and output so far are divided by it (negative ones "
                               "multiplied), greedy or not.", 1) = None,
    no_repeat_ngram_size: _filed(int, "--no-repeat-ngram-size", "Never repeat an n-gram of this size from the "
                                 "prompt and output (0 = off), greedy or not.", 0) = None,
    min_new_tokens: _filed(int, "--min-new-tokens", "Hold back EOS, --stop-token-ids and --stop strings until "
                           "this many tokens are generated, greedy or not.", 0) = None,
    chunk_size: ChunkOpt = 512,
    op_profile: Annotated[bool, typer.Option("--op-profile/--no-op-profile", help="Per-op times in the "
                          "roofline: on the GPU engine (CUDA with triton) a second, eager pass over the prompt "
                          "(the timed run is unaffected); on the reference engine a timer around every op of "
                          "the run. --no-op-profile: phase times only.")] = True,
    kv_cache_dtype: KvCacheDtypeOpt = "bf16",
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the checkpoint's chat "
                                             "template (ChatML when it has none), as HF apply_chat_template.")] = False,
    system: Annotated[Optional[str], typer.Option("--system", metavar="<text>", help="With --chat: a system "
                      "message before the prompt.")] = None,
    chat_template_kwargs: Annotated[Optional[list[str]], typer.Option("--chat-template-kwargs",
                                    metavar="<key=json>", help="With --chat: a variable for the chat template "
                                    "as KEY=JSON_VALUE, e.g. enable_thinking=false (repeatable), as HF "
                                    "apply_chat_template's kwargs and vLLM/SGLang's chat_template_kwargs.")] = None,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Keep generating past end-of-sequence tokens.")] = False,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", metavar="<str>", help="End generation once the "
                    "generated text contains this string (repeatable). As in vLLM, the text printed and returned "
                    "ends before it, and finish_reason is stop.")] = None,
    stop_token_ids: Annotated[Optional[str], typer.Option("--stop-token-ids", metavar="<ids>", help="Token ids "
                              "that end generation as EOS does, e.g. 1,2 (also with --ignore-eos): the id is the "
                              "last of output_token_ids, its text is not printed, finish_reason is stop.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", metavar="<path>", parser=non_empty_path("--out", "a directory"), help="Append prefill/decode records to DIR/records.jsonl.")] = None,
    label: Annotated[Optional[str], typer.Option("--label", help="A name for this run in the --out records.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Generate text with the embedded runtime; print TTFT, tok/s and a roofline table."""
    from salactl.run_job import RunRequest, execute

    out_dirs.directory_option(out, files=("records.jsonl",))
    if out is None:
        refuse_unused(passed(ctx, "label"), "the records written to --out", "add --out DIR, or drop {it}")
    from salactl.bench.records import check_label

    prompt, system, label = (None if t is None else input_files.utf8_text(t) for t in (prompt, system, label))
    stop = [input_files.utf8_text(s) for s in stop or ()]
    check_label(label)
    given = [x is not None for x in (prompt, prompt_ids, prompt_file)]
    if sum(given) != 1:
        raise UsageError("give exactly one of --prompt, --prompt-ids or --prompt-file")
    if prompt_file is not None:
        # as check_tokenizer_memory would refuse it after reading; a device such as /dev/zero stops there
        cap = input_files.memory_read_cap(input_files.TOKENIZER_BYTES_PER_BYTE, "the tokenizer can encode", "shorten the prompt",
                                     floor=4 * input_files.TOKENIZER_CHECK_FROM)
        prompt = input_files.read_text_option(prompt_file, "--prompt-file", cap=cap)
    else:
        _check_utf8("--prompt", prompt)
    _check_utf8("--system", system)
    req = RunRequest(prompt=prompt, prompt_ids=parse_list(prompt_ids, "--prompt-ids") if prompt_ids is not None else None,
                     model=model, random_weights=random_weights, seed=seed if passed(ctx, "seed") else None,
                     device=device, dtype=dtype,
                     tokenizer=tokenizer, max_new_tokens=max_new_tokens, temperature=temperature,
                     top_p=top_p, top_k=top_k, min_p=min_p, repetition_penalty=repetition_penalty,
                     no_repeat_ngram_size=no_repeat_ngram_size, min_new_tokens=min_new_tokens,
                     chunk_size=chunk_size, chat=chat, system=system,
                     chat_template_kwargs=_template_kwargs(chat_template_kwargs), ignore_eos=ignore_eos,
                     stop=tuple(stop), stop_token_ids=_stop_token_ids(stop_token_ids),
                     kv_cache_dtype=kv_cache_dtype, op_profile=op_profile)
    last_text = [""]
    stdout_failed: list[Exception] = []

    def stream(text: str) -> None:
        last_text[0] = text or last_text[0]
        if stdout_failed:
            return
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except (BrokenPipeError, StdoutWriteError) as e:     # a closed pipe (`| head -1`), a full disk
            if out is None:         # nothing to keep: it ends the command now
                raise
            stdout_failed.append(e)     # the run goes on, so that its records are written

    try:
        with output.PrefillProgress() as prefill_progress:
            result = execute(req, None if json_out else stream, None if json_out else prefill_progress)
    except KeyboardInterrupt:       # "interrupted" goes on a line of its own, not after the cut text
        if last_text[0] and not last_text[0].endswith("\n"):
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.write("\n")
                sys.stdout.flush()
        raise
    if out is not None:
        from salactl.bench.records import RECORDS_NAME, RecordWriter
        from salactl.run_job import run_records

        writer = RecordWriter(out / RECORDS_NAME)
        records = run_records(result, req, label)
        writer.extend(records)
        result = {**result, "run_id": records[0]["run_id"], "files": {"records": writer.path}}
    if stdout_failed:               # now its exit code: 141 for the closed pipe, 16 for the rest
        raise stdout_failed[0]
    if json_out:
        output.print_json(result)
        return
    sys.stdout.write("\n\n")
    render(result)


def _template_kwargs(items: list[str] | None) -> dict:
    """--chat-template-kwargs KEY=JSON_VALUE ... as a dict."""
    kwargs = {}
    for item in items or ():
        key, eq, value = input_files.utf8_text(item).partition("=")
        if not eq or not key:
            raise UsageError(f"--chat-template-kwargs {item!r} is not KEY=JSON_VALUE; e.g. enable_thinking=false")
        _check_utf8("--chat-template-kwargs", key)
        try:
            kwargs[key] = json.loads(value)
        except (ValueError, RecursionError) as e:      # ValueError: also a number past int()'s digit limit
            why = e.msg if isinstance(e, json.JSONDecodeError) else \
                "nested too deeply" if isinstance(e, RecursionError) else "a number too long"
            shown = value if len(value) <= 60 else value[:57] + "..."
            raise UsageError(f"--chat-template-kwargs {key}: {shown!r} is not JSON ({why}); use true/false, "
                             f"null, a number or a quoted string, e.g. {key}='\"text\"'") from None
        _check_json_utf8(f"--chat-template-kwargs {key}", kwargs[key])
    return kwargs


def _check_json_utf8(flag: str, value) -> None:
    """_check_utf8 on every string (keys too) in a JSON value, walked without recursion: what
    json.loads accepts may nest close to Python's recursion limit."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            _check_utf8(flag, v)
        elif isinstance(v, dict):
            todo += [*v, *v.values()]
        elif isinstance(v, list):
            todo += v


def _check_utf8(flag: str, text: str | None) -> None:
    """A UsageError naming `flag` where `text` holds bytes that are not UTF-8 (lone surrogates, as
    Python keeps such argv bytes; or JSON's "\\udcff"): checked here, as --stop is, because with --chat
    the tokenizer meets them only in the rendered template, at a position the user never wrote."""
    from salactl.runtime.tokenizer import check_utf8 as check

    try:
        check(text)
    except UsageError as e:
        raise UsageError(f"{flag}: {e}") from None


def _stop_token_ids(text: str | None) -> tuple[int, ...]:
    return () if text is None else tuple(parse_list(text, "--stop-token-ids", minimum=0, dedupe=True))


def render(r: dict) -> None:
    from salactl.run_job import OP_TIMES_NOT_MEASURED

    output.stdout.print(
        f"model {r['model']} on {r['device']} ({r['dtype']}): prompt {len(r['prompt_token_ids'])} tok, "
        f"generated {len(r['output_token_ids'])} tok ({r['finish_reason']})")
    ttft_ms = r["ttft_s"] and r["ttft_s"] * 1e3          # rates are None when the phase did not run
    output.stdout.print(f"TTFT {output.fmt(ttft_ms)} ms | prefill {output.fmt(r['prefill_tok_s'])} tok/s | "
                        f"decode {output.fmt(r['decode_tok_s'])} tok/s")
    output.stdout.print(f"ceilings: {output.ceilings(r['peaks'])}")
    if r.get("timing"):
        op_times = r["timing"]["op_times"]
        per_op = f"per op {op_times}" if op_times == OP_TIMES_NOT_MEASURED else f"per op from {op_times}"
        scaled = [f"{phase} x{f:.2f}" for phase, f in r["timing"].get("op_times_scale", {}).items() if f != 1]
        warm = r["timing"].get("warm_up_s")
        output.stdout.print(f"times: phases from {r['timing']['phase_times']}; {per_op}"
                            + (f"; op times scaled to fit the phase: {', '.join(scaled)}" if scaled else "")
                            + (f"; after {warm:.1f} s of untimed warm-up (kernel compiles, CUDA-graph capture)"
                               if warm is not None else ""))
    for phase in ("prefill", "decode"):
        rows = r["roofline"][phase]
        if not rows:
            continue
        span = _phase_span(phase, rows[-1]["steps"], len(r["prompt_token_ids"]))
        output.table(
            f"{phase} roofline: totals over {span}",
            ["op", "bytes", "FLOPs", "time ms", "GB/s", "TFLOP/s", "% peak", "floor ms"],
            [[x["op"], human_bytes(x["bytes"]), float(x["flops"]),   # 1.65e+07, not every digit
              None if x["time_s"] is None else x["time_s"] * 1e3, x["achieved_gbps"],
              x["achieved_tflops"], x["pct_of_peak"], x["floor_s"] * 1e3] for x in rows])
        tot = rows[-1]
        if tot["time_s"]:
            per_token = f", {tot['floor_s'] / tot['steps'] * 1e3:.2f} ms/token" if phase == "decode" else ""
            output.stdout.print(f"{phase} ({span}): {tot['time_s'] / tot['floor_s']:.1f}x the floor "
                                f"({tot['floor_s'] * 1e3:.2f} ms total{per_token})")


def _phase_span(phase: str, steps: int, prompt_tokens: int) -> str:
    """What a phase's roofline totals add up: "2 chunks, 900 tokens" or "23 steps"."""
    if phase == "prefill":
        return f"{steps} chunk{'s' * (steps != 1)}, {prompt_tokens} tokens"
    return f"{steps} step{'s' * (steps != 1)}"


def register(app: typer.Typer) -> None:
    app.command("run")(run)
