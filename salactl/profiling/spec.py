"""What to profile: a frozen, validated description shared by the CLI and the child process that
runs under Nsight Compute (it travels as JSON)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from salactl.errors import ConfigError, UsageError

PHASES = ("prefill", "decode")
WEIGHTS = ("auto", "bf16", "fp16", "fp32", "w4a16", "w8a16")  # auto: a GPTQ checkpoint's own format, else --dtype's
# the unquantized --weights: the whole model in that dtype, as sweep casts it; the --dtype names of each
CASTS = {"bf16": ("bf16", "bfloat16"), "fp16": ("fp16", "float16"), "fp32": ("fp32", "float32")}
KV_DTYPES = ("auto", "bf16", "fp8_e4m3", "fp8_e5m2")
BACKENDS = ("auto", "engine", "reference")
MAX_WARMUP = 100        # each warm-up step repeats the profiled one; more than a few only waits


def parse_layers(text: str | None) -> tuple[tuple[int, ...] | None, bool]:
    """"1,9,lm_head" -> ((1, 9), True); None -> (None, True)."""
    if text is None:
        return None, True
    items = [t.strip() for t in text.split(",")]
    if items == [""]:
        raise UsageError("--layers is empty")
    head = "lm_head" in items
    indices = [t for t in items if t != "lm_head"]
    # plain ASCII digits only: int() also takes "1_0", "+1" and other scripts' digits; a negative
    # index passes here for ProfileSpec to say indices start at 0
    if not all(re.fullmatch(r"-?[0-9]+", t) for t in indices):
        raise UsageError(f"--layers takes layer indices and optionally lm_head, e.g. 1,9,lm_head; got "
                         f"{text!r}")
    return tuple(sorted({int(t) for t in indices})), head


@dataclass(frozen=True)
class ProfileSpec:
    model: str = "sala-nano"
    random_weights: bool = False
    seed: int = 0
    phases: tuple[str, ...] = ("decode",)
    batch: int = 1
    context: int = 4096          # tokens in the cache before the decode step / prompt length
    chunk_size: int = 512        # prefill: the profiled chunk is the prompt's last one (at most --context)
    weights: str = "auto"        # with_checkpoint_weights() resolves it (and dtype) before the model loads
    kv_cache_dtype: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    warmup: int = 1
    layers: tuple[int, ...] | None = None   # profile only these decoder layers (None: whole step)
    lm_head: bool = True                     # with `layers`: also the lm_head
    backend: str = "auto"        # engine (GPU engine), reference (plain PyTorch), auto: engine on CUDA

    def __post_init__(self) -> None:
        bad = [p for p in self.phases if p not in PHASES]
        if bad or not self.phases:
            raise UsageError(f"unknown phase {bad[0] if bad else ''!r}; valid: prefill, decode, both")
        if self.batch <= 0:
            raise UsageError(f"--batch must be positive, got {self.batch}")
        if self.context <= 0:
            raise UsageError(f"--context must be positive, got {self.context}")
        if self.chunk_size <= 0:
            raise UsageError(f"--chunk-size must be positive, got {self.chunk_size}")
        if self.weights not in WEIGHTS:
            raise UsageError(f"unknown --weights {self.weights!r}; valid: {', '.join(WEIGHTS)}")
        if self.dtype != "auto":
            from salactl.runtime.loader import resolve_dtype

            resolve_dtype(self.dtype, None)     # a name it does not know: its usual unknown-dtype error
        if self.weights in CASTS and self.dtype not in ("auto", *CASTS[self.weights]):
            raise UsageError(f"--weights {self.weights} loads the model in {CASTS[self.weights][1]} but --dtype is "
                             f"{self.dtype}; drop --dtype or --weights")
        if self.kv_cache_dtype not in KV_DTYPES:
            raise UsageError(f"unknown --kv-cache-dtype {self.kv_cache_dtype!r}; valid: "
                             f"{', '.join(KV_DTYPES)}")
        if self.backend not in BACKENDS:
            raise UsageError(f"unknown --backend {self.backend!r}; valid: {', '.join(BACKENDS)}")
        if not 0 <= self.warmup <= MAX_WARMUP:
            raise UsageError(f"--warmup must be in 0..{MAX_WARMUP} (unprofiled steps before the profiled "
                             f"one; 1-3 warm the caches and kernels), got {self.warmup}")
        if self.layers is not None and ((not self.layers and not self.lm_head)
                                        or (self.layers and min(self.layers) < 0)):
            raise UsageError("--layers needs layer indices >= 0 (and/or lm_head)")
        # a chunk longer than the prompt prefills the whole prompt (run and bench clamp it too): the
        # spec, and so the manifest, records the chunk that runs
        object.__setattr__(self, "chunk_size", min(self.chunk_size, self.context))

    def with_checkpoint_weights(self) -> "ProfileSpec":
        """This spec with `weights` what runs: auto becomes a GPTQ checkpoint's own format (w4a16,
        w8a16), else the dtype the unquantized model loads in (bf16, fp16 or fp32: --dtype's, or
        the device's for auto); an unquantized `weights` also becomes `dtype`, so bf16 loads the
        model in bfloat16. An explicit value a GPTQ checkpoint cannot run is a ConfigError. Reads
        the checkpoint's quantization_config only, no weights."""
        from salactl.quant.loading import parse_quant_config
        from salactl.runtime.loader import DTYPES, model_quantization, resolve_device, resolve_dtype

        qc = model_quantization(self.model, self.random_weights)
        own = None if qc is None else f"w{parse_quant_config(qc)['bits']}a16"
        if own:
            if self.weights not in ("auto", own):
                raise ConfigError(f"{self.model} is a {own.upper()} GPTQ checkpoint, which runs only as its "
                                  f"own weights; drop --weights {self.weights} (auto reads the checkpoint's "
                                  f"format) or pass --weights {own}")
            return replace(self, weights=own)
        if self.weights not in ("auto", *CASTS):        # w4a16, w8a16: RTN in memory, in --dtype
            return self
        weights = self.weights
        if weights == "auto":
            device = resolve_device(self.device) if self.dtype == "auto" else None   # auto: the device's
            weights = {DTYPES[w]: w for w in CASTS}[resolve_dtype(self.dtype, device)]
        return replace(self, weights=weights, dtype=weights)

    @property
    def scopes(self) -> tuple[str, ...] | None:
        """Analytic scopes (salactl/profiling/analytic.py) that the profile covers; None = all."""
        if self.layers is None:
            return None
        return tuple(f"layer{i}" for i in self.layers) + (("lm_head",) if self.lm_head else ())

    def step_rows(self, phase: str) -> tuple[int, int]:
        """(new tokens, cached tokens) of each sequence in the profiled step."""
        if phase == "decode":
            return 1, self.context
        return self.chunk_size, self.context - self.chunk_size

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ProfileSpec":
        layers = d.get("layers")
        return cls(**{**d, "phases": tuple(d.get("phases", ("decode",))),
                      "layers": None if layers is None else tuple(layers)})

    def write(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2))

    @classmethod
    def read(cls, path: Path) -> "ProfileSpec":
        return cls.from_dict(json.loads(Path(path).read_text()))
