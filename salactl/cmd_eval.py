"""`salactl eval ppl|passkey`: perplexity on held-out text (vs a unigram baseline) and passkey
retrieval accuracy over context lengths and depths, for any checkpoint the runtime loads."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

from salactl import input_files, output
from salactl.errors import CheckpointError, UsageError
from salactl.lists import parse_list
from salactl.options import (SEED_MAX, ChunkOpt, DeviceOpt, DtypeOpt, JsonOpt, KvCacheDtypeOpt, TokenizerOpt, non_empty_path,
                             passed, refuse_unused)

eval_app = typer.Typer(no_args_is_help=True, help="Evaluate a model: perplexity and passkey retrieval.")

DEFAULT_DEPTHS = "0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9"
DEFAULT_SPLIT = "heldout"
# not options.ModelOpt: that offers every preset, and eval (without --random-weights) scores trained weights only
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Checkpoint directory with trained weights, or "
                                       "sala-nano (the preset whose weights ship with salactl).")]


@contextmanager
def progress_bar(description: str):
    """A rich progress bar on stderr, drawn from the first update(done, total) on and erased when
    the work fails (the error stays the only line)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeRemainingColumn(), console=output.stderr)
    task = None

    def update(done, total):
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task(description, total=total)
        bar.update(task, completed=done, total=total)

    try:
        yield update
    except BaseException:
        bar.live.transient = True
        bar.live.stop()     # not bar.stop(): off a terminal it ends the erased bar with a blank line
        raise
    if task is not None:
        bar.stop()


def _check_chunk(chunk_size: int) -> None:
    if chunk_size < 1:
        raise UsageError(f"--chunk-size must be a positive token count, got {chunk_size}")


def _check_trained(model: str) -> None:
    """A preset other than sala-nano has only shapes, no weights; loading would suggest
    --random-weights, which eval lacks (scores of random weights mean nothing)."""
    from salactl.runtime.presets import PRESETS

    if model in PRESETS and model != "sala-nano":
        raise CheckpointError(f"preset {model!r} has no trained weights, and eval scores trained weights only; "
                              "pass a checkpoint directory or sala-nano (the default)")


def _before_loading(model: str, tokenizer: str | None, kv_cache_dtype: str):
    """(config, tokenizer) of `model`, checked without its weights: every check that needs only
    them and the options runs before the (slow, for a 9B model) load."""
    from salactl.runtime.kv_fp8 import check_scales_before_loading
    from salactl.runtime.loader import model_config, model_dir
    from salactl.runtime.tokenizer import check_fits, find_tokenizer

    _check_trained(model)
    config, directory = model_config(model), model_dir(model)
    check_scales_before_loading(config, directory, False, kv_cache_dtype)
    tok = find_tokenizer(tokenizer, directory)
    check_fits(tok, config.vocab_size)
    return config, tok


def _warn_capped_windows(seq_len: int, max_tokens: int, text_tokens: int, bos: bool) -> None:
    """A window holds at most --max-tokens + 1 tokens: said where --seq-len asks for longer ones and
    the text (`text_tokens`, encoded up to one past what the window takes) has tokens the cap left
    unscored (without <s>, the text's first token is context only)."""
    if max_tokens and seq_len > max_tokens + 1 and text_tokens > max_tokens + (not bos):
        output.warn_once(f"--seq-len {seq_len:,} is longer than --max-tokens {max_tokens:,} lets a window be: "
                         f"one window of at most {max_tokens + 1:,} tokens is scored; pass --max-tokens 0 (the "
                         f"whole text) or --max-tokens {seq_len - 1:,} or more")


# Host bytes per byte of a --file that its token ids take where eval ppl holds them all: at most an id
# a byte (a byte-level tokenizer's worst case; sala-nano's has 0.27 on plain text, 0.9-1.0 on
# punctuation, digits and CJK), each an 8-byte list slot and a 32-byte int object (CPython shares
# those of ids up to 256 only), a list's growth slack, and a second list of them (the unigram
# baseline's targets): 12-22 bytes per byte measured on those texts, counted for the worst case
IDS_BYTES_PER_BYTE = 50
# a --max-tokens below this holds few ids (50 MiB at most, as IDS_BYTES_PER_BYTE counts them): not counted
FEW_IDS = 1 << 20
IDS_FIX = "lower --max-tokens or give a shorter text"


