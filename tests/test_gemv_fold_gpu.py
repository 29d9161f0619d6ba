"""The folded batch-1 GEMVs (runtime/ops/gemv/fused.py) on the GPU: every committed FOLD_CONFIGS
entry at the real 9B shapes and the narrowest and widest candidate block shapes at an uneven shape, bf16 and fp32,
against the plain-PyTorch references; and the fused sala-nano model with the folds on against the
folds-off path and the reference Engine. Skipped without CUDA; CPU coverage is in
test_gemv_fold_interpret.py."""

import pytest
import torch

from conftest import gpu

pytestmark = [pytest.mark.gpu, gpu]


def _assert_rows(rows):
    bad = [r for r in rows if not r[1] <= r[2]]
    assert not bad, bad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fold_gemv_committed_shapes(dtype):
    from salactl.runtime.ops.gemv import fused as F
    from salactl.runtime.ops.gemv.check import check_fold_gemv

    _assert_rows(check_fold_gemv("cuda", dtype, sorted(F.FOLD_CONFIGS)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fold_gemv_candidates_on_uneven_shape(dtype):
    from salactl.runtime.ops.gemv import fused as F
    from salactl.runtime.ops.gemv.check import check_fold_gemv

    shapes = [(100, 700, kind) for kind in F.KINDS]
    _assert_rows(check_fold_gemv("cuda", dtype, shapes, configs=(F.CANDIDATE_CONFIGS[0], F.CANDIDATE_CONFIGS[-1])))


def test_engine_with_folds_matches_reference_engine(monkeypatch):
    """sala-nano shapes, CUDA graph: batch-1 decode with every fold on (entries added for the nano
    shapes) against the reference Engine, in fp32 so that the wiring is checked at 1e-3; the bf16
    kernels are checked per shape above (the bf16 engine differs from the reference by bf16 noise
    near the 3e-2 bound of the engine tests either way: 3.01e-2 with all folds on the H200)."""
    from salactl.runtime.checkpoint import random_state_dict
    from salactl.runtime.gpu import selfcheck as S
    from salactl.runtime.loader import build_model
    from salactl.runtime.ops.gemv import fused as F
    from salactl.runtime.presets import sala_nano

    cfg = sala_nano(vocab_size=512)
    h, i = cfg.hidden_size, cfg.intermediate_size
    qkvz = 4 * cfg.lightning_nh * cfg.lightning_head_dim
    qkvg = 2 * cfg.num_attention_heads * cfg.head_dim + 2 * cfg.num_key_value_heads * cfg.head_dim
    o_in = cfg.num_attention_heads * cfg.head_dim
    lo_in = cfg.lightning_nh * cfg.lightning_head_dim
    keys = {(qkvz, h, "norm"), (qkvg, h, "norm"), (2 * i, h, "norm"), (512, h, "norm"),
            (h, lo_in, "norm_gate"), (h, o_in, "gate"), (h, i, "glu")}
    for key in keys:
        monkeypatch.setitem(F.FOLD_CONFIGS, key, F.CANDIDATE_CONFIGS[1])
    ran = []
    real = F.fold_gemv
    monkeypatch.setattr(F, "fold_gemv", lambda kind, w, *a, **kw: ran.append((*w.shape, kind)) or real(kind, w, *a, **kw))
    model = build_model(cfg, random_state_dict(cfg, "cuda", torch.float32, 3))
    _assert_rows(S.check_model(model, "cuda", 700, decode_steps=4, chunk=100, cuda_graph=True, tol=1e-3))
    assert model.fold_into_gemv and set(ran) == keys
