#!/usr/bin/env bash
# Source me on an offline GPU node: installs .gpu-wheels/ (scripts/gpu/prepare_wheels.sh) and this
# checkout into a private site folder, adds the megatron-core dataset-helper Makefile the wheel
# lacks, and exports PYTHONPATH plus the multicast-off variables. Used by run_suite.sh and benchmarks.
#   source scripts/gpu/env.sh
SITE=${EP_OVERLAP_SITE:-/tmp/ep-overlap-site}
mkdir -p "$SITE"
# NVLink multicast stays off everywhere (shared hosts); keep any stricter value already set.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1} \
       NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1} PYTHONUNBUFFERED=1
# A native crash (SIGSEGV in a kernel library) prints the Python stack of every thread.
export PYTHONFAULTHANDLER=1
# USE_MNNVL (HybridEP's fabric vs CUDA-IPC memory handles) is deliberately not set here: the caller
# may set it; `mbridge-ep-overlap doctor --smoke` tries HybridEP's default path and, if that fails,
# USE_MNNVL=0, and names the cause.
if [ -d .gpu-wheels ] && ls .gpu-wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu-wheels/*.whl \
    || { echo "gpu/env.sh: wheel install failed" >&2; return 1; }
fi
# py-spy's binary sits in its wheel's data folder, which pip --target does not install: unpack it.
for w in .gpu-wheels/py_spy-*.whl; do
  [ -f "$w" ] || continue
  python3 -m zipfile -e "$w" "$SITE/.py-spy" && chmod +x "$SITE"/.py-spy/py_spy-*.data/scripts/py-spy \
    && export EP_OVERLAP_PY_SPY=$(ls "$SITE"/.py-spy/py_spy-*.data/scripts/py-spy | head -1)
done
# DeepEP, when a wheel of it (built beside this repository) was carried along in .deepep-wheel/.
if ls .deepep-wheel/deep_ep-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .deepep-wheel/deep_ep-*.whl \
    || { echo "gpu/env.sh: DeepEP wheel install failed" >&2; return 1; }
fi
# A DeepEP built with NVSHMEM needs libnvshmem_host.so.3: the nvidia-nvshmem wheel torch uses.
NVSHMEM_LIB=$(python3 -c 'import nvidia.nvshmem as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)
[ -d "$NVSHMEM_LIB" ] && export LD_LIBRARY_PATH="$NVSHMEM_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Transformer Engine loads its own libcudnn with ctypes when imported, searching CUDNN_HOME,
# CUDNN_PATH, CUDA_HOME and /usr/local/cuda before the pip wheel. On the H200 node that found the
# toolkit's cuDNN 9.14 while torch runs the 9.19 wheel, and TE's fused attention failed with
# CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED (2026-11-30 and 2026-12-01; rule te-cudnn-matches-torch, doctor's
# cuDNN line). Point TE at torch's cuDNN, unless the caller chose one.
if [ -z "${CUDNN_HOME:-}${CUDNN_PATH:-}" ]; then
  _cudnn=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  [ -d "$_cudnn/lib" ] && export CUDNN_HOME=$_cudnn
  unset _cudnn
fi
# The cuDNN and CUDA 13 runtime wheels' lib folders (cuDNN dlopens its engine sublibraries and NVRTC by name).
for _lib in $(python3 - <<'PY' 2>/dev/null
import importlib, os
for name in ("nvidia.cudnn", "nvidia.cu13", "nvidia.cuda_nvrtc"):
    try:
        for p in importlib.import_module(name).__path__:
            print(os.path.join(p, "lib"))
    except Exception:
        pass
PY
); do [ -d "$_lib" ] && export LD_LIBRARY_PATH="$_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; done; unset _lib
# HybridEP JIT-compiles with $CUDA_HOME/bin/nvcc and links libnvtx3interop from the toolkit.
if source scripts/gpu/cuda_home.sh; then
  export LD_LIBRARY_PATH="$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . \
  || { echo "gpu/env.sh: project install failed" >&2; return 1; }
# The megatron-core wheel's datasets folder lacks the Makefile MB's initialize runs (doctor reports it).
bash scripts/dataset_makefile.sh "$SITE/megatron/core/datasets"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" EP_OVERLAP_LOG_DIR="${LOG_DIR:-${EP_OVERLAP_LOG_DIR:-out/functional}}"
