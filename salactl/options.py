"""Reusable Typer option aliases shared by subcommands."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Checkpoint directory or preset (sala-nano, sala-9b).")]
RandomWeightsOpt = Annotated[bool, typer.Option("--random-weights", help="Random weights of the preset's real shapes.")]
SEED_MAX = 2**63 - 1     # torch.manual_seed and numpy's generators both take 0 .. 2^63-1
SeedOpt = Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX, help="Seed for random weights and sampling.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="bfloat16, float16 or float32.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
TokenizerOpt = Annotated[Optional[str], typer.Option("--tokenizer", help="tokenizer.json or its directory.")]
ChunkOpt = Annotated[int, typer.Option("--chunk-size", help="Prefill chunk size in tokens.")]
