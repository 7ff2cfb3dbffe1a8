"""Install or build: a backend or kernel the configuration needs is not importable or too old, or was built for
another torch (its version, its Python API, its C++ ABI). ``IMPORT_NAME_MISSING``, ``CIRCULAR_IMPORT``,
``SUBMODULE_MISSING`` and ``PACKAGE_NOT_INSTALLED`` are the rows of an ImportError / ModuleNotFoundError read
against what is installed here (``diagnose.import_errors`` makes one finding per error)."""

from __future__ import annotations

from .base import TE_AT, Signature, github_blob


def _release(text) -> tuple[int, ...] | None:
    """'3.5.19' / '1.2.1+309785a' -> (3, 5, 19) / (1, 2, 1); None for what is not a version."""
    parts = []
    for piece in str(text or "").split("+")[0].split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts) or None


def _deepep_nvshmem_pairing_ok(facts: dict) -> bool | None:
    versions = facts.get("versions") or {}
    deep_ep, nvshmem = _release(versions.get("deep-ep")), _release(versions.get("nvshmem"))
    if deep_ep is None or nvshmem is None:
        return None
    return not (deep_ep[:3] == (1, 2, 1) and nvshmem >= (3, 5, 19))

ENABLE_IBGDA = ("enable IBGDA on the nodes as DeepEP's third-party/README.md says: NVIDIA driver options "
                "NVreg_EnableStreamMemOPs=1 NVreg_RegistryDwords=\"PeerMappingOverride=1;\"")
"""How IBGDA is turned on, said by every signature whose fix it is."""

SIGNATURES = (
    Signature(
        id="deepep-not-installed", symptom="install",
        patterns=(r"DeepEP is not installed\. Please install DeepEP package", r"No module named '?deep_ep'?(?!\.)"),
        cause="The flex dispatcher with the deepep backend was chosen, but the deep_ep package is not importable "
              "in the training processes.",
        fix="install DeepEP built against this torch/CUDA (and NVSHMEM for internode) in the job's image, "
            "or choose the alltoall dispatcher; `mbridge-ep-overlap doctor` shows what is importable",
        source="installed:megatron/core/transformer/moe/token_dispatcher.py",
        emitted=("DeepEP is not installed. Please install DeepEP package from https://github.com/deepseek-ai/deepep.",),
        confidence=0.9, rule="flex-backend-importable", versions="megatron-core 0.14+"),
    Signature(
        id="hybridep-not-installed", symptom="install",
        patterns=(r"HybridEP is not installed\. Please install HybridEP package",),
        cause="The flex dispatcher with the hybridep backend was chosen, but DeepEP's hybrid-ep build is not "
              "importable in the training processes.",
        fix="install DeepEP from its hybrid-ep branch in the job's image, or choose another dispatcher",
        source="installed:megatron/core/transformer/moe/token_dispatcher.py",
        emitted=("HybridEP is not installed. Please install HybridEP package from "
                 "https://github.com/deepseek-ai/DeepEP/tree/hybrid-ep.",),
        confidence=0.9, rule="flex-backend-importable", versions="megatron-core 0.15+"),
    Signature(
        id="te-fused-permute-missing", symptom="install",
        patterns=(r"fused (permutation|_?permute|_?unpermute) is not available\. Please install TE >= 2\.1\.0",
                  r"fused_(permute|unpermute) is not available\. Please install TE >= 2\.1\.0"),
        cause="moe_permute_fusion is on but Transformer Engine is missing or older than 2.1.",
        fix="install Transformer Engine >= 2.1 (the job's container), or model.moe_permute_fusion=false",
        source="installed:megatron/core/transformer/transformer_config.py",
        emitted=("fused permutation is not available. Please install TE >= 2.1.0.",),
        confidence=0.9, rule="te-features-need-te", versions="megatron-core 0.12+"),
)

