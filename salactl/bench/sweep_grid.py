"""The sweep grid: comma-separated knob lists -> validated points, each with a label and a stable
key (`--resume` skips points whose key is already recorded).

Knobs: sparse `dense_len`, `topk`, `window` (window_size), `block` (block_size) — checked by the
same SparseConfig validation the runtime uses — `chunk_size`, `batch_size`, `kv_dtype`
(bf16 = auto | fp8_e5m2 | fp8_e4m3, the latter with calibrated scales) and `weight_dtype`
(bf16 | fp16 | fp32 | w4a16 / w8a16 = RTN 4-/8-bit group 128 in memory, or the checkpoint's own
GPTQ; bfloat16, float16 and float32 name the casts too, as --dtype)."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass

from salactl.errors import ConfigError, UsageError
from salactl.lists import parse_list
from salactl.runtime.config import INT64_MAX, MAX_SPARSE_SPAN

KV_DTYPES = ("bf16", "fp8_e5m2", "fp8_e4m3")
SPARSE_SPAN_OPTIONS = ("topk", "window", "block")     # sparse_config sizes capped at MAX_SPARSE_SPAN
WEIGHT_DTYPES = ("bf16", "fp16", "fp32", "w4a16", "w8a16")
# other spellings per option, read as the name they stand for: the KV cache's "auto" stores the model's
# dtype as "bf16" does (run's names), and the casts take --dtype's long names
ALIASES = {"kv-cache-dtype": {"auto": "bf16"},
           "weight-dtype": {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}}
LABEL_ABBR = {"dense_len": "dl", "topk": "tk", "window": "w", "block": "b", "chunk_size": "cs",
              "batch_size": "bs", "kv_dtype": "kv", "weight_dtype": "wt"}


@dataclass(frozen=True)
class SweepPoint:
    dense_len: int
    topk: int
    window: int
    block: int
    chunk_size: int
    batch_size: int
    kv_dtype: str
    weight_dtype: str

    def knobs(self) -> dict:
        return dataclasses.asdict(self)

    def label(self, varying: list[str]) -> str:
        parts = [f"{LABEL_ABBR[k]}{getattr(self, k)}" for k in varying]
        return "-".join(parts) or "default"

    def sparse_config(self, base):
        """The SparseConfig of this point (raises ConfigError when the combination is invalid)."""
        return dataclasses.replace(base, dense_len=self.dense_len, topk=self.topk,
                                   window_size=self.window, block_size=self.block)


def parse_ints(text: str | None, name: str, default: int, minimum: int = 1) -> list[int]:
    """A grid's integers; past int64 (which the runtime compares knobs with token positions in), or a
    --topk/--window/--block past sparse_config's size limit, is exit 2 before any model loads (any
    dense_len past the longest sequence already keeps it dense)."""
    values = [default] if text is None else parse_list(text, f"--{name}", minimum=minimum, dedupe=True)
    big = [v for v in values if v > INT64_MAX]
    if big:
        raise UsageError(f"--{name} values must be at most {INT64_MAX} (2^63 - 1), got {big[0]}")
    big = [v for v in values if v > MAX_SPARSE_SPAN] if name in SPARSE_SPAN_OPTIONS else []
    if big:
        raise UsageError(f"--{name} values must be at most {MAX_SPARSE_SPAN} (2^20, sparse_config's limit), "
                         f"got {big[0]}")
    return values


def parse_name(value: str, name: str, valid: tuple[str, ...]) -> str:
    """One --NAME value as its name in `valid` (an alias of ALIASES[name] as the name it stands for)."""
    aliases = ALIASES.get(name, {})
    if value in valid or value in aliases:
        return aliases.get(value, value)
    also = f" (also {', '.join(f'{a} for {v}' for a, v in aliases.items())})" if aliases else ""
    raise UsageError(f"--{name} {value!r} is not supported; supported today: {', '.join(valid)}{also}")


def parse_names(text: str | None, name: str, default: str, valid: tuple[str, ...]) -> list[str]:
    if text is None:
        return [default]
    if not text.replace(",", "").strip():   # "" or ",": refused as an unknown name is, listing the valid ones
        parse_name(text, name, valid)
    return list(dict.fromkeys(parse_name(v, name, valid) for v in parse_list(text, f"--{name}", str)))


def check_window_and_block(window: str | None, block: str | None, base_sparse) -> None:
    """A --window or --block value that is invalid with every value of the other (or with the
    model's own, where that option is not given) is a usage error, said before the model loads; a
    grid where only some combinations are invalid skips those points (build_points)."""
    windows = parse_ints(window, "window", base_sparse.window_size, minimum=0)
    blocks = parse_ints(block, "block", base_sparse.block_size)

    def valid(w: int, b: int) -> bool:
        try:
            dataclasses.replace(base_sparse, window_size=w, block_size=b)
        except ConfigError:
            return False
        return True

    stride = base_sparse.kernel_stride
    for b in blocks if block is not None else ():
        if b % stride:
            raise UsageError(f"--block {b} is not a multiple of the model's kernel_stride {stride}; use a "
                             f"multiple of {stride}")
    for w in windows if window is not None else ():
        if any(valid(w, b) for b in blocks):
            continue
        if block is None:
            raise UsageError(f"--window {w} is not a multiple of the block size {blocks[0]}; use a multiple of "
                             f"{blocks[0]}")
        raise UsageError(f"--window {w} is not a multiple of any --block value ({', '.join(map(str, blocks))}); "
                         "use a multiple of one of them")
    for b in blocks if block is not None else ():
        if not any(valid(w, b) for w in windows):
            if window is None:
                raise UsageError(f"--block {b} does not divide the model's window_size {windows[0]} (the window "
                                 f"is whole blocks); use a divisor of {windows[0]}, or add --window with a "
                                 f"multiple of {b}")
            raise UsageError(f"--block {b} divides no --window value ({', '.join(map(str, windows))}); use a "
                             "block size that divides one")


def build_points(axes: dict[str, list], base_sparse) -> tuple[list[SweepPoint], list[str], list[tuple[SweepPoint, str]]]:
    """All combinations; returns (valid points, the knobs that vary, invalid (point, reason))."""
    order = ["dense_len", "topk", "window", "block", "chunk_size", "batch_size", "kv_dtype", "weight_dtype"]
    varying = [k for k in order if len(axes[k]) > 1]
    valid, invalid = [], []
    for combo in itertools.product(*(axes[k] for k in order)):
        p = SweepPoint(**dict(zip(order, combo)))
        try:
            p.sparse_config(base_sparse)
        except ConfigError as e:
            invalid.append((p, str(e)))
            continue
        valid.append(p)
    return valid, varying, invalid


def point_key(point: SweepPoint, context: dict) -> str:
    """Stable id of (point, model, workload, accuracy settings)."""
    blob = json.dumps({"point": point.knobs(), **context}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
