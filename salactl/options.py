"""Reusable Typer option aliases shared by subcommands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from salactl.errors import UsageError


def non_empty_path(flag: str, what: str):
    """A typer parser for a path option: "" (or blanks) is a usage error naming the flag, where
    typer would read it as Path("."), the working directory."""
    def parse(value) -> Path:
        if isinstance(value, Path):        # a default value
            return value
        if not str(value).strip():
            raise UsageError(f"{flag} is empty; give {what}")
        return Path(value)
    return parse


def non_empty(flag: str, what: str):
    """A typer parser for a text option naming a file, URL or spec: "" is a usage error, not unset."""
    def parse(value) -> str:
        if not str(value).strip():
            raise UsageError(f"{flag} is empty; give {what}")
        return str(value)
    return parse


ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Checkpoint directory or preset (sala-nano, sala-9b).")]
RandomWeightsOpt = Annotated[bool, typer.Option("--random-weights", help="Random weights (from --seed) in the "
                                                  "shapes of --model: a preset or a checkpoint directory's "
                                                  "config.json.")]
SEED_MAX = 2**63 - 1     # torch.manual_seed and numpy's generators both take 0 .. 2^63-1


def seed_option(what: str):
    """--seed with a help saying what it seeds in that command."""
    return Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX, help=f"Seed for {what}.")]


DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
DTYPE_HELP = "bfloat16 (bf16), float16 (fp16) or float32 (fp32); auto: bfloat16 on CUDA, float32 on CPU."
DtypeOpt = Annotated[str, typer.Option("--dtype", help=DTYPE_HELP)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
TokenizerOpt = Annotated[Optional[str], typer.Option("--tokenizer", help="tokenizer.json or its directory.",
                                                     parser=non_empty("--tokenizer", "a tokenizer.json or its directory"))]
ChunkOpt = Annotated[int, typer.Option("--chunk-size", help="Prefill chunk size in tokens.")]
KvCacheDtypeOpt = Annotated[str, typer.Option("--kv-cache-dtype", help="bf16 or auto (the model's dtype), "
                                                         "fp8_e4m3 (needs calibrated scales) or fp8_e5m2.")]


def _on_command_line(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)    # by name: typer may vendor its own click and ParameterSource
    return source is not None and source.name == "COMMANDLINE"


def passed(ctx: typer.Context, *names: str) -> list[str]:
    """The flags of the parameters `names` that the command line set, as written (e.g. --no-plots),
    in declaration order; an option left at its default is not listed, whatever its value."""
    flags = []
    for param in ctx.command.params:
        if param.name in names and _on_command_line(ctx, param.name):
            off = getattr(param, "secondary_opts", None) and ctx.params[param.name] is False
            flags.append(max(param.secondary_opts if off else param.opts, key=len))
    return flags


def passed_names(ctx: typer.Context) -> frozenset[str]:
    """The names of every parameter the command line set, for checks made below the CLI."""
    return frozenset(param.name for param in ctx.command.params if _on_command_line(ctx, param.name))


def refuse_unused(flags: list[str], scope: str, fix: str, verb: tuple[str, str] = ("applies to", "apply to")) -> None:
    """Options that would be ignored are a usage error: "FLAGS apply to SCOPE; FIX". verb is the
    (one flag, several flags) forms of "apply to"'s replacement, e.g. ("sizes", "size"); SCOPE and
    FIX may say {it} (it or them)."""
    if flags:
        one = len(flags) == 1
        it = "it" if one else "them"
        raise UsageError(f"{', '.join(flags)} {verb[0] if one else verb[1]} {scope.format(it=it)}; "
                         + fix.format(it=it))
