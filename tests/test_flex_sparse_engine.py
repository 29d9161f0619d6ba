"""The GPU engine with sparse_prefill='flex' (FlexAttention sparse prefill, both query layouts)
against the reference Engine: on CPU through Triton's interpreter (selection kernels) and eager
flex_attention, in fp32 on a micro model; on CUDA with the compiled flex kernel in bf16."""

import os

import pytest
import torch

from conftest import micro_model

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")
pytest.importorskip("torch.nn.attention.flex_attention")

from salactl.runtime.gpu import selfcheck as S  # noqa: E402
from salactl.runtime.ops.attention import flex_sparse  # noqa: E402


def test_engine_with_flex_sparse_prefill_matches_reference_engine(monkeypatch):
    """Folded layout here (the unfolded one differs only in the q/o views, covered in
    test_flex_sparse.py); a cached prefix, dense and sparse rows in one chunk (25..49: sparse
    from 39), then decode. Two chunks, not more: each sparse one costs the interpreter seconds."""
    monkeypatch.setattr(flex_sparse, "SPARSE_PREFILL_DEFAULT", "flex")
    monkeypatch.setattr(flex_sparse, "FLEX_FOLD", True)
    ran = []                        # a spy around the real function: the flex path must have run, folded
    real = flex_sparse.sparse_attention
    monkeypatch.setattr(flex_sparse, "sparse_attention",
                        lambda flex_fn, q, kp, vp, inputs, *a, **kw: ran.append(inputs.fold)
                        or real(flex_fn, q, kp, vp, inputs, *a, **kw))
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    model = micro_model(torch.bfloat16 if cuda else torch.float32).to(device)
    rows = S.check_model(model, device, prompt_len=50, decode_steps=1, chunk=25,
                         tol=2e-2 if cuda else 1e-4)
    bad = [r for r in rows if not r[1] <= r[2]]
    assert not bad, bad
    assert ran and all(ran), ran
