"""FlexAttention sparse prefill (runtime/ops/attention/flex_sparse.py) against the plain-PyTorch
attention reference on random paged inputs and random per-token selections, in eager
flex_attention on CPU (tiny shapes), for both query layouts; plus the block lists themselves:
every visible key lies in a listed block of its query tile, and every "full" block is entirely
visible (so skipping the mask_mod there is exact). GPU: the compiled kernel at sala-9b head
shapes against the same reference."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from salactl.runtime.ops.attention import flex_sparse as fs
from salactl.runtime.ops.attention.reference import attention
from salactl.runtime.ops.selection.check import contiguous_keys
from salactl.runtime.ops.selection.reference import sparse_token_mask
from conftest import gpu, rel_err

flex_mod = pytest.importorskip("torch.nn.attention.flex_attention")


def make_case(hq, hkv, D, B, pos0, n, K, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    nb = math.ceil((pos0 + n) / B)
    P = nb + 5
    W = nb + 3
    pt = torch.full((2, W), P - 1, dtype=torch.int32)
    pt[0, :nb] = torch.randperm(P, generator=gen)[:nb].to(torch.int32)
    kp = torch.randn(P, hkv, B, D, generator=gen)
    vp = torch.randn(P, hkv, B, D, generator=gen)
    q = torch.randn(n, hq, D, generator=gen)
    pos = pos0 + torch.arange(n)
    sel = torch.full((n, hkv, K), 10 ** 6, dtype=torch.int32)        # junk past the count
    cnt = torch.zeros(n, hkv, dtype=torch.int32)
    for i in range(n):
        own = int(pos[i]) // B
        for h in range(hkv):
            # own block always (as the forced local window); head 0 shares a common set so
            # that "full" blocks occur; some rows select fewer than K
            if h == 0:
                rest = [0, 1, 2] if own > 2 else []
            else:
                rest = torch.randperm(own, generator=gen)[:K - 1].tolist() if own else []
            blocks = ([own] + [b for b in rest if b != own])[:K if i % 5 else 2]
            sel[i, h, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            cnt[i, h] = len(blocks)
    dev = dict(device=device)
    return (q.to(dtype=dtype, **dev), kp.to(dtype=dtype, **dev), vp.to(dtype=dtype, **dev), pt.to(**dev),
            sel.to(**dev), cnt.to(**dev), pos.to(**dev), P)


def reference(q, kp, vp, pt, sel, cnt, pos, B):
    n, hkv, _ = sel.shape
    L = int(pos[-1]) + 1
    nb = math.ceil(L / B)
    blocks = torch.zeros(hkv, n, nb, dtype=torch.bool, device=q.device)
    for i in range(n):
        for h in range(hkv):
            blocks[h, i, sel[i, h, :int(cnt[i, h])].long()] = True
    allowed = sparse_token_mask(blocks, pos, L, B)
    k = contiguous_keys(kp, pt[0], L, B)
    v = contiguous_keys(vp, pt[0], L, B)
    return attention(q, k, v, pos, allowed)


@pytest.mark.parametrize("fold", [False, True])
def test_flex_sparse_matches_reference_eager(fold):
    hq, hkv, D, B = 8, 2, 32, 16
    q, kp, vp, pt, sel, cnt, pos, P = make_case(hq, hkv, D, B, pos0=300, n=150, K=6)
    inp = fs.build_inputs(sel, cnt, pt[0], 300, 150, P, hq, B, fold, pad_to=128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fs.sparse_attention(flex_mod.flex_attention, q, kp, vp, inp)
    ref = reference(q, kp, vp, pt, sel, cnt, pos, B)
    assert out.shape == ref.shape
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("fold", [False, True])
def test_block_lists_cover_mask_and_full_blocks_are_full(fold):
    hq, hkv, D, B = 8, 2, 32, 16
    pos0, n = 300, 150
    q, kp, vp, pt, sel, cnt, pos, P = make_case(hq, hkv, D, B, pos0=pos0, n=n, K=6, seed=1)
    inp = fs.build_inputs(sel, cnt, pt[0], pos0, n, P, hq, B, fold, pad_to=128)
    bm = inp.block_mask
    G = hq // hkv
    q_len, kv_len = bm.seq_lengths
    heads = hkv if fold else hq
    dense = flex_mod.create_mask(bm.mask_mod, 1, heads, q_len, kv_len, device="cpu")[0]   # [H, Q, KV]
    nqb, nkb = q_len // fs.Q_BLOCK, kv_len // B
    tiles = dense.view(heads, nqb, fs.Q_BLOCK, nkb, B)
    any_blk, all_blk = tiles.any(4).any(2), tiles.all(4).all(2)                # [H, nqb, nkb]
    listed = torch.zeros_like(any_blk)
    full = torch.zeros_like(any_blk)
    for dst, num, idx in ((listed, bm.kv_num_blocks, bm.kv_indices),
                          (full, bm.full_kv_num_blocks, bm.full_kv_indices)):
        for h in range(heads):
            for t in range(nqb):
                dst[h, t, idx[0, h, t, :int(num[0, h, t])].long()] = True
    assert not (listed & full).any()
    assert ((listed | full) >= any_blk).all()          # nothing visible is skipped
    assert (all_blk >= full).all()                     # full blocks need no mask_mod
    assert full.any() and listed.any()                 # both kinds occur in this case
    # the mask itself is the per-token selection: spot-check a token against sel/cnt
    i, h = 7, 1
    row = dense[h if fold else h * G, i * (G if fold else 1)]
    vis = row.nonzero().flatten()
    phys_page = vis // (hkv * B)
    assert ((vis // B) % hkv == h).all()
    inv = {int(p): b for b, p in enumerate(pt[0].tolist())}
    logical = sorted({inv[int(p)] for p in phys_page})
    assert logical == sorted(sel[i, h, :int(cnt[i, h])].tolist())


@gpu
@pytest.mark.parametrize("fold", [False, True])
def test_flex_sparse_gpu_bf16(fold):
    hq, hkv, D, B = 32, 2, 128, 64
    pos0, n = 2000, 300
    q, kp, vp, pt, sel, cnt, pos, P = make_case(hq, hkv, D, B, pos0, n, K=12, dtype=torch.bfloat16,
                                                device="cuda")
    inp = fs.build_inputs(sel, cnt, pt[0], pos0, n, P, hq, B, fold, pad_to=256)
    out = fs.sparse_attention(fs.compiled_flex(), q, kp, vp, inp, fs.kernel_options(B))
    ref = reference(q, kp, vp, pt, sel, cnt, pos, B)
    assert rel_err(out, ref) < 1e-2
