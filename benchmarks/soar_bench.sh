#!/usr/bin/env bash
# The SOAR speed protocol (S1, S8, Smax) on the embedded GPU engine, at a --scale that fits the
# time budget: bf16 first, then W4A16 (RTN, group 128) + FP8 KV scored against the bf16 durations.
# Results: $OUT/records.jsonl (render with `salactl report latency $OUT/records.jsonl`), one
# summary per run, and the score line. Usage: benchmarks/soar_bench.sh [SCALE] [OUT]
set -euo pipefail
SCALE=${1:-0.05}
OUT=${2:-bench-soar}
MODEL=${MODEL:-sala-9b}
mkdir -p "$OUT"

salactl bench --profile soar --model "$MODEL" --random-weights --device cuda --engine gpu \
  --scale "$SCALE" --label bf16 --details --out "$OUT" --json > "$OUT/bf16.json"

REF=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
print(",".join(f"{p[\"phase\"]}={p[\"duration\"]}" for p in r["phases"]))' "$OUT/bf16.json")
echo "bf16 durations: $REF"

if [ ! -d "$OUT/w4a16-fp8" ]; then
  salactl quantize --model "$MODEL" --random-weights --method rtn --group-size 128 \
    --kv-cache-dtype fp8_e4m3 --calib random --nsamples 8 --seqlen 2048 --out "$OUT/w4a16-fp8"
fi
salactl bench --profile soar --model "$OUT/w4a16-fp8" --device cuda --engine gpu --kv-cache-dtype fp8_e4m3 \
  --scale "$SCALE" --reference "$REF" --label w4a16-fp8 --details --out "$OUT"
