#!/usr/bin/env bash
# Download, on a machine with network access, the wheels the offline GPU test machine lacks
# (Python 3.12, x86_64, torch 2.11 cu130 already there) into .gpu-wheels/ (git-ignored).
# The list is what this project's CPU venv has beyond that machine's image: megatron-core,
# megatron-bridge and the packages `import megatron.bridge` and its training loop really import.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.gpu-wheels}
mkdir -p "$DEST"
PKGS=(
  megatron-core==0.19.2 megatron-bridge==0.6.2
  transformers==5.12.1 tokenizers==0.22.2
  omegaconf==2.3.1 hydra-core==1.3.8
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
  megatron-energon==7.4.1 braceexpand==0.1.7 webdataset==1.0.2 multi-storage-client==1.3.1
  diffusers==0.42.1 nvidia-modelopt==0.47.0 PuLP==3.3.2
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  deprecation==2.1.0 filetype==1.2.0
  jmespath==1.1.0 lark==1.3.1 wcmatch==10.2.1 bracex==3.2.3 rapidyaml==0.15.2 xattr==1.3.0
  opentelemetry-api==1.45.2 cffi==2.1.1 pycparser==3.12
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  nvdlfw-inspect==0.2.2  # Transformer Engine 2.18 imports it
  py-spy==0.4.3  # the stacks of a stuck run (record_failures.py --py-spy; diagnose reads its dumps)
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  --platform any -d "$DEST" "${PKGS[@]}"
# PuLP (imported, never solved with, by nvidia-modelopt) bundles 36 MB of CBC solver binaries for
# every OS; drop them (and their RECORD lines) to keep the copied tree small.
python3 - "$DEST"/[Pp]u[Ll][Pp]-*.whl <<'PY'
import sys, zipfile, os
path = sys.argv[1]
with zipfile.ZipFile(path) as z:
    items = [(i, z.read(i.filename)) for i in z.infolist() if "/solverdir/" not in i.filename]
if len(items) < len(zipfile.ZipFile(path).infolist()):
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        for info, data in items:
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(l + b"\n" for l in data.splitlines() if b"/solverdir/" not in l)
            out.writestr(info, data)
    os.replace(tmp, path)
PY
# Published only as source distributions (pure Python): build the wheels here.
python3 -m pip wheel -q --no-deps -w "$DEST" antlr4-python3-runtime==4.9.3
du -sh "$DEST"
