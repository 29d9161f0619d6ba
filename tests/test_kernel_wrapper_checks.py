"""What the Triton kernel wrappers accept: shapes and strides a kernel cannot run are refused with a
one-line message before any launch (so these run on any machine with triton, without the
interpreter), and the W8A16 int8-layout kernels take every group of 16k columns, checked through
the interpreter against the plain GPTQ reference."""

import pytest
import torch

from conftest import gpu, micro_model, rel_err
from test_w4a16_triton import _run_interpreted, interpreted, needs_triton

pytestmark = needs_triton

_W8_GROUPS_CHECK = """
import torch
from salactl.quant.linear import GPTQLinear
from salactl.quant.packing import default_g_idx, to_gptq_tensors
from salactl.runtime.ops.w4a16 import reference
from salactl.runtime.ops.w8a16.triton import W8Config, w8a16_linear

# K, N, group, rows: per-channel over K = 192 / 48 / 320 and groups of 96 / 160 (steps of 64, 16, 64,
# 32, 32 columns), the gemv and the tensor-core kernel, split-K over 3-5 steps (sms=4)
for K, N, G, M in [(192, 40, -1, 1), (192, 40, -1, 5), (192, 48, 96, 1), (48, 16, -1, 2),
                   (320, 24, -1, 1), (320, 48, 160, 3)]:
    gen = torch.Generator().manual_seed(K + N + M)
    codes = torch.randint(0, 256, (N, K), generator=gen)
    scales = (torch.rand(1 if G == -1 else K // G, N, generator=gen) * 0.01 + 0.001).half()
    t = to_gptq_tensors(codes, scales, default_g_idx(K, G), 8)
    mod = GPTQLinear.from_gptq(t["qweight"], t["scales"], t["g_idx"], 8, G, "cpu", torch.bfloat16)
    x = torch.randn(M, K, generator=gen).bfloat16()
    ref = reference.w4a16_matmul(x.float(), t["qweight"], t["scales"], t["g_idx"], 8)
    for cfg in (None, W8Config(gemv=0)):
        for _ in range(2):                        # the second call checks the split-K tickets were reset
            y = w8a16_linear(x, mod.qweight, scales, 4, cfg)      # fp16 scales, as on CUDA
            err = float((y.float() - ref).norm() / ref.norm())
            assert err < 5e-3, (K, N, G, M, cfg, err)
print("ok")
"""


@interpreted
def test_w8a16_kernels_take_groups_that_are_not_powers_of_two_in_the_interpreter():
    _run_interpreted(_W8_GROUPS_CHECK)


def test_w8a16_step_is_the_largest_power_of_two_dividing_the_group():
    """Today's steps for the groups that already ran (powers of two, multiples of 128); others get
    the largest power-of-two divisor; groups not of 16k columns are left to the dequantized path."""
    from salactl.runtime.ops.w8a16.triton import DEFAULT, DEFAULT_GEMV, group_fits, w8a16_linear

    for cfg in (DEFAULT, DEFAULT_GEMV):
        for g in (16, 32, 64, 128, 256, 384, 512, 4096):
            assert cfg.step(g) == min(cfg.block_k, g), g
        assert [cfg.step(g) for g in (192, 96, 48, 320, 160)] == [64, 32, 16, 64, 32]
    assert [group_fits(g) for g in (16, 48, 96, 192, 8, 24, 100)] == [True] * 4 + [False] * 3
    x, codes, scales = torch.zeros(1, 48), torch.zeros(2, 16, 24, dtype=torch.int8), torch.ones(2, 16)
    with pytest.raises(AssertionError, match="groups of 16k"):
        w8a16_linear(x.bfloat16(), codes, scales.half())


