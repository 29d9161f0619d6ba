"""Correctness checks of every GPU-engine kernel against its plain-PyTorch reference on fresh
random inputs. Used by tests/test_gpu_*.py (GPU, and CPU under TRITON_INTERPRET=1 at small
sizes in fp32) and by benchmarks/gpu_engine_bench.py. Each check returns [(name, err, tol)]."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from salactl.runtime.config import SparseConfig
from salactl.runtime.ops.decode_attention.reference import pack_v_pages, v_rows


@dataclass(frozen=True)
class Shapes:
    hq: int = 32
    hkv: int = 2
    d: int = 128
    block: int = 64
    sparse: SparseConfig = SparseConfig(dense_len=2048, topk=16, window_size=512)

    @classmethod
    def small(cls) -> "Shapes":
        return cls(8, 2, 32, 32, SparseConfig(block_size=32, dense_len=256, kernel_size=16,
                                              kernel_stride=8, topk=4, window_size=64))


def rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    if torch.isnan(a).any():
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _tol(dtype) -> float:
    return 1e-2 if dtype != torch.float32 else 1e-4


def check_gla(device, dtype, H=32, D=128, n=5, T=300) -> list:
    from salactl.runtime.layers.lightning import alibi_slopes
    from salactl.runtime.ops.gla.reference import gla_chunked, gla_recurrent
    from salactl.runtime.ops.gla.triton import gla_decode_, gla_prefill_, prefill_impl

    g = -torch.tensor(alibi_slopes(H), device=device)
    pool = torch.randn(n + 2, H, D, D, device=device) * 0.1
    slots = torch.randperm(n + 2, device=device)[:n].to(torch.int32)
    q, k, v = (torch.randn(n, H, D, device=device).to(dtype) for _ in range(3))
    scale = D ** -0.5
    ref_o, ref_s = [], []
    for i, s in enumerate(slots.tolist()):
        o, st = gla_recurrent(q[i:i + 1], k[i:i + 1], v[i:i + 1], g, scale, pool[s])
        ref_o.append(o[0])
        ref_s.append(st)
    work = pool.clone()
    o = gla_decode_(q, k, v, g, scale, work, slots, out_dtype=torch.float32)
    untouched = [s for s in range(n + 2) if s not in slots.tolist()]
    out = [("gla_decode.o", rel_err(o, torch.stack(ref_o)), 1e-4),
           ("gla_decode.state (in place)", rel_err(work[slots.long()], torch.stack(ref_s)), 1e-4),
           ("gla_decode.other slots untouched", float((work[untouched] - pool[untouched]).abs().max()), 0.0)]
    qT, kT, vT = (torch.randn(T, H, D, device=device).to(dtype) for _ in range(3))
    ro, rs = gla_chunked(qT, kT, vT, g, scale, pool[1])
    work = pool.clone()
    o = gla_prefill_(qT, kT, vT, g, scale, work, 1, max_chunk=128)
    tol = 1e-4 if (dtype == torch.float32 and not qT.is_cuda) else (2e-3 if dtype == torch.float32 else 1e-2)
    name = f"gla_prefill[{prefill_impl(device)}]"
    out += [(f"{name}.o", rel_err(o, ro), tol), (f"{name}.state", rel_err(work[1], rs), tol)]
    return out


def _paged_setup(device, sh: Shapes, lens, dtype):
    B = sh.block
    need = sum(math.ceil(L / B) for L in lens)
    P = need + 3                        # spare pages no sequence owns
    perm = torch.randperm(P, device=device).to(torch.int32)
    width = max(math.ceil(L / B) for L in lens) + 2
    pt = torch.full((len(lens) + 1, width), P, dtype=torch.int32, device=device)
    off = 0
    for i, L in enumerate(lens):
        c = math.ceil(L / B)
        pt[i, :c] = perm[off:off + c]
        off += c
    kp = torch.randn(P + 1, sh.hkv, B, sh.d, device=device).to(dtype)
    vp = torch.randn(P + 1, sh.hkv, B, sh.d, device=device).to(dtype)
    return pt, kp, vp


def check_decode_attention(device, dtype, sh: Shapes = Shapes(), fp8: bool = False, config=None) -> list:
    """Dense and sparse rows (several sequences, partial last pages) vs the reference; `config`:
    a decode_attention.triton.DecodeConfig (None: the default for the page dtype)."""
    from salactl.runtime.ops.decode_attention.reference import paged_attention as ref
    from salactl.runtime.ops.decode_attention.triton import paged_attention as fast
    from salactl.runtime.ops.decode_attention.triton import split_partials

    B = sh.block
    lens = [3 * B + 5, B, 7 * B - 1]
    pt, kp, vp = _paged_setup(device, sh, lens, dtype)
    ks = vs = 1.0
    if fp8:
        ks, vs = 0.02, 0.03
        kp, vp = (kp.float() / ks).to(torch.float8_e4m3fn), pack_v_pages((vp.float() / vs).to(torch.float8_e4m3fn))
    slots = torch.tensor([2, 0, 1, 2], dtype=torch.int32, device=device)
    seq = torch.tensor([lens[2], lens[0], lens[1], 2 * B + 3], dtype=torch.int32, device=device)
    q = torch.randn(4, sh.hq, sh.d, device=device).to(dtype)
    # entries past a row's count are never valid blocks: a kernel that read them would fail
    sel = torch.full((4, sh.hkv, 4), 12345, dtype=torch.int32)
    cnt = torch.zeros(4, sh.hkv, dtype=torch.int32)
    rnd = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    for i, L in enumerate(seq.tolist()):
        own = (L - 1) // B
        for h in range(sh.hkv):
            others = torch.randperm(own, generator=rnd)[:3].tolist() if own else []
            blocks = [own] + others
            c = int(torch.randint(1, len(blocks) + 1, (1,), generator=rnd))
            sel[i, h, :c] = torch.tensor(blocks[:c])
            cnt[i, h] = c
    sel, cnt = sel.to(device), cnt.to(device)
    name = "decode_attention" + (".fp8" if fp8 else "")
    out = []
    for mode, kw in (("dense", {}), ("sparse", dict(block_ids=sel, num_blocks=cnt, dense_len=2 * B))):
        r = ref(q, kp, vp, pt, slots, seq, k_scale=ks, v_scale=vs, **kw)
        for splits in (1, 3, 16):
            f = fast(q, kp, vp, pt, slots, seq, k_scale=ks, v_scale=vs, num_splits=splits, config=config, **kw)
            out.append((f"{name}.{mode}.splits{splits}", rel_err(f, r), _tol(dtype)))
        # split_partials' contract, merged here by log-sum-exp in torch (empty splits: lse -inf)
        po, plse = split_partials(q, kp, vp, pt, slots, seq, k_scale=ks, v_scale=vs, num_splits=3, config=config, **kw)
        G = sh.hq // sh.hkv
        w = torch.softmax(plse[:, :, :G], dim=1).nan_to_num(0.0)             # [rows, splits, G]
        merged = (w[..., None] * po[:, :, :G]).sum(1).reshape(q.shape)
        out.append((f"{name}.{mode}.partials", rel_err(merged, r), _tol(dtype)))
    return out


def check_store_kv(device, dtype, sh: Shapes = Shapes(), fp8=None) -> list:
    """Rows land in the right (page, head, offset); FP8 pages hold saturate(x / scale)."""
    from salactl.runtime.ops.decode_attention.triton import store_kv

    pt, kp, vp = _paged_setup(device, sh, [3 * sh.block, 2 * sh.block], dtype)
    ks = torch.rand(sh.hkv, device=device) + 0.01
    vs = torch.rand(sh.hkv, device=device) + 0.01
    if fp8 is not None:
        kp, vp = kp.to(fp8), pack_v_pages(vp.to(fp8))
    slots = torch.tensor([1, 0, 0], dtype=torch.int32, device=device)
    seq = torch.tensor([sh.block + 2, 1, 3 * sh.block], dtype=torch.int32, device=device)
    k, v = (torch.randn(3, sh.hkv, sh.d, device=device).to(dtype) * 300 for _ in range(2))
    kp2, vp2 = kp.clone(), vp.clone()
    store_kv(kp2, vp2, k, v, pt, slots, seq, ks, vs)
    vp, vp2 = v_rows(vp), v_rows(vp2)              # compare V as [.., B, D] rows
    exp_k, exp_v = kp.clone(), vp.clone()
    written = torch.zeros(kp.shape[:3], dtype=torch.bool, device=device)          # [pages, Hkv, B]
    x_k, x_v = (torch.zeros(kp.shape, device=device) for _ in range(2))           # what the kernel casts
    for i in range(3):
        t = int(seq[i]) - 1
        page = int(pt[int(slots[i]), t // sh.block])
        written[page, :, t % sh.block] = True
        if fp8 is None:
            exp_k[page, :, t % sh.block], exp_v[page, :, t % sh.block] = k[i], v[i]
        else:
            m = torch.finfo(fp8).max
            x_k[page, :, t % sh.block] = (k[i].float() / ks[:, None]).clamp(-m, m)
            x_v[page, :, t % sh.block] = (v[i].float() / vs[:, None]).clamp(-m, m)
            exp_k[page, :, t % sh.block] = x_k[page, :, t % sh.block].to(fp8)
            exp_v[page, :, t % sh.block] = x_v[page, :, t % sh.block].to(fp8)
    if fp8 is None:
        err = float((kp2.float() - exp_k.float()).abs().max() + (vp2.float() - exp_v.float()).abs().max())
        return [("store_kv", err, 0.0)]
    name = f"store_kv.{str(fp8).replace('torch.', '')}"
    bits = lambda t: t.contiguous().view(torch.uint8)                             # noqa: E731
    # every other position keeps its old bits; the written rows are compared value by value, exactly
    changed = sum(int((bits(a)[~written] != bits(b)[~written]).sum()) for a, b in ((kp2, kp), (vp2, vp)))
    got = torch.cat([kp2[written].reshape(-1), vp2[written].reshape(-1)])
    exp = torch.cat([exp_k[written].reshape(-1), exp_v[written].reshape(-1)])
    x = torch.cat([x_k[written].reshape(-1), x_v[written].reshape(-1)])
    miss = bits(got) != bits(exp)
    if not kp.is_cuda:
        miss &= ~interpreter_fp8_miss(got, exp, x)
    return [(f"{name}.written values off", int(miss.sum()), 0),
            (f"{name}.other positions changed", changed, 0)]


def interpreter_fp8_miss(got: torch.Tensor, exp: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Where fp8 `got` (cast from fp32 `x`) is one of the Triton interpreter's two known fp32->fp8
    misses (triton 3.6 interpreter.py `_convert_float`; a kernel that only casts shows both, so
    they are the interpreter's, not store_kv's math; the GPU converts right: tolerance 0 there):
    - a lost carry: when rounding carries out of the mantissa (|x| just below a power of two) the
      carry is ORed into the exponent field, a no-op when that field is odd, so 2^e comes out as
      2^(e-1): e5m2 7827.8 -> 4096 (8192), -510.5 -> -256 (-512), -1954 -> -1024 (-2048).
      Excused only as: exp = +-2^e, |x| < |exp|, got = exp / 2 with an odd exponent field;
    - subnormals: a result at or below the smallest normal is shifted without rounding (e4m3fn
      -0.01286 -> -0.01172, RTNE -0.01367; 0.0156 -> 0.0078). Excused only there, and only toward
      zero: |got| <= |x| <= smallest normal, same sign;
    and exact ties round away from zero, not to even (e4m3fn 14.5 -> 15, RTNE 14): excused only
    where x lies exactly halfway between got and exp, one code apart."""
    mant = {torch.float8_e5m2: 2, torch.float8_e4m3fn: 3}[got.dtype]
    gb, eb = got.view(torch.uint8).int(), exp.view(torch.uint8).int()
    g, e = got.float(), exp.float()
    carry = (((eb & ((1 << mant) - 1)) == 0) & (gb == eb - (1 << mant)) & (((gb & 0x7F) >> mant) % 2 == 1)
             & (x.abs() < e.abs()) & (e == 2 * g))
    tiny = float(torch.finfo(got.dtype).smallest_normal)
    subnormal = (e.abs() <= tiny) & (x.abs() <= tiny) & (g.abs() <= x.abs()) & (g * x >= 0)
    tie = ((gb - eb).abs() == 1) & ((x.double() - g.double()).abs() == (x.double() - e.double()).abs())
    return carry | subnormal | tie


