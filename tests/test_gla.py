import pytest
import torch

from salactl.runtime.layers.lightning import LightningAttention, alibi_slopes
from salactl.runtime.ops.gla import gla_chunked, gla_recurrent
from conftest import rel_err, tiny_config


def masked_decay_attention(q, k, v, g, scale, s0):
    """O(T²) form: o_t = Σ_{j<=t} exp(g(t-j)) (scale q_t·k_j) v_j + exp(g(t+1)) (scale q_t) S0."""
    T = q.shape[0]
    t = torch.arange(T, dtype=torch.float64)
    diff = t[:, None] - t[None, :]
    decay = torch.exp(g.double()[:, None, None] * diff.clamp(min=0)) * (diff >= 0)
    att = torch.einsum("ihk,jhk->hij", q.double() * scale, k.double()) * decay
    o = torch.einsum("hij,jhv->ihv", att, v.double())
    o += torch.einsum("thk,hkv->thv", q.double() * scale, s0.double()) * torch.exp(
        g.double()[None, :, None] * (t[:, None, None] + 1))
    return o


def test_alibi_slopes_match_reference_values():
    s = alibi_slopes(32)
    assert abs(s[0] - 0.8409) < 1e-4 and abs(s[3] - 0.5) < 1e-9 and abs(s[31] - 2 ** -8) < 1e-12
    assert len(alibi_slopes(12)) == 12 and len(alibi_slopes(8)) == 8
    # not a power of two (Press et al.): the 4 slopes of 4 heads, then every other slope of 8 heads,
    # starting with the first
    assert alibi_slopes(6) == pytest.approx([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3], rel=1e-12)
    assert alibi_slopes(12)[8:] == pytest.approx([2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5], rel=1e-12)


def test_recurrence_equals_masked_decay_attention():
    g = torch.Generator().manual_seed(0)
    T, H, D = 37, 4, 16
    q, k, v = (torch.randn(T, H, D, generator=g) for _ in range(3))
    gam = -torch.tensor(alibi_slopes(H))
    s0 = torch.randn(H, D, D, generator=g)
    ref = masked_decay_attention(q, k, v, gam, D ** -0.5, s0)
    o_rec, s_rec = gla_recurrent(q, k, v, gam, D ** -0.5, s0)
    o_chk, s_chk = gla_chunked(q, k, v, gam, D ** -0.5, s0, chunk=8)
    assert rel_err(o_rec, ref) < 1e-5
    assert rel_err(o_chk, ref) < 1e-5
    assert rel_err(s_chk, s_rec) < 1e-5


def test_chunked_state_carry_matches_one_call():
    g = torch.Generator().manual_seed(1)
    T, H, D = 50, 2, 8
    q, k, v = (torch.randn(T, H, D, generator=g) for _ in range(3))
    gam = -torch.tensor(alibi_slopes(H))
    s0 = torch.zeros(H, D, D)
    o_all, s_all = gla_chunked(q, k, v, gam, 0.3, s0, chunk=16)
    o1, s1 = gla_chunked(q[:21], k[:21], v[:21], gam, 0.3, s0, chunk=16)
    o2, s2 = gla_chunked(q[21:], k[21:], v[21:], gam, 0.3, s1, chunk=16)
    assert rel_err(torch.cat([o1, o2]), o_all) < 1e-6 and rel_err(s2, s_all) < 1e-6


def test_16_bit_inputs_are_computed_in_fp32():
    """bf16/fp16 q, k, v give exactly the fp32 call on the same (upcast) values: scale·q is not
    rounded to 16 bits, and the output and state are fp32."""
    g = torch.Generator().manual_seed(2)
    T, H, D = 9, 2, 8
    gam = -torch.tensor(alibi_slopes(H))
    s0 = torch.randn(H, D, D, generator=g)
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = (torch.randn(T, H, D, generator=g).to(dtype) for _ in range(3))
        for fn, kw in ((gla_recurrent, {}), (gla_chunked, {"chunk": 4})):
            o, s = fn(q, k, v, gam, 0.3, s0, **kw)
            o32, s32 = fn(q.float(), k.float(), v.float(), gam, 0.3, s0, **kw)
            assert o.dtype == s.dtype == torch.float32
            assert torch.equal(o, o32) and torch.equal(s, s32), (dtype, fn.__name__)


def test_a_decay_strong_enough_to_overflow_exp_of_its_opposite_stays_finite():
    """The in-chunk decay exp(g·(i-j)) is taken at i-j >= 0 only: with g = -3 over a 64-token chunk,
    exp(-g·63) would overflow fp32 above the diagonal (inf·0 = NaN)."""
    g = torch.Generator().manual_seed(3)
    T, H, D = 64, 2, 4
    q, k, v = (torch.randn(T, H, D, generator=g) for _ in range(3))
    gam = torch.tensor([-3.0, -0.01])
    s0 = torch.randn(H, D, D, generator=g)
    o, s = gla_chunked(q, k, v, gam, 0.5, s0, chunk=64)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    assert rel_err(o, masked_decay_attention(q, k, v, gam, 0.5, s0)) < 1e-5


def test_no_tokens_leave_the_state_unchanged():
    s0 = torch.randn(2, 4, 3)
    for fn in (gla_recurrent, gla_chunked):
        o, s = fn(torch.zeros(0, 2, 4), torch.zeros(0, 2, 4), torch.zeros(0, 2, 3), torch.tensor([-0.5, -0.1]), 0.5, s0)
        assert o.shape == (0, 2, 3) and torch.equal(s, s0)


def test_the_layer_caches_its_decay_per_device():
    layer = LightningAttention(tiny_config(), 0)
    cpu = layer.g_gamma(torch.device("cpu"))
    assert layer.g_gamma(torch.device("cpu")) is cpu            # cached, not rebuilt each forward
    assert torch.equal(cpu, -torch.tensor(alibi_slopes(layer.heads)))
    assert layer.g_gamma(torch.device("meta")).device.type == "meta"     # another device: rebuilt there
    assert layer.g_gamma(torch.device("cpu")).device.type == "cpu"
