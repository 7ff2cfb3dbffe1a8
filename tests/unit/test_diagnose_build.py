"""The toolchain's own words, made to print on CPU (GCC's missing header, glibc's missing shared object,
the CUDA runtime's error strings), recognised by the build signatures; and the timeout lines of NCCL,
DeepEP and HybridEP read for the op, the ranks and the ranked causes (diagnose.timeouts)."""

from __future__ import annotations

import ctypes
import io
import shutil
import subprocess
from pathlib import Path

import pytest

from mbridge_ep_overlap.diagnose.engine import diagnose
from mbridge_ep_overlap.diagnose.signatures import all_signatures
from mbridge_ep_overlap.diagnose.signatures.build import CUDA_ERRORS, LIBRARIES, TRIGGERED

SIGS = all_signatures()
BY_ID = {s.id: s for s in SIGS}
SITE = Path(__import__("megatron.core").core.__file__).resolve().parents[2]
CUDART = SITE / "nvidia" / "cu13" / "lib" / "libcudart.so.13"


def claimed(text: str) -> list[str]:
    return [s.id for s in SIGS if any(p.search(text) for p in s.compiled())]


def top(text: str) -> str:
    return (diagnose(["-"], stdin=io.BytesIO(text.encode())).cause_ids or ["-"])[0]


def _compiler_error(tmp_path: Path, header: str) -> str:
    cc = shutil.which("g++") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C/C++ compiler on this machine to print its missing-header error")
    source = tmp_path / "t.cpp"
    source.write_text(f'#include "{header}"\n')
    done = subprocess.run([cc, "-c", str(source), "-o", str(tmp_path / "t.o")], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode != 0
    return done.stderr


@pytest.mark.parametrize("lib", LIBRARIES, ids=lambda lib: lib.key)
def test_compiler_missing_header_names_the_library(lib, tmp_path):
    text = _compiler_error(tmp_path, lib.header_example)
    sig_id = f"{lib.key}-header-not-found"
    assert claimed(text) == [sig_id], text
    assert top(text) == sig_id
    # the emitted line is the compiler's format, the path of the translation unit aside
    first = next(line for line in text.splitlines() if "fatal error:" in line)
    assert first.split(": ", 1)[1] == BY_ID[sig_id].emitted[0].split(": ", 1)[1], first


def test_an_absolute_include_path_and_angle_brackets_are_named_too():
    line = ("/usr/local/lib/python3.12/dist-packages/nvidia/nvshmem/include/device_host/nvshmem_tensor.h:37:10: "
            "fatal error: cuda/std/tuple: No such file or directory")
    assert claimed(line) == ["cccl-header-not-found"]
    assert claimed("csrc/kernels/ibgda_device.cuh:5:10: fatal error: infiniband/verbs.h: No such file or directory") \
        == ["rdma-core-header-not-found"]
    assert claimed("foo.cpp:1:10: fatal error: some_other_lib.h: No such file or directory") == []


def test_the_installed_nvshmem_headers_include_cccl():
    """The cause the cccl signature names: NVSHMEM's own headers include libcu++ (checked in the installed wheel)."""
    header = SITE / "nvidia" / "nvshmem" / "include" / "device_host" / "nvshmem_tensor.h"
    if not header.is_file():
        pytest.skip("nvidia-nvshmem is not installed here")
    assert '#include "cuda/std/tuple"' in header.read_text()


@pytest.mark.parametrize("lib", [lib for lib in LIBRARIES if lib.sonames], ids=lambda lib: lib.key)
def test_loader_missing_library_names_the_library(lib):
    missing = lib.soname_example.rsplit(".so", 1)[0] + ".so.999"  # a version no image ships
    with pytest.raises(OSError) as raised:
        ctypes.CDLL(missing)
    text = f"OSError: {raised.value}"
    sig_id = f"{lib.key}-library-not-found"
    assert claimed(text) == [sig_id], text
    assert top(text) == sig_id
    assert BY_ID[sig_id].emitted[0].replace(lib.soname_example, missing) == text


@pytest.mark.parametrize("lib", [lib for lib in LIBRARIES if lib.sonames], ids=lambda lib: lib.key)
def test_linker_missing_library_names_the_library(lib, tmp_path):
    """GNU ld's own words for a library it cannot find, in both spellings (-l:FILE and -lNAME)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler on this machine to link with")
    (tmp_path / "t.c").write_text("int main(void) { return 0; }\n")
    unversioned = lib.soname_example.rsplit(".so", 1)[0] + ".so"
    name = unversioned.removeprefix("lib").removesuffix(".so")
    sig_id = f"{lib.key}-link-library-not-found"
    for flag in (f"-l:{unversioned}", f"-l{name}"):
        done = subprocess.run([cc, str(tmp_path / "t.c"), flag, "-o", str(tmp_path / "t")], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode != 0
        line = next(x for x in done.stderr.splitlines() if "cannot find" in x)
        assert claimed(line) == [sig_id], (flag, line)
        assert top(done.stderr) == sig_id
    assert BY_ID[sig_id].emitted[0].endswith(f"cannot find -l:{unversioned}: No such file or directory")
    assert claimed(f"/usr/bin/ld: cannot find -l{name}extra: No such file or directory") == []


@pytest.mark.parametrize("lib", [lib for lib in LIBRARIES if lib.symbols], ids=lambda lib: lib.key)
def test_loader_undefined_symbol_names_the_library(lib, tmp_path):
    """An extension linked against a symbol of the library that the process does not have: built here with the
    compiler (undefined symbols are allowed in a shared object) and loaded, so the loader says it."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler on this machine to build the extension")
    (tmp_path / "ext.c").write_text(f"extern int {lib.symbol_example}(void);\nint call(void) {{ return {lib.symbol_example}(); }}\n")
    so = tmp_path / "ext_for_test.so"
    subprocess.run([cc, "-shared", "-fPIC", str(tmp_path / "ext.c"), "-o", str(so)], check=True, capture_output=True,
                   timeout=60)
    with pytest.raises(OSError) as raised:
        ctypes.CDLL(str(so))
    text = f"ImportError: {raised.value}"
    sig_id = f"{lib.key}-symbol-not-found"
    assert claimed(text) == [sig_id], text
    assert top(text) == sig_id
    assert text.endswith(BY_ID[sig_id].emitted[0].rsplit(".so: ", 1)[1])


