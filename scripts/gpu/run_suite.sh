#!/usr/bin/env bash
# Run the functional GPU suite on an offline GPU node that has Python 3.12 + torch but no
# Megatron packages: install the wheels from .gpu-wheels/ (scripts/gpu/prepare_wheels.sh) into a
# private site folder, install this checkout there, check each token dispatcher on the GPUs
# (`doctor --smoke`), then `pytest tests/functional -m gpu`.
#
#   bash scripts/gpu/run_suite.sh [LOG_DIR] [extra pytest args...]
#
# LOG_DIR (default: $EP_OVERLAP_LOG_DIR or out/functional) receives doctor.txt (versions, the
# dispatcher smoke-check verdicts), smoke/ (the smoke check's per-rank logs) and smoke.json (its
# cached verdicts, which the suite reuses instead of checking again), the pytest log, and each run's
# per-rank logs and JSON summaries. Time: the smoke check ~1-2 min (bounded by its per-backend
# timeouts, 10 min at worst), the suite ~5-6 min on 2x H200 (EP_OVERLAP_PARALLEL_RUNS runs at a
# time, default 3; every run has a hard timeout). USE_MNNVL is left to the caller (the smoke check
# decides HybridEP's memory-handle path; the plan sets USE_MNNVL=0 for NVLink domains <= 8 GPUs).
# To stay under a 10-minute command limit, split the suite and skip the second smoke check:
#   bash scripts/gpu/run_suite.sh out/functional -k "not packed"
#   EP_OVERLAP_SMOKE=cached EP_OVERLAP_SMOKE_CACHE=out/functional/smoke.json \
#     bash scripts/gpu/run_suite.sh out/functional-packed -k packed
set -uo pipefail
cd "$(dirname "$0")/../.."
LOG_DIR=${1:-${EP_OVERLAP_LOG_DIR:-out/functional}}
shift || true
source scripts/gpu/env.sh || exit 1
mkdir -p "$LOG_DIR"
export EP_OVERLAP_SMOKE_CACHE=${EP_OVERLAP_SMOKE_CACHE:-$LOG_DIR/smoke.json}
# EP_OVERLAP_SMOKE=cached reuses the verdicts of an earlier check (EP_OVERLAP_SMOKE_CACHE; doctor shows them).
# Ranks sharing one GPU (EP_OVERLAP_SHARE_GPU=1): the smoke check needs a GPU per rank, so doctor runs without it.
if [ "${EP_OVERLAP_SHARE_GPU:-0}" = 1 ] || { [ "${EP_OVERLAP_SMOKE:-}" = cached ] && [ -s "$EP_OVERLAP_SMOKE_CACHE" ]; }; then
  python3 -m mbridge_ep_overlap doctor > "$LOG_DIR/doctor.txt" 2>&1
else
  python3 -m mbridge_ep_overlap doctor --smoke > "$LOG_DIR/doctor.txt" 2>&1
fi
cat "$LOG_DIR/doctor.txt"
python3 -m pytest tests/functional -m gpu -v -rsP -p no:cacheprovider "$@" 2>&1 | tee "$LOG_DIR/pytest.log"
exit "${PIPESTATUS[0]}"
