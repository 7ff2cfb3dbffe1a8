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
SITE=${EP_OVERLAP_SITE:-/tmp/ep-overlap-site}
mkdir -p "$LOG_DIR" "$SITE"
# NVLink multicast stays off everywhere (shared hosts); keep any stricter value already set.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1} \
       NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1} PYTHONUNBUFFERED=1
if [ -d .gpu-wheels ] && ls .gpu-wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu-wheels/*.whl \
    || { echo "run_suite: wheel install failed" >&2; exit 1; }
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . \
  || { echo "run_suite: project install failed" >&2; exit 1; }
# The megatron-core 0.19.2 wheel ships the compiled dataset helpers but not their Makefile, and
# MB's initialize always runs `make -C megatron/core/datasets` (exit 1 without a Makefile).
# `mbridge-ep-overlap doctor` reports this gap; here we add the no-op Makefile it recommends.
DS="$SITE/megatron/core/datasets"
if [ ! -f "$DS/Makefile" ] && ls "$DS"/helpers_cpp*.so >/dev/null 2>&1; then
  printf 'default:\n\t@echo "helpers_cpp is prebuilt in the megatron-core wheel"\n' > "$DS/Makefile"
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" EP_OVERLAP_LOG_DIR="$LOG_DIR"
python3 -m mbridge_ep_overlap doctor > "$LOG_DIR/doctor.txt" 2>&1; cat "$LOG_DIR/doctor.txt"
python3 -m pytest tests/functional -m gpu -v -rs -p no:cacheprovider "$@" 2>&1 | tee "$LOG_DIR/pytest.log"
exit "${PIPESTATUS[0]}"
