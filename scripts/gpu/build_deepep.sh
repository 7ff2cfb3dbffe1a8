#!/usr/bin/env bash
# Build a DeepEP wheel from .deepep-src/ (fetch_deepep.sh) into .deepep-wheel/ (both git-ignored).
#
#   bash scripts/gpu/build_deepep.sh [SRC] [OUT]
#
# Needs: the Python that will run training ($PYTHON, default python3) with the same torch build
# as the GPU nodes (the extension is tied to torch's version and CUDA major), nvcc of that CUDA
# major (CUDA_HOME, or nvcc on PATH), and a C++ compiler. No GPU is needed to build.
# Knobs (environment):
#   DEEPEP_ARCH_LIST      GPU architectures of this build (default 9.0: H100/H200; "9.0 10.0" adds
#                         B200/GB200). It becomes TORCH_CUDA_ARCH_LIST for DeepEP's setup.py, which
#                         also bakes it into HybridEP's run-time JIT (-DSM_ARCH). TORCH_CUDA_ARCH_LIST
#                         from the environment is NOT used: a shell cannot tell a value set for this
#                         build from one exported globally (the GPU test machine exports 9.0a for
#                         everything), and DeepEP's setup.py would take either.
#   DISABLE_AGGRESSIVE_PTX_INSTRS  DeepEP's own switch, passed through; its setup.py defaults it to 1
#                         (off). 0 turns the aggressive loads/stores on, which setup.py allows only
#                         when the arch list is exactly "9.0".
#   DEEPEP_NVSHMEM        auto (default): build the internode and low-latency kernels when the
#                         nvidia-nvshmem wheel (or NVSHMEM_DIR) is there; off: intranode kernels
#                         only. megatron-core 0.19 needs NVSHMEM for `deepep` even on one node (its
#                         buffer sizing calls get_rdma_buffer_size_hint, which an `off` build
#                         refuses); an `off` build still serves `hybridep`.
#   MAX_JOBS              parallel compile jobs (default: all cores).
# The wheel gets deep_ep/ep_overlap_build.json (source commit, arch list, NVSHMEM, torch and CUDA
# versions), which `mbridge-ep-overlap doctor` prints.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=$(realpath "${1:-.deepep-src}")
OUT=$(realpath -m "${2:-.deepep-wheel}")
PYTHON=${PYTHON:-python3}
DEEPEP_ARCH_LIST=$(echo "${DEEPEP_ARCH_LIST:-9.0}" | xargs)  # trimmed: setup.py compares it with "9.0" verbatim
if [ -n "${TORCH_CUDA_ARCH_LIST:-}" ] && [ "$TORCH_CUDA_ARCH_LIST" != "$DEEPEP_ARCH_LIST" ]; then
  echo "build_deepep: ignoring TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST from the environment; set DEEPEP_ARCH_LIST to change the arch list"
fi
export TORCH_CUDA_ARCH_LIST=$DEEPEP_ARCH_LIST
# Mirror DeepEP's rule (setup.py, get_extension_deep_ep_cpp): -DDISABLE_AGGRESSIVE_PTX_INSTRS unless
# DISABLE_AGGRESSIVE_PTX_INSTRS=0, and 0 is refused (assert) for any arch list but exactly "9.0".
AGGRESSIVE_PTX=0
if [ "${DISABLE_AGGRESSIVE_PTX_INSTRS:-1}" = 0 ]; then
  [ "$TORCH_CUDA_ARCH_LIST" = 9.0 ] || { echo "build_deepep: DISABLE_AGGRESSIVE_PTX_INSTRS=0 needs DEEPEP_ARCH_LIST=9.0 exactly (DeepEP's setup.py asserts)" >&2; exit 2; }
  AGGRESSIVE_PTX=1