@gpu
@pytest.mark.parametrize("K,G", [(192, -1), (192, 96), (192, 24), (48, -1)])
def test_w8a16_int8_layout_on_cuda_for_any_group(K, G):
    """N = 40 keeps the int8 layout (no tensor-core fit): the kernel for groups of 16k columns, the
    dequantized weight for the rest, at every row count."""
    from salactl.quant.linear import GPTQLinear
    from salactl.quant.packing import default_g_idx, to_gptq_tensors
    from salactl.runtime.ops.w4a16 import reference

    gen = torch.Generator().manual_seed(K)
    N = 40
    codes = torch.randint(0, 256, (N, K), generator=gen)
    scales = (torch.rand(1 if G == -1 else K // G, N, generator=gen) * 0.01 + 0.001).half()
    t = to_gptq_tensors(codes, scales, default_g_idx(K, G), 8)
    mod = GPTQLinear.from_gptq(t["qweight"], t["scales"], t["g_idx"], 8, G, "cuda", torch.bfloat16)
    assert mod.layout == "int8"
    for rows in (1, 5, 65):
        x = torch.randn(rows, K, generator=gen).bfloat16()
        ref = reference.w4a16_matmul(x.float(), t["qweight"], t["scales"], t["g_idx"], 8)
        assert rel_err(mod(x.cuda()).float().cpu(), ref) < 1e-2, rows


def _config(head_dim: int, **sparse):
    import dataclasses

    cfg = micro_model().config
    return cfg.replace(head_dim=head_dim, lightning_head_dim=head_dim, hidden_size=4 * head_dim,
                       sparse_config=dataclasses.replace(cfg.sparse_config, **sparse))


@pytest.mark.parametrize("head_dim", [24, 8])
def test_gpu_engine_refuses_head_dims_its_kernels_cannot_run(head_dim, monkeypatch):
    from salactl.errors import ConfigError
    from salactl.runtime.checkpoint import random_state_dict
    from salactl.runtime.gpu.engine import GPUEngine
    from salactl.runtime.loader import build_model

    monkeypatch.setenv("TRITON_INTERPRET", "1")      # GPUEngine takes a CPU device only then
    cfg = _config(head_dim)
    model = build_model(cfg, random_state_dict(cfg, "cpu", torch.float32, 5))
    with pytest.raises(ConfigError, match=f"power-of-two head_dim >= 16, got {head_dim}; .*--backend reference"):
        GPUEngine(model, "cpu", max_running_requests=1, chunk_size=32, kv_tokens=256)
    assert type(model).__name__ == "SalaForCausalLM"     # refused before fuse_model re-classes it


def test_check_shapes_raises_config_errors():
    from salactl.errors import ConfigError
    from salactl.runtime.ops.selection.gpu import check_shapes

    check_shapes(_config(16))
    check_shapes(_config(64))
    with pytest.raises(ConfigError, match="power-of-two sparse_config.kernel_size, got 12"):
        check_shapes(_config(16, kernel_size=12))


def _paged(n=3, hq=4, hkv=2, d=16, block=16, width=4):
    """q [n, hq, d], K/V pages, page table, slots and seq_lens of n rows (contiguous)."""
    P = n * width
    pages = torch.zeros(P, hkv, block, d)
    pt = torch.arange(P, dtype=torch.int32).reshape(n, width)
    slots = torch.arange(n, dtype=torch.int32)
    lens = torch.tensor([5, 17, 33][:n], dtype=torch.int32)
    return torch.randn(n, hq, d), pages, pages.clone(), pt, slots, lens


def _every_other(t: torch.Tensor) -> torch.Tensor:
    """t's values in a view of stride 2 along its last dimension."""
    return torch.stack([t, torch.zeros_like(t)], -1).flatten(-2)[..., ::2]


def _strided_index_cases(pt, slots, lens):
    return [("page_table", (_every_other(pt), slots, lens)), ("slots", (pt, _every_other(slots), lens)),
            ("seq_lens", (pt, slots, _every_other(lens)))]


def test_decode_attention_and_store_kv_refuse_strided_index_tensors():
    from salactl.runtime.ops.decode_attention.triton import paged_attention, store_kv

    q, kp, vp, pt, slots, lens = _paged()
    k = torch.randn(3, 2, 16)
    for name, (pt_, slots_, lens_) in _strided_index_cases(pt, slots, lens):
        with pytest.raises(AssertionError, match=f"^{name} needs unit"):
            paged_attention(q, kp, vp, pt_, slots_, lens_, num_splits=2)
        with pytest.raises(AssertionError, match=f"^{name} needs unit"):
            store_kv(kp, vp, k, k, pt_, slots_, lens_)


def test_decode_attention_refuses_query_heads_not_a_multiple_of_kv_heads():
    from salactl.runtime.ops.decode_attention.triton import paged_attention

    q, kp, vp, pt, slots, lens = _paged(hq=5)
    with pytest.raises(AssertionError, match="5 query heads do not split into groups of the 2 KV heads"):
        paged_attention(q, kp, vp, pt, slots, lens, num_splits=2)


def test_selection_launchers_refuse_strided_index_tensors():
    from salactl.runtime.ops.selection.gpu import compress_update, select_decode, select_paged

    sc = micro_model().config.sparse_config
    q, kp, _, pt, slots, lens = _paged()
    k1 = torch.zeros(kp.shape[0], 2, sc.block_size // sc.kernel_stride, 16)
    for name, (pt_, slots_, lens_) in _strided_index_cases(pt, slots, lens):
        with pytest.raises(AssertionError, match=f"^{name} needs unit"):
            select_paged(q, k1, pt_, slots_, lens_, sc, 4, one_sequence=True)
        with pytest.raises(AssertionError, match=f"^{name} needs unit"):
            select_decode(q, k1, pt_, slots_, lens_, sc, 4)
    with pytest.raises(AssertionError, match="^k1_count needs unit"):
        select_decode(q, k1, pt, slots, lens, sc, 4, k_pages=kp, k1_start=lens, k1_count=_every_other(lens))
    with pytest.raises(AssertionError, match="^starts needs unit"):
        compress_update(kp, k1, pt, slots, _every_other(lens), lens, 2, sc)


def test_gla_decode_refuses_head_dims_and_slots_it_would_get_wrong():
    from salactl.runtime.ops.gla.triton import gla_decode_

    def run(K, V, slots=torch.arange(2, dtype=torch.int32)):
        q, k, v = torch.randn(2, 2, K), torch.randn(2, 2, K), torch.randn(2, 2, V)
        gla_decode_(q, k, v, -torch.ones(2), K ** -0.5, torch.zeros(2, 2, K, V), slots)

    for K, V in ((16, 48), (24, 24), (16, 80)):
        with pytest.raises(AssertionError, match=f"power-of-two head dims, got K={K}, V={V}"):
            run(K, V)
    with pytest.raises(AssertionError, match="^slots needs unit stride"):
        run(16, 16, _every_other(torch.arange(2, dtype=torch.int32)))


def test_fused_ops_refuse_a_strided_last_dimension():
    from salactl.runtime.ops.fused import triton as T

    x, w = torch.randn(3, 64), torch.randn(64)
    xs = _every_other(x)
    q = torch.randn(3, 4, 16)
    cos, w16 = torch.randn(3, 16), torch.randn(16)
    cases = [("add_rmsnorm: h", lambda: T.add_rmsnorm(xs, None, 1.0, w, 1e-6)),
             ("add_rmsnorm: delta", lambda: T.add_rmsnorm(x, xs, 1.0, w, 1e-6)),
             ("qk_norm_rope: q", lambda: T.qk_norm_rope(_every_other(q), q, w16, w16, cos, cos, 1e-6)),
             ("qk_norm_rope: sin", lambda: T.qk_norm_rope(q, q, w16, w16, cos, _every_other(cos), 1e-6)),
             ("rmsnorm_gate: z", lambda: T.rmsnorm_gate(x, w, xs, 1e-6)),
             ("sigmoid_gate: o", lambda: T.sigmoid_gate(xs, x)),
             ("silu_mul: gate_up", lambda: T.silu_mul(xs))]
    for message, call in cases:
        with pytest.raises(AssertionError, match=f"^{message} needs a contiguous last dimension"):
            call()
    with pytest.raises(AssertionError, match="qk_norm_rope: cos and sin need the same row stride"):
        T.qk_norm_rope(q, q, w16, w16, cos, torch.randn(3, 32)[:, :16], 1e-6)
    with pytest.raises(AssertionError, match="even width"):
        T.silu_mul(torch.randn(3, 2 * 1025 + 1))


def test_w4a16_refuses_scales_of_the_wrong_shape():
    from salactl.runtime.ops.w4a16.layout import pack_tc
    from salactl.runtime.ops.w4a16.triton_tc import w4a16_tc, w4a16_tc_dequantize

    K, N = 384, 16
    qweight = pack_tc(torch.randint(0, 16, (K, N)))
    x = torch.randn(2, K).bfloat16()
    s128 = torch.ones(3, N).half()
    for scales, group in ((s128, -1), (s128, 64), (s128.t().contiguous(), 128), (torch.ones(4, N).half(), 256)):
        want = 1 if group == -1 else -(-K // group)
        with pytest.raises(AssertionError, match=rf"scales \(.*\) for a 16x384 weight .*need \({want}, {N}\)"):
            w4a16_tc(x, qweight, scales, group)
        with pytest.raises(AssertionError, match=rf"need \({want}, {N}\)"):
            w4a16_tc_dequantize(qweight, scales, group)


def test_run_falls_back_to_the_reference_engine_for_shapes_the_gpu_kernels_cannot_run(capsys):
    from salactl.run_job import _gpu_engine_runs

    assert _gpu_engine_runs(_config(16))
    assert not _gpu_engine_runs(_config(24))
    assert "head_dim >= 16, got 24: running the reference engine" in capsys.readouterr().err
