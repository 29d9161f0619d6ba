"""The checks `salactl sweep` makes before loading any weights, so that bad input fails in a second:
options that --no-kl / --no-passkey would silently ignore, the grid's values and the engine's sizes, the
passkey prompts' host memory and the checkpoint's KV scales per grid KV dtype; with the defaults
(PASSKEY_DEFAULTS, PARETO_X_DEFAULT) that check_before_loading fills in for the options left out."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from salactl.bench import records as rec
from salactl.bench.engine_options import check_gpu_engine_values, gpu_engine_sizes, refuse_gpu_engine_options
from salactl.bench.sweep_sizes import check_sizes_fit
from salactl.bench.sweep_grid import (KV_DTYPES, WEIGHT_DTYPES, check_window_and_block, parse_ints,
                                      parse_names)
from salactl.errors import ConfigError, UsageError
from salactl.lists import parse_list
from salactl.options import refuse_unused

if TYPE_CHECKING:
    from salactl.bench.sweep_job import SweepSettings

PARETO_X = {"e2e": "mean_e2e_latency_ms", "ttft": "mean_ttft_ms", "tpot": "mean_tpot_ms"}
PASSKEY_DEFAULTS = {"passkey_lengths": "512", "passkey_depths": "0.25,0.75", "passkey_trials": 2}
PARETO_X_DEFAULT = "e2e"


def _refuse_skipped_options(s: SweepSettings) -> None:
    """Options of an accuracy proxy that --no-kl / --no-passkey skips would be silently ignored."""
    if not s.kl:
        refuse_unused(["--kl-len"] if s.kl_len is not None else [], "the logit KL, which --no-kl skips",
                      "drop {it}, or drop --no-kl")
        refuse_unused(["--pareto-x"] if s.pareto_x is not None else [], "the Pareto front, which trades "
                      "latency against the logit KL that --no-kl skips", "drop {it}, or drop --no-kl")
    if not s.passkey:
        refuse_unused([f"--{k.replace('_', '-')}" for k in PASSKEY_DEFAULTS if getattr(s, k) is not None],
                      "the passkey test, which --no-passkey skips", "drop {it}, or drop --no-passkey",
                      verb=("configures", "configure"))
    if not s.kl and not s.passkey:          # the speed workload's prompts are token ids already
        refuse_unused(["--tokenizer"] if s.tokenizer is not None else [],
                      "the KL and passkey prompts, which --no-kl and --no-passkey skip",
                      "drop {it}, or drop --no-kl or --no-passkey")


def check_before_loading(s: SweepSettings) -> SweepSettings:
    """Everything that does not need the model, so bad input fails in a second; returns `s` with the
    passkey options and --pareto-x left out at their defaults."""
    from salactl.bench.targets.embedded import resolve_engine
    from salactl.runtime.loader import model_config, resolve_device

    _refuse_skipped_options(s)
    rec.check_label(s.label)
    s = dataclasses.replace(s, **{k: v for k, v in PASSKEY_DEFAULTS.items() if getattr(s, k) is None},
                            pareto_x=PARETO_X_DEFAULT if s.pareto_x is None else s.pareto_x)
    if s.pareto_x not in PARETO_X:
        raise UsageError(f"--pareto-x must be one of {', '.join(PARETO_X)}, got {s.pareto_x!r}")
    if s.pareto_x == "tpot" and s.output_len < 2:
        raise UsageError(f"--pareto-x tpot needs --output-len 2 or more (TPOT is the time between output "
                         f"tokens), got {s.output_len}; raise --output-len, or use --pareto-x e2e or ttft")
    for name, v in (("input-len", s.input_len), ("output-len", s.output_len), ("requests", s.requests),
                    ("passkey-trials", s.passkey_trials)):
        if v < 1:
            raise UsageError(f"--{name} must be positive, got {v}")
    check_gpu_engine_values(s.max_running_requests, s.mem_fraction)
    if s.kl_len is not None and s.kl_len < 1:
        raise UsageError(f"--kl-len must be positive, got {s.kl_len}")
    if any(not 0.0 <= d <= 1.0 for d in parse_list(s.passkey_depths, "--passkey-depths", float)):
        raise UsageError(f"--passkey-depths must lie in [0, 1], got {s.passkey_depths!r}")
    parse_ints(s.passkey_lengths, "passkey-lengths", 512)
    for text, name in ((s.dense_len, "dense-len"), (s.window, "window")):
        parse_ints(text, name, 0, minimum=0)
    for text, name in ((s.topk, "topk"), (s.block, "block"), (s.chunk_size, "chunk-size")):
        parse_ints(text, name, 1)
    parse_names(s.kv_dtype, "kv-cache-dtype", "bf16", KV_DTYPES)
    parse_names(s.weight_dtype, "weight-dtype", "bf16", WEIGHT_DTYPES)
    check_window_and_block(s.window, s.block, model_config(s.model, s.random_weights).sparse_config)
    device = resolve_device(s.device)
    kind = resolve_engine(s.engine, device)
    refuse_gpu_engine_options(kind, s.max_running_requests, s.mem_fraction)
    limit = 1 if kind == "reference" else gpu_engine_sizes(s.max_running_requests, s.mem_fraction)[0]
    too_big = [b for b in parse_ints(s.batch_size, "batch-size", 1) if b > limit]
    if too_big:
        raise UsageError(f"--batch-size {too_big[0]} is not supported by the {kind} engine; supported "
                         "today: 1 with the reference engine (one sequence at a time), up to "
                         "--max-running-requests with --engine gpu on CUDA")
    check_sizes_fit(s, device)
    if s.passkey:
        _check_passkey_prompts(s)
    _check_kv_scales_before_loading(s, parse_names(s.kv_dtype, "kv-cache-dtype", "bf16", KV_DTYPES))
    return s


def _check_kv_scales_before_loading(s: SweepSettings, kv_dtypes: list[str]) -> None:
    """run's check of the checkpoint's KV scales (check_scales_before_loading) per grid KV dtype: a
    grid none of whose dtypes has its scales loads no weights; otherwise the points of a dtype
    without them are skipped after loading (_with_usable_kv_scales)."""
    from salactl.runtime.kv_fp8 import check_scales_before_loading
    from salactl.runtime.loader import model_config, model_dir

    config, directory = model_config(s.model, s.random_weights), model_dir(s.model, s.random_weights)
    reasons = []
    for kv in kv_dtypes:
        try:
            check_scales_before_loading(config, directory, s.random_weights, kv)
        except ConfigError as e:
            reasons.append(str(e))
        else:
            return
    raise ConfigError(f"no point could be measured ({reasons[-1]}); nothing was recorded")


def _check_passkey_prompts(s: SweepSettings) -> None:
    """Every passkey prompt is built up front (and again at each point), as eval passkey builds them:
    exit 11 before any is built when they cannot fit the host's memory, counted as eval counts them."""
    from salactl.bench.synthetic import check_host_memory
    from salactl.evaluation.passkey import passkey_prompt_bytes

    lengths = parse_ints(s.passkey_lengths, "passkey-lengths", 512)
    depths = parse_list(s.passkey_depths, "--passkey-depths", float, dedupe=True)
    prompts = passkey_prompt_bytes(lengths, depths, s.passkey_trials)
    count = len(lengths) * len(depths) * s.passkey_trials
    check_host_memory(prompts, f"the passkey test ({count:,} prompts: --passkey-trials {s.passkey_trials:,} x "
                      f"{len(lengths):,} length(s) x {len(depths):,} depth(s))",
                      "lower --passkey-trials, fewer or shorter --passkey-lengths or fewer --passkey-depths, "
                      "or pass --no-passkey")
