"""Decode selection (select_decode, with and without the fused K1 update) against
reference.select_blocks on random paged inputs: the exact selected set *and* order (descending
score, ties -> lower block index, forced blocks first). Used by tests (CPU interpreter in fp32,
GPU in bf16/fp32) and benchmarks/sparse_decode_bench.py. Returns [(name, err, tol)] rows."""

from __future__ import annotations

import math

import torch

from salactl.runtime.config import SparseConfig


def paged_keys(lens, hkv, d, B, dtype, device, ties=False, gen=None, width=None):
    """Page table [len(lens)+1, width] (last row: an unused slot; width defaults to the longest
    row + 2 pages) over a random permutation of pages, and K pages [P+1, hkv, B, d]. ties=True
    makes runs of whole blocks identical (exact score ties between blocks)."""
    need = [math.ceil(L / B) for L in lens]
    P = sum(need) + 3                   # spare pages no row owns
    perm = torch.randperm(P, generator=gen).to(torch.int32)
    width = max(max(need) + 2, width or 0)
    pt = torch.full((len(lens) + 1, width), P, dtype=torch.int32)
    off = 0
    for i, c in enumerate(need):
        pt[i, :c] = perm[off:off + c]
        off += c
    kp = torch.randn(P + 1, hkv, B, d, generator=gen)
    if ties:
        for i, c in enumerate(need):
            for lo, hi in ((2, c // 3), (c // 2, c - 3)):       # blocks with equal keys
                if hi > lo:
                    row = kp[int(pt[i, lo])].clone()
                    for b in range(lo + 1, hi):
                        kp[int(pt[i, b])] = row
    return pt.to(device), kp.to(device=device, dtype=dtype)


def contiguous_keys(kp, pt_row, L, B):
    pages = pt_row[:math.ceil(L / B)].long()
    return kp[pages].transpose(0, 1).reshape(kp.shape[1], -1, kp.shape[-1])[:, :L].transpose(0, 1)


def window_slots(pt_row, nw: int, sc: SparseConfig):
    """(page, slot) of windows 0..nw-1 in the K1 pool: the page of the window's first token."""
    first = torch.arange(nw, device=pt_row.device) * sc.kernel_stride
    return pt_row[first // sc.block_size].long(), (first % sc.block_size) // sc.kernel_stride


def expected_order(scores: torch.Tensor, k: int) -> list[int]:
    """Reference ranking of one row: descending score, ties -> lower index, -inf excluded."""
    order = torch.sort(scores, descending=True, stable=True).indices.tolist()
    return [b for b in order if scores[b] > float("-inf")][:k]


def row_mismatch(got: list[int], scores: torch.Tensor, k: int, rel: float) -> bool:
    """True unless `got` is the reference order, up to swaps between finite near-equal (but not
    equal: exact ties come from identical inputs and must break by index) scores."""
    exp = expected_order(scores, k)
    if got == exp:
        return False
    if len(got) != len(exp) or len(set(got)) != len(got):
        return True
    finite = scores[torch.isfinite(scores)]
    scale = float(finite.abs().max()) if finite.numel() else 1.0
    for g, e in zip(got, exp):
        sg, se = float(scores[g]), float(scores[e])
        near = math.isfinite(sg) and math.isfinite(se) and 0 < abs(sg - se) <= rel * scale
        if g != e and not near:
            return True
    return False


def check_decode_selection(device, dtype, hq: int, hkv: int, d: int, sc: SparseConfig, lens,
                           ties: bool = False, seed: int = 0, rel: float = 1e-5, width=None,
                           tunes=None, **tune) -> list:
    """lens: each row's seq_len (one row per sequence, slot i). Checks K1 from the fused update
    (last window of every row compressed by select_decode itself) and the selection, for `tune`
    (SelectionTuning knobs over gpu.DECODE_TUNING) or each knob dict of `tunes` on the same
    inputs; width: page-table width (blocks) at least."""
    from salactl.runtime.ops.selection.gpu import DECODE_TUNING, select_decode
    from salactl.runtime.ops.selection.reference import (block_scores, compress_keys, num_windows,
                                                         window_scores)

    gen = torch.Generator().manual_seed(seed)
    B, st, ks = sc.block_size, sc.kernel_stride, sc.kernel_size
    pt, kp = paged_keys(lens, hkv, d, B, dtype, device, ties=ties, gen=gen, width=width)
    wpp = B // st
    k1p = torch.zeros(kp.shape[0], hkv, wpp, d, device=device, dtype=dtype)
    n = len(lens)
    slots = torch.arange(n, dtype=torch.int32, device=device)
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    nw = [num_windows(L, sc) for L in lens]
    done = [int(L - ks >= 0 and (L - ks) % st == 0) for L in lens]   # this token completes a window
    have = [w - c for w, c in zip(nw, done)]
    i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    for i, L in enumerate(lens):                  # windows before this token: from the reference
        if have[i]:
            pg, sl = window_slots(pt[i], have[i], sc)
            k1p[pg, :, sl] = compress_keys(contiguous_keys(kp, pt[i], L, B), sc, 0, have[i])
    q = (torch.randn(n, hq, d, generator=gen) * 2).to(device=device, dtype=dtype)
    nb_max = pt.shape[1]
    k = min(sc.selected_blocks, nb_max)
    refs = []
    for i, L in enumerate(lens):
        K1 = compress_keys(contiguous_keys(kp, pt[i], L, B), sc, 0, nw[i])
        pos = torch.tensor([L - 1], device=device)
        nb = math.ceil(L / B)
        # in fp64: an fp32 reference ties unrelated blocks by rounding now and then (three
        # blocks at 140001 tokens in one of 12 fp32 rows), and exact ties must break by index
        scores = block_scores(window_scores(q[i:i + 1].double(), K1.double(), pos, sc), pos, sc, nb)
        refs.append((K1, scores[:, 0].cpu()))
    rows = []
    for tn in (tunes if tunes is not None else [tune]):
        sel, cnt = select_decode(q, k1p, pt, slots, seq, sc, nb_max, k_pages=kp, k1_start=i32(have),
                                 k1_count=i32(done), tuning=DECODE_TUNING.with_knobs(**tn))
        sel, cnt = sel.cpu(), cnt.cpu()
        k1_err, bad = 0.0, 0
        for i, (K1, scores) in enumerate(refs):
            if nw[i]:
                pg, sl = window_slots(pt[i], nw[i], sc)
                got_k1 = k1p[pg, :, sl].float()
                k1_err = max(k1_err, float((got_k1 - K1.float()).norm() / K1.float().norm().clamp_min(1e-30)))
            for h in range(hkv):
                c = int(cnt[i, h])
                if row_mismatch(sel[i, h, :c].tolist(), scores[h], k, rel):
                    bad += 1
        shown = lens if len(lens) <= 6 else f"{len(lens)} rows"
        tag = f"{'ties' if ties else 'random'} lens={shown} {tn or ''}".strip()
        rows += [(f"select_decode.k1_fused {tag}", k1_err, 1e-2 if dtype != torch.float32 else 1e-5),
                 (f"select_decode.rows_differing {tag}", float(bad), 0.0)]
    return rows
