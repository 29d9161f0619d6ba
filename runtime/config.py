"""Frozen, validated model configuration parsed from a Hugging Face MiniCPM-SALA `config.json`.

Key names are the checkpoint's own (reference/architecture.md §1); `to_hf_dict` writes them back.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from salactl.errors import ConfigError
from salactl.runtime.json_file import read_json

SPARSE = "minicpm4"
LIGHTNING = "lightning-attn"
_LIGHTNING_ALIASES = {"lightning", "lightning_attn", "lightning-attn"}
_SCALE_NAMES = {"1/sqrt(d)", "1/d", "1"}
# the checkpoint dtypes SGLang and vLLM serve (and quantize writes back); transformers' names
TORCH_DTYPES = ("bfloat16", "float16", "float32")


INT64_MAX = 2**63 - 1
# The selection materialises whole blocks and a kernel's reach past the keys a query row has:
# ops/selection/reference.block_scores pads each (KV head, row)'s window scores to
# (ceil(L/B)·B + ks)/st columns and the gathered attention takes ceil(L/B)·B tokens, so a row's buffers
# are those of L + B + ks tokens (B = 2^34 at stride 1 tried to allocate 6 TB for a 300-token prompt).
# Capping block_size and kernel_size at 2^20 tokens keeps that excess within what one row of a 1M-token
# context allocates anyway. topk + window_size/block_size blocks are kept per query (per-row block ids;
# times block_size, an int64 token count): past 2^20 they keep more than a 1M-token context holds.
# dense_len and init_blocks are thresholds that allocate nothing (dense_len 2^63 - 1 means "dense").
MAX_SPARSE_SPAN = 2**20
_SPARSE_SPANS = ("block_size", "kernel_size", "topk", "window_size")


@dataclass(frozen=True)
class SparseConfig:
    """InfLLM-V2 selection knobs (`sparse_config`); DESIGN.md §2 defines their exact meaning."""

    block_size: int = 64
    dense_len: int = 8192
    init_blocks: int = 1
    kernel_size: int = 32
    kernel_stride: int = 16
    topk: int = 64
    use_nope: bool = False    # moot: the sparse layers are NoPE (attn_use_rope must be false), nothing is rotated
    window_size: int = 2048

    def __post_init__(self) -> None:
        for name in ("block_size", "kernel_size", "kernel_stride", "topk"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"sparse_config.{name} must be positive, got {getattr(self, name)}")
        for name in ("dense_len", "init_blocks", "window_size"):
            if getattr(self, name) < 0:
                raise ConfigError(f"sparse_config.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("block_size", "dense_len", "init_blocks", "kernel_size", "kernel_stride", "topk", "window_size"):
            if getattr(self, name) > INT64_MAX:         # compared with int64 token positions in every request
                raise ConfigError(f"sparse_config.{name} must be at most {INT64_MAX} (2^63 - 1), got {getattr(self, name)}")
        for name in _SPARSE_SPANS:
            if getattr(self, name) > MAX_SPARSE_SPAN:
                raise ConfigError(
                    f"sparse_config.{name} must be at most {MAX_SPARSE_SPAN} (2^20: the sparse selection's "
                    f"per-query buffers grow with it past a 1M-token context), got {getattr(self, name)}; use "
                    f"the model's original value (MiniCPM-SALA's is {getattr(SparseConfig, name)})")
        if self.block_size % self.kernel_stride:
            raise ConfigError(
                f"sparse_config.block_size {self.block_size} is not a multiple of kernel_stride "
                f"{self.kernel_stride}; pick a stride that divides the block size"
            )
        if self.kernel_size % self.kernel_stride or self.kernel_size < self.kernel_stride:
            raise ConfigError(
                f"sparse_config.kernel_size {self.kernel_size} must be a multiple of kernel_stride "
                f"{self.kernel_stride} (and at least one stride)"
            )
        if self.window_size % self.block_size:
            raise ConfigError(
                f"sparse_config.window_size {self.window_size} is not a multiple of block_size "
                f"{self.block_size}"
            )

    @property
    def window_blocks(self) -> int:
        return self.window_size // self.block_size

    @property
    def selected_blocks(self) -> int:
        """Blocks each query keeps: topk plus the local window (96 for MiniCPM-SALA)."""
        return self.topk + self.window_blocks

    @property
    def forced_blocks_note(self) -> str | None:
        """Why a query may not attend to its own block: DESIGN.md §2 step 4 keeps topk + W/B blocks,
        forced ones first by index, but init_blocks + W/B + 1 blocks are forced in, so with
        topk <= init_blocks the newest local block (the query's own) falls out of the budget."""
        if self.topk > self.init_blocks:
            return None
        return (f"sparse_config.topk {self.topk} <= init_blocks {self.init_blocks}: the init and local blocks "
                f"forced in exceed the {self.selected_blocks}-block budget, so sparse queries past the init "
                "blocks drop their own block (DESIGN.md §2 step 4); use topk > init_blocks")

    @classmethod
    def from_dict(cls, d: dict | None, required: bool = True) -> "SparseConfig":
        """`sparse_config` of config.json. Where minicpm4 layers use it (`required`), it must be there
        with every key that defines the selection; only use_nope, moot for NoPE layers, may be left out."""
        if d is None:
            if required:
                raise ConfigError(f"config.json has no sparse_config, which the minicpm4 layers need; add it with "
                                  f"keys {list(_SPARSE_REQUIRED)} from the model's original config.json")
            return cls()
        if not isinstance(d, dict):
            raise ConfigError(f"sparse_config must be an object, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"sparse_config has unknown keys {unknown}; valid keys: {sorted(known)}")
        missing = [k for k in _SPARSE_REQUIRED if k not in d]
        if missing and required:
            raise ConfigError(f"config.json's sparse_config lacks {missing}, which define the minicpm4 layers' "
                              "sparse attention; add them from the model's original config.json")
        _check_types(d, {k: "true or false" if k == "use_nope" else "an integer" for k in known}, "sparse_config.")
        return cls(**d)


# every real MiniCPM-SALA config.json carries these (reference/architecture.md §1); use_nope is moot
_SPARSE_REQUIRED = ("block_size", "dense_len", "init_blocks", "kernel_size", "kernel_stride", "topk",
                    "window_size")


# initializer_range only sets random weights' embedding std, but is checked for every config: HF configs
# always carry a sane one, and quantize writes it back into the config.json it saves
_POSITIVE_NUMBERS = ("rms_norm_eps", "rope_theta", "scale_emb", "scale_depth", "dim_model_base", "initializer_range")
_FLOAT_SETTINGS = ("rms_norm_eps", "rope_theta", "scale_emb", "scale_depth", "initializer_range")


@dataclass(frozen=True)
class SalaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    mixer_types: tuple[str, ...]
    lightning_nh: int
    lightning_nkv: int
    lightning_head_dim: int
    sparse_config: SparseConfig = field(default_factory=SparseConfig)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 524288
    scale_emb: float = 12.0
    scale_depth: float = 1.4
    dim_model_base: int = 256
    hidden_act: str = "silu"
    attention_bias: bool = False
    attn_use_rope: bool = False
    attn_use_output_gate: bool = True
    lightning_scale: str = "1/sqrt(d)"
    lightning_use_rope: bool = True
    qk_norm: bool = True
    use_output_norm: bool = True
    use_output_gate: bool = True
    tie_word_embeddings: bool = False
    bos_token_id: int = 1
    eos_token_id: tuple[int, ...] = (2,)     # () where config.json's is null (stops come from elsewhere)
    pad_token_id: int = 2
    initializer_range: float = 0.1
    torch_dtype: str = "bfloat16"
    extra: tuple[tuple[str, object], ...] = field(default=(), compare=False)  # other HF keys, kept

    def __post_init__(self) -> None:
        ints = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "lightning_nh",
                "lightning_nkv", "lightning_head_dim")
        for name in ints:
            if getattr(self, name) <= 0:
                raise ConfigError(f"config.{name} must be positive, got {getattr(self, name)}")
        if len(self.mixer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"mixer_types has {len(self.mixer_types)} entries but num_hidden_layers is "
                f"{self.num_hidden_layers}; give one mixer type per layer"
            )
        for i, m in enumerate(self.mixer_types):
            if m not in (SPARSE, LIGHTNING):
                raise ConfigError(
                    f"mixer_types[{i}] = {m!r} is unknown; valid: 'minicpm4', 'lightning-attn' "
                    f"(aliases 'lightning', 'lightning_attn')"
                )
        if self.mixer_types[0] != SPARSE:
            raise ConfigError("mixer_types[0] must be 'minicpm4' (the HF cache layout requires it)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads} (GQA group must be integral)"
            )
        if self.lightning_nh != self.lightning_nkv:
            raise ConfigError(
                f"lightning_nkv {self.lightning_nkv} != lightning_nh {self.lightning_nh}; "
                "lightning layers have no GQA"
            )
        if LIGHTNING in self.mixer_types and (
            self.lightning_nh != self.num_attention_heads or self.lightning_head_dim != self.head_dim
        ):
            raise ConfigError(
                "lightning_nh/lightning_head_dim must equal num_attention_heads/head_dim: the HF "
                "model builds lightning layers from the latter"
            )
        if self.attn_use_rope:
            raise ConfigError("attn_use_rope=true is not supported: MiniCPM-SALA sparse layers are NoPE")
        if self.attention_bias:
            raise ConfigError("attention_bias=true is not supported (MiniCPM-SALA has no biases)")
        if self.hidden_act != "silu":
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported; only 'silu'")
        if self.lightning_scale not in _SCALE_NAMES:
            raise ConfigError(
                f"lightning_scale {self.lightning_scale!r} is unknown; valid: {sorted(_SCALE_NAMES)}"
            )
        if self.lightning_use_rope and self.lightning_head_dim % 2:
            raise ConfigError("lightning_head_dim must be even for RoPE")
        if self.tie_word_embeddings:
            raise ConfigError("tie_word_embeddings=true is not supported (MiniCPM-SALA's lm_head is untied)")
        if not (self.qk_norm and self.use_output_norm and self.use_output_gate and self.attn_use_output_gate):
            raise ConfigError(
                "qk_norm, use_output_norm, use_output_gate and attn_use_output_gate must all be true "
                "(the MiniCPM-SALA architecture); other variants are not implemented"
            )
        for name in _POSITIVE_NUMBERS:
            value = getattr(self, name)
            if not isinstance(value, (int, float)):
                raise ConfigError(f"config.{name} must be a positive finite number, got {value!r}")
            try:
                number = float(value)
            except OverflowError:                              # an integer past float's range
                raise ConfigError(f"config.{name} must be a positive finite number, got an integer too large "
                                  "for a float") from None
            if not 0 < number < math.inf:                      # NaN fails every comparison, so it fails here
                raise ConfigError(f"config.{name} must be a positive finite number, got {value}")
            if name in _FLOAT_SETTINGS:                        # torch cannot take a Python int past int64
                object.__setattr__(self, name, number)
        _check_dtype("torch_dtype", self.torch_dtype)
        if self.max_position_embeddings < 1:
            raise ConfigError(f"config.max_position_embeddings must be at least 1, got {self.max_position_embeddings}")
        for t in (*self.eos_token_id, self.bos_token_id):
            if not 0 <= t < self.vocab_size:
                raise ConfigError(f"special token id {t} is outside the vocabulary (size {self.vocab_size})")

    # ---- derived -------------------------------------------------------------------------
    @property
    def sparse_layers(self) -> tuple[int, ...]:
        return tuple(i for i, m in enumerate(self.mixer_types) if m == SPARSE)

    @property
    def lightning_layers(self) -> tuple[int, ...]:
        return tuple(i for i, m in enumerate(self.mixer_types) if m == LIGHTNING)

    @property
    def residual_scale(self) -> float:
        return self.scale_depth / math.sqrt(self.num_hidden_layers)

    @property
    def logit_divisor(self) -> float:
        return self.hidden_size / self.dim_model_base

    @property
    def gla_scale(self) -> float:
        d = self.lightning_head_dim
        return {"1/sqrt(d)": d ** -0.5, "1/d": 1.0 / d, "1": 1.0}[self.lightning_scale]

    def parameter_count(self) -> int:
        """The parameters of checkpoint.expected_tensor_shapes, in closed form per layer type: no
        per-tensor work, so a config with millions of layers is sized at once."""
        hidden, inter = self.hidden_size, self.intermediate_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        lightning = self.lightning_nh * self.lightning_head_dim
        common = 2 * hidden + 3 * inter * hidden                      # two norms, gate/up/down
        sparse = common + 3 * q * hidden + 2 * kv * hidden             # q, o, o_gate; k, v
        linear = common + 5 * lightning * hidden + 2 * self.lightning_head_dim + lightning   # q k v z o; norms
        n_sparse = self.mixer_types.count(SPARSE)
        return (2 * self.vocab_size * hidden + hidden + n_sparse * sparse
                + (self.num_hidden_layers - n_sparse) * linear)

    # ---- HF round trip -------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict) -> "SalaConfig":
        if not isinstance(d, dict):
            raise ConfigError("config.json must hold a JSON object")
        model_type = d.get("model_type")
        if model_type is not None and model_type != "minicpm_sala":
            raise ConfigError(f"model_type {model_type!r} is not 'minicpm_sala'; this is not a MiniCPM-SALA checkpoint")
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "mixer_types")
        missing = [k for k in required if k not in d]
        if missing:
            raise ConfigError(f"config.json lacks required keys {missing}")
        mixers = d["mixer_types"]
        if not isinstance(mixers, list) or not all(isinstance(m, str) for m in mixers):
            raise ConfigError("mixer_types must be a list of strings")
        mixers = tuple(LIGHTNING if m in _LIGHTNING_ALIASES else m for m in mixers)
        _check_types(d, _HF_KINDS, nullable=set(_HF_KINDS) - set(required))
        heads = d["num_attention_heads"]
        if heads <= 0:
            raise ConfigError(f"config.num_attention_heads must be positive, got {heads}")
        if _given(d, "head_dim") is None and d["hidden_size"] % heads:
            raise ConfigError(f"hidden_size {d['hidden_size']} is not divisible by num_attention_heads "
                              f"{heads} and config.json gives no head_dim; add head_dim")
        head_dim = _given(d, "head_dim", d["hidden_size"] // heads)
        eos = d.get("eos_token_id", 2)
        for key in ("dtype", "torch_dtype"):
            if d.get(key) is not None:
                _check_dtype(key, d[key])
        kw: dict = dict(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=_given(d, "num_key_value_heads", heads),
            head_dim=head_dim,
            mixer_types=mixers,
            lightning_nh=_given(d, "lightning_nh", heads),
            lightning_nkv=_given(d, "lightning_nkv", _given(d, "lightning_nh", heads)),
            lightning_head_dim=_given(d, "lightning_head_dim", head_dim),
            sparse_config=SparseConfig.from_dict(d.get("sparse_config"), required=SPARSE in mixers),
            eos_token_id=() if eos is None else tuple(eos if isinstance(eos, list) else [eos]),
            # transformers >= 4.56 prefers `dtype` (torch_dtype is its deprecated alias) when both are given
            torch_dtype=_given(d, "dtype", _given(d, "torch_dtype", "bfloat16")),
        )
        simple = ("rms_norm_eps", "rope_theta", "max_position_embeddings", "scale_emb", "scale_depth",
                  "dim_model_base", "hidden_act", "attention_bias", "attn_use_rope",
                  "attn_use_output_gate", "lightning_scale", "lightning_use_rope", "qk_norm",
                  "use_output_norm", "use_output_gate", "tie_word_embeddings", "bos_token_id",
                  "pad_token_id", "initializer_range")
        for k in simple:
            if d.get(k) is not None:
                kw[k] = d[k]
        _refuse_unimplemented_top_level(d)
        rope_theta = _rope_theta(d)
        if rope_theta is not None:
            kw["rope_theta"] = rope_theta
        handled = set(kw) | set(required) | {"head_dim", "lightning_nh", "lightning_nkv",
                                             "lightning_head_dim", "num_key_value_heads", "dtype",
                                             "sparse_config", "rope_scaling", "rope_parameters", "architectures",
                                             "model_type", "use_cache"}
        kw["extra"] = tuple(sorted((k, v) for k, v in d.items() if k not in handled
                                   and isinstance(k, str) and _jsonable(v)))
        try:
            return cls(**kw)
        except TypeError as e:
            raise ConfigError(f"config.json has a value of the wrong type: {e}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> "SalaConfig":
        path = Path(path)
        try:
            d = read_json(path, ConfigError, "fix it or re-download the checkpoint")
        except FileNotFoundError:
            raise ConfigError(f"{path} does not exist; a checkpoint directory needs config.json") from None
        except OSError as e:                                   # a symlink loop, no permission, ...
            raise ConfigError(f"cannot read {path} ({e.strerror}); fix it or re-download the checkpoint") from None
        return cls.from_hf_dict(d)

    def to_hf_dict(self) -> dict:
        d = dict(self.extra)
        d.update(
            architectures=["MiniCPMSALAForCausalLM"],
            model_type="minicpm_sala",
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            mixer_types=list(self.mixer_types),
            lightning_nh=self.lightning_nh,
            lightning_nkv=self.lightning_nkv,
            lightning_head_dim=self.lightning_head_dim,
            sparse_config=dataclasses.asdict(self.sparse_config),
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=None,
            max_position_embeddings=self.max_position_embeddings,
            scale_emb=self.scale_emb,
            scale_depth=self.scale_depth,
            dim_model_base=self.dim_model_base,
            hidden_act=self.hidden_act,
            attention_bias=self.attention_bias,
            attention_dropout=0.0,
            attn_use_rope=self.attn_use_rope,
            attn_use_output_gate=self.attn_use_output_gate,
            lightning_scale=self.lightning_scale,
            lightning_use_rope=self.lightning_use_rope,
            qk_norm=self.qk_norm,
            use_output_norm=self.use_output_norm,
            use_output_gate=self.use_output_gate,
            tie_word_embeddings=self.tie_word_embeddings,
            bos_token_id=self.bos_token_id,
            eos_token_id=list(self.eos_token_id) or None,
            pad_token_id=self.pad_token_id,
            initializer_range=self.initializer_range,
            torch_dtype=self.torch_dtype,
            use_cache=True,
        )
        return d

    def replace(self, **changes) -> "SalaConfig":
        return dataclasses.replace(self, **changes)


def _given(d: dict, key: str, default=None):
    """d[key] unless it is absent or null (then `default`): a 0 is a value, which validation refuses."""
    return default if d.get(key) is None else d[key]


def _check_dtype(key: str, value: str) -> None:
    if value not in TORCH_DTYPES:
        raise ConfigError(f"config.{key} {value!r} is not supported; use one of {', '.join(TORCH_DTYPES)} "
                          "(the dtype of the checkpoint's tensors)")


def _is_int(v: object) -> bool:
    # JSON's integers only; not sampling.is_int (numpy's too), which would make loading a config import torch
    return isinstance(v, int) and not isinstance(v, bool)


_KIND_CHECKS = {
    "an integer": _is_int,
    "a number": lambda v: _is_int(v) or isinstance(v, float),
    "true or false": lambda v: isinstance(v, bool),
    "a string": lambda v: isinstance(v, str),
    "an integer or a list of integers": lambda v: _is_int(v) or isinstance(v, list) and all(map(_is_int, v)),
}
_HF_KINDS = {
    **dict.fromkeys(("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "lightning_nh", "lightning_nkv",
                     "lightning_head_dim", "max_position_embeddings", "dim_model_base", "bos_token_id",
                     "pad_token_id"), "an integer"),
    **dict.fromkeys(("rms_norm_eps", "rope_theta", "scale_emb", "scale_depth", "initializer_range"), "a number"),
    **dict.fromkeys(("attention_bias", "attn_use_rope", "attn_use_output_gate", "lightning_use_rope", "qk_norm",
                     "use_output_norm", "use_output_gate", "tie_word_embeddings"), "true or false"),
    **dict.fromkeys(("hidden_act", "lightning_scale", "torch_dtype", "dtype"), "a string"),
    "eos_token_id": "an integer or a list of integers",
}


def _check_types(d: dict, kinds: dict[str, str], prefix: str = "", nullable=frozenset()) -> None:
    """Every present key of `kinds` has its kind (null only where `nullable`: the default applies)."""
    for k, kind in kinds.items():
        if k in d and not (d[k] is None and k in nullable) and not _KIND_CHECKS[kind](d[k]):
            raise ConfigError(f"config.json has {prefix}{k} = {json.dumps(d[k], default=repr)}; "
                              f"expected {kind}")


_ROPE_TYPE_KEYS = ("rope_type", "type")


def _is_one(v: object) -> bool:
    return _KIND_CHECKS["a number"](v) and v == 1


# top-level keys that transformers' Llama-family code reads (default RoPE: partial_rotary_factor;
# LlamaMLP: mlp_bias) or that name a RoPE variant, with the only value salactl implements: anything
# else changes the maths, so it is refused rather than kept in `extra` (null means the default)
_TOP_LEVEL_ONLY = {
    "partial_rotary_factor": (_is_one, "1.0 (RoPE over every dimension of a head)"),
    "rope_type": (lambda v: v == "default", '"default" (unscaled RoPE)'),
    # nn.Linear(bias=config.mlp_bias): any falsy value (false, 0) builds no bias, as salactl runs
    "mlp_bias": (lambda v: not v, "false (MiniCPM-SALA's MLP has no biases)"),
}


def _refuse_unimplemented_top_level(d: dict) -> None:
    for key, (implemented, only) in _TOP_LEVEL_ONLY.items():
        if d.get(key) is not None and not implemented(d[key]):
            raise ConfigError(f"config.json has {key} = {json.dumps(d[key], default=repr)}, which salactl does not "
                              f"implement; it runs only {only}: remove the key or set it to that")


def _default_rope(name: str, value: object, extra_keys: tuple[str, ...] = ()) -> dict:
    """`value` as a dict that asks for plain (unscaled) RoPE, else a ConfigError naming what it asks.
    An explicit rope_type default ignores other keys (factor, ...) as transformers does, except
    partial_rotary_factor, which transformers' default RoPE applies: only 1.0 (or null) passes."""
    if not isinstance(value, dict):
        raise ConfigError(f"config.{name} must be an object or null, got {type(value).__name__}")
    kind = next((value[k] for k in _ROPE_TYPE_KEYS if k in value), None)
    if kind not in (None, "default"):
        raise ConfigError(f"config.{name} asks for {kind!r} RoPE scaling; salactl runs the lightning layers' "
                          f"RoPE unscaled only (rope_type default; the sparse layers are NoPE)")
    full = value.get("partial_rotary_factor") is None or _is_one(value["partial_rotary_factor"])
    if kind is None:
        unknown = sorted(set(value) - set(extra_keys) - ({"partial_rotary_factor"} if full else set()))
    else:
        unknown = [] if full else ["partial_rotary_factor"]
    if unknown:
        raise ConfigError(f"config.{name} has {', '.join(unknown)}, which salactl does not implement; "
                          f"only unscaled RoPE (rope_type default) is supported")
    return value


def _rope_theta(d: dict) -> float | None:
    """The RoPE base from `rope_theta` or transformers-5 `rope_parameters` (None: neither gives one).
    Any RoPE scaling is refused rather than ignored."""
    if d.get("rope_scaling") is not None:
        _default_rope("rope_scaling", d["rope_scaling"])
    if d.get("rope_parameters") is None:
        return None
    params = _default_rope("rope_parameters", d["rope_parameters"], ("rope_theta",))
    _check_types(params, {"rope_theta": "a number"}, "rope_parameters.")
    theta = params.get("rope_theta")
    top = d.get("rope_theta")
    if theta is not None and top is not None and theta != top:
        raise ConfigError(f"config.rope_theta ({top}) and rope_parameters.rope_theta ({theta}) disagree; "
                          f"keep one")
    return theta


def _jsonable(v: object) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False