SIGNATURES += (
    Signature(
        id="deepep-built-for-other-nvl-peers", symptom="install",
        patterns=(r'static assertion failed with "Invalid number of NVL peers"',),
        cause="DeepEP was built with NUM_MAX_NVL_PEERS other than 8: its internode kernels pack one bool per "
              "NVLink peer into a uint64 and assume exactly 8 GPUs per node.",
        fix="build DeepEP with the default NUM_MAX_NVL_PEERS=8 (nodes of 8 GPUs), or use the alltoall dispatcher",
        source="https://github.com/deepseek-ai/DeepEP/issues/50",
        emitted=('DeepEP/csrc/kernels/internode.cu(295): error: static assertion failed with "Invalid number of NVL peers"',),
        corpus_report="deepep-50", confidence=0.9, versions="DeepEP 1.x"),
    Signature(
        id="nvshmem-ib-transport-failed", symptom="install",
        patterns=(r"ibrc\.cpp:\d+: NULL value (cq|qp) creation failed", r"ibrc\.cpp:\d+: non-zero status: \d+ ep_create failed"),
        cause="NVSHMEM's InfiniBand RC transport could not create completion queues / queue pairs / endpoints on "
              "these NICs; DeepEP's internode buffers then fail (ranks may segfault).",
        fix="check the NICs NVSHMEM uses (NVSHMEM_HCA_LIST / NVSHMEM_ENABLE_NIC_PE_MAPPING), the queue-pair "
            "depth and limits (ulimit -l), and run DeepEP's internode test on the same nodes",
        source="https://github.com/deepseek-ai/DeepEP/issues/126",
        emitted=("/sgl-workspace/nvshmem/src/modules/transport/ibrc/ibrc.cpp:304: NULL value cq creation failed",),
        corpus_report="deepep-126", confidence=0.7, rule="deepep-built-with-nvshmem", versions="NVSHMEM 3.x"),
    Signature(
        id="nvshmem-init-failed", symptom="install",
        patterns=(r"nvshmem initialization failed", r"building transport map failed"),
        cause="NVSHMEM could not initialise (its bootstrap or transport map failed): DeepEP's internode and "
              "low-latency buffers cannot be created.",
        fix="check NVSHMEM's bootstrap network (NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME), the transports it can use "
            "(NVSHMEM_DEBUG=INFO), and the DeepEP x NVSHMEM build pairing",
        source="https://github.com/deepseek-ai/DeepEP/issues/223",
        emitted=("/sgl-workspace/nvshmem/src/host/init/init.cu:nvshmemi_check_state_and_init:1080: nvshmem "
                 "initialization failed, exiting",),
        corpus_report="deepep-223", confidence=0.6, rule="deepep-built-with-nvshmem", versions="NVSHMEM 3.x"),
)

SIGNATURES += (
    Signature(
        id="nvshmem-ibgda-transport-failed", symptom="install",
        patterns=(r"ibgda\.cpp:\d+: (?:NULL value|non-zero status: -?\d+)",),
        cause="NVSHMEM's IBGDA transport (GPU-initiated RDMA, which DeepEP's internode and low-latency kernels use) "
              "could not set up a NIC resource (an address handle, queue pair or memory registration): the NIC, its "
              "driver or the GPU driver's settings do not support IBGDA as the job configures it.",
        fix=f"{ENABLE_IBGDA}, or gdrcopy with its gdrdrv module for CPU-assisted IBGDA; on RoCE check the GID index "
            "NVSHMEM uses (NVSHMEM_IB_GID_INDEX); "
            "NVSHMEM_DEBUG=INFO names the failing NIC",
        source="installed:nvidia/nvshmem/lib/nvshmem_transport_ibgda.so.3",
        emitted=("/dvs/p4/build/sw/rel/gpgpu/toolkit/r13.0/main_nvshmem/src/modules/transport/ibgda/ibgda.cpp:2234: "
                 "NULL value Unable to create ah.",),
        confidence=0.6, rule="deepep-built-with-nvshmem", versions="NVSHMEM 3.x (the installed wheel: 3.4.5)"),
    Signature(
        id="nvshmem-ibgda-cpu-proxy-fallback", symptom="fallback",
        patterns=(r"ibgda_alloc_and_map_qp_uar with GPU as handler failed\. We may need to enter the CPU fallback path",
                  r"ibgda_nic_mem_gpu_map failed\. We may need to use the CPU fallback path",
                  r"cudaHostRegister with IoMemory failed with error=\d+\. We may need to use a fallback path"),
        cause="NVSHMEM's IBGDA transport could not map the NIC's doorbell and queue memory for the GPU, so the GPU "
              "cannot ring the NIC itself and NVSHMEM goes on with its CPU-assisted path: DeepEP's internode and "
              "low-latency RDMA traffic then runs far below the NICs' bandwidth (IBGDA is not fully enabled).",
        fix=f"{ENABLE_IBGDA}, then reload the driver or reboot; then rerun DeepEP's test_internode.py and compare its "
            "RDMA GB/s with the NICs' line rate",
        source="installed:nvidia/nvshmem/lib/nvshmem_transport_ibgda.so.3",
        emitted=("WARN: ibgda_alloc_and_map_qp_uar with GPU as handler failed. We may need to enter the CPU fallback path.",
                 "WARN: cudaHostRegister with IoMemory failed with error=800. We may need to use a fallback path."),
        confidence=0.7, rule="deepep-built-with-nvshmem", versions="NVSHMEM 3.x (the installed wheel: 3.4.5)"),
    Signature(
        id="nvshmem-ibgda-init-failed", symptom="install",
        patterns=(r"transport\.cpp:nvshmemi_transport_init:\d+: init failed for transport: IBGDA",),
        cause="NVSHMEM could not initialise its IBGDA transport (GPU-initiated RDMA over InfiniBand or RoCE, which "
              "DeepEP's low-latency and internode kernels need on either fabric): the GPU driver is not set up for "
              "IBGDA, or no NIC NVSHMEM can use was found.",
        fix=f"{ENABLE_IBGDA}, on RoCE as on InfiniBand; "
            "NVSHMEM_DEBUG=INFO names the NIC and the step that failed",
        source="installed:nvidia/nvshmem/lib/libnvshmem_host.so.3",
        emitted=("/dvs/p4/build/sw/rel/gpgpu/toolkit/r13.0/main_nvshmem/src/host/transport/transport.cpp:"
                 "nvshmemi_transport_init:282: init failed for transport: IBGDA",),
        confidence=0.65, rule="deepep-built-with-nvshmem", versions="NVSHMEM 3.x (the installed wheel: 3.4.5)"),
)

