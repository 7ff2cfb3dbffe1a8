"""Install or build, read from the toolchain's own words: a header or shared library of a named library
that the compiler or the dynamic loader cannot find, a device symbol the link step cannot resolve, and
kernels that were not built for the GPU the run is on.

The text is the toolchain's, not a report's: GCC's ``fatal error: HEADER: No such file or directory``
(nvcc passes its host compiler's through), glibc's ``NAME: cannot open shared object file`` and
``undefined symbol: SYMBOL``, GNU ld's ``cannot find -lNAME`` / ``-l:FILE``, nvlink's
``Undefined reference to 'SYMBOL'`` and the CUDA runtime's error strings (``cudaGetErrorString``). Which
library a header or a shared object belongs to is one table, ``LIBRARIES``, so a build of any extension
(DeepEP, Transformer Engine, grouped_gemm, apex) that misses NVSHMEM, rdma-core, gdrcopy, NCCL or the CUDA
toolkit's C++ libraries is named by the library and its usual fix, whichever file or symbol of it is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import DEEPEP_AT, Signature

TRIGGERED = "triggered in the parity test"
"""Said in ``source`` where the parity test makes the toolchain print the text on CPU."""
ASSEMBLED = "assembled from its pieces"
"""Said in ``source`` where the text is a message a binary builds from fixed pieces and numbers; the parity test
checks each piece in the installed binary."""
_COMPILER = f"installed:gcc (its missing-header error; {TRIGGERED})"
_LOADER = f"installed:glibc dlopen through ctypes (its dlerror text; {TRIGGERED})"
_CUDART = f"installed:nvidia/cu13/lib/libcudart.so.13 (cudaGetErrorString; {TRIGGERED})"


@dataclass(frozen=True)
class Library:
    key: str
    name: str
    headers: str
    """Regular expression of the library's include paths as an ``#include`` names them."""
    sonames: str
    """Regular expression of its shared objects' names ('' where it ships none that extensions load)."""
    fix: str
    header_example: str
    soname_example: str = ""
    symbols: str = ""
    """Regular expression of the start of its exported C symbols ('' where none are recognisable)."""
    symbol_example: str = ""
    cmake: str = ""
    """Regular expression of the name CMake's ``find_package`` knows it by ('' where no build here finds it so)."""
    cmake_hints: str = ""
    """What the find modules of the builds that need it search, said in the fix of a failed ``find_package``."""


