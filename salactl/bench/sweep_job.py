"""`salactl sweep` as a function: for every grid point, the speed of a small closed-loop workload
(the bench runner over the embedded engine: TTFT, TPOT, ITL, throughput, peak GPU memory) and the
accuracy proxies (logit KL vs dense attention, passkey), one record per point, then the Pareto front."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from salactl import input_files, output
from salactl.bench import phase_checks
from salactl.bench import records as rec
from salactl.bench.engine_options import gpu_engine_sizes
from salactl.bench.grid_memory import cache_bytes_per_request
from salactl.bench.out_of_memory import out_of_memory_is_capacity
from salactl.bench.sweep_checks import PARETO_X, check_before_loading
from salactl.bench.sweep_resume import reusable
from salactl.bench.sweep_sizes import KL_REFERENCE_CHUNK
from salactl.bench.sweep_grid import (KV_DTYPES, WEIGHT_DTYPES, SweepPoint, build_points, parse_ints,
                                      parse_names, point_key)
from salactl.bench.targets.embedded import EmbeddedTarget
from salactl.errors import CapacityError, ConfigError, OutputExistsError, SalactlError, UsageError
from salactl.evaluation.passkey import ANSWER_TOKENS
from salactl.lists import parse_list
from salactl.quant.in_memory import QUANTIZED_BITS, quantize_rtn_in_memory, quantized_as
from salactl.reports.atomic import exclusive_lock, write_atomic
from salactl.runtime.kv_fp8 import kv_item_bytes, stored_kv_name

if TYPE_CHECKING:
    from salactl.runtime.loader import LoadedModel

PARETO_Y = "logit_kl_mean"
SWEEP_LOCK = ".salactl-sweep.lock"     # held in --out while a sweep runs, removed when it ends


@dataclass(frozen=True)
class SweepSettings:
    model: str | None = None
    random_weights: bool = False
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    tokenizer: str | None = None
    dense_len: str | None = None
    topk: str | None = None
    window: str | None = None
    block: str | None = None
    chunk_size: str | None = None
    batch_size: str | None = None
    kv_dtype: str | None = None
    weight_dtype: str | None = None
    input_len: int = 512
    output_len: int = 16
    requests: int = 2
    kl: bool = True
    kl_len: int | None = None
    passkey: bool = True
    passkey_lengths: str | None = None  # None: PASSKEY_DEFAULTS (None so that --no-passkey can refuse them)
    passkey_depths: str | None = None
    passkey_trials: int | None = None
    engine: str = "auto"
    max_running_requests: int | None = None     # None: the GPU engine's default (refused on the reference)
    mem_fraction: float | None = None
    out: Path = Path("salactl-results/sweep")
    resume: bool = False
    label: str | None = None
    pareto_x: str | None = None         # None: PARETO_X_DEFAULT (None so that --no-kl can refuse it)


@dataclass
class SweepRun:
    run_id: str
    label: str | None = None
    points: list[dict] = field(default_factory=list)
    resumed: int = 0
    invalid: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pareto: list[str] = field(default_factory=list)            # the front's point names
    pareto_keys: list[str] = field(default_factory=list)       # and their point_key, which marks them
    files: dict = field(default_factory=dict)
    interrupted: bool = False           # stopped early: points and front cover the finished points only
    stopped: str | None = None          # or ended early on an error: its line, and the point it ended at
    stopped_at: str | None = None
    failure: SalactlError | None = None     # the last error that ended a point's measurement (not in to_dict)

    def to_dict(self) -> dict:
        d = {"run_id": self.run_id, "label": self.label, "points": self.points,
             "resumed_points": self.resumed, "invalid_points": self.invalid, "notes": self.notes,
             "pareto": self.pareto, "pareto_point_keys": self.pareto_keys, "interrupted": self.interrupted,
             "files": self.files}
        if self.stopped is not None:        # as bench's summary says it
            d.update(stopped=self.stopped, stopped_at=self.stopped_at)
        return rec.jsonable(d)


@dataclass(frozen=True)
class _SweepContext:
    """What every point of one sweep shares, built once by run_sweep before the first point."""
    settings: SweepSettings
    lm: LoadedModel                     # the base weights, their config, source and model_dir
    base_dtype: torch.dtype
    engine_kind: str
    varying: list[str]                  # the axes with more than one value (they name the points)
    knobs: dict                         # the sweep-wide knobs every record carries and its key hashes
    tok: object | None
    passkey: bool
    passkey_lengths: list[int]
    passkey_depths: list[float]
    kl_prompt: list[int] | None         # with the dense reference's logits over it; None with --no-kl
    ref_logits: torch.Tensor | None
    env: dict
    weights_cache: dict = field(default_factory=dict)    # weight dtype -> the base weights in it


def _with_usable_kv_scales(points: list[SweepPoint], lm: LoadedModel, varying: list[str],
                           run: SweepRun) -> list[SweepPoint]:
    """The points whose KV dtype has its scales (fp8_e4m3 needs calibrated ones), resolved once per
    dtype right after loading, before any reference is computed; the rest go to run.invalid."""
    from salactl.runtime.kv_fp8 import model_kv_scales, resolve_kv_scales

    unusable = {}
    for kv in dict.fromkeys(p.kv_dtype for p in points):
        try:
            resolve_kv_scales(lm.config, kv, model_kv_scales(lm.model), lm.model.device)
        except ConfigError as e:
            unusable[kv] = str(e)
    usable = [p for p in points if p.kv_dtype not in unusable]
    for p in points:
        if p.kv_dtype in unusable:
            run.invalid.append({"knobs": p.knobs(), "reason": unusable[p.kv_dtype]})
            if usable:                  # none left: the error says why
                output.stderr.print(f"note: skipping point {p.label(varying)}: {unusable[p.kv_dtype]}")
    return usable


def _weights_model(base, config, weight_dtype: str, base_dtype: torch.dtype, cache: dict):
    """The base weights in `weight_dtype` (built once per dtype; bf16/fp16/fp32 casts, w4a16/w8a16 RTN)."""
    from salactl.bench.accuracy import rebuild_model
    from salactl.runtime.loader import DTYPES

    if weight_dtype in cache:
        return cache[weight_dtype]
    quantized = quantized_as(base)
    if quantized and weight_dtype != quantized:
        raise UsageError(f"--weight-dtype {weight_dtype}: the checkpoint is GPTQ-quantized; "
                         f"supported for it: {quantized}")
    if quantized:
        model = base
    elif weight_dtype in QUANTIZED_BITS:
        model = quantize_rtn_in_memory(rebuild_model(base, config), config, 128,
                                       bits=QUANTIZED_BITS[weight_dtype])
    else:
        dt = DTYPES[weight_dtype]
        model = base if dt == base_dtype else rebuild_model(base, config, dt)
    cache[weight_dtype] = model
    return model


def _axes(s: SweepSettings, config, default_weight: str, default_chunk: int) -> dict[str, list]:
    sc = config.sparse_config
    return {
        "dense_len": parse_ints(s.dense_len, "dense-len", sc.dense_len, minimum=0),
        "topk": parse_ints(s.topk, "topk", sc.topk),
        "window": parse_ints(s.window, "window", sc.window_size, minimum=0),
        "block": parse_ints(s.block, "block", sc.block_size),
        "chunk_size": parse_ints(s.chunk_size, "chunk-size", default_chunk),
        "batch_size": parse_ints(s.batch_size, "batch-size", 1),
        "kv_dtype": parse_names(s.kv_dtype, "kv-cache-dtype", "bf16", KV_DTYPES),
        "weight_dtype": parse_names(s.weight_dtype, "weight-dtype", default_weight, WEIGHT_DTYPES),
    }


def run_sweep(s: SweepSettings, progress=None) -> SweepRun:
    s = check_before_loading(s)
    with _sole_sweep(Path(s.out)):          # from reading the records already there to the summary
        return _sweep(s, progress)


@contextlib.contextmanager
def _sole_sweep(out: Path) -> Iterator[None]:
    """Hold `out`'s sweep lock for the block: a second sweep on the same --out is refused (exit 10)
    instead of measuring the points the first is measuring and writing the same files. The
    directories this makes are removed again when the sweep leaves nothing in them."""
    made = [d for d in (out.absolute(), *out.absolute().parents) if not d.exists()]
    out.mkdir(parents=True, exist_ok=True)
    try:
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(exclusive_lock(out / SWEEP_LOCK, wait=False, remove=True))
            except BlockingIOError:
                raise OutputExistsError(f"another sweep is writing {out}; wait for it to end or choose "
                                        "another --out") from None
            yield
    finally:
        for d in made:                      # innermost first; rmdir refuses a directory with files
            try:
                d.rmdir()
            except OSError:
                break


def _sweep(s: SweepSettings, progress) -> SweepRun:
    from salactl.bench.targets.embedded import DEFAULT_CHUNK, resolve_engine
    from salactl.env import environment
    from salactl.runtime.loader import load_model

    depths = parse_list(s.passkey_depths, "--passkey-depths", float, dedupe=True)
    lengths = parse_ints(s.passkey_lengths, "passkey-lengths", 512)
    run = SweepRun(rec.new_run_id(), s.label)
    out = Path(s.out)
    records_path = out / rec.RECORDS_NAME
    existing = [r for r in rec.read_records(records_path) if r.get("kind") == "sweep"]
    if existing and not s.resume:
        raise OutputExistsError(f"{records_path} already holds sweep records; pass --resume to skip "
                                "finished points, or choose another --out")

    lm = load_model(s.model, s.device, s.dtype, s.random_weights, s.seed)
    config, base = lm.config, lm.model
    device = base.device
    base_dtype = base.model.embed_tokens.weight.dtype
    default_weight = quantized_as(base) or {torch.bfloat16: "bf16", torch.float16: "fp16",
                                             torch.float32: "fp32"}[base_dtype]
    engine_kind = resolve_engine(s.engine, device)
    axes = _axes(s, config, default_weight, DEFAULT_CHUNK[engine_kind])
    points, varying, invalid = build_points(axes, config.sparse_config)
    for p, why in invalid:
        run.invalid.append({"knobs": p.knobs(), "reason": why})
        if points or len(invalid) > 1:      # a grid of one invalid point: the error below says why
            output.stderr.print(f"note: skipping invalid point {p.label(varying)}: {why}")
    if not points:
        raise ConfigError(f"no valid point in the grid ({invalid[0][1]})")
    points = _with_usable_kv_scales(points, lm, varying, run)
    if not points:
        raise ConfigError(f"no point could be measured ({run.invalid[-1]['reason']}); nothing was recorded")

    tok = _tokenizer(s, lm, run)
    do_passkey = s.passkey
    if do_passkey and tok is None:
        do_passkey = False
        _note(run, "passkey skipped: it needs the model's tokenizer (pass --tokenizer)")
    if do_passkey:
        _check_passkey_lengths(tok, lengths, depths, s)
    if not s.kl:
        _note(run, f"no Pareto front: it trades {s.pareto_x} against the logit KL, which --no-kl skips")

    kl_len = s.kl_len or s.input_len
    longest = max([_speed_positions(s.input_len, s.output_len), kl_len if s.kl else 0,
                   *([n + ANSWER_TOKENS - 1 for n in lengths] if do_passkey else [])])
    _warn_past_trained_length(s, kl_len, lengths if do_passkey else [], config.max_position_embeddings)
    for p in points:
        note = p.sparse_config(config.sparse_config).forced_blocks_note
        if note and longest >= p.dense_len:          # only a point whose sequences reach its sparse path
            output.warn_once(f"point {p.label(varying)}: {note}")
            run.notes.append(f"{p.label(varying)}: {note}")     # in the summary; said once, as the warning
    prompt = None
    if s.kl:
        from salactl.bench.accuracy import kl_prompt

        prompt = kl_prompt(tok, kl_len, config.vocab_size, s.seed)
    context = {"model": input_files.utf8_text(lm.source), "device": str(device), "dtype": str(base_dtype).replace("torch.", ""),
               "engine": engine_kind,
               "input_len": s.input_len, "output_len": s.output_len, "requests": s.requests,
               "kl": s.kl, "kl_len": kl_len, "passkey": do_passkey, "passkey_lengths": lengths,
               "passkey_depths": depths, "passkey_trials": s.passkey_trials, "seed": s.seed,
               **_prompt_sources(tok, prompt, kl_len, config.vocab_size, s),
               **_engine_sizes(engine_kind, s)}
    # a point recorded under another --label belongs to another run: resume only this label's points
    done, unusable = reusable([r for r in existing if r.get("label") == s.label])
    env = environment()
    writer = rec.RecordWriter(records_path)
    run.files["records"] = records_path        # paths stay paths: jsonable names them as UTF-8

    ref_logits = None
    todo = [p for p in points if point_key(p, context) not in done]
    for p in todo:
        if point_key(p, context) in unusable:
            output.stderr.print(f"note: the record of point {p.label(varying)} in {records_path} "
                                f"{unusable[point_key(p, context)]}; measuring it again")
    other_labels = {r["point_key"] for r in existing
                    if r.get("label") != s.label and isinstance(r.get("point_key"), str)} - set(done)
    relabelled = sum(point_key(p, context) in other_labels for p in todo)
    if relabelled:
        this = f"--label {s.label}" if s.label else "this sweep without --label"
        output.stderr.print(f"note: {relabelled} point(s) recorded under another --label are measured again "
                            f"for {this}: --resume reuses only points of the same --label")
    if s.kl and todo:
        from salactl.bench.accuracy import dense_config, prompt_logits, with_config

        with out_of_memory_is_capacity("the dense KL reference", "lower --kl-len, or pass --no-kl"):
            ref_logits = prompt_logits(with_config(base, dense_config(config, kl_len)), prompt,
                                       KL_REFERENCE_CHUNK)

    ctx = _SweepContext(settings=s, lm=lm, base_dtype=base_dtype, engine_kind=engine_kind, varying=varying,
                        knobs=context, tok=tok, passkey=do_passkey, passkey_lengths=lengths,
                        passkey_depths=depths, kl_prompt=prompt, ref_logits=ref_logits, env=env)
    if progress:
        progress.begin("sweep", len(points))
    try:
        for p in points:
            key = point_key(p, context)
            if key in done:
                run.points.append(dict(done[key], phase=p.label(varying)))   # named as this sweep names it
                run.resumed += 1
            else:
                record = _measure(p, key, ctx, run)
                if record is not None:
                    with rec.interrupts_deferred():     # the summary written on the way out has every record
                        writer.append(record)
                        run.points.append(record)
            if progress:
                progress.advance_point()
    except KeyboardInterrupt:
        run.interrupted = True
        raise
    except Exception as e:          # out of memory, a records file that cannot take the point's record
        run.stopped, run.stopped_at = _error_line(e), p.label(varying)
        raise
    finally:
        with rec.interrupts_deferred():         # a second interrupt waits for the summary of the first
            if progress:
                progress.end()
            _finish(run, s, out)
    if not run.points:                   # every point failed to build, or all its requests failed
        if run.failure is not None:      # its own error and exit code (NaN logits: 15), as bench's
            raise run.failure
        raise ConfigError(f"no point could be measured ({run.invalid[-1]['reason']}); nothing was recorded")
    return run


def _error_line(e: Exception) -> str:
    """What ended the sweep, in one line: a known error's message, else its type and first line."""
    if isinstance(e, SalactlError):
        return str(e)
    detail = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {detail}" if detail else type(e).__name__