SIGNATURES += (
    Signature(
        id="deepep-nvshmem-queue-pair-layout", symptom="install", patterns=(),
        cause="DeepEP 1.2.1 runs against NVSHMEM >= 3.5.19, which changed how default queue pairs are stored: "
              "DeepEP indexes the RC queue pairs the old way and the internode dispatch never completes "
              "(it ends in 'DeepEP error: timeout (dispatch CPU)').",
        fix="use a DeepEP build with deepseek-ai/DeepEP PR #564 (NVSHMEM >= 3.5.19 support), or NVSHMEM < 3.5.19 "
            "for DeepEP 1.2.1; pin the pair together in the image",
        source="https://github.com/deepseek-ai/DeepEP/issues/553", emitted=(), corpus_report="deepep-553",
        confidence=0.9, found_by="facts", facts_pass=_deepep_nvshmem_pairing_ok, facts_keys=("versions",),
        versions="DeepEP 1.2.1 x NVSHMEM >= 3.5.19"),
)

# The dynamic loader's own words (glibc's dlerror text), which CPython's import of a compiled extension
# raises as ImportError / OSError: a missing versioned symbol of the C++ runtime, or a missing symbol.
_LOADER = "installed:python3.12 (importlib: the dynamic loader's dlerror text of a compiled extension)"

SIGNATURES += (
    Signature(
        id="extension-needs-newer-libstdcxx", symptom="install",
        patterns=(r"version [`']?(GLIBCXX|CXXABI)_[0-9.]+'? not found",
                  r"(ImportError|OSError): \S+\.so[^:]*: undefined symbol: _ZN?K?St",),
        cause="A compiled extension (deep_ep, transformer_engine, grouped_gemm, apex, ...) was built against a "
              "newer libstdc++ / C++ ABI than the runtime the Python process loads (often a conda "
              "environment's older libstdc++.so.6 shadowing the system one): a libstdc++ symbol it needs is "
              "missing at import.",
        fix="build the extension with the same compiler and libstdc++ the job runs with, or make the runtime "
            "load the newer libstdc++ (install a newer libstdcxx-ng in the conda environment, or put the "
            "system's libstdc++ first, e.g. LD_PRELOAD of /usr/lib/x86_64-linux-gnu/libstdc++.so.6); "
            "`strings libstdc++.so.6 | grep GLIBCXX` shows which versions the runtime has",
        source=_LOADER,
        emitted=("ImportError: /opt/conda/lib/libstdc++.so.6: version `GLIBCXX_3.4.32' not found (required by "
                 "/opt/conda/lib/python3.12/site-packages/deep_ep_cpp.cpython-312-x86_64-linux-gnu.so)",
                 "ImportError: /opt/conda/lib/python3.12/site-packages/deep_ep_cpp.cpython-312-x86_64-linux-gnu.so: "
                 "undefined symbol: _ZNSt15__exception_ptr13exception_ptr9_M_addrefEv"),
        confidence=0.85, versions="any compiled extension"),
    Signature(
        id="extension-built-for-other-torch", symptom="install",
        patterns=(r"(ImportError|OSError): \S+\.so[^:]*: undefined symbol: _ZN(K?)(3c10|2at|5torch|6caffe2)",
                  r"^\s*undefined symbol: _ZN(K?)(3c10|2at|5torch|6caffe2)\w*\s*$"),  # the loader's message wrapped at ': '
        cause="A compiled extension (deep_ep, transformer_engine, ...) was built against another torch than the "
              "one installed: a torch / c10 C++ symbol it links to is missing at import.",
        fix="rebuild the extension against the installed torch (pip install --no-build-isolation from source), "
            "or install the build made for this torch version",
        source=_LOADER,
        emitted=("ImportError: /usr/local/lib/python3.12/dist-packages/transformer_engine/transformer_engine_torch"
                 ".cpython-312-x86_64-linux-gnu.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",),
        confidence=0.8, versions="any compiled extension"),
)

