"""Paged decode attention, one sala-9b layer (2 KV heads x 16 query heads, head_dim 128, 64-token
pages): bf16 vs fp8_e4m3 pages, the current defaults vs the launch configs of SWEEP_CONFIGS
(runtime/ops/decode_attention/config.py). Issue 5's target: fp8 >= 1.7x bf16 at 128K, batch 1.

    python benchmarks/decode_attention_bench.py [--out FILE.json] [--quick] [--configs 0,3,5] [--split-only]
        [--cases "128K b1,128K b4,128K b8"] [--read-floor] [--rounds 5] [--layout sequential]

1. correctness (fails loudly, exit 1): every config x {bf16, fp8_e4m3 with per-head scales} on
   dense 4K batch 8, dense 128K batch 1 and a sparse-selected row set (128K, 96 random blocks
   per KV head, the own block included) against reference.paged_attention; rel err <= 1e-2.
2. timing: dense 32K/128K/1M batch 1, dense 4K batch 8/32, sparse-selected 128K batch 1 (or the
   --cases given, e.g. 128K at batch 8: the FP8 question when several requests share a step); each a
   CUDA graph of calls that rotate over R disjoint page ranges of one pool (R x KV bytes >= 150 MB,
   so KV is not served from the 50 MB L2); median of replays; the time includes the merge kernel.
   --rounds N: every (dtype, config) of a case timed N times, odd rounds in reverse order, median.
   --layout: the pages of each rotation in random order (default: a pool after much churn) or
   consecutive (what the engine's allocator gives a request in a fresh pool: one contiguous range).
--split-only adds, per dtype, the default config's split kernel alone (`split_partials`, no merge
kernel): what the merge launch costs in a graph of calls. --read-floor adds, per dense case and
dtype, the fastest kernel that only reads the KV bytes once (read_floor.py) in the same rotation:
the floors' fp8/bf16 is the most any FP8 kernel could gain over bf16 there.
Table (stdout, last): case, dtype, config, us per call, GB/s (KV bytes read / time), x default (the
dtype's current default time / this time), fp8/bf16 (bf16 default time / this time, fp8 rows).
With 3+ dense contexts at one batch (e.g. --cases "32K b1,128K b1,512K b1,1M b1"), the defaults'
times are then split into streaming (the rate between the two longest contexts) and a fixed cost
per call, with the fixed cost fp8 would need at each context for 1.7x bf16.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import events_time  # noqa: E402

from salactl.runtime.gpu.selfcheck import rel_err  # noqa: E402

HKV, HQ, D, B = 2, 32, 128, 64      # sala-9b: 32 query heads over 2 KV heads (G = 16)
SELECTED = 96                       # sala-9b's selected_blocks (topk 64 + 32 window blocks)
L2_BYTES = 150e6
DTYPES = {"bf16": None, "fp8_e4m3": torch.float8_e4m3fn}


def kv_bytes(tokens: int, dt: str) -> int:
    """K and V bytes of `tokens` tokens of one layer in page dtype `dt`."""
    return 2 * tokens * HKV * D * (2 if DTYPES[dt] is None else 1)


class Case:
    """n rows of length ctx; `rot` copies of the page set (pool, page tables) for L2 rotation."""

    def __init__(self, name, ctx, batch, sparse=False, rot=1, seed=0, layout="random"):
        self.name, self.ctx, self.batch, self.sparse = name, ctx, batch, sparse
        g = torch.Generator(device="cuda").manual_seed(seed)
        per = math.ceil(ctx / B)
        self.pages_per_rot = batch * per
        P = rot * self.pages_per_rot
        self.kp = torch.randn(P, HKV, B, D, device="cuda", dtype=torch.bfloat16, generator=g)
        self.vp = torch.randn(P, HKV, B, D, device="cuda", dtype=torch.bfloat16, generator=g)
        self.q = torch.randn(batch, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
        self.slots = torch.arange(batch, dtype=torch.int32, device="cuda")
        self.seq = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        self.seq[-1] = ctx - 17 if batch > 1 else ctx       # one partial last page
        self.tables = []
        for r in range(rot):
            perm = (torch.randperm(self.pages_per_rot, device="cuda", generator=g) if layout == "random"
                    else torch.arange(self.pages_per_rot, device="cuda")) + r * self.pages_per_rot
            self.tables.append(perm.to(torch.int32).reshape(batch, per).contiguous())
        self.sel = self.cnt = None
        self.blocks = per
        if sparse:
            sel = torch.zeros(batch, HKV, SELECTED, dtype=torch.int32, device="cuda")
            for i in range(batch):
                for h in range(HKV):
                    own = per - 1
                    others = torch.randperm(own, device="cuda", generator=g)[:SELECTED - 1]
                    sel[i, h] = torch.cat([others.sort().values, torch.tensor([own], device="cuda")]).to(torch.int32)
            self.sel = sel
            self.cnt = torch.full((batch, HKV), SELECTED, dtype=torch.int32, device="cuda")
            self.blocks = SELECTED
        self.scales = {"bf16": (1.0, 1.0),
                       "fp8_e4m3": (torch.tensor([0.02, 0.03], device="cuda"), torch.tensor([0.025, 0.035], device="cuda"))}
        self.pools = {}

    def pool(self, dt):
        from salactl.runtime.ops.decode_attention.reference import pack_v_pages
        if dt not in self.pools:
            if DTYPES[dt] is None:
                self.pools[dt] = (self.kp, self.vp)
            else:
                ks, vs = self.scales[dt]
                self.pools[dt] = ((self.kp.float() / ks[None, :, None, None]).to(DTYPES[dt]),
                                  pack_v_pages((self.vp.float() / vs[None, :, None, None]).to(DTYPES[dt])))
        return self.pools[dt]

    def kv_bytes(self, dt) -> int:
        return kv_bytes(self.batch * (self.blocks * B if self.sparse else self.ctx), dt)

    def call(self, dt, cfg, rot=0, out=None, split_only=False):
        from salactl.runtime.ops.decode_attention.config import choose_splits
        from salactl.runtime.ops.decode_attention.triton import paged_attention, split_partials
        kp, vp = self.pool(dt)
        ks, vs = self.scales[dt]
        splits = choose_splits(self.batch * HKV, self.blocks, torch.cuda.get_device_properties(0).multi_processor_count,
                               config=cfg)
        kw = dict(block_ids=self.sel, num_blocks=self.cnt, dense_len=1) if self.sparse else {}
        if not split_only:
            kw["out"] = out
        return (split_partials if split_only else paged_attention)(
            self.q, kp, vp, self.tables[rot], self.slots, self.seq, k_scale=ks, v_scale=vs, num_splits=splits,
            config=cfg, **kw)

    def reference(self, dt):
        from salactl.runtime.ops.decode_attention.reference import paged_attention as ref
        kp, vp = self.pool(dt)
        ks, vs = self.scales[dt]
        kw = dict(block_ids=self.sel, num_blocks=self.cnt, dense_len=1) if self.sparse else {}
        return ref(self.q.float(), kp, vp, self.tables[0], self.slots, self.seq, k_scale=ks, v_scale=vs,
                   **kw)


def time_case(case, dt, cfg, rot, split_only=False) -> float:
    """Seconds per call: replays of a graph of calls cycling over the `rot` page ranges."""
    out = torch.empty(case.batch, HQ, D, device="cuda", dtype=torch.bfloat16)
    calls = rot * max(1, math.ceil(12 / rot))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for r in range(rot):
            case.call(dt, cfg, r, out, split_only)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            case.call(dt, cfg, i % rot, out, split_only)
    return events_time(g.replay, reps=11, warm=2) / calls


DEFAULT_CASES = "32K b1,128K b1,1M b1,4K b8,4K b32,sparse 128K b1"


def parse_case(name: str, ap):
    """A timing case from its name: "[sparse ]<n>K b<batch>" or "<n>M b<batch>" (e.g. "128K b8")."""
    m = re.fullmatch(r"(sparse )?(\d+)([KM]) b(\d+)", name)
    if not m:
        ap.error(f"bad case {name!r}: expected e.g. '128K b8', '1M b1' or 'sparse 128K b1'")
    ctx = int(m.group(2)) << (10 if m.group(3) == "K" else 20)
    return name, ctx, int(m.group(4)), bool(m.group(1))


def streaming_fit(points):
    """points [(ctx, us, kv_bytes)] of one dtype's default at one batch, 3 contexts or more. The two
    longest give the streaming rate (bytes per us); what each context's time has beyond its bytes at
    that rate is its fixed cost. Returns (TB/s, [(ctx, fixed us)]) in context order."""
    pts = sorted(points)
    (_, t1, b1), (_, t2, b2) = pts[-2], pts[-1]
    bytes_per_us = (b2 - b1) / (t2 - t1)
    return bytes_per_us / 1e6, [(c, t - b / bytes_per_us) for c, t, b in pts]


def print_fits(rows, specs):
    """Per batch with 3+ dense contexts: each dtype's streaming rate and fixed cost per context
    (from the defaults), and the fixed cost fp8 would need at each context for 1.7x bf16."""
    dense = [(n, c, b) for n, c, b, sparse in specs if not sparse]
    for batch in sorted({b for _, _, b in dense}):
        cases = [(n, c) for n, c, b in dense if b == batch]
        if len({c for _, c in cases}) < 3:
            continue
        fits, times = {}, {}
        for dt in DTYPES:
            t = {c: r["us"] for n, c in cases for r in rows
                 if r["case"] == n and r["dtype"] == dt and r["default"] and "split-only" not in r["config"]}
            times[dt] = t
            fits[dt] = streaming_fit([(c, us, kv_bytes(batch * c, dt)) for c, us in t.items()])
        print(f"\nbatch {batch}: streaming rate from the two longest contexts, fixed cost = time - bytes / rate (us)")
        for dt, (tbs, fixed) in fits.items():
            print(f"  {dt:8} {tbs:.2f} TB/s; " + ", ".join(f"{c >> 10}K {f:.1f}" for c, f in fixed))
        tbs8 = fits["fp8_e4m3"][0]
        need = [(c, times["bf16"][c] / 1.7 - kv_bytes(batch * c, "fp8_e4m3") / (tbs8 * 1e6)) for c, _ in fits["bf16"][1]]
        print("  fp8 fixed cost for 1.7x bf16: " + ", ".join(f"{c >> 10}K {f:.1f}" for c, f in need))


def print_floors(floors) -> None:
    """Per dense case: each dtype's read floor (a kernel that only reads the KV bytes once) beside
    the default's time, and fp8/bf16 of the floors: the most any FP8 kernel could gain there."""
    if not floors:
        return
    print("\nread floor (read_floor.py: the fastest kernel that only reads the KV bytes once):")
    print(f"{'case':15} {'dtype':8} {'default us':>10} {'floor us':>9} {'default/floor':>13}  floor config")
    for f in floors:
        print(f"{f['case']:15} {f['dtype']:8} {f['default_us']:10.1f} {f['us']:9.1f} {f['default_us'] / f['us']:13.2f}  "
              f"{f['config']}")
    for case in dict.fromkeys(f["case"] for f in floors):
        by = {f["dtype"]: f for f in floors if f["case"] == case}
        if "bf16" in by and "fp8_e4m3" in by:
            print(f"  {case}: fp8/bf16 of the floors {by['bf16']['us'] / by['fp8_e4m3']['us']:.2f}x, of the defaults "
                  f"{by['bf16']['default_us'] / by['fp8_e4m3']['default_us']:.2f}x")