def _tokenizer(s: SweepSettings, lm: LoadedModel, run: SweepRun):
    """The model's tokenizer (--tokenizer's), or None with a note where the model has none."""
    from salactl.runtime.tokenizer import check_fits, find_tokenizer

    try:
        tok = find_tokenizer(s.tokenizer, lm.model_dir)
        check_fits(tok, lm.config.vocab_size)
        return tok
    except SalactlError as e:
        if s.tokenizer:
            raise
        _note(run, f"no tokenizer ({e}); KL uses random token ids")
        return None


def _check_passkey_lengths(tok, lengths: list[int], depths: list[float], s: SweepSettings) -> None:
    """Every passkey prompt built once, before any point is measured: a length too short for the
    passkey text is a usage error now, not after the first point."""
    from salactl.evaluation.passkey import passkey_trials

    try:
        passkey_trials(tok, lengths, depths, s.passkey_trials, s.seed)
    except UsageError as e:
        raise UsageError(f"--passkey-lengths: {e}") from None


def _warn_past_trained_length(s: SweepSettings, kl_len: int, passkey_lengths: list[int], limit: int) -> None:
    """As run and eval passkey do, for the longest sequence of the sweep (the flag that sets it named)."""
    lengths = [(s.input_len + s.output_len, "--input-len plus --output-len")]
    if s.kl:
        lengths.append((kl_len, "--kl-len" if s.kl_len else "--kl-len (default: --input-len)"))
    if passkey_lengths:
        lengths.append((max(passkey_lengths) + ANSWER_TOKENS,
                        f"the longest --passkey-lengths plus the {ANSWER_TOKENS} answer tokens"))
    tokens, what = max(lengths, key=lambda x: x[0])
    output.warn_past_trained_length(tokens, limit, what)