def _file_read_cap(max_tokens: int) -> input_files.ReadCap | None:
    """The most bytes eval ppl reads of --file: as its bytes and decoded text fit the available
    memory, with its token ids where --max-tokens (0: every token) lets it hold many."""
    if max_tokens and max_tokens < FEW_IDS:
        return input_files.memory_read_cap(input_files.DECODED_BYTES_PER_BYTE, "its bytes and decoded text fit",
                                      "give a smaller --file (eval ppl reads it whole before encoding it)")
    return input_files.memory_read_cap(input_files.DECODED_BYTES_PER_BYTE + IDS_BYTES_PER_BYTE,
                                  "its bytes, decoded text and token ids fit", "give a smaller --file or "
                                  f"--max-tokens 1 to {FEW_IDS - 1:,} (eval ppl reads it whole, then holds the "
                                  "ids of the tokens it scores)")


def _check_passkey_memory(model: str, device: str, dtype: str, lengths: list[int], depths: list[float],
                          trials: int, chunk_size: int, kv_cache_dtype: str) -> None:
    """Before the model loads: the device, dtype, model and its weights as loading would check them,
    then memory with the weights counted."""
    from salactl.evaluation.passkey import check_passkey_memory
    from salactl.evaluation.perplexity import model_weight_bytes
    from salactl.runtime.loader import (check_host_memory, model_config, model_quantization, resolve_device,
                                        resolve_dtype)

    dev = resolve_device(device)
    _check_trained(model)
    config = model_config(model)
    act = resolve_dtype(dtype, dev)
    quantization = model_quantization(model)
    if quantization is None:
        check_host_memory(config, act, dev, model)
    check_passkey_memory(config, dev, act.itemsize, lengths, depths, trials, chunk_size,
                         weights=model_weight_bytes(config, quantization, act.itemsize), kv_cache_dtype=kv_cache_dtype)


def _check_ppl_memory(model: str, device: str, dtype: str, config, window: int, chunk_size: int,
                      kv_cache_dtype: str) -> None:
    """Before the model loads: the longest window's scoring with the weights still to load counted."""
    from salactl.evaluation.perplexity import check_perplexity_memory, model_weight_bytes
    from salactl.runtime.loader import model_quantization, resolve_device, resolve_dtype

    dev = resolve_device(device)
    act = resolve_dtype(dtype, dev)
    check_perplexity_memory(config, dev, act.itemsize, window, chunk_size, kv_cache_dtype,
                            weights=model_weight_bytes(config, model_quantization(model), act.itemsize))


def _act_dtype(lm):
    return lm.model.model.embed_tokens.weight.dtype


def _describe(lm) -> dict:
    """The model (its checkpoint directory as an absolute path, as the sala-nano preset's), device and dtype."""
    w = next(lm.model.parameters())
    return {"model": input_files.model_record_name(lm.source), "device": str(w.device), "dtype": str(w.dtype).replace("torch.", "")}


def _runtime_knobs(lm, kv_cache_dtype: str) -> dict:
    """What scored, named as `run` records it: the weights (w4a16/w8a16 or the activation dtype) and
    what the KV cache stores."""
    from salactl.quant.in_memory import quantized_as
    from salactl.runtime.kv_fp8 import stored_kv_name

    act = _act_dtype(lm)
    return {"weights": quantized_as(lm.model) or str(act).replace("torch.", ""),
            "kv_cache_dtype": stored_kv_name(kv_cache_dtype, act)}


