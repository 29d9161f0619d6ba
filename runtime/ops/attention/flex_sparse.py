"""Sparse (InfLLM-V2) prefill attention with FlexAttention over the paged K/V pools, exact per token.

Why not our Triton paged kernel: that one treats every query token as a 16-row tile (its GQA
group) over its own 96 blocks, so prefill runs at decode-like tensor-core utilisation. Flex runs
128-row query tiles; the price is that a tile must visit the *union* of its rows' blocks. This
module builds that BlockMask from the selection (`BlockMask.from_kv_blocks`, no dense mask) and
a mask_mod that keeps it exact: a key is visible to token t of KV head h iff its block is in t's
selection for h and its position is <= t's position.

No layout conversion: a layer's pool k_pages [P, Hkv, B, D] (contiguous, head-major pages) is
viewed as ONE key sequence of P*Hkv*B tokens with a single KV head; "physical block" p*Hkv + h
is page p of KV head h, and the block lists point at physical blocks of the right head. The
mask_mod maps a physical block back (head, logical block) through `phys_head` / `phys_logical`,
so it is exact on its own (eager flex, which evaluates it everywhere, gives the same result).

Two query layouts (`fold`):
  - fold=False: q [1, Hq, n, D], enable_gqa; a 128-row tile = 128 tokens of one query head;
    block-mask heads = Hq (each the union of its KV head's selections).
  - fold=True: the GQA group folded into the rows, q [1, Hkv, n*G, D]; a 128-row tile = 128/G
    tokens x G heads, so the union is over 8 tokens only (less wasted work on scattered
    selections), at the cost of a q/o transpose copy.
Full blocks (selected by every token of a tile and entirely in the past of all of them) are
passed as full_kv_* so flex skips the mask_mod there.

bf16/fp16 pools only (FP8 pools would need a dequantised copy: not done here). The query rows
are padded to a multiple of `pad_to` so that the compiled kernel sees few distinct shapes.
Reference: runtime/ops/decode_attention/reference.py paged_attention over the same selection.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

# ---- defaults, set from benchmarks/sparse_prefill_bench.py (edit here) -----------------------
# Which path GPUBackend._prefill_attention uses for queries past dense_len: "triton" (the paged
# kernel, one token per row) or "flex" (this module). Switch to "flex" only if a flex row beats the
# triton row in "total ms" at both 32K and 128K for the "iid" queries (worst case), or for
# "local" if the lead accepts that real selections are that correlated.
SPARSE_PREFILL_DEFAULT = "triton"
# Query layout when flex is used: True = GQA group folded into the rows ("flex-fold" rows of the
# bench), False = 128 tokens x 1 head tiles with enable_gqa ("flex" rows). Take the faster.
FLEX_FOLD = True
Q_BLOCK = 128


def kernel_options(block_size: int) -> dict:
    """Flex tiles: 128 query rows x 64 keys (a KV tile must divide the 64-token block)."""
    return {"BLOCK_M": Q_BLOCK, "BLOCK_N": min(64, block_size)}


@dataclass
class FlexSparseInputs:
    block_mask: object          # torch.nn.attention.flex_attention.BlockMask
    rows: int                   # padded token rows
    fold: bool


def _mask_mod_factory(bitmap, phys_head, phys_logical, pos0, group: int, fold: bool, B: int):
    """bitmap [Hkv, rows, nb+1] bool (selected logical blocks per token); phys_head /
    phys_logical [P*Hkv] int32 (-1 head = not this sequence's page); pos0 0-d int tensor."""
    def mask_mod(b, h, q_idx, kv_idx):
        tok = q_idx // group if fold else q_idx
        kvh = h if fold else h // group
        pb = kv_idx // B
        lb = phys_logical[pb]
        ok = phys_head[pb] == kvh
        sel = bitmap[kvh, tok, lb]
        return ok & sel & (lb * B + kv_idx % B <= pos0 + tok)
    return mask_mod


_STATES: dict = {}


def _state(dev, hkv, rows, W, num_pages, G, fold, B):
    """Persistent mask tensors and ONE mask_mod closure per shape, refilled in place by each
    build_inputs: the compiled flex sees the same function and tensor objects every call (no
    recompiles; a fresh closure per call could hit dynamo's recompile limit and fall back to the
    unfused eager kernel). A BlockMask is therefore valid until the next build_inputs call with
    the same shapes."""
    key = (str(dev), hkv, rows, W, num_pages, G, fold, B)
    if key not in _STATES:
        bitmap = torch.zeros(hkv, rows, W + 1, dtype=torch.bool, device=dev)
        phys_head = torch.full((num_pages * hkv,), -1, dtype=torch.int32, device=dev)
        phys_logical = torch.zeros(num_pages * hkv, dtype=torch.int32, device=dev)
        pos = torch.zeros((), dtype=torch.int64, device=dev)
        mask_mod = _mask_mod_factory(bitmap, phys_head, phys_logical, pos, G, fold, B)
        _STATES[key] = (bitmap, phys_head, phys_logical, pos, mask_mod)
    return _STATES[key]


def build_inputs(sel, cnt, page_table_row, pos0: int, n: int, num_pages: int, hq: int,
                 block_size: int, fold: bool, pad_to: int = 2048) -> FlexSparseInputs:
    """BlockMask for n query tokens at positions pos0.. of the sequence whose pages are
    page_table_row, selection sel [n, Hkv, K] int32 / cnt [n, Hkv] (entries past cnt ignored)."""
    from torch.nn.attention.flex_attention import BlockMask

    dev = sel.device
    _, hkv, K = sel.shape
    G, B = hq // hkv, block_size
    rows = math.ceil(n / pad_to) * pad_to
    W = page_table_row.numel()          # static width: shapes do not change with the context
    nb = math.ceil((pos0 + n) / B)
    assert nb <= W
    bitmap, phys_head, phys_logical, pos, mask_mod = _state(dev, hkv, rows, W, num_pages, G, fold, B)
    # per-token bitmap over logical blocks; entries past cnt go to the dummy column W
    valid = torch.arange(K, device=dev)[None, None, :] < cnt[..., None]
    idx = torch.where(valid, sel.long().clamp(0, W), W)
    bitmap.zero_()
    bitmap[:, :n].scatter_(2, idx.transpose(0, 1), True)
    bitmap[:, :, W] = False
    t = Q_BLOCK // G if fold else Q_BLOCK          # tokens per query tile
    assert rows % t == 0
    nqb = rows // t
    tiles = bitmap[:, :, :W].view(hkv, nqb, t, W)
    first_pos = pos0 + torch.arange(nqb, device=dev) * t
    past = (torch.arange(W, device=dev)[None, :] * B + B - 1) <= first_pos[:, None]   # [nqb, W]
    tok_real = (torch.arange(nqb, device=dev) * t + t) <= n               # tile without padded rows
    full = tiles.all(2) & past[None] & tok_real[None, :, None]
    partial = tiles.any(2) & ~full
    logical_pages = page_table_row.long()

    def lists(m):                       # [hkv, nqb, W] bool -> counts, physical block ids
        num = m.sum(-1, dtype=torch.int32)
        order = torch.sort(m.to(torch.int8), dim=-1, descending=True, stable=True).indices
        phys = logical_pages[order] * hkv + torch.arange(hkv, device=dev)[:, None, None]
        if not fold:
            num, phys = num.repeat_interleave(G, 0), phys.repeat_interleave(G, 0)
        return num[None].contiguous(), phys[None].to(torch.int32).contiguous()

    kv_num, kv_idx = lists(partial)
    full_num, full_idx = lists(full)
    phys_head.fill_(-1)
    ids = logical_pages[:nb, None] * hkv + torch.arange(hkv, device=dev)[None, :]      # [nb, hkv]
    phys_head[ids.reshape(-1)] = torch.arange(hkv, device=dev, dtype=torch.int32).repeat(nb)
    phys_logical[ids.reshape(-1)] = torch.arange(nb, device=dev, dtype=torch.int32).repeat_interleave(hkv)
    pos.fill_(pos0)
    q_len = rows * G if fold else rows
    bm = BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(Q_BLOCK, B),
                                  mask_mod=mask_mod, seq_lengths=(q_len, num_pages * hkv * B),
                                  compute_q_blocks=False)
    return FlexSparseInputs(bm, rows, fold)