def _prompt_sources(tok, prompt: list[int] | None, kl_len: int, vocab_size: int, s: SweepSettings) -> dict:
    """What the KL and passkey prompts are built from, for the point keys (--resume measures a point
    again when they change): the tokenizer (its tokenizer.json path and the hash of its files) and
    whether the KL prompt is text or random ids (a tokenizer's text too short or outside the
    vocabulary falls back to random ids)."""
    from salactl.bench.accuracy import kl_prompt

    kl_source = None
    if prompt is not None:
        kl_source = "random" if tok is None or prompt == kl_prompt(None, kl_len, vocab_size, s.seed) else "text"
    return {"tokenizer": None if tok is None else input_files.utf8_text(str(Path(tok.path).resolve())),
            "tokenizer_sha256": None if tok is None else _tokenizer_hash(Path(tok.path)),
            "kl_prompt": kl_source}


def _tokenizer_hash(path: Path) -> str:
    """sha256 of tokenizer.json and the side files beside it that change its ids (16 hex digits)."""
    h = hashlib.sha256()
    for f in (path, path.parent / "tokenizer_config.json", path.parent / "special_tokens_map.json"):
        h.update(f.name.encode() + b"\0")
        with contextlib.suppress(OSError):
            h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _engine_sizes(engine_kind: str, s: SweepSettings) -> dict:
    """The GPU engine's --max-running-requests and --mem-fraction (its defaults where not given),
    which size its caches and batching; none on the reference engine, which refuses them."""
    if engine_kind == "reference":
        return {}
    max_running, mem_fraction = gpu_engine_sizes(s.max_running_requests, s.mem_fraction)
    return {"max_running_requests": max_running, "mem_fraction": mem_fraction}


