"""Named model presets: `sala-9b` (the real MiniCPM-SALA shapes) and `sala-nano` (the embedded model)."""

from __future__ import annotations

from salactl.errors import ConfigError
from salactl.runtime.config import LIGHTNING, SPARSE, SalaConfig, SparseConfig

_SALA_9B_SPARSE = {0, 9, 16, 17, 22, 29, 30, 31}


def sala_9b() -> SalaConfig:
    return SalaConfig(
        vocab_size=73448,
        hidden_size=4096,
        intermediate_size=16384,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=2,
        head_dim=128,
        mixer_types=tuple(SPARSE if i in _SALA_9B_SPARSE else LIGHTNING for i in range(32)),
        lightning_nh=32,
        lightning_nkv=32,
        lightning_head_dim=128,
        sparse_config=SparseConfig(),
        eos_token_id=(2, 73440),
        max_position_embeddings=524288,
    )


def sala_nano(vocab_size: int = 4096) -> SalaConfig:
    """Same structure at ~9M parameters: 8 layers, sparse first and last (1:3 sparse:linear),
    GQA 8:2, and a sparse config scaled so selection is active from 256 tokens on."""
    return SalaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        mixer_types=tuple(SPARSE if i in (0, 7) else LIGHTNING for i in range(8)),
        lightning_nh=8,
        lightning_nkv=8,
        lightning_head_dim=32,
        sparse_config=SparseConfig(
            block_size=32, dense_len=256, init_blocks=1, kernel_size=16, kernel_stride=8,
            topk=4, window_size=64,
        ),
        dim_model_base=64,
        eos_token_id=(2, 4),        # </s> and <|im_end|> of the sala-nano tokenizer
        max_position_embeddings=65536,
        initializer_range=0.02,
    )


PRESETS = {"sala-9b": sala_9b, "sala-nano": sala_nano}


def preset(name: str) -> SalaConfig:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}") from None
