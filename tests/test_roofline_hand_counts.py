"""Attention and GLA bytes/FLOPs of runtime/roofline.py's call_costs for the real MiniCPM-SALA shapes,
counted by hand from DESIGN.md §2 (what a query attends) and the roofline's counting rules: sparse
decode (each query reads only its topk + W/B selected blocks), dense decode and prefill chunks."""

import pytest

from salactl.runtime.presets import sala_9b
from salactl.runtime.roofline import LinearCost, call_costs

CFG = sala_9b()
HQ, HKV, D = 32, 2, 128            # minicpm4 layers: query heads, KV heads, head dim
N_SPARSE, N_LIGHT = 8, 24          # minicpm4 / lightning-attn layers
H, DK = 32, 128                    # lightning heads, head dim (dk = dv)
SELECTED = (64 + 2048 // 64) * 64  # topk + window/block = 96 blocks of 64 tokens: 6144 keys at most
DENSE_LEN, KS, ST = 8192, 32, 16
BF16, FP32 = 2, 4


def costs(rows):
    # zero linears: only the attention and gla classes are checked here
    no_linears = {c: LinearCost() for c in ("qkv", "gates", "o_proj", "mlp", "lm_head")}
    return call_costs(CFG, no_linears, rows, len(rows))


def visible_windows(t):
    """Compressed-key windows j a query at position t sees: j·st + ks − 1 <= t (DESIGN.md §2 step 2)."""
    return sum(1 for j in range(t // ST + 1) if j * ST + KS - 1 <= t)


def attention_by_hand(n, ctx):
    """(bytes, flops) of one sequence's n new tokens after ctx cached ones, over the 8 minicpm4 layers."""
    total = ctx + n
    attended = k1_scored = 0
    sparse_rows = 0
    for t in range(ctx, total):
        if t + 1 >= DENSE_LEN:         # sparse query: its 96 selected blocks (whole blocks counted)
            attended += min(t + 1, SELECTED)
            k1_scored += visible_windows(t)
            sparse_rows += 1
        else:                          # dense causal query: keys 0..t
            attended += t + 1
    # K/V read: a sparse decode query reads its selected blocks only; otherwise the whole cache
    read = min(total, SELECTED) if (n == 1 and sparse_rows) else total
    kv_read = read * 2 * HKV * D * BF16            # K and V of every read token
    kv_write = n * 2 * HKV * D * BF16              # the new tokens' K and V
    q_and_o = n * 2 * HQ * D * BF16                # q read, o written
    k1_read = (((total - KS) // ST + 1) * HKV * D * BF16) if sparse_rows else 0   # all K1 once
    flops = 4 * HQ * D * attended + 2 * HQ * D * k1_scored   # q·k and p·v; q·K1 scoring
    return N_SPARSE * (kv_read + kv_write + q_and_o + k1_read), N_SPARSE * flops


def gla_by_hand(n, chunk=64):
    """(bytes, flops) of n tokens of one sequence over the 24 lightning layers."""
    state = 2 * H * DK * DK * FP32                 # fp32 state [32,128,128] read and written once
    qkvo = n * 4 * H * DK * BF16                   # q, k, v read, o written
    state_flops = n * 4 * H * DK * DK              # S += kᵀv (2·dk·dv) and q·S (2·dk·dv) per token
    pairs = n * min(n, chunk) // 2 if n > 1 else 0     # ≈ intra-chunk (query, key) pairs
    intra = 2 * H * (DK + DK) * pairs              # q·k and p·v inside a chunk
    return N_LIGHT * (state + qkvo), N_LIGHT * (state_flops + intra)


@pytest.mark.parametrize("rows", [
    [(1, 20000)],                                   # sparse decode
    [(1, 131072)],                                  # sparse decode at 128K
    [(1, 20000), (1, 131072), (1, 4096), (1, 8191)],   # batch 4: sparse, sparse, dense, first sparse step
    [(1, 4096)],                                    # dense decode
    [(1, 8190)],                                    # last dense step: t + 1 = 8191 < dense_len
    [(512, 7680)],                                  # prefill chunk whose last query turns sparse
    [(256, 20000)],                                 # prefill chunk wholly past dense_len
])
def test_attention_and_gla_match_hand_counts(rows):
    c = costs(rows)
    want_attn = [attention_by_hand(n, ctx) for n, ctx in rows]
    want_gla = [gla_by_hand(n) for n, _ in rows]
    assert c["attention"].bytes == sum(b for b, _ in want_attn)
    assert c["attention"].flops == sum(f for _, f in want_attn)
    assert c["gla"].bytes == sum(b for b, _ in want_gla)
    assert c["gla"].flops == sum(f for _, f in want_gla)


def test_sparse_decode_literal_numbers():
    """One step at 20000 cached tokens, written out: 6144 keys read, 1249 compressed keys scored."""
    c = costs([(1, 20000)])
    assert (20000 - KS) // ST + 1 == visible_windows(20000) == 1249
    per_layer = 6144 * 2 * 2 * 128 * 2 + 2 * 2 * 128 * 2 + 2 * 32 * 128 * 2 + 1249 * 2 * 128 * 2
    assert c["attention"].bytes == 8 * per_layer
    assert c["attention"].flops == 8 * (4 * 32 * 128 * 6144 + 2 * 32 * 128 * 1249)
    assert c["gla"].flops == 24 * 4 * 32 * 128 * 128
    # a dense step attends every key it sees
    assert costs([(1, 4096)])["attention"].flops == 8 * 4 * 32 * 128 * 4097


def test_prefill_chunk_literal_numbers():
    """512 tokens after 7680: queries at 7680..8190 dense (7681..8191 keys), 8191 sparse (6144)."""
    c = costs([(512, 7680)])
    attended = sum(range(7681, 8192)) + 6144
    assert attended == 4_061_440
    per_layer = 8192 * 2 * 2 * 128 * 2 + 512 * 2 * 2 * 128 * 2 + 512 * 2 * 32 * 128 * 2 + 511 * 2 * 128 * 2
    assert c["attention"].bytes == 8 * per_layer
    assert c["attention"].flops == 8 * (4 * 32 * 128 * attended + 2 * 32 * 128 * 511)
    assert c["gla"].flops == 24 * (4 * 32 * 128 * 128 * 512 + 2 * 32 * 256 * (512 * 64 // 2))
    assert c["gla"].bytes == 24 * (2 * 32 * 128 * 128 * 4 + 512 * 4 * 32 * 128 * 2)
