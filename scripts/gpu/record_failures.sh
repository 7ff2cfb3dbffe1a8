#!/usr/bin/env bash
# Record real failures of the proxy under EP overlap on a one-GPU node, with the evidence every run
# leaves (docs/evidence-files.md), and measure what that evidence costs.
#
#   bash scripts/gpu/record_failures.sh OUT_DIR [--only CASE,...] [--overhead-pairs N] [--overhead-steps N]
#
# After `source scripts/gpu/env.sh` (done here): tests/functional/record_failures.py runs, on
# qwen3_moe_proxy (local layers, no Transformer Engine), EP = 2 with both ranks on GPU 0
# (EP_OVERLAP_SHARE_GPU=1), overlap on (alltoall): first the same healthy run (25 steps) with evidence
# on and with evidence off, 3 pairs alternating which goes first, on the quiet GPU (the overhead;
# `--only overhead`), then each fault of
# tests/functional/fault_injector.py - nccl_timeout, hang, stall, crash, nan, no_gain - 3 at a time,
# each under a hard timeout (110-180 s). Whole recording bounded by --deadline-s 420 (and a 460 s
# kill); about 7 minutes with the install.
# OUT_DIR receives runs/<case>/ (pruned logs, evidence/, summary.json, injected-fault.json),
# cases.json, overhead.json, doctor.txt and record.log (logs pruned to 256 KiB each).
set -uo pipefail
if [ $# -lt 1 ] || [ -z "$1" ]; then
  echo "usage: bash scripts/gpu/record_failures.sh OUT_DIR [record_failures.py options]" >&2
  exit 2
fi
OUT_DIR=$1
shift
DEADLINE=${RECORD_DEADLINE_S:-420}
cd "$(dirname "$0")/../.."
mkdir -p "$OUT_DIR" || { echo "record_failures.sh: cannot create $OUT_DIR" >&2; exit 2; }
OUT_DIR=$(cd "$OUT_DIR" && pwd)
source scripts/gpu/env.sh || exit 1
python3 -m mbridge_ep_overlap doctor > "$OUT_DIR/doctor.txt" 2>&1
timeout -k 10 $((DEADLINE + 40)) python3 tests/functional/record_failures.py "$OUT_DIR" --deadline-s "$DEADLINE" "$@" 2>&1 | tee "$OUT_DIR/record.log"
rc=${PIPESTATUS[0]}
du -sh "$OUT_DIR"
exit "$rc"
