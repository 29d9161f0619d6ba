"""W8A16 linear (8-bit symmetric GPTQ, group 128) against bf16 cuBLAS on the 9B's projection shapes.

For each shape and row count: checks our Triton kernel (runtime/ops/w8a16/triton.py) and every
`--configs` variant against the fp32 product of the dequantized weight, then times bf16 cuBLAS, the
kernel, the variants and the per-call dequantization + cuBLAS (the path above 64 rows) as CUDA-graph
replays over rotating weight copies (> 200 MB, so no call finds its weight in L2). Prints a table
(a wrong kernel or variant shows as "wrong" there, is named after it and makes the exit status 1).

    cd benchmarks && python w8a16_bench.py --batches 1,8,32 --configs "bn=32,pps=4;stages=6"
    cd benchmarks && python w8a16_bench.py --tc8 ";un=2;waves=8"     # the tensor-core kernel's configs
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import torch

from timing import graph_time_us
from w4a16_bench import GROUP, ROTATE_BYTES, SHAPES, copy_bandwidth, n_calls, rel_err

from salactl.runtime.ops.w8a16.layout import pack_tc8
from salactl.runtime.ops.w8a16.triton import DEFAULT, DEFAULT_GEMV, W8Config, w8a16_linear
from salactl.runtime.ops.w8a16.triton_tc import TC8Config, default_tc8_config, w8a16_tc

MAX_ERR = 1e-2
_KEYS = {"bn": "block_n", "bk": "block_k", "w": "warps", "stages": "stages", "pps": "programs_per_sm",
         "gemv": "gemv"}


def parse_config(spec: str, rows: int) -> W8Config:
    """'bn=32,pps=4' -> the dispatch's default for `rows` with those fields replaced."""
    fields = {}
    for item in filter(None, spec.replace(" ", "").split(",")):
        key, _, value = item.partition("=")
        if key not in _KEYS:
            sys.exit(f"config {spec!r}: unknown key {key!r} (known: {', '.join(_KEYS)})")
        if not value.lstrip("-").isdigit():
            sys.exit(f"config {spec!r}: {key} wants an integer, got {value!r}")
        fields[_KEYS[key]] = int(value)
    return dataclasses.replace(DEFAULT_GEMV if rows == 1 else DEFAULT, **fields)