LIBRARIES = (
    Library("cccl", "the CUDA C++ core libraries (CCCL: libcu++, CUB, Thrust)",
            r"(?:cuda/std/|cuda/|cub/|thrust/|nv/target)[\w/.]*", "",
            "put the CUDA toolkit's CCCL headers on the host compiler's include path (CUDA 13 keeps them in "
            "$CUDA_HOME/include/cccl: CPLUS_INCLUDE_PATH=$CUDA_HOME/include/cccl), and build with a CUDA toolkit of "
            "the same major version as the NVSHMEM / CUDA wheels whose headers include them",
            "cuda/std/tuple"),
    Library("nvshmem", "NVSHMEM", r"(?:nvshmemx?|nvshmem_\w+|device_host/\w+|non_abi/[\w/]+|host/nvshmem\w*)\.c?u?h?",
            r"lib(?:nvshmem(?:_host|_device)?|nvshmem_bootstrap\w*)\.so[.\d]*",
            "point the build at an NVSHMEM installation (NVSHMEM_DIR=... for DeepEP, or pip install nvidia-nvshmem-cu12 / "
            "-cu13 matching the CUDA major) and make its lib folder visible at run time (LD_LIBRARY_PATH)",
            "nvshmem.h", "libnvshmem_host.so.3", r"nvshmemx?i?_", "nvshmemx_init_attr", r"NVSHMEM",
            "find_package's config search: NVSHMEM_DIR naming the folder of NVSHMEM's CMake config, or "
            "CMAKE_PREFIX_PATH naming the NVSHMEM installation"),
    Library("rdma-core", "rdma-core (libibverbs / mlx5 user-space verbs)", r"infiniband/(?:verbs|mlx5dv|verbs_api)\.h",
            r"lib(?:ibverbs|mlx5|rdmacm)\.so[.\d]*",
            "install rdma-core's development and runtime packages in the image (libibverbs-dev / rdma-core-devel, "
            "ibverbs-providers); NVSHMEM's IB transports and DeepEP's IBGDA need them",
            "infiniband/mlx5dv.h", "libmlx5.so.1", r"(?:ibv_|mlx5dv_)", "mlx5dv_devx_umem_reg"),
    Library("gdrcopy", "gdrcopy", r"gdrapi\.h", r"libgdrapi\.so[.\d]*",
            "install gdrcopy (the user library and, on the host, its gdrdrv kernel module) or build NVSHMEM without it",
            "gdrapi.h", "libgdrapi.so.2", r"gdr_", "gdr_pin_buffer"),
    Library("nccl", "NCCL", r"nccl(?:_net|_device)?\.h", r"libnccl\.so[.\d]*",
            "use the NCCL torch ships (nvidia-nccl-cu12 / -cu13) or set NCCL_HOME / LD_LIBRARY_PATH to one installation",
            "nccl.h", "libnccl.so.2", r"nccl[A-Z]", "ncclCommInitRankScalable", r"NCCL",
            "the hints of the FindNCCL.cmake the CMake Error line names (it says which variables and environment "
            "variables it reads)"),
    Library("cudnn", "cuDNN", r"cudnn(?:_\w+)?\.h", r"libcudnn(?:_\w+)?\.so[.\d]*",
            "put cuDNN's headers and libraries where the build looks (Transformer Engine: CUDNN_PATH or CUDNN_HOME "
            "naming a folder with include/cudnn.h; the nvidia-cudnn-cu12 / -cu13 wheel, which Transformer Engine 2.x "
            "also searches, or a cluster's cuDNN module exported as CUDNN_PATH), the same cuDNN as torch's",
            "cudnn.h", "libcudnn.so.9", cmake=r"CUDNN|cuDNN",
            cmake_hints="Transformer Engine's cuDNN search reads the CUDNN_PATH environment variable (a folder "
                        "with include/cudnn.h and lib or lib64/libcudnn.so; 2.x also CUDNN_INCLUDE_PATH, "
                        "CUDNN_LIBRARY_PATH and the nvidia-cudnn wheel), not CUDNN_INCLUDE_DIR / CUDNN_LIBRARY "
                        "exported as environment variables"),
    Library("cuda-toolkit", "the CUDA toolkit", r"(?:cuda_runtime(?:_api)?|cuda|cuda_bf16|cuda_fp8|cublas_v2|cusparse)\.h",
            r"lib(?:cudart|cublas|cublasLt|cuda)\.so[.\d]*",
            "set CUDA_HOME to a CUDA toolkit of the same major version as torch's (torch.version.cuda) and put its "
            "lib64 on LD_LIBRARY_PATH",
            "cuda_runtime.h", "libcudart.so.12", cmake=r"CUDAToolkit|CUDA",
            cmake_hints="CMake's FindCUDAToolkit reads CUDAToolkit_ROOT, the CUDA_PATH environment variable and the "
                        "nvcc on PATH (or CMAKE_CUDA_COMPILER)"),
)


def _missing_header(lib: Library) -> Signature:
    return Signature(
        id=f"{lib.key}-header-not-found", symptom="install",
        patterns=(rf"fatal error: ['\"<]?(?:\S*/)?{lib.headers}['\">]?: No such file or directory",),
        cause=f"A build (an extension's setup.py, nvcc or its host compiler) could not find a header of "
              f"{lib.name}: the library, or its development files, is not on the compiler's include path.",
        fix=lib.fix, source=_COMPILER,
        emitted=(f"t.cpp:1:10: fatal error: {lib.header_example}: No such file or directory",),
        confidence=0.85, versions="any build")


def _missing_symbol(lib: Library) -> Signature:
    return Signature(
        id=f"{lib.key}-symbol-not-found", symptom="install",
        patterns=(rf"undefined symbol: (?:_Z\w*?)?{lib.symbols}\w*",),
        cause=f"A compiled extension was built against a version of {lib.name} whose symbol the library loaded at "
              f"run time does not export: another version of it is found first (LD_LIBRARY_PATH, a second copy in the "
              f"image or a wheel), or it is not loaded at all.",
        fix=lib.fix + "; the build and the run must see the same version (`ldd` on the extension's .so shows which "
            "one the loader picks)",
        source=_LOADER,
        emitted=(f"ImportError: /usr/local/lib/python3.12/dist-packages/deep_ep_cpp.cpython-312-x86_64-linux-gnu.so: "
                 f"undefined symbol: {lib.symbol_example}",),
        confidence=0.8, versions="any compiled extension")