def check_selection(device, dtype, sh: Shapes = Shapes(), L: int | None = None) -> list:
    """GPU selection over paged K1 vs reference.select_blocks over contiguous keys. A differing
    block is tolerated only at a near tie (|score - kth score| <= 1e-5 of the scale)."""
    from salactl.runtime.ops.selection.gpu import compress_update, select_paged
    from salactl.runtime.ops.selection.reference import (block_scores, compress_keys, num_windows,
                                                         select_blocks, window_scores)

    sc = sh.sparse
    B = sc.block_size
    L = L or 12 * sc.window_size + 37
    pt, kp, _ = _paged_setup(device, sh, [L], dtype)
    wpp = B // sc.kernel_stride
    k1p = torch.zeros(kp.shape[0], sh.hkv, wpp, sh.d, device=device, dtype=dtype)
    ptc = pt.cpu()
    K = torch.stack([kp[int(ptc[0, t // B]), :, t % B] for t in range(L)])         # [L, hkv, d]
    nw = num_windows(L, sc)
    one = lambda v: torch.tensor([v], dtype=torch.int32, device=device)           # noqa: E731
    half = nw // 2                                                                 # two updates
    compress_update(kp, k1p, pt, one(0), one(0), one(half), half, sc)
    compress_update(kp, k1p, pt, one(0), one(half), one(nw - half), nw - half, sc)
    K1 = compress_keys(K, sc, 0, nw)
    got = torch.stack([k1p[int(ptc[0, (j * sc.kernel_stride) // B]), :, (j * sc.kernel_stride % B) // sc.kernel_stride]
                       for j in range(nw)])
    out = [("selection.compressed_keys", rel_err(got, K1), _tol(dtype))]
    pos = torch.tensor(sorted({sc.dense_len - 1, sc.dense_len, L // 2, L - 2, L - 1, sc.kernel_size - 2,
                               3 * B - 1, L - B - 3}), device=device)
    q = torch.randn(len(pos), sh.hq, sh.d, device=device).to(dtype)
    nb = math.ceil(L / B)
    ref = select_blocks(q, K1, pos, sc, nb)
    scores = block_scores(window_scores(q, K1, pos, sc), pos, sc, nb)
    for one_seq in (False, True):
        sel, cnt = select_paged(q, k1p, pt, torch.zeros(len(pos), dtype=torch.int32, device=device),
                                (pos + 1).to(torch.int32), sc, nb + 5, one_sequence=one_seq)
        bad = 0
        sel, cnt, ref_c, scores_c = sel.cpu(), cnt.cpu(), ref.cpu(), scores.cpu()
        for i in range(len(pos)):
            for h in range(sh.hkv):
                s = set(sel[i, h, :cnt[i, h]].tolist())
                r = set(torch.nonzero(ref_c[h, i]).flatten().tolist())
                if s != r:
                    row = scores_c[h, i]
                    kth = row[sorted(r, key=lambda b: -float(row[b]))[-1]] if r else 0.0
                    scale = float(row[torch.isfinite(row)].abs().max())
                    if any(abs(float(row[b] - kth)) > 1e-5 * scale for b in s ^ r):
                        bad += 1
        out.append((f"selection.blocks(one_sequence={one_seq}) rows differing", float(bad), 0.0))
    return out


def check_fused(device, dtype) -> list:
    from salactl.runtime.layers.rope import rope_cos_sin
    from salactl.runtime.ops.fused import reference as R
    from salactl.runtime.ops.fused import triton as T

    n, H, D, N = 3, 4, 64, 1000
    tol = _tol(dtype)
    h = torch.randn(n, N, device=device).to(dtype)
    delta = torch.randn(n, 2 * N, device=device).to(dtype)[:, :N]
    w = torch.randn(N, device=device).to(dtype)
    out = []
    a, b = R.add_rmsnorm(h, delta, 0.3, w, 1e-6), T.add_rmsnorm(h, delta, 0.3, w, 1e-6)
    out += [("fused.add_rmsnorm.h", rel_err(b[0], a[0]), tol), ("fused.add_rmsnorm.y", rel_err(b[1], a[1]), tol)]
    out.append(("fused.rmsnorm", rel_err(T.add_rmsnorm(h, None, 1.0, w, 1e-6)[1], R.add_rmsnorm(h, None, 1.0, w, 1e-6)[1]), tol))
    big = torch.randn(n, 3 * H * D, device=device).to(dtype)
    q, k, z = big[:, :H * D].view(n, H, D), big[:, H * D:2 * H * D].view(n, H, D), big[:, 2 * H * D:]
    wq, wk = torch.randn(D, device=device).to(dtype), torch.randn(D, device=device).to(dtype)
    cos, sin = rope_cos_sin(torch.tensor([0, 17, 70000], device=device), D, 10000.0)
    a, b = R.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6), T.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6)
    out += [("fused.qk_norm_rope.q", rel_err(b[0], a[0]), tol), ("fused.qk_norm_rope.k", rel_err(b[1], a[1]), tol)]
    o = torch.randn(n, H * D, device=device).to(dtype)
    wo = torch.randn(H * D, device=device).to(dtype)
    out.append(("fused.rmsnorm_gate", rel_err(T.rmsnorm_gate(o, wo, z, 1e-6), R.rmsnorm_gate(o, wo, z, 1e-6)), tol))
    out.append(("fused.sigmoid_gate", rel_err(T.sigmoid_gate(o, z), R.sigmoid_gate(o, z)), tol))
    gu = torch.randn(n, 2 * 1500, device=device).to(dtype)
    out.append(("fused.silu_mul", rel_err(T.silu_mul(gu), R.silu_mul(gu)), tol))
    return out


def model_logits(model, device, prompt_len: int, decode_steps: int = 3, chunk: int = 128,
                 cuda_graph: bool = False, seed: int = 0, kv_cache_dtype: str = "bf16",
                 reference: bool = True, gpu: bool = True) -> tuple[list, list]:
    """Last-token logits of the GPU engine (fused model, paged caches, GPU backend) and of the
    reference Engine on the same weights, after a chunked prefill and after each teacher-forced
    decode step (both with `kv_cache_dtype` KV caches): (gpu rows, reference rows); an engine
    not asked for gives []."""
    from salactl.runtime.engine import Engine
    from salactl.runtime.gpu.engine import GPUEngine

    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=g).tolist()
    feed = torch.randint(0, cfg.vocab_size, (decode_steps,), generator=g).tolist()
    r_logits, g_logits = [], []
    if reference:
        ref = Engine(copy.deepcopy(model), device, chunk_size=chunk, kv_cache_dtype=kv_cache_dtype)
        seq = ref.new_sequence()
        r_logits = [ref.prefill(seq, prompt)[-1]]
        for t in feed:
            r_logits.append(ref.forward(seq, [t])[-1])
    if gpu:
        eng = GPUEngine(model, device, max_running_requests=2, chunk_size=chunk,
                        kv_tokens=prompt_len + decode_steps + 2 * cfg.sparse_config.block_size,
                        cuda_graph=cuda_graph, kv_cache_dtype=kv_cache_dtype)
        slot = eng.scheduler.slots.alloc(1)[0]
        pages = eng.scheduler.pages.alloc(math.ceil((prompt_len + decode_steps) / cfg.sparse_config.block_size))
        eng.pools.assign_pages(slot, pages)
        for c0 in range(0, prompt_len, chunk):
            last = eng.runner.prefill([(slot, prompt[c0:c0 + chunk], c0)])
        g_logits.append(last[0])
        for i, t in enumerate(feed):
            g_logits.append(eng.runner.decode([(slot, t, prompt_len + i)])[0])
    return g_logits, r_logits


def check_model(model, device, prompt_len: int, decode_steps: int = 3, chunk: int = 128,
                cuda_graph: bool = False, tol: float = 1e-2, seed: int = 0,
                kv_cache_dtype: str = "bf16") -> list:
    """The GPU engine against the reference Engine on the same weights (model_logits): last-token
    logits after a chunked prefill and after teacher-forced decode."""
    g_logits, r_logits = model_logits(model, device, prompt_len, decode_steps, chunk, cuda_graph, seed,
                                      kv_cache_dtype)
    tag = f"model(prompt={prompt_len}, graph={cuda_graph}, kv={kv_cache_dtype})"
    out = [(f"{tag}.prefill_logits", rel_err(g_logits[0], r_logits[0]), tol)]
    out += [(f"{tag}.decode{i}_logits", rel_err(a, b), tol) for i, (a, b) in enumerate(zip(g_logits[1:], r_logits[1:]))]
    return out


def check_chunk_invariance(model, device, prompt_len: int, chunks: tuple[int, ...], tol: float = 1e-4,
                           seed: int = 0, kv_cache_dtype: str = "bf16") -> list:
    """The GPU engine's last-token logits after prefilling one prompt in chunks of each size,
    against the first size's: DESIGN §2 makes them independent of the chunk size, FP8 caches
    included (every chunk attends the stored, quantized keys)."""
    from salactl.runtime.gpu.engine import GPUEngine

    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=g).tolist()
    logits = []
    for chunk in chunks:
        eng = GPUEngine(copy.deepcopy(model), device, max_running_requests=1, chunk_size=chunk,
                        kv_tokens=prompt_len + cfg.sparse_config.block_size, kv_cache_dtype=kv_cache_dtype)
        slot = eng.scheduler.slots.alloc(1)[0]
        eng.pools.assign_pages(slot, eng.scheduler.pages.alloc(math.ceil(prompt_len / cfg.sparse_config.block_size)))
        for c0 in range(0, prompt_len, chunk):
            last = eng.runner.prefill([(slot, prompt[c0:c0 + chunk], c0)])
        logits.append(last[0])
    tag = f"chunk_invariance(prompt={prompt_len}, kv={kv_cache_dtype})"
    return [(f"{tag}.chunk{c}_vs_{chunks[0]}", rel_err(x, logits[0]), tol) for c, x in zip(chunks[1:], logits[1:])]


def check_model_batched(model, device, prompt_lens: tuple[int, ...], decode_steps: int = 3, chunk: int = 4096,
                        cuda_graph: bool = False, tol: float = 1e-2, seed: int = 0, ahead: int = 0) -> list:
    """Several requests at once, as bench and serving run them: one prefill call holding every
    prompt as its own segment (ragged lengths), then decode steps over all rows together (batched
    linears: the skinny GEMM at 9B widths; the CUDA graph of the row count's bucket), each row's
    last-token logits against the reference Engine running that request alone. ahead > 0: the
    graphs for up to that many rows are captured before the first step, largest first (as bench's
    prepare does), so a smaller bucket replays before the larger ones captured ahead of it."""
    from salactl.runtime.engine import Engine
    from salactl.runtime.gpu.engine import GPUEngine

    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    B = cfg.sparse_config.block_size
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in prompt_lens]
    feeds = [torch.randint(0, cfg.vocab_size, (decode_steps,), generator=g).tolist() for _ in prompt_lens]
    ref = Engine(copy.deepcopy(model), device, chunk_size=chunk)
    r_logits = []
    for prompt, feed in zip(prompts, feeds):
        seq = ref.new_sequence()
        rows = [ref.prefill(seq, prompt)[-1]]
        rows += [ref.forward(seq, [t])[-1] for t in feed]
        r_logits.append(rows)
    need = sum(math.ceil((n + decode_steps) / B) for n in prompt_lens)
    eng = GPUEngine(model, device, max_running_requests=max(len(prompts), ahead), chunk_size=chunk,
                    kv_tokens=(need + 2) * B, cuda_graph=cuda_graph)
    slots = eng.scheduler.slots.alloc(len(prompts))
    for slot, n in zip(slots, prompt_lens):          # as GPUEngine.step admits a request
        eng.pools.assign_pages(slot, eng.scheduler.pages.alloc(math.ceil((n + decode_steps) / B)))
        eng.pools.state[:, slot].zero_()
        eng.backend.release_slot(slot)
    g_logits = [[row] for row in eng.runner.prefill([(slot, p, 0) for slot, p in zip(slots, prompts)])]
    if ahead:
        eng.runner.capture_graphs(ahead, dense=True, sparse=True)
    for i in range(decode_steps):
        out = eng.runner.decode([(slot, feed[i], n + i) for slot, feed, n in zip(slots, feeds, prompt_lens)])
        for rows, row in zip(g_logits, out):
            rows.append(row)
    tag = f"batched(prompts={','.join(map(str, prompt_lens))}, graph={cuda_graph}, ahead={ahead})"
    return [(f"{tag}.request{r}.{'prefill' if i == 0 else f'decode{i - 1}'}_logits", rel_err(a, b), tol)
            for r, (gs, rs) in enumerate(zip(g_logits, r_logits)) for i, (a, b) in enumerate(zip(gs, rs))]


def run_all(device, dtype=torch.bfloat16) -> list:
    rows = []
    rows += check_gla(device, dtype)
    rows += check_store_kv(device, dtype)
    rows += check_store_kv(device, dtype, fp8=torch.float8_e4m3fn)
    rows += check_store_kv(device, dtype, fp8=torch.float8_e5m2)
    rows += check_decode_attention(device, dtype)
    rows += check_decode_attention(device, torch.bfloat16, fp8=True)
    rows += check_selection(device, dtype)
    rows += check_fused(device, dtype)
    return rows
