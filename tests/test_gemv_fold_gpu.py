"""The folded batch-1 GEMVs (runtime/ops/gemv/fused.py) on the GPU: every committed FOLD_CONFIGS
entry at the real 9B shapes and the narrowest and widest candidate block shapes at an uneven shape, bf16 and fp32,
against the plain-PyTorch references; and the fused sala-nano model with the folds on against the
folds-off path and the reference Engine; the skinny-GEMM gate folds (gemv/skinny_fold.py) at the
committed shapes and in prefill / batched graph decode. Skipped without CUDA; CPU coverage is in
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


def _nano_skinny_fold_keys(cfg, bms=(16, 32)):
    lo_in = cfg.lightning_nh * cfg.lightning_head_dim
    o_in = cfg.num_attention_heads * cfg.head_dim
    return {(cfg.hidden_size, k, bm, kind) for bm in bms for k, kind in ((lo_in, "norm_gate"), (o_in, "gate"))}


def test_skinny_fold_committed_shapes():
    """Every FOLD_SKINNY_CONFIGS entry at 8 / 16 / 32 rows (bf16): "gate" bit-identical to
    sigmoid_gate + skinny_linear, "norm_gate" within bf16 rounding of rmsnorm_gate + skinny_linear
    and of the reference."""
    from salactl.runtime.ops.gemv import skinny_fold as SF
    from salactl.runtime.ops.gemv.check import check_skinny_fold

    shapes = [(m, n, k, kind) for n, k, bm, kind in sorted(SF.FOLD_SKINNY_CONFIGS) for m in (8, 16, 32)
              if SF.block_m(m) == bm]
    _assert_rows(check_skinny_fold("cuda", torch.bfloat16, shapes))


def test_skinny_fold_candidates_on_uneven_shape():
    from salactl.runtime.ops.gemv import skinny_fold as SF
    from salactl.runtime.ops.gemv.check import check_skinny_fold

    shapes = [(m, 100, 700, kind) for m in (3, 17, 64) for kind in SF.KINDS]
    _assert_rows(check_skinny_fold("cuda", torch.bfloat16, shapes, configs=SF.CANDIDATE_CONFIGS[:3] + SF.CANDIDATE_CONFIGS[-1:]))


def test_engine_with_skinny_fold_matches_reference_engine(monkeypatch):
    """sala-nano bf16, CUDA graph: prefill chunks of 32 rows run o_proj with the gates folded into
    the skinny GEMM; the logits match the reference Engine within the engine tests' bf16 bound."""
    from salactl.runtime.checkpoint import random_state_dict
    from salactl.runtime.gpu import selfcheck as S
    from salactl.runtime.loader import build_model
    from salactl.runtime.ops.gemv import skinny_fold as SF
    from salactl.runtime.presets import sala_nano

    cfg = sala_nano(vocab_size=512)
    for key in _nano_skinny_fold_keys(cfg):
        monkeypatch.setitem(SF.FOLD_SKINNY_CONFIGS, key, SF.CANDIDATE_CONFIGS[0])
    ran = []
    real = SF.skinny_fold_linear
    monkeypatch.setattr(SF, "skinny_fold_linear", lambda kind, w, o, *a, **kw: ran.append((kind, o.shape[0])) or real(kind, w, o, *a, **kw))
    model = build_model(cfg, random_state_dict(cfg, "cuda", torch.bfloat16, 3))
    _assert_rows(S.check_model(model, "cuda", 400, decode_steps=3, chunk=32, cuda_graph=True, tol=3e-2))
    assert model.fold_into_skinny and {k for k, _ in ran} == set(SF.KINDS)


def test_batched_graph_decode_with_skinny_fold_matches_fold_off(monkeypatch):
    """sala-nano bf16, 8 sequences decoding together in a CUDA graph (8 rows: BM 16) after 32-row
    prefill chunks (BM 32): logits with the fold on vs off, same weights, every step."""
    import math

    from salactl.runtime.checkpoint import random_state_dict
    from salactl.runtime.gpu.engine import GPUEngine
    from salactl.runtime.gpu.selfcheck import rel_err
    from salactl.runtime.loader import build_model
    from salactl.runtime.ops.gemv import skinny_fold as SF
    from salactl.runtime.presets import sala_nano

    cfg = sala_nano(vocab_size=512)
    for key in _nano_skinny_fold_keys(cfg):
        monkeypatch.setitem(SF.FOLD_SKINNY_CONFIGS, key, SF.CANDIDATE_CONFIGS[0])
    ran = []
    real = SF.skinny_fold_linear
    monkeypatch.setattr(SF, "skinny_fold_linear", lambda kind, w, o, *a, **kw: ran.append((kind, o.shape[0])) or real(kind, w, o, *a, **kw))
    g = torch.Generator().manual_seed(1)
    seqs, prompt_len, steps = 8, 96, 4
    prompts = torch.randint(0, cfg.vocab_size, (seqs, prompt_len), generator=g).tolist()
    feed = torch.randint(0, cfg.vocab_size, (seqs, steps), generator=g).tolist()

    def run(on: bool) -> list:
        model = build_model(cfg, random_state_dict(cfg, "cuda", torch.bfloat16, 3))
        model.fold_into_skinny = on
        bs = cfg.sparse_config.block_size
        eng = GPUEngine(model, "cuda", max_running_requests=seqs, chunk_size=32,
                        kv_tokens=seqs * (prompt_len + steps + 2 * bs), cuda_graph=True)
        slots = eng.scheduler.slots.alloc(seqs)
        out = []
        for slot, prompt in zip(slots, prompts):
            eng.pools.assign_pages(slot, eng.scheduler.pages.alloc(math.ceil((prompt_len + steps) / bs)))
            for c0 in range(0, prompt_len, 32):
                last = eng.runner.prefill([(slot, prompt[c0:c0 + 32], c0)])
            out.append(last[0])
        for i in range(steps):
            out.append(eng.runner.decode([(s, feed[j][i], prompt_len + i) for j, s in enumerate(slots)]))
        return out

    on, off = run(True), run(False)
    errs = [rel_err(a, b) for a, b in zip(on, off)]
    assert max(errs) <= 1e-2, errs
    assert {(kind, m) for kind in SF.KINDS for m in (32, seqs)} <= set(ran)