@eval_app.command("ppl")
def ppl(
    ctx: typer.Context,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", metavar="<path>", parser=non_empty_path("--file", "a UTF-8 text file"), help="UTF-8 text file to score (default: the built-in held-out split). Special-token text in it (<s>, </s>, ...) is scored as the characters it is, not as those tokens.")] = None,
    split: Annotated[str, typer.Option("--split", help="Built-in corpus split when no --file: heldout or train.")] = DEFAULT_SPLIT,
    model: ModelOpt = "sala-nano",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    tokenizer: TokenizerOpt = None,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Window length in tokens (incl. <s>).")] = 1024,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Score at most this many tokens (0 = all).")] = 16384,
    chunk_size: ChunkOpt = 512,
    kv_cache_dtype: KvCacheDtypeOpt = "bf16",
    json_out: JsonOpt = False,
) -> None:
    """Perplexity of the model on held-out text, next to a unigram baseline."""
    from salactl.bench.out_of_memory import out_of_memory_is_capacity
    from salactl.env import environment
    from salactl.evaluation.perplexity import (check_scorable, encode_text, longest_window, perplexity,
                                               scored_targets, unigram_baseline)
    from salactl.runtime.kv_fp8 import fp8_dtype
    from salactl.runtime.loader import load_model

    if max_tokens < 0:
        raise UsageError(f"--max-tokens must be >= 0 (0 = all), got {max_tokens}")
    if seq_len < 2:
        raise UsageError(f"--seq-len must be at least 2, got {seq_len}")
    _check_chunk(chunk_size)
    fp8_dtype(kv_cache_dtype)                   # an unknown name is a usage error before the model loads
    source: dict
    if file is not None:
        refuse_unused(passed(ctx, "split"), "the built-in corpus only (without --file)", "drop one of --split "
                      "and --file")
        # read whole before it is encoded piecewise; a device such as /dev/zero stops at what memory holds
        text = input_files.read_text_option(file, "--file", cap=_file_read_cap(max_tokens))
        source = {"file": input_files.utf8_text(str(file))}
        what = f"--file {file}"
    else:
        from salactl.data.corpus import SPLITS, corpus_sha256, corpus_text

        if split not in SPLITS:
            raise UsageError(f"unknown --split {split!r}; valid: {', '.join(SPLITS)}")
        text = corpus_text(split)
        source = {"split": split, "corpus_sha256": corpus_sha256(split)}     # env has the Python version
        what = f"the {split} split"
    config, tok = _before_loading(model, tokenizer, kv_cache_dtype)
    cap = max_tokens or None
    bos = tok.bos_id if tok.add_bos else None
    with out_of_memory_is_capacity("eval ppl", IDS_FIX):
        # the windows take at most --max-tokens + 1 ids; one more tells whether the cap left any unscored
        ids = encode_text(tok, text, cap and cap + 2, what)
    del text                                    # scoring needs the ids only: the text's memory goes
    check_scorable(ids, seq_len, cap, bos, config.vocab_size, what)
    longest = longest_window(len(ids), seq_len, cap, bos)
    _warn_capped_windows(seq_len, max_tokens, len(ids), bos is not None)
    output.warn_past_trained_length(longest, config.max_position_embeddings,
                                    "--seq-len" if longest == seq_len else "the longest window scored")
    _check_ppl_memory(model, device, dtype, config, longest, chunk_size, kv_cache_dtype)
    lm = load_model(model, device, dtype)
    out_of_memory = out_of_memory_is_capacity("eval ppl", "lower --chunk-size or --seq-len")
    with progress_bar("perplexity") as update, out_of_memory:
        res = perplexity(lm.model, ids, seq_len, cap, progress=update, bos_id=bos, chunk_size=chunk_size,
                         kv_cache_dtype=kv_cache_dtype, what=what)
    with out_of_memory_is_capacity("eval ppl", IDS_FIX):
        uni = unigram_baseline(scored_targets(ids, seq_len, cap, bos))
    record = {**_describe(lm), **_runtime_knobs(lm, kv_cache_dtype), **source, **res, "longest_window": longest,
              "max_tokens": max_tokens, "bos": bos is not None, "unigram": uni, "chunk_size": chunk_size,
              "env": environment()}
    if json_out:
        output.print_json(record)
        return
    output.table("perplexity", ["", "NLL (nats/token)", "perplexity", "tokens"],
                 [[lm.source, res["nll"], res["ppl"], res["tokens"]],
                  ["unigram baseline (" + uni["fit"] + ")", uni["nll"], uni["ppl"], uni["tokens"]]])


