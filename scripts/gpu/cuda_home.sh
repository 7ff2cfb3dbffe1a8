#!/usr/bin/env bash
# Source me: export CUDA_HOME (the CUDA toolkit root, the one holding include/cuda_runtime_api.h;
# nvcc on PATH may be a wrapper elsewhere) unless it is already set. Returns 1 when none is found.
# DeepEP's build needs it, and HybridEP JIT-compiles its kernels with $CUDA_HOME/bin/nvcc at run time.
if [ -z "${CUDA_HOME:-}" ]; then
  for _c in "$(dirname "$(dirname "$(realpath "$(command -v nvcc || echo /nonexistent)")")")" /usr/local/cuda; do
    if [ -f "$_c/include/cuda_runtime_api.h" ]; then CUDA_HOME=$_c; break; fi
  done
  unset _c
fi
[ -n "${CUDA_HOME:-}" ] && export CUDA_HOME