def _measure(p: SweepPoint, key: str, ctx: _SweepContext, run: SweepRun) -> dict | None:
    """One grid point's record, or None when it measured nothing: its engine cannot be built, or its
    requests, warmup included, or accuracy proxies failed (NaN logits in fp16, say); the reason goes
    to run.invalid and the sweep goes on. Running out of memory (a CapacityError) ends the sweep."""
    try:
        return _measure_point(p, key, ctx, run)
    except CapacityError:
        raise
    except SalactlError as e:
        run.failure = e
        return _skip_point(run, p, p.label(ctx.varying), str(e))


def _skip_point(run: SweepRun, p: SweepPoint, label: str, reason: str) -> None:
    """A point that measured nothing: listed under invalid_points with a warning (--resume measures it again)."""
    run.invalid.append({"knobs": p.knobs(), "reason": reason})
    output.warn_once(f"skipping point {label}: {reason}")


def _measure_point(p: SweepPoint, key: str, ctx: _SweepContext, run: SweepRun) -> dict | None:
    """One grid point's record (speed, then the accuracy proxies), or None when its engine cannot be
    built (the reason goes to run.invalid)."""
    from salactl.bench.accuracy import logit_kl, passkey_accuracy, prompt_logits, with_config
    from salactl.bench.profiles import Phase
    from salactl.bench.runner import run_phase
    from salactl.bench.metrics import phase_metrics
    from salactl.bench.synthetic import random_lengths
    from salactl.bench.targets.embedded import build_engine

    s, lm, config, base_dtype = ctx.settings, ctx.lm, ctx.lm.config, ctx.base_dtype
    label = p.label(ctx.varying)
    device = lm.model.device
    try:
        weights = _weights_model(lm.model, config, p.weight_dtype, base_dtype, ctx.weights_cache)
        cfg = config.replace(sparse_config=p.sparse_config(config.sparse_config))
        model = with_config(weights, cfg)
        driver, _, _ = build_engine(model, device, ctx.engine_kind, p.chunk_size, p.kv_dtype,
                                    s.max_running_requests, s.mem_fraction)
    except (ConfigError, UsageError) as e:
        run.invalid.append({"knobs": p.knobs(), "reason": str(e)})
        output.stderr.print(f"note: skipping point {label}: {e}")
        return None
    target = EmbeddedTarget(driver, lm.source, config.vocab_size, device)
    try:
        n = max(s.requests, p.batch_size)
        reqs = random_lengths(n, s.input_len, s.output_len, config.vocab_size, seed=s.seed + 1, prefix=f"{label}-")
        outcome = run_phase(target, Phase(label, max_concurrency=p.batch_size, flush_cache=False), reqs)
    finally:
        target.close()
        del target, driver
        if device.type == "cuda":        # free this point's engine (GPU pools) before the next one
            import gc

            gc.collect()
            torch.cuda.empty_cache()
    failed = unmeasured(label, outcome.results)
    if failed:
        return _skip_point(run, p, label, failed)
    metrics = phase_metrics(outcome.results, outcome.duration)
    metrics.update(outcome.device)
    # bf16/fp16/fp32 cast the whole model: its KV ("bf16" stores the activation dtype) and K1 follow
    act_dtype = model.model.embed_tokens.weight.dtype
    metrics["cache_bytes_per_request"] = cache_bytes_per_request(
        cfg, s.input_len + s.output_len, kv_item_bytes(p.kv_dtype, act_dtype.itemsize), act_dtype.itemsize)
    with out_of_memory_is_capacity(f"the accuracy proxies of point {label}",
                                    "lower --chunk-size, --kl-len or --passkey-lengths"):
        if ctx.ref_logits is not None:
            logits = prompt_logits(model, ctx.kl_prompt, p.chunk_size, p.kv_dtype)
            metrics.update(logit_kl(ctx.ref_logits, logits, p.dense_len))
        if ctx.passkey:
            metrics.update(passkey_accuracy(model, ctx.tok, ctx.passkey_lengths, ctx.passkey_depths,
                                            s.passkey_trials, s.seed, p.chunk_size, lm.model_dir, p.kv_dtype))
    metrics["point_key"] = key
    knobs = dict(p.knobs(), **{k: v for k, v in ctx.knobs.items() if k not in ("model",)})
    # what ran, named as run and bench records name it (kv_dtype "bf16" on a float32 model stores float32)
    act_name = str(act_dtype).replace("torch.", "")
    knobs.update(dtype=act_name, kv_cache_dtype=stored_kv_name(p.kv_dtype, act_dtype),
                 weights=quantized_as(model) or act_name)
    return rec.make_record("sweep", run.run_id, s.label, "sweep", label, "embedded", lm.source, metrics,
                           knobs, ctx.env, outcome.started_at)