@eval_app.command("passkey")
def passkey(
    lengths: Annotated[str, typer.Option("--lengths", help="Prompt lengths in tokens, each exact (BOS "
                                         "included); at least the prompt's fixed parts (62 tokens with "
                                         "sala-nano's tokenizer).")] = "256,512,1024,2048",
    depths: Annotated[str, typer.Option("--depths", help="Needle depths in [0, 1].")] = DEFAULT_DEPTHS,
    trials: Annotated[int, typer.Option("--trials", help="Prompts per (length, depth).")] = 5,
    seed: Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX, help="Seed of the passkeys.")] = 0,
    model: ModelOpt = "sala-nano",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    tokenizer: TokenizerOpt = None,
    chunk_size: ChunkOpt = 512,
    kv_cache_dtype: KvCacheDtypeOpt = "bf16",
    json_out: JsonOpt = False,
) -> None:
    """Passkey retrieval accuracy (greedy) per context length and needle depth."""
    from salactl.bench.out_of_memory import out_of_memory_is_capacity
    from salactl.env import environment
    from salactl.evaluation.passkey import ANSWER_TOKENS, passkey_trials, run_passkey
    from salactl.runtime.kv_fp8 import fp8_dtype
    from salactl.runtime.loader import load_model

    length_list = parse_list(lengths, "--lengths", dedupe=True)
    depth_list = parse_list(depths, "--depths", float, dedupe=True)
    if any(n <= 0 for n in length_list):
        raise UsageError(f"--lengths must be positive, got {lengths!r}")
    if any(not 0.0 <= d <= 1.0 for d in depth_list):
        raise UsageError(f"--depths must lie in [0, 1], got {depths!r}")
    if trials <= 0:
        raise UsageError(f"--trials must be positive, got {trials}")
    _check_chunk(chunk_size)
    fp8_dtype(kv_cache_dtype)                   # an unknown name is a usage error before the model loads
    _check_passkey_memory(model, device, dtype, length_list, depth_list, trials, chunk_size, kv_cache_dtype)
    config, tok = _before_loading(model, tokenizer, kv_cache_dtype)
    output.warn_past_trained_length(max(length_list) + ANSWER_TOKENS, config.max_position_embeddings,
                                    f"the longest --lengths plus the {ANSWER_TOKENS} answer tokens")
    prompts = passkey_trials(tok, length_list, depth_list, trials, seed)     # refuses a length too short
    lm = load_model(model, device, dtype)
    out_of_memory = out_of_memory_is_capacity("eval passkey", "lower --chunk-size or the longest --lengths")
    with progress_bar("passkey") as update, out_of_memory:
        rows = run_passkey(lm.model, tok, prompts, chunk_size, progress=update, model_dir=lm.model_dir,
                           kv_cache_dtype=kv_cache_dtype)
    by_length = {}
    for n in length_list:
        mine = [r for r in rows if r["length"] == n]
        by_length[str(n)] = sum(r["correct"] for r in mine) / sum(r["trials"] for r in mine)
    record = {**_describe(lm), **_runtime_knobs(lm, kv_cache_dtype), "lengths": length_list, "depths": depth_list,
              "trials": trials, "seed": seed, "chunk_size": chunk_size,
              "sparse_config": lm.config.sparse_config.__dict__, "results": rows,
              "accuracy_by_length": by_length, "env": environment()}
    if json_out:
        output.print_json(record)
        return
    table_rows = []
    for n in length_list:
        acc = {r["depth"]: r["accuracy"] for r in rows if r["length"] == n}
        table_rows.append([n, *[acc[d] for d in depth_list], by_length[str(n)]])
    output.table(f"passkey accuracy ({trials} trials per cell, dense_len "
                 f"{lm.config.sparse_config.dense_len})",
                 ["length", *[f"d={d:g}" if float(f"{d:g}") == d else f"d={d!r}" for d in depth_list], "mean"], table_rows)


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")
