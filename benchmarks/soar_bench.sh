#!/usr/bin/env bash
# The SOAR speed protocol (S1, S8, Smax) on the embedded GPU engine, at a --scale that fits the
# time budget: bf16 first, then W4A16 (RTN, group 128) + FP8 KV scored against the bf16 durations.
# Results: $OUT/records.jsonl (render with `salactl report latency $OUT/records.jsonl`), one
# summary per run, and the score line. Usage: benchmarks/soar_bench.sh [SCALE] [OUT]
# Env: MODEL (sala-9b), DEVICE (cuda), ENGINE (gpu), CKPT (where the quantized checkpoint goes;
# default OUT/w4a16-fp8 — put it outside OUT when OUT is copied somewhere).
set -euo pipefail
SCALE=${1:-0.05}
OUT=${2:-bench-soar}
MODEL=${MODEL:-sala-9b}
DEVICE=${DEVICE:-cuda}
ENGINE=${ENGINE:-gpu}
CKPT=${CKPT:-$OUT/w4a16-fp8}
mkdir -p "$OUT"

salactl bench --profile soar --model "$MODEL" --random-weights --device "$DEVICE" --engine "$ENGINE" \
  --scale "$SCALE" --label bf16 --details --out "$OUT" --json > "$OUT/bf16.json"

REF=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
print(",".join("%s=%s" % (p["phase"], p["duration"]) for p in r["phases"]))' "$OUT/bf16.json")
echo "bf16 durations: $REF"

if [ ! -d "$CKPT" ]; then
  salactl quantize --model "$MODEL" --random-weights --method rtn --group-size 128 \
    --kv-cache-dtype fp8_e4m3 --calib random --nsamples 8 --seqlen 2048 --device "$DEVICE" --out "$CKPT"
fi
salactl bench --profile soar --model "$CKPT" --device "$DEVICE" --engine "$ENGINE" --kv-cache-dtype fp8_e4m3 \
  --scale "$SCALE" --reference "$REF" --label w4a16-fp8 --details --out "$OUT"
