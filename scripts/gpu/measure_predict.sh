#!/usr/bin/env bash
# Measurements for the step-time and memory model (scripts/gpu/measure_predict.py), on one GPU node:
#   bash scripts/gpu/measure_predict.sh OUT
# OUT receives gemm.json (TE dense / grouped GEMMs and attention, forward and backward, BF16 and every
# FP8-class recipe the GPU supports; a row "skipped" when Transformer Engine does not import),
# memory.json (peak memory per rank of the proxy recipe, EP = 2 with both ranks on GPU 0, overlap off /
# on / + delayed wgrad / + early attention release, local and - where TE imports - TE layers),
# attention.json (TE fused attention, BF16 and FP8 attention, forward and backward, with the backend TE chose),
# memory-runs/ (each run's per-rank logs and evidence summary), and the three parts' logs.
# Hard limits: the GEMM part 150 s, the attention part 120 s, the memory part 300 s (each run 200 s), about 6-7 minutes in all.
set -uo pipefail
if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: bash scripts/gpu/measure_predict.sh OUT (a folder for the results)" >&2
  exit 2
fi
OUT=$1
cd "$(dirname "$0")/../.."
mkdir -p "$OUT" || { echo "measure_predict.sh: cannot create $OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
source scripts/gpu/env.sh || exit 1
export EP_OVERLAP_SHARE_GPU=1
rc=0
# GEMMs first, alone on the GPU: the memory runs would disturb their timings.
timeout -k 10 150 python3 scripts/gpu/measure_predict.py gemm "$OUT/gemm.json" > "$OUT/gemm.log" 2>&1 || rc=$?
tail -3 "$OUT/gemm.log"
timeout -k 10 120 python3 scripts/gpu/measure_predict.py attention "$OUT/attention.json" > "$OUT/attention.log" 2>&1 || rc=$?
tail -3 "$OUT/attention.log"
timeout -k 15 300 python3 scripts/gpu/measure_predict.py memory "$OUT/memory.json" --runs "$OUT/memory-runs" \
  > "$OUT/memory.log" 2>&1 || rc=$?
tail -3 "$OUT/memory.log"
exit "$rc"