fi
export DEEPEP_AGGRESSIVE_PTX=$AGGRESSIVE_PTX
echo "build_deepep: arch list TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST (HybridEP JIT SM_ARCH too); aggressive PTX $([ $AGGRESSIVE_PTX = 1 ] && echo on || echo 'off (-DDISABLE_AGGRESSIVE_PTX_INSTRS)')"
export DEEPEP_NVSHMEM=${DEEPEP_NVSHMEM:-auto}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
source scripts/gpu/cuda_home.sh || { echo "build_deepep: set CUDA_HOME (no CUDA toolkit found)" >&2; exit 2; }
export PATH="$CUDA_HOME/bin:$PATH"
[ -f "$SRC/setup.py" ] || { echo "build_deepep: no DeepEP source in $SRC (run scripts/gpu/fetch_deepep.sh)" >&2; exit 2; }
case "$DEEPEP_NVSHMEM" in auto|off) ;; *) echo "build_deepep: DEEPEP_NVSHMEM must be auto or off" >&2; exit 2;; esac
# A minimal toolkit (nvcc + runtime only) lacks the library headers torch's CUDA headers include
# (cusparse.h, cublas_v2.h): take them from the CUDA wheels torch was installed with.
if [ ! -f "$CUDA_HOME/include/cusparse.h" ]; then
  WHEEL_INC=$("$PYTHON" -c 'import nvidia, os; print(next((os.path.join(p, "cu13", "include") for p in nvidia.__path__ if os.path.isdir(os.path.join(p, "cu13", "include"))), ""))' 2>/dev/null || true)
  [ -n "$WHEEL_INC" ] && export CPATH="$WHEEL_INC${CPATH:+:$CPATH}"
fi
# CUDA 13 keeps libcu++/CCCL under include/cccl; nvcc finds it, the host compiler (deep_ep.cpp
# includes NVSHMEM's headers, which include <cuda/std/tuple>) does not.
[ -d "$CUDA_HOME/include/cccl" ] && export CPATH="$CUDA_HOME/include/cccl${CPATH:+:$CPATH}"
# DeepEP's internode kernels include <infiniband/mlx5dv.h> (rdma-core headers: libibverbs-dev / rdma-core-devel).
WANT_NVSHMEM=0
if [ "$DEEPEP_NVSHMEM" = auto ] && { [ -n "${NVSHMEM_DIR:-}" ] || "$PYTHON" -c 'import nvidia.nvshmem' 2>/dev/null; }; then
  WANT_NVSHMEM=1
fi
if [ "$WANT_NVSHMEM" = 1 ] && [ ! -f /usr/include/infiniband/mlx5dv.h ] && [ -z "${RDMA_CORE_HOME:-}" ]; then
  echo "build_deepep: NVSHMEM build needs rdma-core headers (apt install libibverbs-dev, or set RDMA_CORE_HOME)" >&2
  exit 2
fi
[ -n "${RDMA_CORE_HOME:-}" ] && export CPATH="$RDMA_CORE_HOME/include${CPATH:+:$CPATH}"
# HybridEP links libnvtx3interop: CUDA >= 12.8 toolkits ship it (lib64/ or lib/).
export LIBRARY_PATH=${LIBRARY_PATH:-}
for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib"; do
  [ -d "$d" ] && export LIBRARY_PATH="$d${LIBRARY_PATH:+:$LIBRARY_PATH}"
done

mkdir -p "$OUT"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
# -lcuda needs an unversioned libcuda.so at link time only (the driver provides libcuda.so.1 at
# run time): use the toolkit's stub, else make an empty one with the driver's soname.
if [ -f "$CUDA_HOME/lib64/stubs/libcuda.so" ]; then
  export LIBRARY_PATH="$CUDA_HOME/lib64/stubs:$LIBRARY_PATH"