def _missing_library(lib: Library) -> Signature:
    return Signature(
        id=f"{lib.key}-library-not-found", symptom="install",
        patterns=(rf"{lib.sonames}: cannot open shared object file",),
        cause=f"A process or extension needs a shared library of {lib.name} that the dynamic loader does not find "
              f"(not installed in the image, or not on LD_LIBRARY_PATH).",
        fix=lib.fix, source=_LOADER,
        emitted=(f"OSError: {lib.soname_example}: cannot open shared object file: No such file or directory",),
        confidence=0.85, versions="any")


_LINK = f"installed:binutils ld (its missing-library error; {TRIGGERED})"


def link_stem(lib: Library) -> str:
    """The library's ``-lNAME`` name: its shared objects' pattern without ``lib`` and ``.so...``."""
    return lib.sonames.removeprefix("lib").removesuffix(r"\.so[.\d]*")


def _link_library_missing(lib: Library) -> Signature:
    unversioned = lib.soname_example.rsplit(".so", 1)[0] + ".so"
    return Signature(
        id=f"{lib.key}-link-library-not-found", symptom="install",
        patterns=(rf"cannot find -l(?::{lib.sonames}|{link_stem(lib)})(?=[:\s]|$)",
                  # CMake's find_library(... REQUIRED), as Transformer Engine's FindCUDNN.cmake calls it
                  rf"Could not find \w+_LIBRARY using the following names: (?:[\w.+-]+, )*(?:lib)?(?:{link_stem(lib)})"
                  r"(?:\.so)?(?=[,.\s]|$)"),
        cause=f"The link step of a build (an extension's setup.py, CMake) could not find {lib.name}'s library by the "
              f"name it asked for: `-l:NAME` wants that exact file and `-lNAME` the unversioned libNAME.so, while pip "
              f"wheels (nvidia-*-cu12 / -cu13) and some runtime images ship only the versioned file "
              f"({lib.soname_example}) without the unversioned link.",
        fix=lib.fix + f"; with a wheel, link the versioned file of the library the line names (its lib folder has, "
            f"for example, {lib.soname_example}) or add the unversioned link beside it (for that example: ln -s "
            f"{lib.soname_example} {unversioned}) before building"
            + ("; `-lcuda` is the driver's library: a build machine without a driver links the toolkit's stub "
               "($CUDA_HOME/lib64/stubs/libcuda.so)" if lib.key == "cuda-toolkit" else ""),
        source=_LINK,
        emitted=(f"/usr/bin/ld: cannot find -l:{unversioned}: No such file or directory",),
        confidence=0.85, versions="any build that links it")


_FIND_PACKAGE = f"installed:cmake FindPackageHandleStandardArgs.cmake (its failure message; {TRIGGERED})"


def _cmake_package_missing(lib: Library) -> Signature:
    return Signature(
        id=f"{lib.key}-cmake-package-not-found", symptom="install",
        # CMake's error form (indented under 'CMake Error at', or quoted): '-- Could NOT find ...' is the status line of
        # an optional lookup that a build goes on without
        patterns=(rf"(?<!-- )Could NOT find (?:{lib.cmake}) \(missing:",),
        cause=f"CMake's find_package for {lib.name} found none of the files behind the variables the line lists "
              "(missing: ...): those names are CMake variables, set on the cmake command line (-DNAME=...) or by the "
              "find module from what it searches; an environment variable of the same name is read only where the "
              "find module reads $ENV{NAME}.",
        fix=f"{lib.cmake_hints}; or give CMake the variables themselves (-D... on its command line); " + lib.fix,
        source=_FIND_PACKAGE,
        emitted=(f"  Could NOT find {lib.cmake.split('|')[0]} (missing: {lib.key.upper().replace('-', '_')}_INCLUDE_DIR "
                 f"{lib.key.upper().replace('-', '_')}_LIBRARY)",),
        confidence=0.85, versions="CMake 3.x (FindPackageHandleStandardArgs)")


