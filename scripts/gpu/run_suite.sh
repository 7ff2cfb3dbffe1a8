#!/usr/bin/env bash
# Run the functional GPU suite on an offline GPU node that has Python 3.12 + torch but no
# Megatron packages: install the wheels from .gpu-wheels/ (scripts/gpu/prepare_wheels.sh) into a
# private site folder, install this checkout there, then `pytest tests/functional -m gpu`.
#
#   bash scripts/gpu/run_suite.sh [LOG_DIR] [extra pytest args...]
#
# LOG_DIR (default: $EP_OVERLAP_LOG_DIR or out/functional) receives the pytest log, each run's
# per-rank logs and JSON summaries.
set -uo pipefail
cd "$(dirname "$0")/../.."
LOG_DIR=${1:-${EP_OVERLAP_LOG_DIR:-out/functional}}
shift || true
source scripts/gpu/env.sh || exit 1
mkdir -p "$LOG_DIR"
python3 -m mbridge_ep_overlap doctor > "$LOG_DIR/doctor.txt" 2>&1; cat "$LOG_DIR/doctor.txt"
python3 -m pytest tests/functional -m gpu -v -rsP -p no:cacheprovider "$@" 2>&1 | tee "$LOG_DIR/pytest.log"
exit "${PIPESTATUS[0]}"
