"""sala-nano quality of GPTQ vs RTN checkpoints and of the FP8 KV cache, on CPU.

    python benchmarks/quant_quality.py --gptq DIR --rtn DIR [--base sala-nano] [--out FILE]

Checkpoints come from `salactl quantize` (the GPTQ one with --kv-cache-dtype fp8_e4m3 for its
scales). Perplexity: salactl.evaluation.perplexity on the built-in held-out split (same windows for
every model); FP8 KV runs the same windows through Engine(kv_cache_dtype=...). Passkey:
salactl.evaluation.passkey.run_passkey. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F


def ppl(model, ids, seq_len, max_tokens, bos, kv="bf16", chunk=512):
    from salactl.evaluation.perplexity import score_windows
    from salactl.runtime.engine import Engine

    eng = Engine(model, "cpu", chunk_size=chunk, kv_cache_dtype=kv)
    nll, n = 0.0, 0
    for w in score_windows(ids, seq_len, max_tokens, bos):
        logits = eng.prefill(eng.new_sequence(), w, all_logits=True)
        nll += float(F.cross_entropy(logits[:-1].float(), torch.tensor(w[1:]), reduction="sum"))
        n += len(w) - 1
    return {"ppl": math.exp(nll / n), "tokens": n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="sala-nano")
    ap.add_argument("--gptq", required=True)
    ap.add_argument("--rtn", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--passkey-lengths", default="256,512,1024")
    ap.add_argument("--passkey-trials", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    from salactl.data.corpus import corpus_text
    from salactl.evaluation.passkey import passkey_trials, run_passkey
    from salactl.runtime.kv_fp8 import model_kv_scales
    from salactl.runtime.loader import load_model
    from salactl.runtime.tokenizer import find_tokenizer

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    models = {name: load_model(path, "cpu", args.dtype) for name, path in
              (("bf16", args.base), ("gptq", args.gptq), ("rtn", args.rtn))}
    tok = find_tokenizer(None, models["bf16"].model_dir)
    ids = tok.encode(corpus_text("heldout"))
    bos = models["bf16"].config.bos_token_id
    res: dict = {"dtype": args.dtype, "seq_len": args.seq_len, "max_tokens": args.max_tokens, "ppl": {}, "passkey": {}}
    # the GPTQ checkpoint's calibrated scales, also attached to the bf16-weight model
    for i, (k, v) in model_kv_scales(models["gptq"].model).items():
        models["bf16"].model.model.layers[i].self_attn.register_buffer("k_scale", k.clone())
        models["bf16"].model.model.layers[i].self_attn.register_buffer("v_scale", v.clone())
    runs = [("bf16", "bf16"), ("gptq", "bf16"), ("rtn", "bf16"), ("bf16", "fp8_e4m3"), ("gptq", "fp8_e4m3"),
            ("bf16", "fp8_e5m2")]
    for name, kv in runs:
        t = time.perf_counter()
        res["ppl"][f"{name}/{kv}"] = ppl(models[name].model, ids, args.seq_len, args.max_tokens, bos, kv)
        log(f"ppl {name} kv={kv}: {res['ppl'][f'{name}/{kv}']['ppl']:.4f} ({time.perf_counter() - t:.0f} s)")
    lengths = [int(x) for x in args.passkey_lengths.split(",")]
    depths = [0.1, 0.3, 0.5, 0.7, 0.9]
    for name in ("bf16", "gptq", "rtn"):
        t = time.perf_counter()
        rows = run_passkey(models[name].model, tok, passkey_trials(tok, lengths, depths, args.passkey_trials, 0),
                           model_dir=models[name].model_dir)
        acc = sum(r["correct"] for r in rows) / sum(r["trials"] for r in rows)
        res["passkey"][name] = {"accuracy": acc, "rows": rows}
        log(f"passkey {name}: {acc:.3f} ({time.perf_counter() - t:.0f} s)")
    p = res["ppl"]
    base = p["bf16/bf16"]["ppl"]
    res["summary"] = {
        "gptq_increase": p["gptq/bf16"]["ppl"] - base,
        "rtn_increase": p["rtn/bf16"]["ppl"] - base,
        "gptq_over_rtn_increase": (p["gptq/bf16"]["ppl"] - base) / max(p["rtn/bf16"]["ppl"] - base, 1e-12),
        "fp8_e4m3_change_pct_bf16_weights": 100 * (p["bf16/fp8_e4m3"]["ppl"] / base - 1),
        "fp8_e4m3_change_pct_gptq_weights": 100 * (p["gptq/fp8_e4m3"]["ppl"] / p["gptq/bf16"]["ppl"] - 1),
        "fp8_e5m2_change_pct_bf16_weights": 100 * (p["bf16/fp8_e5m2"]["ppl"] / base - 1),
        "passkey_points_gptq_minus_bf16": 100 * (res["passkey"]["gptq"]["accuracy"]
                                                 - res["passkey"]["bf16"]["accuracy"]),
    }
    text = json.dumps(res, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(json.dumps(res["summary"], indent=1))


if __name__ == "__main__":
    main()