_TE_V1_13 = "NVIDIA/TransformerEngine@e5edd6cc3d5a868bb3fe4e81088d22aab505a30d"
"""Transformer Engine v1.13, whose framework-extension lookup and fusible-ops autocast call older reports print."""

SIGNATURES += (
    Signature(
        id="te-torch-extension-missing", symptom="install",
        patterns=(r"Could not find shared object file for Transformer Engine \S+ lib",
                  r'so_path = next\(so_dir\.glob\(f"\{module_name\}'),
        cause="Transformer Engine's core package is installed without its PyTorch extension (transformer_engine_torch): "
              "`import transformer_engine.pytorch` finds no transformer_engine_torch shared object (Transformer "
              "Engine 2.x raises FileNotFoundError; 1.13 and older fail in _load_library with a bare StopIteration). "
              "The pip wheels of 1.13 and older could also leave the three packages out of step.",
        fix="install the extension with the core: pip install --no-build-isolation 'transformer-engine[pytorch]==VERSION' "
            "(after pip uninstall transformer-engine transformer-engine-cu12 transformer-engine-torch when they "
            "disagree), or use an NGC PyTorch container that ships it",
        source=github_blob(TE_AT, "transformer_engine/common/__init__.py") + "#L125-L130",
        emitted=("FileNotFoundError: Could not find shared object file for Transformer Engine torch lib.",
                 '    so_path = next(so_dir.glob(f"{module_name}.*.{extension}"))'),
        excerpts=(f"{TE_AT}:transformer_engine/common/__init__.py:125-130",
                  f"{_TE_V1_13}:transformer_engine/pytorch/__init__.py:49-55"),
        confidence=0.9, rule="te-features-need-te",
        versions="FileNotFoundError: Transformer Engine 2.x to 2.18; the StopIteration in _load_library: 1.13 and older"),
    Signature(
        id="te-calls-newer-torch-api", symptom="install",
        patterns=(r"torch\.is_autocast_enabled\(device_type\)",
                  r"torch\.is_autocast_enabled\(\) takes no arguments \(1 given\)"),
        cause="Transformer Engine 1.13's fusible ops (transformer_engine/pytorch/ops) call "
              "torch.is_autocast_enabled(device_type), a form that older PyTorch (before 2.4.3, Transformer Engine's "
              "own guard) does not have, so with an older torch the call raises TypeError; Transformer Engine 2.1 "
              "and newer check the torch version first (TransformerEngine PR #1494).",
        fix="use a Transformer Engine and PyTorch pair it supports: upgrade PyTorch (2.4.3 or newer) or Transformer "
            "Engine (2.1 or newer), as the release notes of the Transformer Engine in use say",
        source="https://github.com/NVIDIA/TransformerEngine/pull/1494",
        emitted=("    if torch.is_autocast_enabled(device_type):",
                 "TypeError: torch.is_autocast_enabled() takes no arguments (1 given)"),
        excerpts=(f"{_TE_V1_13}:transformer_engine/pytorch/ops/_common.py:130-140",
                  f"{TE_AT}:transformer_engine/pytorch/ops/_common.py:68-82"),
        confidence=0.85,
        versions="Transformer Engine 1.13 (to 2.0) with torch < 2.4.3; 2.1 to 2.18 guard the call"),
)

