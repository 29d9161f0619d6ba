"""Offline sm_90 SASS of our hot Triton kernels: registers, spills, shared memory and the
instruction mix of every loop that issues MMAs (no GPU needed).

    python tools/sass_loops.py decode-split [--kv fp8|bf16] [--warps 2] [--stages 3] [--preload 16] [--tma]
    python tools/sass_loops.py w4a16 [--spec "bn=64,w=4,un=4"] [--m 1] [--n 4096] [--k 4096]   # no --spec: the dispatch's
    python tools/sass_loops.py w8a16 [--spec8 "un=2,waves=8"] [--m 1] [--n 4096] [--k 4096]
    python tools/sass_loops.py select-lse [--warps 4] [--stages 2] [--bw 128] [--per-row]   # decode selection's pass 1
    python tools/sass_loops.py select-words [--warps 4] [--late]    # decode selection's pass 2
    python tools/sass_loops.py select-top [--warps 8]       # its one-program radix top-k
    python tools/sass_loops.py select-rank [--warps 8]      # its rank top-k
    ... [--arch 90] [--json] [--order]

The selection kernels are compiled as select_decode launches them for sala-9b at batch 1 in the
1M-wide page table of benchmarks/sparse_decode_bench.py (DECODE_TUNING); they have no MMA loop
(pass 2's windows are unrolled), so the whole kernel's instruction count and opcode mix are given.

BENCHMARKS.md and the kernel docstrings quote "offline sm_90 SASS" counts (instructions per page or
per 128-row block, registers); this is the command that reproduces them. It compiles through
`triton.compile` for the target (Triton's bundled ptxas) and disassembles with Triton's bundled
cuobjdump; a loop is a backward branch, and a loop's count is the instructions from its target to
the branch (an outer loop includes its inner ones). Hand-written because neither Triton nor any
installed tool reports per-loop SASS of a Triton kernel.

`--order` also prints the issue order of the kernel's memory, barrier and MMA instructions (G global
load, A async copy to shared memory, S / s shared store / load, b barrier, M MMA, | backward branch):
ptxas places each global load just before its first use unless a barrier or the data flow pins it
earlier (BENCHMARKS.md, W4A16 session 26), so this is how to see how many loads a warp really has in
flight before its math.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path


def _pointer_attrs(sig: dict, aligned: tuple[str, ...]) -> dict:
    """16-byte divisibility hints for every pointer and the given integer arguments, as at launch."""
    names = list(sig)
    return {(names.index(a),): [["tt.divisibility", 16]] for a in names
            if sig[a].startswith("*") or a in aligned}


def decode_split_source(kv: str, preload: int, tma: bool = False):
    from triton.compiler import ASTSource

    from salactl.runtime.ops.decode_attention.triton import _split_kernel
    page = "fp8e4nv" if kv == "fp8" else "bf16"
    sig = {"q_ptr": "*bf16", "k_ptr": f"*{page}", "v_ptr": f"*{page}", "pt_ptr": "*i32", "slot_ptr": "*i32",
           "seqlen_ptr": "*i32", "sel_ptr": "*i32", "cnt_ptr": "*i32", "po_ptr": "*fp32", "plse_ptr": "*fp32",
           **({"k_desc": f"tensordesc<{page}[64, 128]>",
               "v_desc": f"tensordesc<{page}[{'128, 64' if kv == 'fp8' else '64, 128'}]>"} if tma
              else {"k_desc": f"*{page}", "v_desc": f"*{page}"}),
           **{s: "i32" for s in ("s_qn", "s_qh", "s_kp", "s_kh", "s_pt", "s_seln", "s_selh", "s_cntn", "s_cnth")},
           "sm_scale": "fp32", "ks_ptr": "*fp32", "vs_ptr": "*fp32", "dense_len": "i32", "num_splits": "i32"}
    const = {"HKV": 2, "G": 16, "BG": 16, "BS": 64, "D": 128, "FP8": kv == "fp8", "DOT_F32": False,
             "MAXP": preload, "SUB": 64, "EARLY": True, "TMA": tma, "PDL": True}
    sig.update({c: "constexpr" for c in const})
    return ASTSource(_split_kernel, sig, const, _pointer_attrs(sig, ("s_qn", "s_qh", "s_kp", "s_kh", "s_pt")))


def w4a16_source(spec: str | None, M: int, N: int, K: int):
    """The register kernel (`_w4a16_tc_kernel`) as the dispatch would launch it for this spec (None:
    the config the dispatch picks for this shape and row count)."""
    from triton.compiler import ASTSource

    from salactl.runtime.ops.w4a16.tc_config import default_tc_config, tc_config_from_spec
    from salactl.runtime.ops.w4a16.triton_tc import _w4a16_tc_kernel, tc_kernel_constexprs
    if spec is None:
        cfg = default_tc_config(M, N, K)
        if cfg.tma:
            raise SystemExit(f"tools/sass_loops.py: the dispatch runs the TMA kernel at M={M} {N}x{K}; only the "
                             "register kernel is supported: pass a --spec without tma=")
    else:
        try:
            cfg = tc_config_from_spec(spec, M, N, K)
        except ValueError as e:
            raise SystemExit(f"tools/sass_loops.py: --spec {spec!r}: {e}") from None
        if cfg.tma:
            raise SystemExit("tools/sass_loops.py: only the register kernel is supported (drop tma= from --spec)")
    sig = {"x_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*fp16", "y_ptr": "*bf16", "ws_ptr": "*fp32",
           "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32",
           "split_k": "i32", "bias": "fp32"}
    const = {**tc_kernel_constexprs(cfg, N, K, 128, use_asm=True, dot_f32=False), "PDL": True}
    for name, value in (("M", M), ("split_k", cfg.split_k)):
        if value == 1:                     # Triton specialises integer arguments equal to 1
            const[name] = 1
    sig.update({c: "constexpr" for c in const})
    src = ASTSource(_w4a16_tc_kernel, sig, const, _pointer_attrs(sig, ("N", "K", "stride_xm", "stride_ym")))
    return src, cfg


def w8a16_source(spec: str, M: int, N: int, K: int):
    """The W8A16 tensor-core kernel (`_w8a16_tc_kernel`) as `w8a16_tc` launches it for this spec."""
    from triton.compiler import ASTSource

    from salactl.runtime.ops.w4a16.tc_config import tc_block_m
    from salactl.runtime.ops.w8a16.triton_tc import TC8Config, _unroll, _w8a16_tc_kernel, default_tc8_config
    try:
        cfg = TC8Config.parse(spec, default_tc8_config(M, N, K))
    except ValueError as e:
        raise SystemExit(f"tools/sass_loops.py: {e}") from None
    split = cfg.split(M, N, K, 132)
    sig = {"x_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*fp16", "y_ptr": "*bf16", "ws_ptr": "*fp32",
           "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32",
           "split_k": "i32"}
    const = {"GROUP": 128, "BLOCK_N": cfg.block_n, "BLOCK_M": tc_block_m(M), "USE_ASM": True, "DOT_F32": False,
             "WARPS": cfg.warps, "UNROLL": _unroll(cfg.unroll, -(-K // 64 // split)),
             "EVEN_N": N % cfg.block_n == 0, "RED": cfg.red, "F16": bool(cfg.f16), "PDL": True}
    for name, value in (("M", M), ("split_k", split)):
        if value == 1:                     # Triton specialises integer arguments equal to 1
            const[name] = 1
    sig.update({c: "constexpr" for c in const})
    src = ASTSource(_w8a16_tc_kernel, sig, const, _pointer_attrs(sig, ("N", "K", "stride_xm", "stride_ym")))
    return src, cfg, split


def _sala_9b_selection():
    from salactl.runtime.ops.selection import gpu
    from salactl.runtime.presets import sala_9b
    cfg = sala_9b()
    return cfg, cfg.sparse_config, gpu.DECODE_TUNING


def select_words_source(late: bool = False):
    """Pass 2 (`_block_words_kernel`) with the default knobs, 256 lse splits (batch 1), fused K1
    (as the engine launches it); late: its K1 scores after the PDL wait (p2_early=False)."""
    from triton.compiler import ASTSource

    from salactl.runtime.ops.selection.gpu import words_constexprs
    from salactl.runtime.ops.selection.triton_decode import _block_words_kernel
    cfg, sc, tuning = _sala_9b_selection()
    sig = {"q_ptr": "*bf16", "k1_ptr": "*bf16", "pt_ptr": "*i32", "slot_ptr": "*i32", "seqlen_ptr": "*i32",
           "plse_ptr": "*fp32", "word_ptr": "*i32", "ctr_ptr": "*i32", "jstart_ptr": "*i32", "jcount_ptr": "*i32",
           **{s: "i32" for s in ("s_qn", "s_qh", "s_1p", "s_1h", "s_pt", "s_word")}, "sm_scale": "fp32",
           "num_splits": "i32"}
    const = {**words_constexprs(sc, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, tuning.nbc,
                                256, dot_f32=False, dedup=tuning.dedup, early=tuning.p2_early and not late, fuse=True), "PDL": True}
    sig.update({c: "constexpr" for c in const})
    return ASTSource(_block_words_kernel, sig, const, _pointer_attrs(sig, ("s_qn", "s_qh", "s_1p", "s_1h")))


def select_lse_source(bw: int | None = None, per_row: bool = False):
    """Pass 1 (`_lse_kernel`) with the default knobs (or `bw` windows per step; per_row: the online
    softmax reduced per row at every step, lse_elem=False) and fused K1 (as the engine launches it)."""
    from triton.compiler import ASTSource

    from salactl.runtime.ops.selection.gpu import lse_constexprs
    from salactl.runtime.ops.selection.triton_decode import _lse_kernel
    cfg, sc, tuning = _sala_9b_selection()
    sig = {"q_ptr": "*bf16", "k1_ptr": "*bf16", "pt_ptr": "*i32", "slot_ptr": "*i32", "seqlen_ptr": "*i32",
           "plse_ptr": "*fp32", "ctr_ptr": "*i32", "k_ptr": "*bf16", "jstart_ptr": "*i32", "jcount_ptr": "*i32",
           "ks_ptr": "*fp32", **{s: "i32" for s in ("s_qn", "s_qh", "s_1p", "s_1h", "s_kp", "s_kh", "s_pt")},
           "sm_scale": "fp32", "num_splits": "i32"}
    const = {**lse_constexprs(sc, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                              bw or tuning.lse_bw, dot_f32=False, fuse=True, fp8=False,
                              elem=tuning.lse_elem and not per_row), "PDL": True}
    sig.update({c: "constexpr" for c in const})
    return ASTSource(_lse_kernel, sig, const, _pointer_attrs(sig, ("s_qn", "s_qh", "s_1p", "s_1h", "s_kp", "s_kh")))


def select_top_source():
    """The one-program radix top-k (`_radix_kernel`) of rows up to DECODE_TUNING.short_blocks blocks."""
    from triton.compiler import ASTSource

    from salactl.runtime.ops.selection.triton_radix import _radix_kernel, radix_constexprs
    from salactl.runtime.ops.selection.triton_rank import NCTR
    cfg, sc, tuning = _sala_9b_selection()
    sig = {"seqlen_ptr": "*i32", "word_ptr": "*i32", "ctr_ptr": "*i32", "pick_ptr": "*i64", "sel_ptr": "*i32",
           "cnt_ptr": "*i32", **{s: "i32" for s in ("s_word", "s_seln", "s_selh", "s_cntn", "s_cnth")}}
    const = {**radix_constexprs(cfg.num_key_value_heads, sc.block_size, sc.selected_blocks,
                                tuning.short_blocks, NCTR), "PDL": True}
    sig.update({c: "constexpr" for c in const})
    return ASTSource(_radix_kernel, sig, const, _pointer_attrs(sig, ()))


def select_rank_source():
    """The rank top-k (`_rank_kernel`) with DECODE_TUNING's tiles, short rows ranked too."""
    from triton.compiler import ASTSource

    from salactl.runtime.ops.selection.triton_rank import NCTR, _rank_kernel
    cfg, sc, tuning = _sala_9b_selection()
    sig = {"seqlen_ptr": "*i32", "word_ptr": "*i32", "ctr_ptr": "*i32", "kept_ptr": "*i64", "sel_ptr": "*i32",
           "cnt_ptr": "*i32", **{s: "i32" for s in ("s_word", "s_kept", "s_seln", "s_selh", "s_cntn", "s_cnth")}}
    const = {"HKV": cfg.num_key_value_heads, "BS": sc.block_size, "NCTR": NCTR, "K": sc.selected_blocks,
             "RB": tuning.rank_rb, "CT": tuning.rank_ct, "SMALL": tuning.short_blocks, "SHORT": True, "PDL": True}
    sig.update({c: "constexpr" for c in const})
    return ASTSource(_rank_kernel, sig, const, _pointer_attrs(sig, ()))


