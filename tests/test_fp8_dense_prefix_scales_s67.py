"""The GPU engine's dense prefill over an FP8 prefix (GPUBackend._dense_prefill reading the stored
pages back through _gather) applies each KV head's own k/v scale: every row of a dense second chunk
against the reference Engine with the same FP8 cache and scales. On CPU through Triton's
interpreter (fp32, micro model), on CUDA when there is one.

The scales differ 16x between the two KV heads (k and v in opposite directions), so scales applied
to the wrong heads give logits ~0.7-1.4 apart (rel. error), far above the interpreter's fp8
rounding noise (<= 0.045); test_gpu_interpret.py's FP8 engine test checks only a sparse last row,
where such a swap stays below its tolerance."""

import copy
import math
import os

import pytest
import torch

from conftest import micro_model, rel_err

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# Each head's scale covers its |K|, |V| (<= 4 on this prompt: at most 400 of e4m3's 448)
K_SCALE, V_SCALE = [0.01, 0.16], [0.16, 0.01]
PROMPT, FIRST = 39, 20          # chunk 2 is positions 20..38, all dense (dense_len 40)
TOL = 0.1


def _model():
    model = micro_model().to(DEV)
    for i in model.config.sparse_layers:
        attn = model.model.layers[i].self_attn
        attn.register_buffer("k_scale", torch.tensor(K_SCALE, device=DEV))
        attn.register_buffer("v_scale", torch.tensor(V_SCALE, device=DEV))
    return model


def _prefill_every_row(eng, slot, toks, p0):
    """ModelRunner.prefill for one segment, returning the logits of every row, not only the last."""
    from salactl.runtime.gpu.batch import GPUBatch, Segment

    n = len(toks)
    with torch.inference_mode():
        positions = torch.arange(p0, p0 + n, device=DEV)
        slots = torch.full((n,), slot, dtype=torch.int32, device=DEV)
        batch = GPUBatch.build(eng.config, eng.backend, positions, slots, decode=False,
                               segments=[Segment(slot, 0, n, p0)])
        rows = torch.arange(n, device=DEV)
        logits = eng.runner.model(torch.tensor(toks, device=DEV), batch, rows)
    eng.backend.end_forward()
    return logits


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_dense_prefill_over_fp8_prefix_uses_each_heads_scales(kv):
    from salactl.runtime.engine import Engine
    from salactl.runtime.gpu.engine import GPUEngine

    model = _model()
    cfg = model.config
    assert PROMPT - 1 < cfg.sparse_config.dense_len - 1     # the whole second chunk is dense
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (PROMPT,), generator=g).tolist()

    ref = Engine(copy.deepcopy(model), DEV, chunk_size=FIRST, kv_cache_dtype=kv)
    seq = ref.new_sequence()
    ref.forward(seq, prompt[:FIRST])
    want = ref.forward(seq, prompt[FIRST:], all_logits=True)

    eng = GPUEngine(model, DEV, max_running_requests=1, chunk_size=FIRST,
                    kv_tokens=PROMPT + cfg.sparse_config.block_size, kv_cache_dtype=kv)
    assert len(eng.pools.k_scale) == len(cfg.sparse_layers)
    for ks, vs in zip(eng.pools.k_scale, eng.pools.v_scale):    # per head, not one scalar
        assert ks.tolist() == pytest.approx(K_SCALE) and vs.tolist() == pytest.approx(V_SCALE)
    slot = eng.scheduler.slots.alloc(1)[0]
    pages = eng.scheduler.pages.alloc(math.ceil(PROMPT / cfg.sparse_config.block_size))
    eng.pools.assign_pages(slot, pages)
    eng.runner.prefill([(slot, prompt[:FIRST], 0)])
    got = _prefill_every_row(eng, slot, prompt[FIRST:], FIRST)

    assert got.shape == want.shape == (PROMPT - FIRST, cfg.vocab_size)
    errs = [rel_err(a, b) for a, b in zip(got, want)]
    assert max(errs) <= TOL, errs
