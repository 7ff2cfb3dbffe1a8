#!/usr/bin/env bash
# Add the no-op Makefile the megatron-core wheel lacks to its datasets folder (the one owner of that text).
# The 0.19.2 wheel ships the compiled dataset helpers (helpers_cpp*.so) but not their Makefile, and
# MB's initialize always runs `make -C megatron/core/datasets` (exit 1 without one). Used by
# scripts/setup_env.sh and scripts/gpu/env.sh; `mbridge-ep-overlap doctor` names this script as the fix.
#   bash scripts/dataset_makefile.sh SITE_PACKAGES_DIR/megatron/core/datasets
DS=${1:?usage: dataset_makefile.sh MEGATRON_CORE_DATASETS_DIR}
if [ ! -f "$DS/Makefile" ] && ls "$DS"/helpers_cpp*.so >/dev/null 2>&1; then
  printf 'default:\n\t@echo "helpers_cpp is prebuilt in the megatron-core wheel"\n' > "$DS/Makefile"
fi