def _instructions(sass: str) -> list[tuple[int, str]]:
    """(address, text) of every instruction of a cuobjdump disassembly."""
    return [(int(a, 16), ins) for a, ins in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]


def _opcode(ins: str) -> str:
    """An instruction's opcode without its predicate or modifiers (`@!P0 LDG.E.128 ...` -> LDG)."""
    return re.sub(r"^@!?U?P[T0-9]+\s+", "", ins).split()[0].split(".")[0]


def _branch_target(ins: str) -> int | None:
    """The address a BRA instruction jumps to (None for any other instruction)."""
    m = re.search(r"\bBRA\s+(?:`\()?[^0-9]*(0x[0-9a-f]+)", ins)
    return int(m.group(1), 16) if m else None


def loops(sass: str) -> list[dict]:
    """Every backward-branch loop with an MMA in it: its instruction count and opcode histogram."""
    lines = _instructions(sass)
    addr = [a for a, _ in lines]
    out = []
    for i, (_, ins) in enumerate(lines):
        target = _branch_target(ins)
        if target is None or target >= addr[i] or target not in addr:
            continue
        body = [_opcode(x) for _, x in lines[addr.index(target):i + 1]]
        ops = Counter(body)
        if any(op.endswith("MMA") for op in ops):
            out.append({"instructions": len(body), "ops": dict(ops.most_common())})
    return out


