"""The GPU engine with sparse_prefill='flex' (FlexAttention sparse prefill, both query layouts)
against the reference Engine: on CPU through Triton's interpreter (selection kernels) and eager
flex_attention, in fp32 on a micro model; on CUDA with the compiled flex kernel in bf16."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")
pytest.importorskip("torch.nn.attention.flex_attention")

from salactl.runtime.gpu import selfcheck as S  # noqa: E402
from salactl.runtime.ops.attention import flex_sparse  # noqa: E402


def _micro_model(dtype):
    from salactl.runtime.checkpoint import random_state_dict
    from salactl.runtime.config import LIGHTNING, SPARSE, SalaConfig, SparseConfig
    from salactl.runtime.loader import build_model

    cfg = SalaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     mixer_types=(SPARSE, LIGHTNING, SPARSE), lightning_nh=4, lightning_nkv=4,
                     lightning_head_dim=16, dim_model_base=16, eos_token_id=(2,), initializer_range=0.1,
                     sparse_config=SparseConfig(block_size=16, dense_len=40, init_blocks=1, kernel_size=8,
                                                kernel_stride=4, topk=1, window_size=16))
    return build_model(cfg, random_state_dict(cfg, "cpu", dtype, 5))


def test_engine_with_flex_sparse_prefill_matches_reference_engine(monkeypatch):
    """Folded layout here (the unfolded one differs only in the q/o views, covered in
    test_flex_sparse.py); a cached prefix, dense and sparse rows in one chunk, then decode."""
    monkeypatch.setattr(flex_sparse, "SPARSE_PREFILL_DEFAULT", "flex")
    monkeypatch.setattr(flex_sparse, "FLEX_FOLD", True)
    cuda = torch.cuda.is_available()
    model = _micro_model(torch.bfloat16 if cuda else torch.float32)
    rows = S.check_model(model, "cuda" if cuda else "cpu", prompt_len=58, decode_steps=1, chunk=24,
                         tol=2e-2 if cuda else 1e-4)
    bad = [r for r in rows if not r[1] <= r[2]]
    assert not bad, bad