SIGNATURES += (
    Signature(
        id="extension-cxx11-abi-mismatch", symptom="install",
        patterns=(r"\.so[^:\s]*: undefined symbol: _ZN(?!K?(?:3c10|2at|5torch|6caffe2))\w*?Ss",),
        cause="A compiled extension (transformer_engine_extensions / transformer_engine_torch, deep_ep, ...) was built "
              "with another std::string ABI than the library it links to: the symbol it asks for is spelled with the "
              "pre-C++11 ABI's std::string (`Ss` in the mangled name) while the library exports the C++11 one "
              "(`NSt7__cxx1112basic_string...`), or the other way round. PyTorch's older public pip wheels used the "
              "pre-C++11 ABI, most other builds the C++11 one (TransformerEngine #906, fixed by PR #896).",
        fix="build the extension and the libraries it links with the ABI torch uses "
            "(python -c 'import torch; print(torch._C._GLIBCXX_USE_CXX11_ABI)'; -D_GLIBCXX_USE_CXX11_ABI=0/1), or "
            "install the builds made for this torch; `nm -D LIB | grep SYMBOL-NAME` shows which spelling a library has",
        source=_LOADER,
        emitted=("ImportError: /usr/lib/python3.10/site-packages/transformer_engine_extensions.cpython-310-x86_64-linux-"
                 "gnu.so: undefined symbol: _ZN18transformer_engine6getenvIiEET_RKSsRKS1_",),
        confidence=0.8, versions="any compiled C++ extension"),
)

_IMPORTS = "installed:mbridge_ep_overlap/diagnose/import_errors.py"
_IMPORT_CONFIDENCE = ("50% with the importing frame in the log (for a circular import: the cycle), 40% otherwise; read "
                      "against the packages installed here (their source and metadata, nothing imported)")

IMPORT_NAME_MISSING = Signature(
    id="import-name-missing", symptom="install", patterns=(),
    cause="ImportError: cannot import name 'NAME' from 'PKG.MOD' (PATH): the importing code (the traceback's innermost "
          "frame: its file:line and the line it prints) was written for a PKG whose MOD has NAME; the run's PKG (at "
          "PATH) does not: the two packages' versions are not a pair (Megatron-Bridge x Megatron-Core, Megatron-Core x "
          "Transformer Engine or DeepEP, any package x torch). Read against the copy installed here: whether its MOD "
          "defines NAME (and its nearest names), where the installed Megatron source references PKG.MOD.NAME, and the "
          "distribution the importing file belongs to. The importing file and MOD of one distribution: the run mixes "
          "two versions' files.",
    fix="install the PKG version the importing package pins (its Requires-Dist, as the finding quotes it: whether it "
        "pins a version), or an importing package that matches the run's PKG",
    source=_IMPORTS, emitted=(), confidence=0.5, found_by="import-error", versions=_IMPORT_CONFIDENCE)

CIRCULAR_IMPORT = Signature(
    id="circular-import", symptom="install", patterns=(),
    cause="ImportError: cannot import name 'NAME' from partially initialized module 'PKG.MOD' (most likely due to a "
          "circular import): not a version mismatch. MOD was still running its own imports when a module it imports "
          "(directly or through others) imported NAME from it; the cycle is the traceback's frames from the first one "
          "in MOD's file to the importing one.",
    fix="break the cycle: import NAME inside the function that uses it (or import the module and read MOD.NAME at use "
        "time), or move what both modules need into a third module",
    source=_IMPORTS, emitted=(), confidence=0.5, found_by="import-error", versions=_IMPORT_CONFIDENCE)

SUBMODULE_MISSING = Signature(
    id="submodule-missing", symptom="install", patterns=(),
    cause="ModuleNotFoundError: No module named 'PKG.SUB' (Python names the first part it cannot find, so the run "
          "imported PKG): the importing code was written for a version of PKG that has SUB (moved, renamed or added "
          "in another release): the two packages' versions are not a pair. '; PKG is not a package': the run's PKG is "
          "a module file where another version has a package. Whether the copy installed here has SUB, where else "
          "its package has a module of that name, and the installed Megatron lines that import it are read.",
    fix="install the PKG version the importing package pins, or an importing package that matches the run's PKG; "
        "import the module from where the run's PKG has it",
    source=_IMPORTS, emitted=(), confidence=0.5, found_by="import-error", versions=_IMPORT_CONFIDENCE)

PACKAGE_NOT_INSTALLED = Signature(
    id="package-not-installed", symptom="install", patterns=(),
    cause="ModuleNotFoundError: No module named 'PKG': PKG is not installed in the run's environment at all (DeepEP "
          "has a row of its own, deepep-not-installed). The finding names the file that imports it, the distribution "
          "that file belongs to, and the requirement on PKG of that distribution and of the installed Megatron-Core / "
          "Megatron-Bridge.",
    fix="install PKG (the release the importing package requires) in the job's environment, or avoid the feature "
        "that imports it",
    source=_IMPORTS, emitted=(), confidence=0.5, found_by="import-error", versions=_IMPORT_CONFIDENCE)

