"""The folded batch-1 GEMVs (runtime/ops/gemv/fused.py) on the CPU through Triton's interpreter
(fp32, small shapes) against the plain-PyTorch references, and the fused model with every fold
enabled against the reference Engine; the skinny GEMM with o_proj's gate folded in (gemv/skinny_fold.py,
2-64 rows) against the separate kernels + skinny GEMM and in the engine. Skipped without triton (CI) and on CUDA machines
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


def test_skinny_fold_matches_separate_kernels_and_reference():
    """The skinny GEMM with o·sigmoid(g) / o_norm(o)·sigmoid(z) folded in (gemv/skinny_fold.py) for
    2-64 rows: "gate" equals sigmoid_gate + skinny_linear bit for bit, "norm_gate" matches
    rmsnorm_gate + skinny_linear and the reference; M, N and K not multiples of the blocks, split K
    (the per-row sum of squares combined across 2 and 3 splits) and unsplit."""
    from salactl.runtime.ops.gemv import skinny_fold as SF
    from salactl.runtime.ops.gemv.check import check_skinny_fold

    shapes = [(m, 37, 300, kind) for m in (2, 17, 64) for kind in SF.KINDS]
    configs = (SF.CANDIDATE_CONFIGS[0], (16, 64, 4, 2, 3), (32, 128, 4, 4, 1))
    _assert_rows(check_skinny_fold("cpu", torch.float32, shapes, configs=configs))


def test_skinny_fold_routing():
    """Only listed (N, K, BM, kind) of 16-bit weights at 2-64 rows fold."""
    from salactl.runtime.ops.gemv import skinny_fold as SF

    w = torch.zeros(4096, 4096, dtype=torch.bfloat16)
    assert SF.fold_config("gate", 8, w) == SF.FOLD_SKINNY_CONFIGS[(4096, 4096, 16, "gate")]
    assert SF.fold_config("norm_gate", 32, w) == SF.FOLD_SKINNY_CONFIGS[(4096, 4096, 32, "norm_gate")]
    assert SF.fold_config("gate", 1, w) is None and SF.fold_config("gate", 65, w) is None
    assert SF.fold_config("gate", 8, w.float()) is None and SF.fold_config("glu", 8, w) is None
    assert SF.fold_config("gate", 8, w[:, :4000]) is None


def test_engine_with_skinny_fold_matches_reference_engine(monkeypatch):
    """fp16 micro model (the interpreter's fp16 dot is exact enough, bf16 is not): prefill chunks of
    18-20 rows run o_proj with both gates folded into the skinny GEMM, and the logits match the
    reference Engine as closely as with the fold off."""
    from salactl.runtime.gpu import selfcheck as S
    from salactl.runtime.ops.gemv import skinny_fold as SF

    for kind in SF.KINDS:
        monkeypatch.setitem(SF.FOLD_SKINNY_CONFIGS, (32, 64, 32, kind), (16, 32, 4, 2, 2))
    ran = []
    real = SF.skinny_fold_linear
    monkeypatch.setattr(SF, "skinny_fold_linear", lambda kind, w, o, *a, **kw: ran.append((kind, o.shape[0])) or real(kind, w, o, *a, **kw))
    model = micro_model(torch.float16)
    _assert_rows(S.check_model(model, "cpu", prompt_len=38, decode_steps=1, chunk=20, tol=5e-3))
    assert model.fold_into_skinny and set(ran) == {(kind, m) for kind in SF.KINDS for m in (18, 20)}
