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
RandomWeightsOpt = Annotated[bool, typer.Option("--random-weights", help="Random weights of the preset's real shapes.")]
SEED_MAX = 2**63 - 1     # torch.manual_seed and numpy's generators both take 0 .. 2^63-1
SeedOpt = Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX, help="Seed for random weights and sampling.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="bfloat16, float16 or float32.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
TokenizerOpt = Annotated[Optional[str], typer.Option("--tokenizer", help="tokenizer.json or its directory.",
                                                     parser=non_empty("--tokenizer", "a tokenizer.json or its directory"))]
ChunkOpt = Annotated[int, typer.Option("--chunk-size", help="Prefill chunk size in tokens.")]