SIGNATURES = (tuple(_missing_header(lib) for lib in LIBRARIES)
              + tuple(_cmake_package_missing(lib) for lib in LIBRARIES if lib.cmake)
              + tuple(_missing_library(lib) for lib in LIBRARIES if lib.sonames)
              + tuple(_link_library_missing(lib) for lib in LIBRARIES if lib.sonames)
              + tuple(_missing_symbol(lib) for lib in LIBRARIES if lib.symbols))

SIGNATURES += (
    Signature(
        id="nvshmem-built-without-ibgda", symptom="install",
        patterns=(r"Undefined reference to '?nvshmemi_ibgda_\w+",),
        cause="DeepEP's kernels use NVSHMEM's IBGDA device state (nvshmemi_ibgda_device_state_d), but the NVSHMEM "
              "they are linked against was built without IBGDA, so the device link step cannot resolve it.",
        fix="build (or install) NVSHMEM with IBGDA support (NVSHMEM_IBGDA_SUPPORT=1; the nvidia-nvshmem wheels have "
            "it) and rebuild DeepEP against that NVSHMEM_DIR",
        source="https://github.com/deepseek-ai/DeepEP/issues/55", corpus_report="deepep-55",
        emitted=("47.98 nvlink error   : Undefined reference to 'nvshmemi_ibgda_device_state_d' in "
                 "'/usr/src/DeepEP/build/temp.linux-x86_64-cpython-312/csrc/kernels/internode_ll.o'",),
        quote="    return &nvshmemi_ibgda_device_state_d;", quoted_at=f"{DEEPEP_AT}:csrc/kernels/ibgda_device.cuh:73",
        confidence=0.9, rule="deepep-built-with-nvshmem", versions="DeepEP 1.x x NVSHMEM 3.x"),
    Signature(
        id="kernels-not-built-for-this-gpu", symptom="install",
        patterns=(r"no kernel image is available for execution on the device",
                  r"(?:CUDA error|cuda error|cudaError\w*)\W+(?:\S+:\d+ )?'?named symbol not found",
                  r"^\W*named symbol not found\W*$",
                  r"CUDA error\W+(?:\S+:\d+ )?'?invalid device function"),
        cause="A compiled extension's kernels were not built for this GPU's architecture (DeepEP's default arch "
              "list is sm_90 only, so on B200/GB200, sm_100, the kernels it looks up are not in the binary): the "
              "CUDA runtime finds no kernel image or no symbol for the device.",
        fix="rebuild the extension for the GPU it runs on (TORCH_CUDA_ARCH_LIST=9.0 for H100/H200, 10.0 for "
            "B200/GB200, or both: '9.0;10.0'); `cuobjdump --list-elf` on its .so lists the architectures it holds",
        source=_CUDART,
        emitted=("torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device",
                 "RuntimeError: Failed: CUDA error /opt/DeepEP/csrc/kernels/runtime.cu:25 'named symbol not found'",
                 "named symbol not found",
                 "RuntimeError: CUDA error: invalid device function"),
        confidence=0.75, versions="any compiled extension"),
)

_TORCH_BUILD = f"installed:torch/utils/cpp_extension.py (its extension build checks; {TRIGGERED})"

SIGNATURES += (
    Signature(
        id="cuda-toolkit-major-differs-from-torch", symptom="install",
        patterns=(r"The detected CUDA version \((?:%s|[\d.]+)\) mismatches the version that was used to compile",),
        cause="An extension build (DeepEP, Transformer Engine, apex, ...) found a CUDA toolkit (CUDA_HOME's nvcc) of "
              "another major version than the one torch was built with; torch's build refuses to mix them.",
        fix="point CUDA_HOME at a CUDA toolkit of torch's major version (python -c 'import torch; "
            "print(torch.version.cuda)'), or install the torch build for the toolkit you have",
        source=_TORCH_BUILD,
        emitted=("RuntimeError: ('The detected CUDA version (%s) mismatches the version that was used to compilePyTorch "
                 "(%s). Please make sure to use the same CUDA versions.', '12.4', '13.0')",),
        confidence=0.9, versions="torch 2.x"),
    Signature(
        id="cuda-toolkit-not-found", symptom="install",
        patterns=(r"CUDA was not found on the system, please set the CUDA_HOME or the CUDA_PATH",
                  r"CUDA_HOME environment variable is not set\. Please set it to your CUDA install root",
                  r"nvcc not found at '[^']*'\. Ensure CUDA path"),
        cause="An extension build found no CUDA toolkit (no CUDA_HOME / CUDA_PATH, or no nvcc under it): torch's "
              "wheel ships the CUDA runtime, not the compiler, so building DeepEP or Transformer Engine from source "
              "needs a toolkit installed.",
        fix="install the CUDA toolkit of torch's major version and set CUDA_HOME to it (nvcc at $CUDA_HOME/bin/nvcc), "
            "or use an image that has it (the NGC PyTorch containers)",
        source=_TORCH_BUILD,
        emitted=("RuntimeError: CUDA was not found on the system, please set the CUDA_HOME or the CUDA_PATHenvironment "
                 "variable or add NVCC to your system PATH. The extension compilation will fail.",
                 "OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root."),
        confidence=0.9, versions="torch 2.x"),
)

