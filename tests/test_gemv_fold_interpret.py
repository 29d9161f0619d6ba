"""The folded batch-1 GEMVs (runtime/ops/gemv/fused.py) on the CPU through Triton's interpreter
(fp32, small shapes) against the plain-PyTorch references, and the fused model with every fold
enabled against the reference Engine. Skipped without triton (CI) and on CUDA machines
(tests/test_gemv_fold_gpu.py covers those)."""

import os

import pytest
import torch

from conftest import micro_model

if torch.cuda.is_available():
    pytest.skip("CUDA present: the GPU tests cover these kernels", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")

from salactl.runtime.ops.gemv import fused as F  # noqa: E402
from salactl.runtime.ops.gemv.check import check_fold_gemv  # noqa: E402


def _assert_rows(rows):
    bad = [r for r in rows if not r[1] <= r[2]]
    assert not bad, bad


def test_every_fold_kind_matches_reference_on_uneven_shapes():
    """N and K not multiples of the blocks (masked rows and K tails), each candidate block shape."""
    shapes = [(37, 300, kind) for kind in F.KINDS] + [(64, 512, "norm")]
    _assert_rows(check_fold_gemv("cpu", torch.float32, shapes, configs=F.CANDIDATE_CONFIGS[:2]))


def test_engine_with_every_fold_matches_reference_engine(monkeypatch):
    """Batch-1 decode (dense and sparse) with the norms folded into q/k/v/z, q/k/v/o_gate, gate/up
    and lm_head and the gates / silu·mul into o_proj and down_proj gives the reference Engine's
    logits; every fold kind really ran."""
    from salactl.runtime.gpu import selfcheck as S

    cfg = (16, 32, 1, 1)
    micro = {(256, 32, "norm"), (192, 32, "norm"), (128, 32, "norm"), (32, 64, "norm_gate"),
             (32, 64, "gate"), (32, 64, "glu")}
    for key in micro:
        monkeypatch.setitem(F.FOLD_CONFIGS, key, cfg)
    ran = []
    real = F.fold_gemv
    monkeypatch.setattr(F, "fold_gemv", lambda kind, w, *a, **kw: ran.append((*w.shape, kind)) or real(kind, w, *a, **kw))
    model = micro_model()
    rows = S.check_model(model, "cpu", prompt_len=38, decode_steps=2, chunk=40, tol=1e-4)
    _assert_rows(rows)
    assert model.fold_into_gemv and set(ran) == micro
