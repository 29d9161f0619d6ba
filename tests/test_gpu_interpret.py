"""The GPU engine's Triton kernels and the whole GPU backend on the CPU, through Triton's
interpreter (TRITON_INTERPRET=1), in fp32 at small shapes, against the plain-PyTorch references.
Skipped where triton is not installed (CI) and on CUDA machines (test_gpu_*.py cover those).
The interpreter rounds bf16/fp8 conversions differently from GPUs, hence fp32 here."""

import importlib.util
import os

import pytest
import torch

from conftest import assert_stop_token_and_stream_order, end_a_nan_request, micro_model

if torch.cuda.is_available():
    pytest.skip("CUDA present: the GPU tests cover these kernels", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"     # must be set before triton is first imported
pytest.importorskip("triton")


from salactl.runtime.gpu import selfcheck as S  # noqa: E402
from salactl.runtime.ops.selection.triton_rank import KEPT, NCTR, _rank_kernel, topk_launch  # noqa: E402

SMALL = S.Shapes.small()


def _assert_rows(rows):
    bad = [r for r in rows if not r[1] <= r[2]]
    assert not bad, bad


def test_gla_decode_in_place_and_prefill():
    rows = S.check_gla("cpu", torch.float32, H=4, D=32, n=3, T=70)
    _assert_rows(rows)
    assert {"gla_prefill[reference].o", "gla_prefill[reference].state"} <= {r[0] for r in rows}


def test_engine_notes_a_cuda_prefill_without_fla_core():
    """CUDA without fla-core still runs (the exact reference prefill), but says so."""
    from salactl.runtime.gpu.engine import fallback_notes
    from salactl.runtime.ops.gla.triton import FLA, REFERENCE, prefill_impl

    has_fla = importlib.util.find_spec("fla") is not None
    assert prefill_impl("cpu") == REFERENCE and fallback_notes(torch.device("cpu")) == []
    assert prefill_impl("cuda") == (FLA if has_fla else REFERENCE)
    notes = fallback_notes(torch.device("cuda"))
    assert len(notes) == (0 if has_fla else 1)
    assert all("pip install 'salactl[gpu]'" in n for n in notes)


@pytest.mark.parametrize("fp8", [None, torch.float8_e4m3fn, torch.float8_e5m2])
def test_store_kv(fp8):
    _assert_rows(S.check_store_kv("cpu", torch.float32, SMALL, fp8=fp8))


def test_store_kv_check_excuses_only_the_interpreters_fp8_misses():
    """check_store_kv compares every written value exactly, except the interpreter's known fp32->fp8
    misses (selfcheck.interpreter_fp8_miss); a 2x error anywhere else still counts."""
    e5, e4 = torch.float8_e5m2, torch.float8_e4m3fn
    cases = [  # dtype, x, what the kernel stored, excused
        (e5, 7827.8, 4096.0, True), (e5, -510.5, -256.0, True), (e5, -1954.0, -1024.0, True),
        (e5, 7.9, 4.0, True),                    # 8 = 2^3, 4's exponent field (17) odd: the lost carry
        (e5, 3.9, 2.0, False),                   # 2's field (16) even: the interpreter gets 4 right
        (e5, 8300.0, 4096.0, False),             # |x| above 2^13: no carry to lose
        (e5, 1000.0, 512.0, False), (e5, 300.0, 160.0, False), (e5, -7827.8, 4096.0, False),
        (e4, 14.5, 15.0, True),                  # an exact tie rounded away from zero
        (e4, 14.6, 14.0, False),
        (e4, -0.01286, -0.01171875, True),       # subnormal, shifted without rounding
        (e4, 0.01286, -0.01171875, False), (e4, 0.03, 0.0234375, False),
    ]
    for dt, x, stored, ok in cases:
        x = torch.tensor([x])
        got = S.interpreter_fp8_miss(torch.tensor([stored]).to(dt), x.to(dt), x)
        assert bool(got) == ok, (dt, float(x), stored)


@pytest.mark.parametrize("fp8", [False, True])
def test_paged_decode_attention_dense_and_sparse(fp8):
    _assert_rows(S.check_decode_attention("cpu", torch.float32, SMALL, fp8=fp8))


@pytest.mark.parametrize("preload,fp8,sub", [(2, True, 0), (8, False, 0), (2, True, 16), (0, False, 16)])
def test_paged_decode_attention_page_id_preload(preload, fp8, sub):
    """The split kernel with the split's page ids preloaded: in chunks of 2 pages (several chunks
    per split, a partial last chunk) and of 8 (one chunk); sub 16: half a page per softmax step
    (the check's partial last pages leave the second half empty or partly masked)."""
    from salactl.runtime.ops.decode_attention.config import DecodeConfig
    cfg = DecodeConfig(preload=preload, sub=sub, early=bool(sub))
    _assert_rows(S.check_decode_attention("cpu", torch.float32, SMALL, fp8=fp8, config=cfg))


@pytest.mark.parametrize("preload,fp8", [(0, False), (2, False), (0, True), (2, True)])
def test_paged_decode_attention_tma_pages(preload, fp8):
    """K/V pages by TMA descriptors (bf16's default; token-minor [D, B] boxes for FP8 V) against
    the reference, with and without preloaded page ids."""
    from salactl.runtime.ops.decode_attention.config import DecodeConfig
    cfg = DecodeConfig(warps=2, preload=preload, early=True, tma=True)
    _assert_rows(S.check_decode_attention("cpu", torch.float32, SMALL, fp8=fp8, config=cfg))


def test_selection_matches_reference():
    _assert_rows(S.check_selection("cpu", torch.float32, SMALL, L=9 * 64 + 5))


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("knobs", [dict(lse_splits=3),
                                   dict(nbc=4, lse_splits=2, gather_chunk=8, short_blocks=0, rank_rb=4, rank_ct=8),
                                   dict(nbc=8, lse_splits=5, gather_chunk=16, num_warps=4, short_blocks=0),
                                   dict(gather_chunk=64, short_blocks=0, rank_rb=16, rank_ct=32),
                                   dict(gather_chunk=16, short_blocks=32, radix_warps=2, rank_short_rows=0),
                                   dict(gather_chunk=64, short_blocks=32, rank_rb=4, rank_ct=8),
                                   dict(rank_short_rows=0), dict(rank_rb=8, rank_ct=16),
                                   dict(nbc=8, lse_splits=2, gather_chunk=16, short_blocks=0, dedup=False),
                                   dict(dedup=False), dict(lse_bw=16, lse_splits=2), dict(lse_bw=16, lse_elem=False, lse_splits=3),
                                   dict(p2_early=False), dict(p2_early=False, nbc=8, lse_splits=2)])
def test_decode_selection_exact_set_and_order(ties, knobs):
    """select_decode (fused K1 update, top-k in the kernel) = reference.select_blocks: contexts
    at/just past dense_len, not multiples of the block, shorter than topk, one and many gather
    programs per row, several rows in one batch; tied blocks must break by lower index. By
    default every row here is short (short_blocks) and ranked directly; short_blocks 0 gathers
    and ranks every row, 32 mixes both in one launch; rank_short_rows 0 sends short rows to the
    one-program radix select; pass 2 adds one histogram atomic per distinct bin of its program
    (with ties, many blocks share a bin), or with dedup=False one per block."""
    from salactl.runtime.ops.selection.check import check_decode_selection

    sc = SMALL.sparse
    lens = [sc.dense_len, sc.dense_len + 1, 9 * 32 + 5, 31, 1000, 2050]
    _assert_rows(check_decode_selection("cpu", torch.float32, SMALL.hq, SMALL.hkv, SMALL.d, sc, lens,
                                        ties=ties, seed=7, **knobs))


def _tied_words(lens, W, seed=0):
    """Scores [rows, W] and pass 2's order-preserving int32 words of them. Rows 1, 3, 5, ...
    only 4 distinct values, rows 0, 3, 6, ... forced +inf blocks; the last three rows: a narrow
    band (1.56 + U(0, 1e-3): every block in one 12-bit bin, tens of 24-bit bins), a quantised
    band (1.56 + 0..39 ulps: one 24-bit bin, exact ties at the threshold) and all equal."""
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(len(lens), W, generator=g)
    f[1::2] = torch.randint(0, 4, (len(lens) // 2, W), generator=g).float() - 1.0     # ties at -1, 0, 1, 2
    f[::3, :3] = float("inf")
    f[-3] = 1.56 + 1e-3 * torch.rand(W, generator=g)
    f[-2] = 1.56 + torch.randint(0, 40, (W,), generator=g).float() * 2.0 ** -23
    f[-1] = 0.5
    bits = f.view(torch.int32)
    return f, torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


def test_topk_exact_order_with_heavy_ties():
    """triton_rank.topk_launch (the top-k after pass 2) on raw score words and their top-12-bit
    histogram: rows shorter than, equal to and longer than K, heavy ties (taken lowest index
    first), forced blocks, all-equal rows, narrow bands (hundreds of blocks in the threshold's
    12-bit bin, exact ties in its 24-bit bin). small 0: every row gathered then ranked (one and
    many gather programs, one and several rank steps per program); 512: every row short,
    ranked directly or (short_rows 0) radix-selected; 256: both kinds in one batch."""
    W, K = 300, 96
    lens = [1, 5, 95, 96, 97, 200, 300, 250, 300, 290, 299]
    f, words = _tied_words(lens, W)
    u = (words.to(torch.int64) & 0xFFFFFFFF) ^ 0x80000000
    seq = torch.tensor(lens, dtype=torch.int32)
    # interpreter time ~ (row length)^2 / (rb * ct) rank steps: 4 x 8 tiles took a minute
    for small, ch, rb, ct, short_rows in ((0, 16, 8, 16, 64), (0, 512, 32, 64, 64), (512, 64, 16, 64, 64),
                                          (512, 64, 16, 64, 0), (256, 64, 16, 32, 64), (256, 32, 16, 16, 0)):
        ctr = torch.zeros(len(lens), NCTR, dtype=torch.int32)
        for i, L in enumerate(lens):
            ctr[i, 1:4097] = torch.bincount(u[i, :L] >> 20, minlength=4096)
        sel = torch.full((len(lens), 1, K), -7, dtype=torch.int32)
        cnt = torch.empty(len(lens), 1, dtype=torch.int32)
        topk_launch(seq, words, ctr, sel, cnt, 1, 1, K, small=small, chunk=ch, rb=rb, ct=ct, rank_warps=4,
                    short_rows=short_rows, radix_warps=4)
        for i, L in enumerate(lens):
            want = torch.sort(f[i, :L], descending=True, stable=True).indices[:K].tolist()
            assert sel[i, 0, :int(cnt[i, 0])].tolist() == want, (small, ch, rb, ct, short_rows, L)
            if L > small:                   # gathered: every key in or above the threshold's bin
                tbin = int(torch.sort(u[i, :L], descending=True).values[min(K, L) - 1]) >> 20
                assert int(ctr[i, KEPT.value]) == int((u[i, :L] >> 20 >= tbin).sum())


def test_rank_ignores_gathered_order():
    """The gather programs reserve their ranges in whatever order they run: given the kept keys
    reversed and shuffled (and only those in or above the threshold bin), the rank launch still
    writes the reference order (ties at the exact threshold score -> lower block index)."""
    W, K = 300, 96
    lens = [5, 96, 97, 200, 300, 250, 180, 260, 300, 280]
    f, words = _tied_words(lens, W, seed=1)
    u = (words.to(torch.int64) & 0xFFFFFFFF) ^ 0x80000000
    keys = words.to(torch.int64) * 2 ** 32 + (2 ** 32 - 1 - torch.arange(W))
    g = torch.Generator().manual_seed(2)
    ctr = torch.zeros(len(lens), NCTR, dtype=torch.int32)
    kept = torch.zeros(len(lens), W, dtype=torch.int64)
    for i, L in enumerate(lens):
        tbin = int(torch.sort(u[i, :L], descending=True).values[min(K, L) - 1]) >> 20
        idx = torch.nonzero(u[i, :L] >> 20 >= tbin).flatten()
        idx = idx.flip(0) if i % 2 else idx[torch.randperm(len(idx), generator=g)]
        kept[i, :len(idx)] = keys[i, idx]
        ctr[i, KEPT.value] = len(idx)
    seq = torch.tensor(lens, dtype=torch.int32)
    for rb, ct in ((4, 16), (32, 256)):
        sel = torch.full((len(lens), 1, K), -7, dtype=torch.int32)
        cnt = torch.empty(len(lens), 1, dtype=torch.int32)
        _rank_kernel[(len(lens), 3)](seq, words, ctr, kept, sel, cnt, words.stride(0), kept.stride(0),
                                     sel.stride(0), sel.stride(1), cnt.stride(0), cnt.stride(1),
                                     HKV=1, BS=1, NCTR=NCTR, K=K, RB=rb, CT=ct, SMALL=0, SHORT=True)
        for i, L in enumerate(lens):
            want = torch.sort(f[i, :L], descending=True, stable=True).indices[:K].tolist()
            assert sel[i, 0, :int(cnt[i, 0])].tolist() == want, (rb, ct, L)


def test_fused_ops():
    _assert_rows(S.check_fused("cpu", torch.float32))


def test_engine_dense_and_sparse_match_reference_engine():
    """Fused model + paged caches + GPU backend (prefill with a cached prefix and sparse queries,
    sparse decode with GPU selection) against the reference Engine, on a micro model."""
    _assert_rows(S.check_model(micro_model(), "cpu", prompt_len=58, decode_steps=2, chunk=24, tol=1e-4))


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_engine_with_fp8_kv_matches_reference_engine(kv):
    """FP8 pages (token-minor V) through store, dense prefill over a cached prefix, sparse
    prefill and decode (interpreter fp8 rounding differs a little from torch's: looser tol).
    The second chunk (25..49) starts mid-page and holds dense rows over the cached prefix and
    sparse ones (from 39); the decode token lands mid-page too. One chunk and one decode step:
    each sparse one costs the interpreter seconds and a further one adds no FP8 path."""
    from salactl.runtime.gpu.selfcheck import check_model

    model = micro_model()
    for i in model.config.sparse_layers:
        model.model.layers[i].self_attn.register_buffer("k_scale", torch.tensor(0.01))
        model.model.layers[i].self_attn.register_buffer("v_scale", torch.tensor([0.004, 0.006]))
    rows = check_model(model, "cpu", prompt_len=50, decode_steps=1, chunk=25, tol=5e-2, kv_cache_dtype=kv)
    bad = [r for r in rows if not r[1] <= r[2]]
    assert not bad, rows


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2", "bf16"])
def test_prefill_logits_do_not_depend_on_the_chunk_size(kv):
    """A first chunk attends the keys as stored: with FP8 pages, a prompt prefilled whole used to
    attend its unquantized keys and one in chunks the quantized ones (6e-3 / 1.5e-2 apart)."""
    from salactl.runtime.gpu.selfcheck import check_chunk_invariance

    model = micro_model()
    for i in model.config.sparse_layers:
        model.model.layers[i].self_attn.register_buffer("k_scale", torch.tensor(0.2))
        model.model.layers[i].self_attn.register_buffer("v_scale", torch.tensor(0.2))
    _assert_rows(check_chunk_invariance(model, "cpu", prompt_len=36, chunks=(36, 12), tol=1e-5, kv_cache_dtype=kv))


def test_continuous_batching_equals_one_at_a_time():
    """Queued requests, shared prefill chunks, mixed dense/sparse decode rows and per-request
    stop conditions give each request the tokens it gets alone."""
    from salactl.runtime.gpu.engine import GPUEngine
    from salactl.runtime.sampling import SamplingParams

    g = torch.Generator().manual_seed(0)
    lens, news = [4, 42, 1], [2, 2, 3]
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in lens]
    params = [SamplingParams(max_new_tokens=m, ignore_eos=True) for m in news]
    engine = GPUEngine(micro_model(), "cpu", max_running_requests=2, chunk_size=32, kv_tokens=1024)
    batched = engine.generate_batch(list(zip(prompts, params)))
    for p, prm, b in zip(prompts, params, batched):
        alone = engine.generate(p, prm)
        assert len(b.output_token_ids) == prm.max_new_tokens
        assert b.output_token_ids == alone.output_token_ids


def test_stop_tokens_and_streaming_order():
    """test_gpu_engine.py's check on the micro model."""
    from salactl.runtime.gpu.engine import GPUEngine

    assert_stop_token_and_stream_order(
        GPUEngine(micro_model(), "cpu", max_running_requests=2, chunk_size=64, kv_tokens=1024))


def test_profile_engine_workload_matches_reference_engine():
    """`salactl profile --backend engine --phase both`: each phase's profiled step (GPU engine over
    a really prefilled cache of its own) gives the reference Engine's logits for the same tokens.
    Both profiled steps are sparse (from position 39): the prefill phase's over a dense cache of
    39 tokens (caught up at that step), the decode phase's over a cache whose prefill was sparse."""
    import copy

    from salactl.profiling.engine_workload import build_engine_workload
    from salactl.profiling.spec import ProfileSpec
    from salactl.profiling.workload import Workload
    from salactl.runtime.backend_reference import ReferenceBackend
    from salactl.runtime.engine import Engine

    model = micro_model()
    cfg = model.config
    ref = Engine(copy.deepcopy(model), "cpu", chunk_size=24)
    spec = ProfileSpec(model="micro", phases=("prefill", "decode"), context=47, chunk_size=8, backend="engine")
    w = Workload(spec, model, cfg, torch.device("cpu"), torch.float32, 4, "micro", ReferenceBackend(cfg), {})
    ew = build_engine_workload(w)
    gen = torch.Generator().manual_seed(spec.seed)
    for phase in spec.phases:
        prefix = torch.randint(0, cfg.vocab_size, (spec.step_rows(phase)[1],), generator=gen).tolist()
        _, segments, _ = prepared = ew.prepare(phase)
        got = ew.forward(prepared)[-1]
        seq = ref.new_sequence()
        ref.prefill(seq, prefix)
        want = ref.prefill(seq, segments[0][1])[-1]
        assert (got - want).norm() / want.norm() < 1e-4, phase
    assert ew.backend_name == "engine" and w.backend_name == "reference"


def test_fuse_model_again_after_a_module_swap_uses_the_new_weights():
    """Fusing twice keeps one concatenated weight; swapping a projection afterwards (as in-place
    quantization does) and fusing again makes the fused MLP use the new module."""
    from torch import nn

    from salactl.runtime.gpu.fast_model import fuse_model
    from salactl.runtime.op_timer import NULL_TIMER

    model = fuse_model(micro_model())
    mlp = model.model.layers[0].mlp
    first = mlp._w_gate_up
    assert fuse_model(model).model.layers[0].mlp._w_gate_up is first
    new = nn.Linear(mlp.gate_proj.in_features, mlp.gate_proj.out_features, bias=False)
    nn.init.normal_(new.weight)
    mlp.gate_proj = new
    fuse_model(model)
    x = torch.randn(3, new.in_features)
    want = mlp.down_proj(torch.nn.functional.silu(new(x)) * mlp.up_proj(x))
    assert torch.allclose(mlp(x, NULL_TIMER), want, atol=1e-5, rtol=1e-4)


def test_fused_w4a16_projections_equal_the_separate_modules():
    """fuse_model concatenates W4A16 projections (Triton layout) into one GPTQLinear along N: its
    output is the separate modules' outputs side by side, and the originals (now views of the
    fused buffers) give what they gave before."""
    from salactl.quant.linear import GPTQLinear
    from salactl.runtime.gpu.fast_model import _concat
    from salactl.runtime.ops.w4a16.layout import pack_tc

    g = torch.Generator().manual_seed(0)
    K = 256
    mods = []
    for n in (32, 16, 48):
        codes = torch.randint(0, 16, (K, n), generator=g, dtype=torch.int32)
        scales = (torch.rand(K // 128, n, generator=g) * 0.01 + 0.001).to(torch.float16)
        mods.append(GPTQLinear(K, n, 4, 128, "triton", {"qweight": pack_tc(codes), "scales": scales}))
    x = torch.randn(3, K, generator=g).to(torch.float16)
    before = [m(x).float() for m in mods]
    fused = _concat(mods)
    assert fused is not None and fused.module.out_features == 96
    assert torch.allclose(fused(x).float(), torch.cat(before, dim=-1), atol=1e-3, rtol=1e-3)
    for m, b in zip(mods, before):
        assert m.qweight.untyped_storage().data_ptr() == fused.module.qweight.untyped_storage().data_ptr()
        assert torch.allclose(m(x).float(), b, atol=1e-3, rtol=1e-3)
    assert _concat(mods, fused) is fused                     # fusing again reuses it


def test_batch1_gemv_matches_linear():
    """The batch-1 GEMV (every candidate block shape) equals F.linear in fp32, including N and K
    that are not multiples of the blocks; `linear` routes only listed shapes and single rows."""
    from salactl.runtime.ops.gemv import triton as gv

    g = torch.Generator().manual_seed(0)
    for n, k in ((48, 640), (37, 300)):
        w = torch.randn(n, k, generator=g)
        x = torch.randn(1, k, generator=g)
        want = torch.nn.functional.linear(x, w)
        for cfg in gv.CANDIDATE_CONFIGS:
            assert torch.allclose(gv.gemv(x, w, cfg), want, atol=1e-4, rtol=1e-4), cfg
    gv.GEMV_SHAPES.add((37, 300))
    try:
        assert torch.allclose(gv.linear(x, w), want, atol=1e-4, rtol=1e-4)
        x2 = torch.randn(2, 300, generator=g)
        assert torch.allclose(gv.linear(x2, w), torch.nn.functional.linear(x2, w), atol=1e-5)
    finally:
        gv.GEMV_SHAPES.discard((37, 300))


def test_skinny_gemm_matches_linear():
    """The skinny GEMM (every candidate block shape) equals F.linear in fp32 for 2-64 rows,
    including N, K and M that are not multiples of the blocks; `linear` routes only the listed
    (N, K, BM) of 16-bit activations."""
    from salactl.runtime.ops.gemv import skinny
    from salactl.runtime.ops.gemv import triton as gv

    g = torch.Generator().manual_seed(0)
    for m, n, k in ((2, 48, 640), (17, 37, 300), (64, 70, 256)):
        w = torch.randn(n, k, generator=g)
        x = torch.randn(m, k, generator=g)
        want = torch.nn.functional.linear(x, w)
        for cfg in skinny.CANDIDATE_CONFIGS:
            assert torch.allclose(skinny.skinny_linear(x, w, cfg), want, atol=1e-4, rtol=1e-4), (m, n, k, cfg)
    w, x = w.half(), x.half()        # the interpreter's bf16 dot is not trustworthy; fp16 is
    assert skinny.routed(x, w) is None
    skinny.SKINNY_CONFIGS[(70, 256, 64)] = skinny.CANDIDATE_CONFIGS[0]
    try:
        assert skinny.routed(x, w) == skinny.CANDIDATE_CONFIGS[0] and skinny.routed(x.float(), w.float()) is None
        assert skinny.routed(x[:16], w) is None           # BM 16 is not listed
        want = torch.nn.functional.linear(x.float(), w.float())
        assert ((gv.linear(x, w).float() - want).norm() / want.norm()) < 1e-2
    finally:
        skinny.SKINNY_CONFIGS.pop((70, 256, 64))


def test_run_profile_times_the_real_generation_and_profiles_ops_eagerly():
    """`salactl run` on the GPU engine: the timed generation's tokens are the engine's own, per-op
    times come from the eager pass (prefill whole, decode steps scaled to the timed count)."""
    from salactl.runtime.gpu.engine import GPUEngine
    from salactl.runtime.gpu.run_profile import generate_with_op_profile
    from salactl.runtime.sampling import SamplingParams

    # a sparse prompt (past dense_len 40); 2 profiled decode steps of 3 timed ones (each costs seconds)
    prompt = torch.randint(3, 128, (45,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_new_tokens=4, ignore_eos=True)
    engine = GPUEngine(micro_model(), "cpu", max_running_requests=1, chunk_size=32, kv_tokens=256)
    plain = engine.generate(prompt, params)
    res, note = generate_with_op_profile(engine, prompt, params, decode_steps=2)
    assert res.output_token_ids == plain.output_token_ids and res.decode.forward_calls == 3
    assert {"qkv", "mlp", "attention", "gla"} <= set(res.prefill.op_seconds)
    assert {"qkv", "mlp", "attention", "gla"} <= set(res.decode.op_seconds)
    assert "2 decode steps scaled to 3" in note["op_times"]
    assert engine.runner.cuda_graph is False and engine.profile_ops is False     # restored (CPU: no graphs)


def test_kernel_scales_builds_tensors_for_fp8_pages_only():
    """bf16 pages with float scales launch no fill kernel (the kernels read scales for FP8 only)."""
    from salactl.runtime.ops.decode_attention.triton import kernel_scales
    unused = torch.empty(1)
    assert all(t is unused for t in kernel_scales(torch.bfloat16, 2, "cpu", 1.0, 0.5, unused=unused))
    ks, vs = kernel_scales(torch.float8_e4m3fn, 2, "cpu", 0.5, torch.tensor([0.25, 2.0]), unused=unused)
    assert torch.equal(ks, torch.tensor([0.5, 0.5])) and torch.equal(vs, torch.tensor([0.25, 2.0]))
    assert ks.dtype == vs.dtype == torch.float32


def _engine_with_an_inf_token(chunk_size: int = 32):
    """A one-request GPUEngine whose token 99 embeds as inf (NaN logits for any prompt holding it),
    a good prompt, its params and the good prompt's tokens from a healthy engine."""
    from salactl.runtime.gpu.engine import GPUEngine
    from salactl.runtime.sampling import SamplingParams

    model = micro_model()
    good, params = [5, 6, 7, 8], SamplingParams(max_new_tokens=3, ignore_eos=True)
    want = GPUEngine(micro_model(), "cpu", max_running_requests=1, chunk_size=32, kv_tokens=256) \
        .generate(good, params).output_token_ids
    with torch.no_grad():
        model.model.embed_tokens.weight[99] = float("inf")
    return GPUEngine(model, "cpu", max_running_requests=1, chunk_size=chunk_size, kv_tokens=256), good, params, want


def test_a_failed_step_frees_its_requests_and_the_engine_carries_on():
    """A request whose logits are NaN (an inf embedding row) fails its step with NumericsError;
    it is finished as "error" with its slot and pages freed, so later requests still run (with
    one running request at most, a leaked slot would stall them for ever)."""
    from salactl.errors import NumericsError

    engine, good, params, want = _engine_with_an_inf_token()
    pages, slots = engine.scheduler.pages.free, engine.scheduler.slots.free
    bad = engine.submit([5, 99, 6], params)
    with pytest.raises(NumericsError):
        list(engine.events())
    assert engine.result(bad).finish_reason == "error"
    assert (engine.scheduler.pages.free, engine.scheduler.slots.free) == (pages, slots)
    assert engine.generate(good, params).output_token_ids == want
    queued = engine.submit(good, params)
    engine.abort(queued)
    assert engine.result(queued).finish_reason == "abort" and not engine.scheduler.has_work()


@pytest.mark.parametrize("end", ["failed", "prefill_only", "aborted_mid_prefill"])
def test_the_pages_of_a_request_with_nan_kv_do_not_fail_their_next_owner(end):
    """A request whose K/V went NaN leaves them in its freed pages, and the next request (LIFO page
    reuse) has them in the tail of its last, partly filled page, past its length: masked in the
    scores, but 0 x NaN in the V product. However the request ended (failed on its NaN logits, a
    prefill-only request that never samples, aborted before its first token), the engine zeroes
    a newly admitted request's pages."""
    engine, good, params, want = _engine_with_an_inf_token(chunk_size=16)
    end_a_nan_request(engine, [99] + list(range(3, 40)), params, end, 16)      # 38 tokens, all NaN
    assert torch.isnan(engine.pools.v.float()).any()
    assert engine.generate(good, params).output_token_ids == want


@pytest.mark.parametrize("kv", ["bf16", "fp8_e5m2"])
def test_clearing_pages_zeroes_them_in_every_sparse_layer_and_nothing_else(kv):
    from salactl.runtime.gpu.engine import GPUEngine

    pools = GPUEngine(micro_model(), "cpu", max_running_requests=1, chunk_size=32, kv_tokens=256,
                      kv_cache_dtype=kv).pools
    for t in (pools.k, pools.v, pools.k1):
        t.copy_(torch.full(t.shape, 1.5))
    pools.clear_pages([2, 0])
    for t in (pools.k, pools.v, pools.k1):
        assert t.shape[0] == 2 and not t[:, [0, 2]].float().any() and bool((t[:, [1, 3]].float() == 1.5).all())


def test_gpu_engine_and_engine_share_the_eos_contract():
    """Both stop at config.eos_token_id unless ignore_eos; eos_ids add stop ids."""
    from salactl.runtime.engine import Engine
    from salactl.runtime.gpu.engine import GPUEngine
    from salactl.runtime.sampling import SamplingParams

    model, prompt = micro_model(), [5, 6, 7, 8]
    free = Engine(model, "cpu").generate(prompt, SamplingParams(max_new_tokens=5, ignore_eos=True)).output_token_ids
    model.config = model.config.replace(eos_token_id=(free[1],))
    gpu = GPUEngine(model, "cpu", max_running_requests=1, chunk_size=32, kv_tokens=256)
    for params, eos_ids, want in ((SamplingParams(max_new_tokens=5), (), free[:2]),
                                  (SamplingParams(max_new_tokens=5), (free[0],), free[:1]),
                                  (SamplingParams(max_new_tokens=5, ignore_eos=True), (free[0],), free)):
        assert Engine(model, "cpu").generate(prompt, params, eos_ids).output_token_ids == want
        assert gpu.generate(prompt, params, eos_ids).output_token_ids == want


def test_engine_runs_ragged_prompts_in_one_prefill_and_batched_decode():
    """Several prompts in one prefill call (one past dense_len 40) and decode steps over all rows,
    each row against the reference Engine running it alone; the sparse row's two decode steps
    cross a page boundary (47, 48)."""
    rows = S.check_model_batched(micro_model(), "cpu", (5, 30, 47), decode_steps=2, chunk=256, tol=1e-3)
    assert len(rows) == 3 * 3
    bad = [r for r in rows if not r[1] <= r[2]]
    assert not bad, bad


def test_split_k_tickets_are_one_zeroed_buffer_per_device_and_outgrown_ones_are_kept(monkeypatch):
    from salactl.runtime.ops import split_k

    monkeypatch.setattr(split_k, "_BUFFERS", {})
    monkeypatch.setattr(split_k, "_RETIRED", [])
    cpu = torch.device("cpu")
    first = split_k.split_counters(cpu, 10)
    assert first.numel() == split_k.TICKETS and first.dtype == torch.int32 and not first.any()
    assert split_k.split_counters(cpu, split_k.TICKETS) is first
    grown = split_k.split_counters(cpu, split_k.TICKETS + 5)
    assert grown.numel() == split_k.TICKETS + 5 and not grown.any()
    assert split_k._RETIRED == [first] and split_k.split_counters(cpu, 3) is grown