def test_a_torch_or_libstdcxx_symbol_is_not_claimed_by_a_library_row():
    torch_symbol = "ImportError: /x/te.so: undefined symbol: _ZN3c104cuda9SetDeviceEi"
    assert claimed(torch_symbol) == ["extension-built-for-other-torch"]
    mangled = "ImportError: /x/deep_ep_cpp.so: undefined symbol: _Z18nvshmemx_init_attrjP19nvshmemx_init_attr_t"
    assert claimed(mangled) == ["nvshmem-symbol-not-found"]


def test_nvshmem_ibgda_transport_text_is_in_the_installed_transport():
    transport = SITE / "nvidia" / "nvshmem" / "lib" / "nvshmem_transport_ibgda.so.3"
    if not transport.is_file():
        pytest.skip("nvidia-nvshmem is not installed here")
    data = transport.read_bytes()
    sig = BY_ID["nvshmem-ibgda-transport-failed"]
    path, _, message = sig.emitted[0].partition(":2234: NULL value ")
    assert path.encode() in data and b"%s:%d: NULL value " in data and message.encode() in data
    assert claimed(sig.emitted[0]) == [sig.id]


def test_the_installed_nvshmem_device_library_defines_the_ibgda_state():
    """The IBGDA signature's fix (an NVSHMEM built with IBGDA, as the wheels are): the wheel's device library has it."""
    device = SITE / "nvidia" / "nvshmem" / "lib" / "libnvshmem_device.a"
    if not device.is_file():
        pytest.skip("nvidia-nvshmem is not installed here")
    assert b"nvshmemi_ibgda_device_state_d" in device.read_bytes()


def test_cuda_error_strings_are_the_runtime_s():
    if not CUDART.is_file():
        pytest.skip("the CUDA runtime wheel is not installed here")
    runtime = ctypes.CDLL(str(CUDART))
    runtime.cudaGetErrorString.restype = ctypes.c_char_p
    sig = BY_ID["kernels-not-built-for-this-gpu"]
    for words, code in CUDA_ERRORS.items():
        assert runtime.cudaGetErrorString(code).decode() == words
        assert claimed(f"torch.AcceleratorError: CUDA error: {words}") == [sig.id], words
        assert any(words in line for line in sig.emitted)


