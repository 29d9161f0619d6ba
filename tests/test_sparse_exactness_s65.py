"""Independent exactness check of the InfLLM-V2 sparse path (DESIGN.md §2, steps 1-5).

`literal_*` below is written from the DESIGN text alone, in float64 Python loops over queries, heads,
windows and blocks; the reference selection, the reference backend (gathered, masked and SDPA
attention, contiguous or FP8 cache, one or many sequences per batch), the training backend and the
`minicpm4` layer must agree with it for every query, whatever the prefill chunking. Small shapes:
head_dim 4 and integer-valued keys keep the scores exact, so ties are real ties.

Where the text leaves a choice open, this follows the documented reading: forced blocks all rank
as +inf, so when init + local blocks exceed the topk + W/B budget the lowest-indexed ones are kept
(SparseConfig.forced_blocks_note).
"""

import math

import pytest
import torch

from conftest import micro_model, run_backend
from salactl.runtime.backend_reference import ReferenceBackend
from salactl.runtime.backend_train import TrainBatch, TrainingBackend
from salactl.runtime.batch import ForwardBatch
from salactl.runtime.cache import SequenceCache
from salactl.runtime.config import LIGHTNING, SPARSE, SalaConfig, SparseConfig
from salactl.runtime.kv_fp8 import dequantize_kv, fp8_dtype, quantize_kv
from salactl.runtime.ops.attention import sdpa
from salactl.runtime.ops.selection.reference import compress_keys, num_windows, select_blocks


# ---- the literal definition -------------------------------------------------------------------

def literal_k1(K, g, j, sc):
    """Step 1: mean of K[j·st : j·st+ks] for KV head g."""
    rows = [K[i][g] for i in range(j * sc.kernel_stride, j * sc.kernel_stride + sc.kernel_size)]
    return [sum(r[c] for r in rows) / sc.kernel_size for c in range(len(rows[0]))]