elif ! ldconfig -p 2>/dev/null | grep -q 'libcuda.so '; then
  mkdir -p "$STAGE/stubs"
  echo 'void ep_overlap_libcuda_stub(void) {}' | cc -shared -x c - -o "$STAGE/stubs/libcuda.so" -Wl,-soname,libcuda.so.1
  export LIBRARY_PATH="$STAGE/stubs:$LIBRARY_PATH"
  # The stub defines none of the driver symbols, so --as-needed would drop it: keep libcuda.so.1
  # as a dependency, resolved against the real driver on the GPU node.
  export LDFLAGS="-Wl,--no-as-needed${LDFLAGS:+ $LDFLAGS}"
fi
cp -r "$SRC"/. "$STAGE/src"
cd "$STAGE/src"
# setup.py appends `git rev-parse` of the enclosing repository to its version: keep git out of it.
export GIT_CEILING_DIRECTORIES="$STAGE"
start=$(date +%s)
"$PYTHON" - "$STAGE/dist" <<'PY'
import importlib.util, os, runpy, sys
if os.environ["DEEPEP_NVSHMEM"] == "off":
    # DeepEP's setup.py enables NVSHMEM whenever the nvidia-nvshmem wheel is importable.
    real = importlib.util.find_spec
    importlib.util.find_spec = lambda name, *a, **k: None if name == "nvidia.nvshmem" else real(name, *a, **k)
    os.environ.pop("NVSHMEM_DIR", None)
sys.argv = ["setup.py", "-q", "bdist_wheel", "-d", sys.argv[1]]
runpy.run_path("setup.py", run_name="__main__")
PY
seconds=$(( $(date +%s) - start ))

WHEEL=$(ls "$STAGE"/dist/deep_ep-*.whl)
"$PYTHON" - "$WHEEL" "$OUT" "$SRC/EP_OVERLAP_SOURCE" "$seconds" <<'PY'
"""Stamp the build record into the wheel (and rewrite RECORD), then write it to OUT."""
import base64, hashlib, json, os, subprocess, sys, zipfile
from pathlib import Path

import torch

wheel, out, source_file, seconds = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
source = json.loads(source_file.read_text()) if source_file.exists() else {}
nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    for n in names:
        if n.endswith(".so") and b"libcuda.so.1" not in z.read(n):
            sys.exit(f"build_deepep: {n} does not link libcuda.so.1 (driver API symbols would be unresolved)")
    # Same test as environment._links_nvshmem, on the wheel's deep_ep_cpp extension.
    nvshmem = any(b"libnvshmem_host" in z.read(n) for n in names if n.startswith("deep_ep_cpp") and n.endswith(".so"))
record = {
    "source": source,
    "torch_cuda_arch_list": os.environ["TORCH_CUDA_ARCH_LIST"],
    "aggressive_ptx": os.environ["DEEPEP_AGGRESSIVE_PTX"] == "1",
    "nvshmem": nvshmem,
    "kernels": "intranode + internode + low-latency" if nvshmem else "intranode (NVLink, one node)",
    "hybrid_ep": any(n.startswith("hybrid_ep_cpp") for n in names),
    "torch": torch.__version__,
    "nvcc": nvcc,
    "build_seconds": seconds,
}
payload = json.dumps(record, indent=2).encode()
dest = out / wheel.name
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as dst:
    rec_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
    for item in src.infolist():
        if item.filename != rec_name:
            dst.writestr(item, src.read(item.filename))
    dst.writestr("deep_ep/ep_overlap_build.json", payload)
    digest = base64.urlsafe_b64encode(hashlib.sha256(payload).digest()).rstrip(b"=").decode()
    lines = src.read(rec_name).decode().rstrip("\n").split("\n")
    lines.insert(-1, f"deep_ep/ep_overlap_build.json,sha256={digest},{len(payload)}")
    dst.writestr(rec_name, "\n".join(lines) + "\n")
(out / "ep_overlap_build.json").write_text(payload.decode() + "\n")
print(f"build_deepep: {dest} ({dest.stat().st_size / 2**20:.1f} MiB, {seconds} s)")
print(payload.decode())
PY