def unmeasured(label: str, results) -> str | None:
    """Why a point whose timed requests all failed measured nothing (None when some succeeded: a
    warning then says how many failed, and the record's `failed` counts them)."""
    failed = phase_checks.all_failed(label, results)
    if failed is None:
        phase_checks.warn_failures(label, results, details=True)     # details: the sweep has no --details
    return failed


def _speed_positions(input_len: int, output_len: int) -> int:
    """Positions a speed request feeds: its prompt and every output token but the last. Some query
    runs the sparse path iff this reaches dense_len (DESIGN.md §2 step 5: t + 1 >= dense_len)."""
    return input_len + output_len - 1


def _speed_runs_sparse(record: dict) -> bool:
    k = record["knobs"]
    return _speed_positions(k["input_len"], k["output_len"]) >= k["dense_len"]


def _kl_misses_sparse(record: dict) -> bool:
    """The KL prompt ends before dense_len while the speed workload runs sparse: the KL (0 for a
    dense-only prompt) says nothing of the attention the point's speed is measured with."""
    return record.get("kl_sparse_positions") == 0 and _speed_runs_sparse(record)


def _passkey_misses_sparse(record: dict) -> bool:
    """Every passkey prompt ends before dense_len (its answer is predicted by a dense query) while the
    speed workload runs sparse."""
    rows = record.get("passkey_results")
    dense_len = record["knobs"]["dense_len"]
    return bool(rows) and all(r["length"] < dense_len for r in rows) and _speed_runs_sparse(record)