def test_compiler_missing_cutlass_header_names_the_source_build(tmp_path):
    text = _compiler_error(tmp_path, "cutlass/bfloat16.h")
    assert claimed(text) == ["cutlass-headers-missing"], text
    first = next(line for line in text.splitlines() if "fatal error:" in line)
    assert first.split(": ", 1)[1] == BY_ID["cutlass-headers-missing"].emitted[0].split(": ", 1)[1], first
    assert claimed("foo.cpp:1:10: fatal error: mycutlass_wrapper.h: No such file or directory") == []


def test_linker_duplicate_ibgda_state_names_the_nvshmem_rdc_build(tmp_path):
    """Two objects that both define the IBGDA device state (what a host-compiled TU including NVSHMEM 3.5's headers
    and libnvshmem_device.a do), linked: the linker's own words."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler on this machine to link two objects")
    for name in ("a", "b"):
        (tmp_path / f"{name}.c").write_text("int nvshmemi_ibgda_device_state_d;\n"
                                            + ("int main(void) { return 0; }\n" if name == "a" else ""))
        subprocess.run([cc, "-fno-common", "-c", f"{name}.c", "-o", f"{name}.o"], check=True, cwd=tmp_path,
                       capture_output=True, timeout=60)
    done = subprocess.run([cc, "a.o", "b.o", "-o", "t"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    line = next(line for line in done.stderr.splitlines() if "multiple definition" in line)
    sig = BY_ID["nvshmem-headers-need-relocatable-device-code"]
    assert claimed(line) == [sig.id], line
    assert "multiple definition of `nvshmemi_ibgda_device_state_d'" in sig.emitted[0]
    assert claimed(line.replace("nvshmemi_ibgda_device_state_d", "some_other_symbol")) == []


def test_the_installed_nvshmem_headers_declare_the_ibgda_state_only_for_relocatable_code():
    """The cause the rdc signature names, in the installed NVSHMEM headers: the declaration sits under __CUDACC_RDC__."""
    header = SITE / "nvidia" / "nvshmem" / "include" / "device_host_transport" / "nvshmem_common_ibgda.h"
    if not header.is_file():
        pytest.skip("nvidia-nvshmem is not installed here")
    text = header.read_text()
    guard = text.index("#if defined(__CUDACC_RDC__)")
    assert guard < text.index("nvshmemi_ibgda_device_state_t nvshmemi_ibgda_device_state_d;", guard)


def test_nvshmem_skipped_nic_text_is_in_the_installed_transport():
    transport = SITE / "nvidia" / "nvshmem" / "lib" / "nvshmem_transport_ibgda.so.3"
    if not transport.is_file():
        pytest.skip("nvidia-nvshmem is not installed here")
    fmt = b"device %s is not enumerated as an mlx5 device. Skipping..."
    assert fmt in transport.read_bytes()
    sig = BY_ID["nvshmem-nic-not-mlx5"]
    rendered = fmt.decode().replace("%s", "roce_rail1")
    assert rendered in sig.emitted[0] and claimed(rendered) == [sig.id]
    assert claimed("WARN: device mlx5_0 is enumerated as an mlx5 device") == []


def test_every_triggered_signature_is_triggered_here():
    covered = ({f"{lib.key}-header-not-found" for lib in LIBRARIES}
               | {f"{lib.key}-library-not-found" for lib in LIBRARIES if lib.sonames}
               | {f"{lib.key}-link-library-not-found" for lib in LIBRARIES if lib.sonames}
               | {f"{lib.key}-symbol-not-found" for lib in LIBRARIES if lib.symbols}
               | {f"{lib.key}-cmake-package-not-found" for lib in LIBRARIES if lib.cmake}
               | {"kernels-not-built-for-this-gpu", "cuda-toolkit-major-differs-from-torch", "cuda-toolkit-not-found",
                  "cutlass-headers-missing", "nvshmem-headers-need-relocatable-device-code"}
               | {"error-directive", "device-link"}  # triggered in test_diagnose_compile_directives
               | {"header-api", "ptxas"})  # triggered in test_diagnose_limits_and_builds
    assert {s.id for s in SIGS if TRIGGERED in s.source} == covered


def test_kernels_not_built_is_named_through_deepep_s_cuda_check():
    line = "  what():  Failed: CUDA error /opt/DeepEP/csrc/kernels/runtime.cu:25 'named symbol not found'"
    assert top(line) == "kernels-not-built-for-this-gpu"
    assert claimed("the symbol was not found in the named table") == []


# ---- timeouts read for op, ranks and causes ---------------------------------------------------------------------
def _detail(text: str, sig_id: str) -> str:
    d = diagnose(["-"], stdin=io.BytesIO(text.encode()))
    f = next(f for f in d.findings if f.signature.id == sig_id)
    return "\n".join(f.detail)


def _nccl(rank: int, seq: int, op: str) -> str:
    return (f"[rank{rank}]:[E1202 06:38:31.967614106 ProcessGroupNCCL.cpp:689] [Rank {rank}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=16, NumelOut=32, Timeout(ms)=60000) ran for "
            f"60078 milliseconds before timing out.")


def test_nccl_timeout_names_each_rank_s_collectives_and_ranks_divergence_first_when_they_differ():
    text = "\n".join([_nccl(0, 193, "ALLTOALL_BASE"), _nccl(1, 194, "ALLREDUCE")])
    words = _detail(text, "nccl-watchdog-timeout")
    assert "rank 0: ALLTOALL_BASE (sequence number 193, NumelIn=16, NumelOut=32) ran 60078 ms against a 60000 ms" in words
    assert "rank 1: ALLREDUCE (sequence number 194" in words
    assert "1. (likely) the ranks timed out in different collectives (rank(s) [0, 1]" in words
    assert "the all-to-all's split sizes" in words
    assert "(less likely) the transport stalled" in words


def test_nccl_timeout_of_one_collective_on_every_rank_leaves_the_transport_possible():
    text = "\n".join([_nccl(0, 12, "ALLREDUCE"), _nccl(1, 12, "ALLREDUCE")])
    words = _detail(text, "nccl-watchdog-timeout")
    assert "1. (possible) one rank is in a different code path" in words
    assert "split sizes" not in words  # not an all-to-all
    assert "(possible) the transport stalled" in words


def test_hybridep_shortfall_is_counted():
    text = "\n".join(["HYBRID-EP ALLGATHER TIMEOUT:SM 3 [0]:expecting 800 got 798"] * 3)
    assert top(text) == "hybridep-allgather-short"
    words = _detail(text, "hybridep-allgather-short")
    assert "expecting 800 got 798 (3 line(s)): 2 rank-call(s) missing" in words
    assert "1. (likely) a rank stopped before this call" in words  # two short: not one rank one call
    assert "2. (possible) one rank issued fewer HybridEP calls" in words


def test_deepep_kernel_timeouts_of_internode_roles_point_at_the_network():
    text = ("DeepEP dispatch forwarder timeout (RDMA meta), channel: 2, RDMA: 1, nvl: 7, src RDMA lane: 3, dst NVL: 7, "
            "meta: 0, 0, 0, 0")
    assert top(text) == "deepep-kernel-timeout"
    words = _detail(text, "deepep-kernel-timeout")
    assert "DeepEP dispatch forwarder (RDMA meta) (RDMA rank 1, NVLink rank 7)" in words
    assert "1. (likely) the internode RDMA / NVSHMEM path" in words
    intranode = _detail("DeepEP timeout for combine receivers, rank 5, responsible_channel = 1, expect = 3",
                        "deepep-kernel-timeout")
    assert "DeepEP combine receivers (rank 5)" in intranode
    assert "1. (likely) a peer rank did not enter the same dispatch/combine" in intranode


def test_deepep_cpu_timeout_ranks_a_diverged_peer_first():
    words = _detail("RuntimeError: DeepEP error: timeout (combine CPU)", "deepep-dispatch-timeout")
    assert "DeepEP's CPU-side wait in combine timed out" in words
    assert "1. (likely) a peer rank did not reach the same dispatch/combine" in words


def test_an_abridged_fallback_warning_is_named():
    line = "DeepEP is only applicable to Ampere, Hopper, and Blackwell (B200/B300) GPUs ... Falling back to alltoall."
    assert top(line) == "deepep-fell-back-to-alltoall"


# ---- fallback warnings of the installed MCore / MB source -------------------------------------------------------
def test_every_in_scope_fallback_warning_of_the_installed_source_is_named():
    from mbridge_ep_overlap.diagnose import upstream_fallbacks

    found = upstream_fallbacks.warnings_in_source()
    wheres = {f.where.rsplit(":", 1)[0] for f in found}
    assert "megatron/core/transformer/moe/fused_a2a.py" in wheres
    assert "megatron/bridge/training/flex_dispatcher_backend.py" in wheres
    for f in found:
        rendered = f.literal.replace("...", "X")
        ids = diagnose(["-"], stdin=io.BytesIO(f"WARNING: {rendered}".encode())).cause_ids
        assert ids, f.where
        # the general reader names it, unless a hand-written signature already does (MB's flex fallbacks)
        assert ids[0] == f"upstream-fallback:{f.where}" or not ids[0].startswith("upstream-fallback:"), (f.where, ids)
        assert f.condition


def test_fallback_warning_names_the_condition_it_is_issued_under():
    line = ("UserWarning: Current DeepEP version does not support fused permute dispatch or "
            "num_blocks_permute/num_blocks_unpermute. Falling back to unfused HybridEP dispatch.")
    d = diagnose(["-"], stdin=io.BytesIO(line.encode()))
    f = d.findings[0]
    assert f.signature.id.startswith("upstream-fallback:megatron/core/transformer/moe/fused_a2a.py:")
    assert f.signature.symptom == "fallback"
    assert "issued when 'fuse_permute_dispatch' not in sig.parameters" in f.detail[0]


def test_fallbacks_outside_moe_and_overlap_are_not_findings():
    line = "UserWarning: Transformer Engine and Apex are not installed. Falling back to Torch optimizers."
    assert diagnose(["-"], stdin=io.BytesIO(line.encode())).cause_ids == []


def test_a_fallback_a_signature_names_is_not_named_twice():
    line = "DeepEP is only applicable to Ampere, Hopper, and Blackwell (B200/B300) GPUs. Current GPU: NVIDIA GB200. " \
           "Falling back to alltoall."
    assert diagnose(["-"], stdin=io.BytesIO(line.encode())).cause_ids == ["deepep-fell-back-to-alltoall"]


# ---- torch's own checks when an extension is built -----------------------------------------------------------------
def test_cuda_toolkit_of_another_major_is_named(tmp_path, monkeypatch):
    import torch
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        pytest.skip("this torch is not a CUDA build")
    other = "12.4" if not torch.version.cuda.startswith("12.") else "13.0"
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {other}, V{other}.1'\n")
    nvcc.chmod(0o755)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))
    with pytest.raises(RuntimeError) as raised:
        cpp_extension._check_cuda_version("g++", cpp_extension.TorchVersion("13.2"))
    text = f"RuntimeError: {raised.value}"
    assert claimed(text) == ["cuda-toolkit-major-differs-from-torch"], text
    assert top(text) == "cuda-toolkit-major-differs-from-torch"


def test_no_cuda_toolkit_is_named(monkeypatch):
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    texts = []
    with pytest.raises(RuntimeError) as raised:
        cpp_extension._check_cuda_version("g++", cpp_extension.TorchVersion("13.2"))
    texts.append(f"RuntimeError: {raised.value}")
    with pytest.raises(OSError) as raised:
        cpp_extension._join_cuda_home("bin", "nvcc")
    texts.append(f"OSError: {raised.value}")
    for text in texts:
        assert claimed(text) == ["cuda-toolkit-not-found"], text
    assert texts == list(BY_ID["cuda-toolkit-not-found"].emitted)


# ---- out of memory ---------------------------------------------------------------------------------------------------
def test_out_of_memory_text_is_the_allocator_s():
    from mbridge_ep_overlap.diagnose.signatures.memory import OOM_PIECES

    library = SITE / "torch" / "lib" / "libc10_cuda.so"
    if not library.is_file():
        pytest.skip("torch's CUDA allocator library is not installed here")
    data = library.read_bytes()
    line = BY_ID["cuda-out-of-memory"].emitted[0]
    for piece in OOM_PIECES:
        assert piece.encode() in data, piece
        assert piece.strip() in line, piece
    assert claimed(line) == ["cuda-out-of-memory"]


def test_out_of_memory_says_fragmentation_or_use():
    line = BY_ID["cuda-out-of-memory"].emitted[0]  # 16.20 GiB reserved but unallocated, 2.00 GiB asked
    words = _detail(line, "cuda-out-of-memory")
    assert "GPU 0: tried to allocate 2.00 GiB, 1.06 GiB free of 139.80 GiB" in words
    assert "fragmentation" in words
    used = line.replace("16.20 GiB is reserved", "120.00 MiB is reserved")
    assert "memory really in use" in _detail(used, "cuda-out-of-memory")


@pytest.mark.parametrize("lib", [lib for lib in LIBRARIES if lib.sonames], ids=lambda lib: lib.key)
def test_cmake_find_library_missing_names_the_library(lib, tmp_path):
    """CMake's own words when find_library(... REQUIRED) finds nothing (Transformer Engine's FindCUDNN.cmake form)."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("no cmake on this machine")
    unversioned = lib.soname_example.rsplit(".so", 1)[0] + ".so"
    name = unversioned.removeprefix("lib").removesuffix(".so") + "_not_here"
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(t NONE)\n"
        f"find_library({lib.key.replace('-', '_')}_LIBRARY NAMES {name} {unversioned.replace('.so', '_not_here.so')} "
        f"PATHS {tmp_path} NO_DEFAULT_PATH REQUIRED)\n")
    done = subprocess.run([cmake, "-S", str(tmp_path), "-B", str(tmp_path / "b")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert "_LIBRARY using the following names:" in text, text
    # the names the build asked for are the library's own: the row names the line with them (CMake wraps a long
    # line before the names: read joined)
    real = text.replace("_not_here", "")
    d = diagnose(["-"], stdin=io.BytesIO(real.encode()))
    assert f"{lib.key}-link-library-not-found" in d.cause_ids, (real, d.cause_ids)


@pytest.mark.parametrize("lib", [lib for lib in LIBRARIES if lib.cmake], ids=lambda lib: lib.key)
def test_cmake_find_package_missing_names_the_library(lib, tmp_path):
    """CMake's own words when a find module's find_package_handle_standard_args finds nothing (Transformer Engine
    1.x's FindCUDNN.cmake form), for each name the library row knows."""
    other = "  Could NOT find Foo (missing: FOO_LIBRARY)\n"
    assert f"{lib.key}-cmake-package-not-found" not in diagnose(["-"], stdin=io.BytesIO(other.encode())).cause_ids
    optional = f"-- Could NOT find {lib.cmake.split('|')[0]} (missing: X_INCLUDE_DIR X_LIBRARY)\n"  # a status line
    assert f"{lib.key}-cmake-package-not-found" not in diagnose(["-"], stdin=io.BytesIO(optional.encode())).cause_ids
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("no cmake on this machine")
    for name in lib.cmake.split("|"):
        (tmp_path / "CMakeLists.txt").write_text(
            "cmake_minimum_required(VERSION 3.18)\nproject(t NONE)\ninclude(FindPackageHandleStandardArgs)\n"
            f"set({name}_INCLUDE_DIR {name}_INCLUDE_DIR-NOTFOUND)\nset({name}_LIBRARY {name}_LIBRARY-NOTFOUND)\n"
            f"set({name}_FIND_REQUIRED TRUE)\n"  # as find_package({name} REQUIRED) sets it: CMake's error form
            f"find_package_handle_standard_args({name} REQUIRED_VARS {name}_INCLUDE_DIR {name}_LIBRARY)\n")
        done = subprocess.run([cmake, "-S", str(tmp_path), "-B", str(tmp_path / "b")], capture_output=True, text=True,
                              timeout=120)
        text = done.stdout + done.stderr
        assert done.returncode != 0 and f"Could NOT find {name} (missing:" in text, text
        d = diagnose(["-"], stdin=io.BytesIO(text.encode()))
        assert d.cause_ids[0] == f"{lib.key}-cmake-package-not-found", (text, d.cause_ids)