CUDA_ERRORS = {"no kernel image is available for execution on the device": 209, "named symbol not found": 500,
               "invalid device function": 98}
"""The cudaError_t codes whose ``cudaGetErrorString`` the kernels-not-built signature matches (driver_types.h)."""

_LINKER = f"installed:binutils ld (its duplicate-symbol error; {TRIGGERED})"
_TORCH_HEADERS = "installed:torch/include/ATen/core/op_registration/infer_schema.h"

SIGNATURES += (
    Signature(
        id="cutlass-headers-missing", symptom="install",
        patterns=(r"(?:fatal error: )?['\"<]?(?:\S*/)?cutlass/[\w/.]+\.h['\">]?: No such file or directory",),
        cause="An extension built from source (nv-grouped-gemm / grouped_gemm, which Megatron-Core's "
              "moe_grouped_gemm without Transformer Engine uses, or another CUTLASS-based kernel) found no CUTLASS "
              "headers: nv-grouped-gemm's source distribution on PyPI does not carry its CUTLASS submodule, and pip "
              "builds from it when no prebuilt wheel matches the CUDA, torch, C++ ABI and Python of the environment.",
        fix="install a prebuilt nv-grouped-gemm wheel made for this CUDA / torch / ABI / Python, or build it from a "
            "recursive clone (git clone --recursive https://github.com/fanshiqing/grouped_gemm) so third_party/cutlass "
            "is there; or leave it out (it is optional: Megatron-Core's MoE grouped GEMM runs on Transformer Engine's "
            "GroupedLinear, moe_grouped_gemm with transformer_impl=transformer_engine)",
        source=_COMPILER,
        emitted=("t.cpp:1:10: fatal error: cutlass/bfloat16.h: No such file or directory",
                 "cutlass/bfloat16.h: No such file or directory"),
        confidence=0.85, versions="any source build of a CUTLASS-based extension (nv-grouped-gemm 1.1.x)"),
    Signature(
        id="nvshmem-headers-need-relocatable-device-code", symptom="install",
        patterns=(r"multiple definition of [`'‘]nvshmemi_ibgda_device_state_d['`’]",),  # a pasted log may re-quote it
        cause="NVSHMEM 3.5's device headers (device_host_transport/nvshmem_common_ibgda.h) declare "
              "nvshmemi_ibgda_device_state_d extern only when compiled as relocatable device code (__CUDACC_RDC__); "
              "a translation unit that includes them without -rdc=true (DeepEP's deep_ep.cpp, compiled by the host "
              "compiler) defines the symbol again, and the link with libnvshmem_device.a finds two definitions.",
        fix="build DeepEP with a release that supports NVSHMEM 3.5 (deepseek-ai/DeepEP PR #557 compiles with "
            "-rdc=true and keeps host sources off the device headers), or build against NVSHMEM < 3.5 "
            "(nvidia-nvshmem-cu12 3.3 / 3.4); the DeepEP and NVSHMEM versions go together",
        source=_LINKER,
        emitted=("/usr/bin/ld: b.o:(.bss+0x0): multiple definition of `nvshmemi_ibgda_device_state_d'; "
                 "a.o:(.bss+0x0): first defined here",),
        confidence=0.9, rule="deepep-built-with-nvshmem", versions="DeepEP 1.2.x built against NVSHMEM 3.5.19+"),
    Signature(
        id="torch-op-schema-integral-type", symptom="install",
        patterns=(r"INVALID TYPE: Only (?:int8_t, )?int64_t and bool are supported as an integral argument type",),
        cause="A C++ extension registers a TorchScript / torch.library operator with an integral argument other than "
              "the ones torch's schema inference takes (int64_t and bool; newer torch, the installed one, also int8_t): Transformer "
              "Engine's ts_fp8_op.cpp after TransformerEngine PR #772 built against torch 2.1 fails this static "
              "assertion.",
        fix="build the extension against the torch its release supports (the Transformer Engine release notes "
            "list the torch versions), or use a Transformer Engine release built for the installed torch; in own "
            "operators, take int64_t and narrow inside",
        source=_TORCH_HEADERS,
        emitted=("/usr/local/lib/python3.10/dist-packages/torch/include/ATen/core/op_registration/infer_schema.h:42:7: "
                 "error: static assertion failed: INVALID TYPE: Only int64_t and bool are supported as an integral "
                 "argument type",),
        confidence=0.85, versions="'int64_t and bool': torch 2.1 (the report); 'int8_t, int64_t and bool': the installed torch"),
)