def pool_as_sequence(pages: torch.Tensor) -> torch.Tensor:
    """[P, Hkv, B, D] contiguous pool -> [1, 1, P*Hkv*B, D] view (no copy)."""
    P, hkv, B, D = pages.shape
    return pages.view(1, 1, P * hkv * B, D)


def fold_queries(q, rows: int, hkv: int, fold: bool):
    """q [n, Hq, D] -> the 4-D query of the chosen layout, padded to `rows` tokens."""
    n, hq, D = q.shape
    if rows > n:
        q = torch.cat([q, q.new_zeros(rows - n, hq, D)])
    if fold:
        return q.view(rows, hkv, hq // hkv, D).transpose(0, 1).reshape(1, hkv, rows * (hq // hkv), D)
    return q.transpose(0, 1).unsqueeze(0)


def unfold_output(o4, n: int, hq: int, fold: bool):
    """Inverse of fold_queries for the output: [n, Hq, D]."""
    if fold:
        _, hkv, _, D = o4.shape
        return o4[0].view(hkv, -1, hq // hkv, D).transpose(0, 1).reshape(-1, hq, D)[:n]
    return o4[0].transpose(0, 1)[:n]


def sparse_attention(flex_fn, q, k_pages, v_pages, inputs: FlexSparseInputs,
                     kernel_options: dict | None = None):
    """o [n, Hq, D] for q [n, Hq, D] over the pools with the block mask of build_inputs.
    flex_fn: torch.compile(flex_attention) on GPU, plain flex_attention in eager tests."""
    n, hq, _ = q.shape
    hkv = k_pages.shape[1]
    q4 = fold_queries(q, inputs.rows, hkv, inputs.fold)
    kw = {} if kernel_options is None else {"kernel_options": kernel_options}
    with warnings.catch_warnings():        # eager flex warns that it is unfused (CPU tests)
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        o4 = flex_fn(q4, pool_as_sequence(k_pages), pool_as_sequence(v_pages), block_mask=inputs.block_mask,
                     enable_gqa=True, **kw)
    return unfold_output(o4, n, hq, inputs.fold)


_COMPILED = None


def compiled_flex(device=None):
    """One compiled flex_attention per process (each new shape still compiles once); the eager
    (unfused, exact) flex_attention on non-CUDA devices (CPU tests)."""
    global _COMPILED
    from torch.nn.attention.flex_attention import flex_attention
    if device is not None and torch.device(device).type != "cuda":
        return flex_attention
    if _COMPILED is None:
        _COMPILED = torch.compile(flex_attention, dynamic=False)
    return _COMPILED