def bench_shape(name, N, K, batches, configs, tc8, gen, sms, log) -> list[dict]:
    codes = torch.randint(-128, 128, (K // GROUP, N, GROUP), device="cuda", generator=gen, dtype=torch.int8)
    s = (torch.rand(K // GROUP, N, device="cuda", generator=gen) * 2e-3 + 1e-3).half()
    w_ref = (codes.float() * s.float()[:, :, None]).transpose(0, 1).reshape(N, K)      # [N, K] fp32
    w_bf16 = w_ref.bfloat16()
    nbytes = codes.numel() + s.numel() * 2
    copies = [(codes.clone(), s.clone()) for _ in range(max(1, math.ceil(ROTATE_BYTES / nbytes)))]
    words = pack_tc8((codes.int() + 128).transpose(0, 1).reshape(N, K).t().contiguous()) if tc8 else None
    tc_copies = [(words.clone(), s.clone()) for _ in range(len(copies))] if tc8 else []
    rows = []
    for M in batches:
        x = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
        ref = x.float() @ w_ref.t()
        row = {"shape": name, "N": N, "K": K, "M": M}
        ok = {}
        for label, cfg in [("default", None)] + [(c, parse_config(c, M)) for c in configs]:
            errs = [rel_err(w8a16_linear(x, codes, s, sms, cfg), ref) for _ in range(2)]   # 2nd: ticket reset
            if max(errs) > MAX_ERR:
                log(f"  {name} M={M} {label}: WRONG rel err {max(errs):.3g}")
            else:
                ok[label] = cfg
        tc_ok = {}
        for spec in tc8:
            cfg = TC8Config.parse(spec, default_tc8_config(M, N, K))
            errs = [rel_err(w8a16_tc(x, words, s, GROUP, cfg, sms), ref) for _ in range(2)]
            if max(errs) > MAX_ERR:
                log(f"  {name} M={M} tc8 {spec!r}: WRONG rel err {max(errs):.3g}")
            else:
                tc_ok[f"tc8:{spec}"] = cfg
        calls = n_calls(N * K * 2, M)
        bw = [w_bf16.clone() for _ in range(min(calls, max(1, math.ceil(ROTATE_BYTES / (N * K * 2)))))]
        row["bf16_us"] = graph_time_us([lambda i=i: torch.nn.functional.linear(x, bw[i % len(bw)])
                                        for i in range(calls)])
        bw.clear()
        calls = n_calls(nbytes, M)
        for label, cfg in ok.items():
            row[label] = graph_time_us([lambda i=i, c=cfg: w8a16_linear(x, *copies[i % len(copies)], sms, c)
                                        for i in range(calls)])
        for label, cfg in tc_ok.items():
            row[label] = graph_time_us([lambda i=i, c=cfg: w8a16_tc(x, *tc_copies[i % len(tc_copies)], GROUP, c, sms)
                                        for i in range(calls)])
        row["dequant_us"] = graph_time_us(
            [lambda i=i: x @ (copies[i % len(copies)][0].bfloat16() * copies[i % len(copies)][1].bfloat16()[:, :, None])
             .transpose(0, 1).reshape(N, K).t() for i in range(min(calls, 16))])
        row["bytes"] = nbytes
        rows.append(row)
        log(f"{name} M={M}: bf16 {row['bf16_us']:.2f} us, W8A16 {row.get('default', float('nan')):.2f} us")
    return rows


def wrong_cells(rows: list[dict], labels: list[str]) -> list[str]:
    """'shape M=rows label' of every kernel or variant checked wrong (so not timed) in `rows`."""
    return [f"{r['shape']} M={r['M']} {c}" for r in rows for c in labels if c not in r]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="0,2,3,4,5", help="indices into w4a16_bench.SHAPES")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--configs", default="", help="';'-separated variants, e.g. 'bn=32,pps=4;stages=6'")
    ap.add_argument("--tc8", default=None, help="';'-separated TC8Config specs of the tensor-core kernel "
                    "(triton_tc.py; '' = its default), e.g. ';un=2;waves=8'")
    args = ap.parse_args()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    configs = list(filter(None, args.configs.split(";")))
    tc8 = args.tc8.split(";") if args.tc8 is not None else []
    for spec in configs:
        parse_config(spec, 1)                   # a bad spec stops here, before any GPU work
    for spec in tc8:
        try:
            TC8Config.parse(spec, TC8Config())
        except ValueError as e:
            sys.exit(f"--tc8 {spec!r}: {e}")
    if not torch.cuda.is_available():
        sys.exit("w8a16_bench.py: needs a CUDA GPU")
    gen = torch.Generator(device="cuda").manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth()
    rows = []
    for i in args.shapes.split(","):
        name, N, K = SHAPES[int(i)]
        rows += bench_shape(name, N, K, [int(m) for m in args.batches.split(",")], configs, tc8, gen, sms, log)
    labels = ["default"] + configs + [f"tc8:{t}" for t in tc8]
    print(f"{torch.cuda.get_device_name(0)}, copy {bw:.0f} GB/s; us per call, x = bf16 / ours")
    print("| shape | M | bf16 | dequant+cuBLAS | " + " | ".join(labels) + " | read floor |")
    print("|---|---|---|---|" + "---|" * len(labels) + "---|")
    for r in rows:
        cells = [f"{r[c]:.2f} ({r['bf16_us'] / r[c]:.2f}x)" if c in r else "wrong" for c in labels]
        print(f"| {r['shape']} | {r['M']} | {r['bf16_us']:.2f} | {r['dequant_us']:.2f} | " + " | ".join(cells)
              + f" | {r['bytes'] / bw / 1e3:.2f} |")
    wrong = wrong_cells(rows, labels)
    if wrong:
        print(f"w8a16_bench.py: {len(wrong)} wrong: {'; '.join(wrong)}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
