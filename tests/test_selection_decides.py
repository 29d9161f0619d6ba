"""InfLLM-V2 selection where the scores decide: top-k slots outnumber the forced init/local blocks, so
the kept block set of every query position is checked against a transcription of DESIGN.md §2
written here, plus the per-query dense/sparse switch at dense_len."""

import math

import pytest
import torch

from conftest import rel_err, run_backend, tiny_config
from salactl.runtime.ops.selection import compress_keys, num_windows, select_blocks
from test_sparse_attention import random_qkv, transcription

NEAR_TIE = 1e-6     # score gaps this small may round either way (runtime: fp32 K1, fused sums)


def kept_by_design(q, K, t, sc, hkv):
    """For the query at absolute position t (q [Hq, d]; K [L, Hkv, d]), per KV head g: (the blocks
    DESIGN.md §2 keeps, the score gap between the last kept and the first dropped scored block)."""
    hq, d = q.shape
    grp = hq // hkv
    ks, st, B = sc.kernel_size, sc.kernel_stride, sc.block_size
    nwin = (K.shape[0] - ks) // st + 1
    K1 = torch.stack([K[j * st:j * st + ks].double().mean(0) for j in range(nwin)])  # 1. mean pooling
    vis = [j for j in range(nwin) if j * st + ks - 1 <= t]                               # 2. visibility
    own = t // B
    kept, gaps = [], []
    for g in range(hkv):
        s = torch.zeros(len(vis), dtype=torch.float64)
        for h in range(g * grp, (g + 1) * grp):                   # 2. softmax per query head, summed
            if vis:
                s += torch.softmax(K1[vis, g] @ q[h].double() / math.sqrt(d), 0)
        ranked = []
        for b in range(own + 1):                                  # 3. candidates: blocks up to t's
            over = [float(s[i]) for i, j in enumerate(vis) if j * st < (b + 1) * B and j * st + ks > b * B]
            forced = b < sc.init_blocks or own - sc.window_size // B <= b <= own
            ranked.append((not forced, -max(over, default=-math.inf), b))   # forced first, ties: lower b
        ranked.sort()
        slots = sc.topk + sc.window_size // B                     # 4. keep T + W/B
        kept.append({b for _, _, b in ranked[:slots]})
        last, nxt = ranked[slots - 1:slots], ranked[slots:slots + 1]
        gap = nxt[0][1] - last[0][1] if last and nxt and last[0][0] and nxt[0][1] != math.inf else math.inf
        gaps.append(gap)
    return kept, gaps


@pytest.mark.parametrize("knobs", [
    dict(topk=4, window_size=32, init_blocks=0),     # 5 slots: own and previous block forced, 3 scored
    dict(topk=4, window_size=0, init_blocks=1),      # 4 slots: block 0 and own forced, 2 scored
    dict(topk=3, window_size=0, init_blocks=0),      # 3 slots: own forced, 2 scored
])
def test_kept_blocks_equal_design_at_every_position(knobs):
    cfg = tiny_config(dense_len=0, **knobs)
    sc, hkv = cfg.sparse_config, cfg.num_key_value_heads
    L = 640
    q, k, _ = random_qkv(cfg, L, 11)
    q, k = q.double(), k.double()
    pos = torch.arange(L)
    nb = math.ceil(L / sc.block_size)
    mask = select_blocks(q, compress_keys(k, sc, 0, num_windows(L, sc)), pos, sc, nb)   # [Hkv, L, nb]
    checked = decided = 0
    for t in range(L):
        want, gaps = kept_by_design(q[t], k, t, sc, hkv)
        for g in range(hkv):
            if gaps[g] < NEAR_TIE:
                continue
            got = set(mask[g, t].nonzero().flatten().tolist())
            assert got == want[g], (t, g)
            checked += 1
            decided += (t // sc.block_size + 1) > len(want[g])     # some candidate was dropped by score
    assert checked >= 2 * L - 4 and decided > L


def test_dense_len_switch_is_per_query_position():
    """dense_len 300: the query at 299 (t + 1 = 300) is the first sparse one, inside a prefill chunk
    or not; 298 stays dense."""
    cfg = tiny_config(dense_len=300, topk=1, window_size=32, init_blocks=0)
    q, k, v = random_qkv(cfg, 301, 4)
    for chunks in ([290, 10, 1], [299, 1, 1], [301]):
        got = run_backend(cfg, q, k, v, chunks)
        for t in (298, 299, 300):
            want = transcription(q[t], k, v, t, cfg.sparse_config, cfg.num_key_value_heads)
            assert rel_err(got[t], want) < 1e-5, (chunks, t)
    dense = run_backend(tiny_config(dense_len=10**6), q, k, v, [301])
    assert rel_err(dense[299], got[299]) > 1e-3          # the sparse row really drops blocks