def literal_blocks(Qt, K, t, sc, hkv):
    """Steps 2-4 for the query at position t (Qt [Hq][d], K [L][Hkv][d]): sorted kept blocks per KV head."""
    st, ks, B, W = sc.kernel_stride, sc.kernel_size, sc.block_size, sc.window_size
    d, group = len(Qt[0]), len(Qt) // hkv
    visible = []
    while len(visible) * st + ks - 1 <= t:
        visible.append(len(visible))
    kept = []
    for g in range(hkv):
        k1 = {j: literal_k1(K, g, j, sc) for j in visible}
        s = {j: 0.0 for j in visible}
        for h in range(g * group, (g + 1) * group):
            if not visible:
                break
            logit = {j: sum(Qt[h][c] * k1[j][c] for c in range(d)) / math.sqrt(d) for j in visible}
            top = max(logit.values())
            e = {j: math.exp(x - top) for j, x in logit.items()}
            z = sum(e.values())
            for j in visible:
                s[j] += e[j] / z
        own = t // B
        ranked = []
        for b in range(own + 1):                      # blocks after t's block are not candidates
            score = -math.inf
            for j in visible:
                if j * st < (b + 1) * B and j * st + ks > b * B:
                    score = max(score, s[j])
            forced = b < sc.init_blocks or own - W // B <= b <= own
            ranked.append((0 if forced else 1, 0.0 if forced else -score, b))   # ties -> lower index
        ranked.sort()
        kept.append(sorted(b for _, _, b in ranked[:sc.topk + W // B]))
    return kept


def literal_attention(Qt, K, V, t, sc, hkv):
    """Step 5, then causal softmax over the kept blocks' tokens (or all tokens <= t when dense)."""
    d, group = len(Qt[0]), len(Qt) // hkv
    blocks = literal_blocks(Qt, K, t, sc, hkv) if t + 1 >= sc.dense_len else None
    out = []
    for h in range(len(Qt)):
        g = h // group
        if blocks is None:
            toks = list(range(t + 1))
        else:
            toks = [i for b in blocks[g] for i in range(b * sc.block_size, (b + 1) * sc.block_size) if i <= t]
        logit = [sum(Qt[h][c] * K[i][g][c] for c in range(d)) / math.sqrt(d) for i in toks]
        top = max(logit)
        e = [math.exp(x - top) for x in logit]
        z = sum(e)
        out.append([sum(e[n] * V[toks[n]][g][c] for n in range(len(toks))) / z for c in range(len(V[0][g]))])
    return out


def literal_all(q, k, v, sc, hkv):
    Q, K, V = q.double().tolist(), k.double().tolist(), v.double().tolist()
    return torch.tensor([literal_attention(Q[t], K, V, t, sc, hkv) for t in range(len(Q))], dtype=torch.float64)


# ---- fixtures -----------------------------------------------------------------------------------

def config(hq, hkv, d=4, **sparse):
    return SalaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=hq, num_key_value_heads=hkv, head_dim=d,
                      mixer_types=(SPARSE, LIGHTNING), lightning_nh=hq, lightning_nkv=hq,
                      lightning_head_dim=d, dim_model_base=16, eos_token_id=(2,), initializer_range=0.1,
                      sparse_config=SparseConfig(**sparse))


def qkv(L, hq, hkv, d, seed, ints=True, repeat_block=None):
    """Integer-valued q/k (exact K1 means and logits for power-of-two kernels); repeat_block: every
    block's keys equal the first block's, so every block score ties."""
    g = torch.Generator().manual_seed(seed)
    if ints:
        q = torch.randint(-3, 4, (L, hq, d), generator=g).float()
        k = torch.randint(-3, 4, (L, hkv, d), generator=g).float()
    else:
        q = torch.randn(L, hq, d, generator=g)
        k = torch.randn(L, hkv, d, generator=g) + 2 * torch.randn(L, 1, 1, generator=g)
    if repeat_block:
        k = k[:repeat_block].repeat(L // repeat_block + 1, 1, 1)[:L].clone()
    return q, k, torch.randn(L, hkv, d, generator=g)


def chunkings(L):
    return [[L], [1] * L, [3, L - 10, 7] if L > 10 else [L]]


def assert_close(got, want, what):
    err = (got.double() - want).abs().amax(dim=tuple(range(1, want.dim())))
    bad = (err > 2e-5).nonzero().flatten().tolist()
    assert not bad, f"{what}: rows {bad[:8]} differ from the literal definition (max {float(err.max()):.3g})"


# (block, stride, kernel, window, init, topk, dense_len), GQA (hq, hkv), L
CASES = [
    pytest.param(dict(block_size=8, kernel_stride=4, kernel_size=8, window_size=8, init_blocks=1, topk=4,
                      dense_len=0), (4, 2), 61, id="default-shape"),
    pytest.param(dict(block_size=4, kernel_stride=2, kernel_size=8, window_size=0, init_blocks=0, topk=3,
                      dense_len=0), (3, 1), 37, id="window0-kernel>block-no-init"),
    pytest.param(dict(block_size=8, kernel_stride=8, kernel_size=8, window_size=16, init_blocks=3, topk=1,
                      dense_len=0), (2, 2), 53, id="kernel==stride-init-local-overlap-forced-past-budget"),
    pytest.param(dict(block_size=16, kernel_stride=4, kernel_size=16, window_size=16, init_blocks=1, topk=20,
                      dense_len=0), (8, 2), 61, id="topk-past-candidates"),
    pytest.param(dict(block_size=8, kernel_stride=2, kernel_size=4, window_size=8, init_blocks=1, topk=4,
                      dense_len=21), (4, 1), 51, id="dense-then-sparse"),
]


@pytest.mark.parametrize("sparse,heads,L", CASES)
def test_selected_blocks_equal_the_literal_definition(sparse, heads, L):
    hq, hkv = heads
    sc = SparseConfig(**sparse)
    q, k, _ = qkv(L, hq, hkv, 4, seed=L)
    got = select_blocks(q, compress_keys(k, sc, 0, num_windows(L, sc)), torch.arange(L), sc,
                        math.ceil(L / sc.block_size))
    Q, K = q.double().tolist(), k.double().tolist()
    for t in range(L):
        want = literal_blocks(Q[t], K, t, sc, hkv)
        for g in range(hkv):
            assert got[g, t].nonzero().flatten().tolist() == want[g], (t, g)


@pytest.mark.parametrize("sparse,heads,L", CASES)
def test_outputs_equal_the_literal_definition_in_every_chunking(sparse, heads, L):
    hq, hkv = heads
    cfg = config(hq, hkv, **sparse)
    q, k, v = qkv(L, hq, hkv, 4, seed=L + 1)
    want = literal_all(q, k, v, cfg.sparse_config, hkv)
    for chunks in chunkings(L):
        assert_close(run_backend(cfg, q, k, v, chunks), want, f"chunks {chunks[:4]}")


def test_exact_ties_keep_the_lower_index_in_every_chunking():
    """Every block holds the same keys: all block scores tie exactly, so the kept non-forced blocks
    are the lowest-indexed candidates, for one-shot prefill, decode and uneven chunks alike."""
    sparse = dict(block_size=8, kernel_stride=4, kernel_size=8, window_size=8, init_blocks=1, topk=3, dense_len=0)
    cfg = config(4, 2, **sparse)
    L = 60
    q, k, v = qkv(L, 4, 2, 4, seed=7, repeat_block=8)
    want = literal_all(q, k, v, cfg.sparse_config, 2)
    t = L - 1
    assert literal_blocks(q[t].double().tolist(), k.double().tolist(), t, cfg.sparse_config, 2) == [[0, 1, 6, 7]] * 2
    for chunks in chunkings(L):
        assert_close(run_backend(cfg, q, k, v, chunks), want, f"chunks {chunks[:4]}")


def test_queries_at_dense_len_minus_one_and_around_it():
    """Query t is sparse iff t+1 >= dense_len: t = dense_len-2 attends densely, t = dense_len-1, dense_len,
    dense_len+1 sparsely, whether the boundary falls inside a chunk or between decode steps."""
    sparse = dict(block_size=4, kernel_stride=2, kernel_size=4, window_size=0, init_blocks=1, topk=1, dense_len=30)
    cfg = config(2, 1, **sparse)
    L = 33
    q, k, v = qkv(L, 2, 1, 4, seed=3, ints=False)
    want = literal_all(q, k, v, cfg.sparse_config, 1)
    dense = literal_all(q, k, v, SparseConfig(**{**sparse, "dense_len": L + 1}), 1)
    assert torch.equal(want[:29], dense[:29])
    assert all((want[t] - dense[t]).abs().max() > 1e-3 for t in (29, 30, 31, 32))    # the switch matters
    for chunks in ([L], [1] * L, [28, 1, 1, 3], [29, 4], [30, 3], [31, 2]):
        assert_close(run_backend(cfg, q, k, v, chunks), want, f"chunks {chunks}")


@pytest.mark.parametrize("dtype_name", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_cache_equals_the_definition_on_dequantized_keys_and_values(dtype_name):
    sparse = dict(block_size=8, kernel_stride=4, kernel_size=8, window_size=8, init_blocks=1, topk=2, dense_len=9)
    cfg = config(4, 2, **sparse)
    L = 41
    q, k, v = qkv(L, 4, 2, 4, seed=11, ints=False)
    layer = cfg.sparse_layers[0]
    scales = {layer: (torch.tensor([0.03, 0.5]), torch.tensor([0.02, 0.25]))}
    if dtype_name == "fp8_e5m2":
        scales = {layer: (torch.ones(2), torch.ones(2))}
    dt, (ks, vs) = fp8_dtype(dtype_name), scales[layer]
    kd, vd = dequantize_kv(quantize_kv(k, ks, dt), ks, q.dtype), dequantize_kv(quantize_kv(v, vs, dt), vs, q.dtype)
    want = literal_all(q, kd, vd, cfg.sparse_config, 2)
    for chunks in chunkings(L):
        got = run_backend(cfg, q, k, v, chunks, kv_cache_dtype=dtype_name, kv_scales=scales)
        assert_close(got, want, f"{dtype_name} chunks {chunks[:4]}")


def run_two_sequences(cfg, seqs, schedule, backend):
    """Both sequences' rows in the same forward calls; schedule: per step, the new tokens of each."""
    caches = [SequenceCache(cfg, "cpu", torch.float32) for _ in seqs]
    done, outs = [0, 0], [[], []]
    for step in schedule:
        idx = [i for i, n in enumerate(step) if n]
        batch = ForwardBatch.build(cfg, [caches[i] for i in idx], [step[i] for i in idx], backend, "cpu")
        q, k, v = (torch.cat([seqs[i][x][done[i]:done[i] + step[i]] for i in idx]) for x in range(3))
        o = backend.softmax_attention(cfg.sparse_layers[0], q, k, v, batch)
        batch.commit()
        for i, part in zip(idx, o.split([step[i] for i in idx])):
            outs[i].append(part)
            done[i] += step[i]
    return [torch.cat(x) for x in outs]


@pytest.mark.parametrize("variant", ["gathered", "masked", "sdpa"])
def test_batched_sequences_through_every_reference_attention_variant(variant):
    """Two sequences of different lengths share forward calls (one prefilling while the other decodes)."""
    sparse = dict(block_size=4, kernel_stride=2, kernel_size=6, window_size=4, init_blocks=1, topk=2, dense_len=11)
    cfg = config(6, 2, **sparse)
    backend = {"gathered": ReferenceBackend(cfg), "masked": ReferenceBackend(cfg, gather_sparse=False),
               "sdpa": ReferenceBackend(cfg, attention_op=sdpa.attention, gather_sparse=False)}[variant]
    seqs = [qkv(38, 6, 2, 4, seed=21, ints=False), qkv(25, 6, 2, 4, seed=22, ints=False)]
    schedule = [[12, 0], [1, 9], [1, 1], [20, 1], [4, 14]]
    got = run_two_sequences(cfg, seqs, schedule, backend)
    for i, (q, k, v) in enumerate(seqs):
        assert_close(got[i], literal_all(q, k, v, cfg.sparse_config, 2), f"{variant} sequence {i}")


def test_training_backend_equals_the_literal_definition_for_a_batch():
    sparse = dict(block_size=4, kernel_stride=4, kernel_size=8, window_size=4, init_blocks=1, topk=2, dense_len=6)
    cfg = config(4, 2, **sparse)
    T = 29
    seqs = [qkv(T, 4, 2, 4, seed=s, ints=False) for s in (31, 32)]
    backend = TrainingBackend(cfg)
    q, k, v = (torch.cat([s[x] for s in seqs]) for x in range(3))
    o = backend.softmax_attention(cfg.sparse_layers[0], q, k, v, TrainBatch.build(cfg, 2, T, backend, "cpu"))
    for i, (qi, ki, vi) in enumerate(seqs):
        assert_close(o[i * T:(i + 1) * T], literal_all(qi, ki, vi, cfg.sparse_config, 2), f"sequence {i}")


def test_minicpm4_layer_equals_the_literal_definition_on_its_projections():
    """The layer: q/k/v projections, the sparse attention above, × sigmoid(o_gate(x)), o_proj."""
    model = micro_model(torch.float32)
    cfg = model.config
    layer = model.model.layers[cfg.sparse_layers[0]].self_attn
    L = 57                                                     # past dense_len 40, four 16-token blocks
    x = torch.randn(L, cfg.hidden_size, generator=torch.Generator().manual_seed(5))
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    xd = x.double()
    q = (xd @ layer.q_proj.weight.double().T).view(L, hq, d)
    k = (xd @ layer.k_proj.weight.double().T).view(L, hkv, d)
    v = (xd @ layer.v_proj.weight.double().T).view(L, hkv, d)
    o = literal_all(q, k, v, cfg.sparse_config, hkv).view(L, -1)
    want = (o * torch.sigmoid(xd @ layer.o_gate.weight.double().T)) @ layer.o_proj.weight.double().T
    backend = ReferenceBackend(cfg)
    for chunks in chunkings(L):
        seq, off, outs = SequenceCache(cfg, "cpu", torch.float32), 0, []
        for n in chunks:
            batch = ForwardBatch.build(cfg, [seq], [n], backend, "cpu")
            outs.append(layer(x[off:off + n], batch))
            batch.commit()
            off += n
        assert_close(torch.cat(outs), want, f"chunks {chunks[:4]}")