_ORDER = {"LDGSTS": "A", "UTMALDG": "A", "LDG": "G", "STS": "S", "LDS": "s", "BAR": "b"}


def issue_order(sass: str) -> str:
    """The kernel's global loads, async copies, shared stores / loads, barriers and MMAs in program
    order, one letter each (see the module docstring), with | for every backward branch."""
    lines = _instructions(sass)
    out = []
    for addr, ins in lines:
        op = _opcode(ins)
        if op.endswith("MMA"):
            out.append("M")
        elif op == "BRA":
            target = _branch_target(ins)
            if target is not None and target < addr:
                out.append("|")
        elif op in _ORDER:
            out.append(_ORDER[op])
    return "".join(out)


def analyse(src, options: dict, arch: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget

    k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(k.asm["cubin"])
        tool = triton.knobs.nvidia.cuobjdump.path
        res = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    usage = {key.lower(): int(val) for key, val in re.findall(r"(REG|STACK|SHARED):(\d+)", res)}
    ops = [_opcode(ins) for _, ins in _instructions(sass)]
    return {"registers": usage.get("reg"), "stack_bytes": usage.get("stack"),
            "shared_bytes": k.metadata.shared, "instructions": len(ops),
            "kernel_ops": dict(Counter(ops).most_common()), "loops": loops(sass), "issue_order": issue_order(sass)}


def main() -> int:
    # under TRITON_INTERPRET=1 (e.g. inherited from the CPU tests) @triton.jit gives interpreter
    # functions, which cannot be compiled; this tool only ever compiles
    os.environ.pop("TRITON_INTERPRET", None)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel", choices=["decode-split", "w4a16", "w8a16", "select-lse", "select-words", "select-top", "select-rank"])
    ap.add_argument("--kv", choices=["fp8", "bf16"], default="fp8", help="decode-split: page dtype")
    ap.add_argument("--warps", type=int, default=None,
                    help="num_warps (decode-split: 2, select-words: DECODE_TUNING num_warps, select-top / select-rank: DECODE_TUNING "
                         "radix_warps / rank_warps)")
    ap.add_argument("--stages", type=int, default=None, help="decode-split (default 3), select-lse: num_stages")
    ap.add_argument("--bw", type=int, default=None, help="select-lse: windows per step")
    ap.add_argument("--per-row", action="store_true",
                    help="select-lse: the softmax reduced per row at every step (lse_elem=False)")
    ap.add_argument("--preload", type=int, default=16, help="decode-split: page ids preloaded (0: none)")
    ap.add_argument("--tma", action="store_true", help="decode-split: K/V pages by TMA copies")
    ap.add_argument("--late", action="store_true", help="select-words: the K1 scores after the PDL wait")
    ap.add_argument("--spec", default=None,
                    help="w4a16: a register-kernel config spec (tc_config.parse_tc_spec; default: the config "
                         "the dispatch picks for --m/--n/--k)")
    ap.add_argument("--spec8", default="", help="w8a16: TC8Config fields over the dispatch default, e.g. 'un=2,waves=8'")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for sm_90")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--order", action="store_true", help="also print the issue order (see the module docstring)")
    a = ap.parse_args()
    if a.kernel == "decode-split":
        warps = a.warps or 2
        src = decode_split_source(a.kv, a.preload, a.tma)
        stages = a.stages or 3
        options = {"num_warps": warps, "num_stages": stages}
        what = f"decode split kernel, {a.kv} pages, w{warps} s{stages} preload {a.preload}{' tma' if a.tma else ''}"
    elif a.kernel == "select-lse":
        tuning = _sala_9b_selection()[2]
        warps, stages = a.warps or tuning.lse_warps, a.stages or tuning.lse_stages
        src = select_lse_source(a.bw, a.per_row)
        options = {"num_warps": warps, "num_stages": stages}
        what = (f"decode selection pass 1 (sala-9b), w{warps} s{stages}{f' bw{a.bw}' if a.bw else ''}"
                f"{' per-row' if a.per_row else ''}")
    elif a.kernel == "select-words":
        warps = a.warps or _sala_9b_selection()[2].num_warps
        src, options = select_words_source(a.late), {"num_warps": warps}
        what = f"decode selection pass 2 (sala-9b, batch 1), w{warps}{' late' if a.late else ''}"
    elif a.kernel == "select-top":
        warps = a.warps or _sala_9b_selection()[2].radix_warps
        src, options = select_top_source(), {"num_warps": warps}
        what = f"decode selection one-program radix top-k (sala-9b), w{warps}"
    elif a.kernel == "select-rank":
        warps = a.warps or _sala_9b_selection()[2].rank_warps
        src, options = select_rank_source(), {"num_warps": warps}
        what = f"decode selection rank top-k (sala-9b), w{warps}"
    elif a.kernel == "w8a16":
        src, cfg, split = w8a16_source(a.spec8, a.m, a.n, a.k)
        options = {"num_warps": cfg.warps, "num_stages": cfg.stages}
        what = f"W8A16 tensor-core kernel {cfg}, M={a.m} {a.n}x{a.k} (split {split})"
    else:
        src, cfg = w4a16_source(a.spec, a.m, a.n, a.k)
        options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        spec = a.spec if a.spec is not None else f"dispatch default {cfg}"
        what = f"W4A16 register kernel {spec}, M={a.m} {a.n}x{a.k} (split {cfg.split_k}, unroll {cfg.unroll})"
    r = {"kernel": what, "arch": f"sm_{a.arch}", **analyse(src, options, a.arch)}
    if a.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"{what}, sm_{a.arch}: {r['registers']} registers, {r['stack_bytes']} B stack, "
          f"{r['shared_bytes']} B shared, {r['instructions']} instructions")
    if not r["loops"]:
        print("  kernel: " + ", ".join(f"{op} {n}" for op, n in list(r["kernel_ops"].items())[:16]))
    for lp in r["loops"]:
        ops = ", ".join(f"{op} {n}" for op, n in list(lp["ops"].items())[:12])
        print(f"  loop of {lp['instructions']} instructions: {ops}")
    if a.order:
        print(f"  issue order: {r['issue_order']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