ERROR_DIRECTIVE = Signature(
    id="error-directive", symptom="install", patterns=(),
    cause="A header stopped the compile with an #error directive (PyTorch's 'C++17 / C++20 or later compatible compiler "
          "is required', a toolkit's unsupported-compiler check): the build's flags or compiler do not meet what the "
          "installed headers ask for. The finding quotes the directive and the #if above it from the headers installed "
          "here, and for a C++ standard the older -std flags the log's commands pass.",
    fix="meet what the header asks for; for a C++ standard, drop the build's hard-coded -std flag (let "
        "torch.utils.cpp_extension or CMake choose) or pass the standard it names",
    source=f"installed:torch/include/torch/csrc/api/include/torch/all.h (its #error; {TRIGGERED})", emitted=(),
    confidence=0.7, found_by="error-directive",
    versions="70% with the directive found in the headers installed here, 40% from the message alone")

SIGNATURES += (ERROR_DIRECTIVE,)

DEVICE_LINK_ARCH = Signature(
    id="device-link", symptom="install", patterns=(),
    cause="nvlink 'SM Arch ('sm_NN') not found in FILE.o': the extension's CUDA device-link step ran for sm_NN (nvcc's "
          "default when the link is given no architecture) while its objects were compiled for other architectures, "
          "so the library carries no usable device code for its GPUs.",
    fix="pass the compile's architectures to the device-link step too (-gencode / -arch in the dlink flags, CMake's "
        "CUDA_ARCHITECTURES, or TORCH_CUDA_ARCH_LIST where the build gives it to both), then rebuild",
    source=f"installed:mbridge_ep_overlap/diagnose/device_links.py (nvcc -dlink's nvlink warning; {TRIGGERED})",
    emitted=(), confidence=0.7,
    found_by="device-link", versions="nvcc's nvlink, CUDA 12 and 13 (default architecture sm_75)")

SIGNATURES += (DEVICE_LINK_ARCH,)

HEADER_API = Signature(
    id="header-api", symptom="install", patterns=(),
    cause="The compiler says code uses a name of a known library (CUTLASS, PyTorch, CCCL, NVSHMEM, ...) in a form its "
          "headers on the include path do not have (too many template arguments, no such member): the code was written "
          "against another release of that library than the build found.",
    fix="build against the library release the project pins, or a release of the project written for the installed one",
    source=f"installed:mbridge_ep_overlap/diagnose/compile_errors.py (nvcc's front-end errors; {TRIGGERED})",
    emitted=(), confidence=0.65, found_by="header-api",
    versions="nvcc's EDG front end (CUDA 12, 13) and GCC's wording")

PTX_REJECTED = Signature(
    id="ptxas", symptom="install", patterns=(),
    cause="ptxas refused PTX (an instruction's arguments, a modifier or a feature the target lacks): inline PTX in the "
          "source or a JIT compile's output written for another toolkit release or architecture.",
    fix="the toolkit release the library supports, or a release of the library whose PTX builds with this one",
    source=f"installed:mbridge_ep_overlap/diagnose/compile_errors.py (ptxas's error; {TRIGGERED})", emitted=(),
    confidence=0.6, found_by="ptxas", versions="ptxas of CUDA 12 and 13; a JIT compile's 'ptxas FILE: error:' form")

SIGNATURES += (HEADER_API, PTX_REJECTED)