def main() -> int:
    from salactl.runtime.ops.decode_attention.config import DEFAULT_CONFIGS, SWEEP_CONFIGS, default_config
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    ap.add_argument("--quick", action="store_true", help="only 128K batch 1")
    ap.add_argument("--configs", default=None, help="comma-separated indices into SWEEP_CONFIGS ('': the defaults only, which always run)")
    ap.add_argument("--split-only", action="store_true", help="also time each default's split kernel alone")
    ap.add_argument("--read-floor", action="store_true",
                    help="also, per dense case, the fastest kernel that only reads its KV bytes (read_floor.py)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every (dtype, config) of a case this many times, in alternating order, and "
                         "take the median (order effects between configs are ~2-3%%)")
    ap.add_argument("--layout", choices=("random", "sequential"), default="random",
                    help="page order in the timed page tables (sequential: one contiguous range per row)")
    ap.add_argument("--cases", default=None,
                    help="comma-separated timing cases instead of DEFAULT_CASES, e.g. '128K b1,128K b8,"
                         "sparse 128K b1' (--quick: 128K b1)")
    a = ap.parse_args()
    cases = a.cases or ("128K b1" if a.quick else DEFAULT_CASES)
    specs = [parse_case(c.strip(), ap) for c in cases.split(",") if c.strip()]
    t0 = time.time()
    picked = [] if a.configs is None else [int(i) for i in a.configs.split(",") if i.strip()]
    if any(not 0 <= i < len(SWEEP_CONFIGS) for i in picked):
        raise SystemExit(f"decode_attention_bench.py: --configs {a.configs}: indices run 0..{len(SWEEP_CONFIGS) - 1} "
                         "(indices of earlier commits name other configs; see SWEEP_CONFIGS)")
    sweep = SWEEP_CONFIGS if a.configs is None else [SWEEP_CONFIGS[i] for i in picked]
    configs = list(dict.fromkeys([DEFAULT_CONFIGS[k] for k in ("bf16", "fp8", "fp8_mid")] + list(sweep)))

    # 1. correctness
    bad = []
    checks = [Case("4K b8", 4096, 8, seed=1), Case("128K b1", 131072, 1, seed=2),
              Case("sparse 128K b1", 131072, 1, sparse=True, seed=3)]
    for case in checks:
        for dt in DTYPES:
            ref = case.reference(dt)
            for cfg in configs:
                e = rel_err(case.call(dt, cfg).float(), ref)
                if not e <= 1e-2:
                    bad.append((case.name, dt, cfg.name, e))
        print(f"checked {case.name} ({time.time() - t0:.0f} s)", file=sys.stderr)
    del checks
    if bad:
        for b in bad:
            print("WRONG:", *b)
        return 1

    # 2. timing
    rows, floors = [], []
    for name, ctx, batch, sparse in specs:
        per_rot = kv_bytes(batch * (SELECTED * B if sparse else ctx), "fp8_e4m3")   # bytes of one rotation
        rot = min(16, max(1, math.ceil(L2_BYTES / per_rot)))
        case = Case(name, ctx, batch, sparse, rot=rot, layout=a.layout)
        base = {}
        defaults = {dt: default_config(DTYPES[dt] or torch.bfloat16, batch * HKV) for dt in DTYPES}
        pairs = [(dt, cfg) for dt in DTYPES for cfg in configs]
        times = {p: [] for p in pairs}
        for r in range(a.rounds):         # odd rounds reversed: no config always runs first
            for dt, cfg in (pairs if r % 2 == 0 else pairs[::-1]):
                times[(dt, cfg)].append(time_case(case, dt, cfg, rot))
        for dt, cfg in pairs:
            t = statistics.median(times[(dt, cfg)])
            rows.append(dict(case=name, dtype=dt, config=cfg.name, default=cfg == defaults[dt],
                             us=t * 1e6, gb_s=case.kv_bytes(dt) / t / 1e9))
            if cfg == defaults[dt]:
                base[dt] = t * 1e6
                if a.split_only:
                    t = time_case(case, dt, cfg, rot, split_only=True)
                    rows.append(dict(case=name, dtype=dt, config=cfg.name + " split-only", default=False,
                                     us=t * 1e6, gb_s=case.kv_bytes(dt) / t / 1e9))
        for r in rows:
            if r["case"] == name:
                r["x_default"] = base[r["dtype"]] / r["us"]
                r["fp8_vs_bf16"] = base["bf16"] / r["us"] if r["dtype"] != "bf16" else None
        if a.read_floor and not sparse:
            from read_floor import read_floor_us          # triton: GPU runs only (CPU tests import this file)
            for dt in DTYPES:
                us, how = read_floor_us(case.kv_bytes(dt), rot, rot * max(1, math.ceil(12 / rot)))
                floors.append(dict(case=name, dtype=dt, us=us, config=how, default_us=base[dt]))
        print(f"timed {name} (rot {rot}, {time.time() - t0:.0f} s)", file=sys.stderr)
        del case
        torch.cuda.empty_cache()

    if a.out:
        Path(a.out).write_text(json.dumps(rows + floors, indent=1))
    print(f"\n{'case':15} {'dtype':8} {'config':36} {'us':>8} {'GB/s':>7} {'x default':>9} {'fp8/bf16':>8}")
    for r in rows:
        mark = "*" if r["default"] else " "
        f8 = f"{r['fp8_vs_bf16']:.2f}x" if r["fp8_vs_bf16"] is not None else ""
        print(f"{r['case']:15} {r['dtype']:8} {mark}{r['config']:35} {r['us']:8.1f} {r['gb_s']:7.0f} "
              f"{r['x_default']:8.2f}x {f8:>8}")
    # the best config per dtype at 128K b1, and its worst ratio to the default over every case
    print("\nbest at 128K b1 (x default there; worst x default over all cases):")
    for dt in DTYPES:
        at = [r for r in rows if r["dtype"] == dt and r["case"] == "128K b1" and "split-only" not in r["config"]]
        if not at:
            break
        best = min(at, key=lambda r: r["us"])
        worst = min(r["x_default"] for r in rows if r["dtype"] == dt and r["config"] == best["config"])
        f8 = f", {best['fp8_vs_bf16']:.2f}x bf16 default" if best["fp8_vs_bf16"] else ""
        print(f"  {dt:8} {best['config']:35} {best['us']:.1f} us ({best['x_default']:.2f}x{f8}; worst {worst:.2f}x)")
    print_fits(rows, specs)
    print_floors(floors)
    print(f"total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