SIGNATURES += (IMPORT_NAME_MISSING, CIRCULAR_IMPORT, SUBMODULE_MISSING, PACKAGE_NOT_INSTALLED)

TYPE_ERROR_ACROSS_PACKAGES = Signature(
    id="type-error", symptom="install", patterns=(),
    cause="TypeError where two packages meet: the traceback's innermost frame that chose the arguments is in package A "
          "and its caller in package B (A wraps or replaces B's function, a plugin patching B's internals, and B's "
          "version passes another layout), or A calls a function of B with an argument list B's version changed "
          "('X() got an unexpected keyword argument', 'takes N positional arguments but M were given', 'missing N "
          "required positional arguments', 'object of type ... has no len()'): A's code was written for a version of B "
          "whose function had another signature or argument layout. Both packages are named from the frames' paths; "
          "where the function is in the source installed here, its signature says whether the call fits that version.",
    fix="use the versions of A and B that are released to work together (A's Requires-Dist on B, as the finding "
        "quotes it when A's metadata is installed here; else A's supported B versions), or update A to a release "
        "written for the run's B",
    source="installed:mbridge_ep_overlap/diagnose/type_errors.py", emitted=(), confidence=0.45, found_by="type-error",
    versions="45% with both packages' frames in the traceback, 40% with B known from the function the message names; "
             "a TypeError inside one package is not named")

TYPE_ERROR_WITHIN_PACKAGE = Signature(
    id="type-error-within", symptom="install", patterns=(),
    cause="'F() got an unexpected keyword argument K' raised inside one package: its own code passes K to its own "
          "function F, whose installed signature has no such parameter. The installed version of the calling "
          "function says which: it no longer passes K to F (the run's release has a bug the installed one fixed), or "
          "it makes the same call (the installed release has the bug too).",
    fix="upgrade to the release that no longer makes the call (the installed one, where it does not), or avoid the "
        "setting that takes that path; where the installed release makes the same call, bind K where F does not see "
        "it (functools.partial)",
    source="installed:mbridge_ep_overlap/diagnose/type_errors.py", emitted=(), confidence=0.6, found_by="type-error",
    versions="60% where the installed release no longer makes the call, 50% where it makes it too")

SIGNATURES += (TYPE_ERROR_ACROSS_PACKAGES, TYPE_ERROR_WITHIN_PACKAGE)

UNEXPECTED_KEYWORD_PASSED_UPSTREAM = Signature(
    id="passed-keyword", symptom="install", patterns=(),
    cause="'F() got an unexpected keyword argument K' where the installed Megatron-Core / Megatron-Bridge source passes "
          "K by name and F is none of their functions (a class of a spec, a model provider, a layer of the run's own "
          "code or of another package): F was written for a release that did not pass K yet. The finding lists the "
          "installed calls that pass K.",
    fix="accept K in F (a parameter, or **kwargs passed on), or run the Megatron-Core / Megatron-Bridge release F was "
        "written for",
    source="installed:mbridge_ep_overlap/diagnose/passed_keywords.py", emitted=(), confidence=0.5,
    found_by="passed-keyword",
    versions="the installed megatron-core / megatron-bridge (their source is read for the calls passing K)")

SIGNATURES += (UNEXPECTED_KEYWORD_PASSED_UPSTREAM,)

EXTENSION_CALL_MISMATCH = Signature(
    id="extension-call", symptom="install", patterns=(),
    cause="'NAME(): incompatible function arguments. The following argument types are supported: ...': NAME is a "
          "compiled function (a pybind11 binding of Transformer Engine, DeepEP or another extension) and the caller "
          "passed an argument list its build does not take: caller and extension are from different releases.",
    fix="use the caller and the extension from releases made to work together (rebuild or reinstall the extension to "
        "the version the caller was written for, or update the caller)",
    source="installed:mbridge_ep_overlap/diagnose/extension_calls.py (pybind11's overload-resolution error, raised by a "
           "binding of the installed torch in its test)",
    emitted=(), confidence=0.5, found_by="extension-call",
    versions="pybind11's overload-resolution error (its wording since pybind11 2.x)")

SIGNATURES += (EXTENSION_CALL_MISMATCH,)