def _dense_proxy_note(points: list[dict], prompts: str, proxy: str, flag: str) -> str:
    names = ", ".join(p["phase"] for p in points)
    dense_len = max(p["knobs"]["dense_len"] for p in points)
    return (f"{names}: {prompts} end before dense_len ({dense_len}), so {proxy} measures dense attention "
            f"only while the speed workload runs sparse attention; raise {flag} to {dense_len} or more")


def _note(run: SweepRun, text: str) -> None:
    run.notes.append(text)
    output.stderr.print(f"note: {text}")


def _finish(run: SweepRun, s: SweepSettings, out: Path) -> None:
    import json

    from salactl.bench.pareto import pareto_front, plot_front

    if not run.points:                   # nothing measured: leave no files behind
        return
    x = PARETO_X[s.pareto_x]
    dense_kl = [p for p in run.points if _kl_misses_sparse(p)]
    dense_passkey = [p for p in run.points if _passkey_misses_sparse(p)]
    if dense_kl:
        _note(run, _dense_proxy_note(dense_kl, f"the KL prompt's {s.kl_len or s.input_len} tokens", "the KL",
                                     "--kl-len") + "; the Pareto front leaves them out")
    if dense_passkey:
        _note(run, _dense_proxy_note(dense_passkey, "the passkey prompts (--passkey-lengths)",
                                     "the passkey accuracy", "--passkey-lengths"))
    comparable = [p for p in run.points if not any(p is q for q in dense_kl)]
    front = pareto_front(comparable, x, PARETO_Y)
    run.pareto = [p["phase"] for p in front]
    run.pareto_keys = [p["point_key"] for p in front]
    out.mkdir(parents=True, exist_ok=True)
    if front:
        path = plot_front(comparable, front, x, PARETO_Y, out / f"{run.run_id}-pareto.png")
        if path is None:
            from salactl.reports.pyplot import unavailable

            run.notes.append(f"no Pareto plot: {unavailable()}")     # pyplot() has said why on stderr
        else:
            run.files["pareto_plot"] = path
    summary = out / f"{run.run_id}-sweep.json"
    write_atomic(summary, json.dumps(run.to_dict(), indent=2) + "\n")
    run.files["summary_json"] = summary
