"""Native (C++/CUDA) checks (diagnose.native_checks): parity with the macros' own format strings, quoted
from the libraries' sources, and the cause/fix/version diagnose gives for them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from mbridge_ep_overlap.base import run_files
from mbridge_ep_overlap.diagnose import diagnose, native_checks

UNSEEN2 = Path(__file__).parent / "fixtures" / "failure_reports_unseen2"
TE = ("https://github.com/NVIDIA/TransformerEngine/blob/05279e74bf77440e3c35237d77238a7583a09edb/"
      "transformer_engine/common/util/logging.h")
DEEPEP = ("https://github.com/deepseek-ai/DeepEP/blob/69bade5e252a95de8dd65ac253679372ab6f52d6/"
          "csrc/kernels/exception.cuh")
DEEPEP_V2 = ("https://github.com/deepseek-ai/DeepEP/blob/dd758caf451848bd150e1046af3d0a73e5fff38d/"
             "deep_ep/include/deep_ep/common/exception.cuh")
HYBRID_EP = ("https://github.com/deepseek-ai/DeepEP/blob/94a9f8f6b146c07d97ec58f67cd6d303296d6098/"
             "csrc/hybrid_ep/utils.cuh")
NVSHMEM = ("https://github.com/NVIDIA/nvshmem/blob/2d7d25f0816235e3c2b51779571ec032606ea0dd/"
           "src/include/non_abi/nvshmemx_error.h")
TORCH = ("https://github.com/pytorch/pytorch/blob/aac9c440075b7ec15dfe83973dc1dcd63c2fc042/"
         "torch/csrc/distributed/c10d/NCCLUtils.hpp")


def nvte_error(file: str, line: int, func: str, *args: str) -> str:
    # TE: NVTE_ERROR(...) throws std::runtime_error(concat_strings(
    #       __FILE__ ":", __LINE__, " in function ", __func__, ": ", concat_strings(__VA_ARGS__)))
    return "".join([file, ":", str(line), " in function ", func, ": ", "".join(args)])


def nvte_check(file: str, line: int, func: str, expr: str, *args: str) -> str:
    # TE: NVTE_CHECK(expr, ...) -> NVTE_ERROR("Assertion failed: " #expr ". ", concat_strings(__VA_ARGS__))
    return nvte_error(file, line, func, "Assertion failed: " + expr + ". ", "".join(args))


def ep_exception(name: str, file: str, line: int, error: str) -> str:
    # DeepEP: EPException: std::string("Failed: ") + name + " error " + file + ":" + std::to_string(line)
    #         + " '" + error + "'"; EP_HOST_ASSERT(cond) passes ("Assertion", __FILE__, __LINE__, #cond),
    #         CUDA_CHECK(cmd) passes ("CUDA", __FILE__, __LINE__, cudaGetErrorString(e))
    return "Failed: " + name + " error " + file + ":" + str(line) + " '" + error + "'"


def ep_v2_exception(name: str, file: str, line: int, error: str) -> str:
    # DeepEP V2: EPException: ss << name << " exception (" << file << ":" << line << "): " << error;
    #   EP_HOST_ASSERT(cond) -> ("Assertion", __FILE__, __LINE__, #cond); NCCL_CHECK(cmd) -> ("NCCL", ...,
    #   static_cast<int>(e) << " (" << ncclGetLastError(nullptr) << ")"); CUDA_RUNTIME_CHECK(cmd) -> ("CUDA runtime",
    #   ..., static_cast<int>(e) << " (" << cudaGetErrorName(e) << ", " << cudaGetErrorString(e) << ")")
    return name + " exception (" + file + ":" + str(line) + "): " + error


def hybrid_ep_cu_check(file: str, line: int, call: str, reason: str) -> str:
    # HybridEP: CU_CHECK(call): fprintf(stderr, "CU error encountered at: " "file=%s line=%d, call='%s' Reason=%s.\n",
    #   __FILE__, __LINE__, #call, p_err_str)
    return "CU error encountered at: " "file=%s line=%d, call='%s' Reason=%s.\n" % (file, line, call, reason)


def hybrid_ep_cuda_check(file: str, line: int, call: str, name: str, text: str) -> str:
    # HybridEP: CUDA_CHECK(call): "CUDA error encountered at: " "file=%s, line=%d, " "call='%s', Reason=%s:%s"
    return "CUDA error encountered at: " "file=%s, line=%d, " "call='%s', Reason=%s:%s" % (file, line, call, name, text)


def nvshmem_error_print(file: str, function: str, line: int, message: str) -> str:
    # NVSHMEM: NVSHMEMI_ERROR_PRINT(...): fprintf(stderr, "%s:%s:%d: ", __FILE__, __FUNCTION__, __LINE__);
    #   fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n")
    return "%s:%s:%d: " % (file, function, line) + message + "\n"


def nvshmem_error_jmp(file: str, line: int, head: str, message: str) -> str:
    # NVSHMEM: NVSHMEMI_NZ_ERROR_JMP: "%s:%d: non-zero status: %d "; NVSHMEMI_EQ_ERROR_JMP: "%s:%d: error status: %d ";
    #   NVSHMEMI_NULL_ERROR_JMP: "%s:%d: NULL value "; then __VA_ARGS__ and "\n"
    return "%s:%d: " % (file, line) + head + " " + message + "\n"


def ep_device_assert(file: str, line: int, cond: str) -> str:
    # DeepEP: EP_DEVICE_ASSERT(cond): printf("Assertion failed: %s:%d, condition: %s\n", __FILE__, __LINE__, #cond)
    return "Assertion failed: %s:%d, condition: %s\n" % (file, line, cond)


def c10d_nccl_check(file: str, line: int, error: str, version: str) -> str:
    # torch: C10D_NCCL_CHECK: "NCCL error in: " + std::string(__FILE__) + ":" + std::to_string(__LINE__) + ", "
    #        + ncclGetErrorWithVersion(result) + "\n" + getNcclErrorDetailStr(result, failureReason)
    #        (ncclGetErrorWithVersion: ncclGetErrorString(error) + ", NCCL version " + version)
    return "NCCL error in: " + file + ":" + str(line) + ", " + error + ", NCCL version " + version + "\n" + "detail"


CASES = [
    (TE, "RuntimeError: " + nvte_check("/build/te/transformer_engine/common/gemm/cublaslt_gemm.cu", 412, "cublas_gemm",
                                       "ldb >= k", "Invalid ldb (", "8", ")"),
     ("transformer-engine", "NVTE_CHECK", "transformer_engine/common/gemm/cublaslt_gemm.cu", 412, "cublas_gemm",
      "ldb >= k", "Invalid ldb (8)")),
    (TE, "RuntimeError: " + nvte_error("/opt/TransformerEngine/transformer_engine/common/util/cuda_runtime.cpp", 88,
                                       "sm_arch", "CUDA Error: ", "invalid device ordinal"),
     ("transformer-engine", "NVTE_ERROR", "transformer_engine/common/util/cuda_runtime.cpp", 88, "sm_arch", "",
      "CUDA Error: invalid device ordinal")),
    (DEEPEP, "RuntimeError: " + ep_exception("Assertion", "/workspace/DeepEP/csrc/deep_ep.cpp", 97,
                                             "num_ranks <= NUM_MAX_NVL_PEERS"),
     ("deep-ep", "EP_HOST_ASSERT", "csrc/deep_ep.cpp", 97, "", "num_ranks <= NUM_MAX_NVL_PEERS", "")),
    (DEEPEP, "what():  " + ep_exception("CUDA", "/opt/DeepEP/csrc/kernels/runtime.cu", 25, "named symbol not found"),
     ("deep-ep", "CUDA_CHECK", "csrc/kernels/runtime.cu", 25, "", "", "named symbol not found")),
    (DEEPEP, ep_device_assert("/DeepEP/csrc/kernels/internode.cu", 483,
                              "ibgda_get_state()->num_rc_per_pe >= num_channels").splitlines()[0],
     ("deep-ep", "EP_DEVICE_ASSERT", "csrc/kernels/internode.cu", 483, "",
      "ibgda_get_state()->num_rc_per_pe >= num_channels", "")),
    (DEEPEP_V2, "RuntimeError: " + ep_v2_exception("NCCL", "/mnt/DeepEP/csrc/kernels/backend/nccl.cu", 105,
                                                   "5 (GIN_IB_PROXY does not support specifying qp depth)"),
     ("deep-ep", "NCCL_CHECK", "csrc/kernels/backend/nccl.cu", 105, "", "",
      "5 = ncclInvalidUsage: GIN_IB_PROXY does not support specifying qp depth")),
    (DEEPEP_V2, "RuntimeError: " + ep_v2_exception(
        "Assertion", "/opt/DeepEP/csrc/kernels/backend/nccl.cu", 87,
        '(allow_hybrid_mode ? props.railedGinType : props.ginType) != NCCL_GIN_TYPE_NONE and "NCCL GIN is unavailable."'),
     ("deep-ep", "EP_HOST_ASSERT", "csrc/kernels/backend/nccl.cu", 87, "",
      "(allow_hybrid_mode ? props.railedGinType : props.ginType) != NCCL_GIN_TYPE_NONE", "NCCL GIN is unavailable.")),
    (DEEPEP_V2, "RuntimeError: " + ep_v2_exception("CUDA runtime", "/opt/DeepEP/deep_ep/include/deep_ep/common/layout.cuh",
                                                   40, "2 (cudaErrorMemoryAllocation, out of memory)"),
     ("deep-ep", "CUDA_RUNTIME_CHECK", "deep_ep/include/deep_ep/common/layout.cuh", 40, "", "",
      "2 (cudaErrorMemoryAllocation, out of memory)")),
    (HYBRID_EP, hybrid_ep_cu_check("/opt/DeepEP/csrc/hybrid_ep/allocator/allocator.cu", 92,
                                   "cuMemAddressReserve((CUdeviceptr*)ptr, size, fabric_granularity_, 0, 0)",
                                   "out of memory").rstrip(),
     ("deep-ep", "HybridEP CU_CHECK", "csrc/hybrid_ep/allocator/allocator.cu", 92, "cuMemAddressReserve", "",
      "cuMemAddressReserve((CUdeviceptr*)ptr, size, fabric_granularity_, 0, 0) returned out of memory")),
    (HYBRID_EP, hybrid_ep_cuda_check("/opt/DeepEP/csrc/hybrid_ep/hybrid_ep.cu", 310, "cudaMalloc(&p, n)",
                                     "cudaErrorMemoryAllocation", "out of memory"),
     ("deep-ep", "HybridEP CU_CHECK", "csrc/hybrid_ep/hybrid_ep.cu", 310, "cudaMalloc", "",
      "cudaMalloc(&p, n) returned cudaErrorMemoryAllocation:out of memory")),
    (NVSHMEM, nvshmem_error_print("/dvs/p4/build/toolkit/r13.2/main_nvshmem/src/host/team/team_internal.cpp",
                                  "nvshmemi_team_allocate_resources", 1975, "Failed to set team index").rstrip(),
     ("nvshmem", "NVSHMEMI_ERROR_PRINT", "src/host/team/team_internal.cpp", 1975, "nvshmemi_team_allocate_resources",
      "", "Failed to set team index")),
    (NVSHMEM, nvshmem_error_jmp("/repo/nvshmem_src/src/host/team/team_internal.cpp", 1821, "error status: 2",
                                "No more teams available (max = 7)").rstrip(),
     ("nvshmem", "NVSHMEMI_ERROR_JMP", "src/host/team/team_internal.cpp", 1821, "", "",
      "error status: 2 No more teams available (max = 7)")),
    (NVSHMEM, nvshmem_error_jmp("/usr/src/nvshmem/src/modules/transport/ibgda/ibgda.cpp", 2234, "NULL value",
                                "Unable to create ah.").rstrip(),
     ("nvshmem", "NVSHMEMI_ERROR_JMP", "src/modules/transport/ibgda/ibgda.cpp", 2234, "", "",
      "NULL value Unable to create ah.")),
    (TORCH, "torch.distributed.DistBackendError: " + c10d_nccl_check(
        "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp", 3356,
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details)", "2.21.5").splitlines()[0],
     ("nccl", "C10D_NCCL_CHECK", "torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp", 3356, "", "",
      "unhandled cuda error (run with NCCL_DEBUG=INFO for details)")),
]


@pytest.mark.parametrize(("source", "line", "expected"), CASES, ids=[c[2][1] for c in CASES])
def test_each_macro_format_is_read_back(source, line, expected):
    c = native_checks.parse("[rank0]: " + line)
    assert c is not None, source
    assert (c.library, c.macro, c.file, c.line, c.function, c.condition, c.message) == expected


def run(text: str, path=None):
    return diagnose([str(path)]) if path else diagnose(["-"], stdin=io.BytesIO(text.encode()))


def test_the_unseen_te_aux_loss_check_is_named_with_its_condition_and_message():
    log = json.loads((UNSEEN2 / "megatron-lm-5025.json").read_text())["log"]
    top = run(log).findings[0]
    where = "transformer_engine/common/fused_router/fused_moe_aux_loss.cu:90"
    assert top.signature.id == f"native-check:transformer-engine:{where}"
    assert "in function fused_moe_aux_loss_forward_kernel_launcher" in top.signature.cause
    assert "requires num_experts == num_cols: Number of experts (32) must be equal to number of input columns (64)" \
        in top.signature.cause
    assert top.signature.fix.startswith(f"the check in transformer-engine {where} requires num_experts == num_cols")
    assert "version not in the evidence" in top.signature.versions


def test_the_installed_version_comes_from_the_facts(tmp_path):
    line = "RuntimeError: " + nvte_check("/x/transformer_engine/common/fused_router/fused_moe_aux_loss.cu", 90,
                                         "launcher", "num_experts == num_cols", "Number of experts")
    (tmp_path / "train.log").write_text(line + "\n")
    facts = run_files.facts_file(tmp_path, 0)
    facts.parent.mkdir(parents=True)
    facts.write_text(json.dumps({"rank": 0, "versions": {"transformer-engine": "2.16.0"}}))
    top = run("", tmp_path).findings[0]
    assert top.signature.id.startswith("native-check:transformer-engine:")
    assert top.signature.versions == "transformer-engine 2.16.0 (the run's facts)"
    assert "the run's version: transformer-engine 2.16.0" in top.signature.fix


def test_nccl_prints_its_own_version():
    line = c10d_nccl_check("/p/torch/csrc/distributed/c10d/NCCLUtils.cpp", 77,
                           "unhandled system error (run with NCCL_DEBUG=INFO for details)", "2.27.3")
    top = run(line.splitlines()[0] + "\n").findings[0]
    assert top.signature.id == "native-check:nccl:torch/csrc/distributed/c10d/NCCLUtils.cpp:77"
    assert "requires the NCCL call to return ncclSuccess (it returned: unhandled system error" in top.signature.cause
    assert top.signature.versions == "nccl 2.27.3 (printed with the error)"


def test_a_warning_in_the_same_format_is_not_a_failed_check():
    # NVTE_WARN prints __FILE__ ":" __LINE__ " in function " __func__ ": " MESSAGE to stderr and goes on
    warn = "/x/transformer_engine/common/gemm/cublaslt_gemm.cu:12 in function gemm: falling back to cuBLAS"
    assert native_checks.parse(warn) is None


def test_a_hand_written_signature_for_the_same_line_still_names_it():
    line = ("RuntimeError: Failed: Assertion error /home1/DeepEP/csrc/deep_ep.cpp:32 "
            "'num_ranks > NUM_MAX_NVL_PEERS or low_latency_mode'")
    d = run(line + "\n")
    assert d.findings[0].signature.id == "deepep-normal-mode-needs-8-nvlink-peers"
    assert not any(f.signature.id.startswith("native-check:") for f in d.findings)


def test_an_unsupported_branch_reads_as_one():
    c = native_checks.parse(ep_exception("Assertion", "/d/csrc/kernels/internode.cu", 328,
                                         'false and "Unsupported RDMA ranks"'))
    assert c.requires == "a case it supports (it reached one it does not: Unsupported RDMA ranks)"


def test_a_deepep_v2_nccl_error_is_named_with_its_result_and_message():
    line = "RuntimeError: " + ep_v2_exception("NCCL", "/mnt/DeepEP/csrc/kernels/backend/nccl.cu", 105,
                                              "5 (GIN_IB_PROXY does not support specifying qp depth)")
    top = run(line + "\n").findings[0]
    assert top.signature.id == "native-check:deep-ep:csrc/kernels/backend/nccl.cu:105"
    assert "the NCCL call to return ncclSuccess (it returned: 5 = ncclInvalidUsage: GIN_IB_PROXY does not support " \
           "specifying qp depth)" in top.signature.cause


def test_a_message_that_names_the_setting_to_change_says_so_in_the_fix():
    line = nvshmem_error_jmp("/b/main_nvshmem/src/host/team/team_internal.cpp", 1821, "error status: 2",
                             "(NVSHMEMX_ERROR_OUT_OF_MEMORY) No more teams available (max = 7), try setting "
                             "NVSHMEM_MAX_TEAMS environment variable")
    top = run(line).findings[0]
    assert top.signature.id == "native-check:nvshmem:src/host/team/team_internal.cpp:1821"
    assert top.signature.fix.startswith("its message says what to change: try setting NVSHMEM_MAX_TEAMS environment variable")
    assert "nvshmem version not in the evidence" in top.signature.versions


def test_nvshmem_chain_names_the_first_line_first():
    text = (nvshmem_error_jmp("/b/nvshmem/src/modules/bootstrap/uid/bootstrap_uid.cpp", 301, "non-zero status: 7",
                              "bootstrap allgather failed")
            + nvshmem_error_jmp("/b/nvshmem/src/host/init/init.cu", 420, "non-zero status: 7",
                                "nvshmem bootstrap failed"))
    found = run(text).findings
    assert [f.signature.id for f in found][:2] == ["native-check:nvshmem:src/modules/bootstrap/uid/bootstrap_uid.cpp:301",
                                                    "native-check:nvshmem:src/host/init/init.cu:420"]
    assert found[1].signature.confidence == native_checks.FOLLOW_CONFIDENCE < found[0].signature.confidence


def test_an_nvshmem_line_after_one_a_signature_names_follows_from_it():
    text = (nvshmem_error_jmp("/b/main_nvshmem/src/modules/transport/ibgda/ibgda.cpp", 2234, "NULL value",
                              "Unable to create ah.")
            + nvshmem_error_jmp("/b/main_nvshmem/src/host/transport/transport.cpp", 420, "non-zero status: 7",
                                "connect EPS failed"))
    found = run(text).findings
    assert found[0].signature.id == "nvshmem-ibgda-transport-failed"
    assert found[1].signature.confidence == native_checks.FOLLOW_CONFIDENCE


def test_a_path_that_is_not_nvshmem_is_not_read_as_nvshmem():
    assert native_checks.parse("/home/u/train.cpp:12: non-zero status: 3 oops") is None
    assert native_checks.parse("/home/u/train.cpp:main:12: oops") is None


def test_hybridep_fabric_memory_refused_names_the_fabric_handles():
    line = hybrid_ep_cu_check("/opt/DeepEP/csrc/hybrid_ep/allocator/allocator.cu", 91,
                              "cuMemCreate(&handle, size, &fabric_prop_, 0)", "operation not permitted")
    top = run(line).findings[0]
    assert top.signature.id == "hybridep-fabric-memory-not-permitted"
    assert "USE_MNNVL=0" in top.signature.fix


def test_lines_that_only_look_like_native_checks_are_not_read_as_ones():
    path_dump = "LD_LIBRARY_PATH=" + ":".join(["/usr/lib/python3/site-packages/nvidia/nvshmem/lib"] * 300)
    assert native_checks.parse(path_dump) is None
    # a compiler warning in an NVSHMEM header, and another library's exception text
    assert native_checks.parse("/opt/nvshmem/include/nvshmem_defines.h:5:12: warning: unused variable 'x'") is None
    assert native_checks.parse("Unhandled exception (/opt/pytorch/c10/cuda/CUDACachingAllocator.cpp:1200): oom") is None
    assert native_checks.parse("/x/nvshmem/src/a.cpp:" + "9" * 5000 + ": non-zero status: 3 x") is None
    assert run(path_dump + "\n").cause_ids == []


def test_hybridep_cuda_check_line_reaches_the_reader():
    line = hybrid_ep_cuda_check("/opt/DeepEP/csrc/hybrid_ep/hybrid_ep.cu", 310, "cudaMalloc(&p, n)",
                                "cudaErrorMemoryAllocation", "out of memory")
    assert run(line + "\n").cause_ids[0] == "native-check:deep-ep:csrc/hybrid_ep/hybrid_ep.cu:310"


# ---- a CUDA check's error read with its meaning -----------------------------------------------------------------------
def _cuda_text(name: str) -> str:
    from mbridge_ep_overlap.diagnose.signatures.runtime import CUDA_ERRORS  # texts checked against libcudart there
    return CUDA_ERRORS[name][1]


def test_a_deepep_cuda_error_wrapped_onto_the_next_line_is_read_joined():
    head, _, tail = ep_exception("CUDA", "/ws/DeepEP/csrc/deep_ep.cpp", 200,
                                 _cuda_text("cudaErrorPeerAccessUnsupported")).partition(" '")
    d = run(f"RuntimeError: {head}\n'{tail}\nsome other line\n")
    top = d.findings[0]
    assert top.signature.id == "native-check:deep-ep:csrc/deep_ep.cpp:200"
    assert "cudaErrorPeerAccess" in top.signature.cause and "every pair of GPUs of a node" in top.signature.cause
    assert "the CUDA error: cuda-peer-access (cudaErrorPeerAccessUnsupported)" in top.detail
    assert top.signature.fix.startswith("check `nvidia-smi topo -m`")


def test_a_quote_line_after_another_line_is_not_joined():
    d = run("RuntimeError: something failed at step 3\n'peer access is not supported between these two devices'\n")
    assert not any(f.signature.id.startswith("native-check:") for f in d.findings)


@pytest.mark.parametrize("name", ["cudaErrorIllegalAddress", "cudaErrorMemoryAllocation", "cudaErrorPeerAccessUnsupported"])
def test_a_cuda_check_names_the_error_and_its_row(name):
    from mbridge_ep_overlap.diagnose.signatures.runtime import CUDA_ERRORS

    c = native_checks.parse(ep_exception("CUDA", "/x/csrc/kernels/intranode.cu", 12, _cuda_text(name)))
    assert native_checks._cuda_name(c) == name
    assert native_checks._cuda_meaning(c).id == CUDA_ERRORS[name][2]
    hybrid = native_checks.parse(hybrid_ep_cuda_check("/x/csrc/hybrid_ep/x.cu", 7, "cudaMalloc(&p, n)", name,
                                                      _cuda_text(name)))
    assert native_checks._cuda_name(hybrid) in ("", name)  # HybridEP's Reason carries the name when it prints one


def test_an_assertion_check_gets_no_cuda_meaning():
    c = native_checks.parse(ep_exception("Assertion", "/x/csrc/deep_ep.cpp", 5, "num_ranks <= 8"))
    assert native_checks._cuda_name(c) == "" and native_checks._cuda_meaning(c) is None


def test_an_nvshmem_line_before_the_one_a_signature_names_is_the_first():
    text = (nvshmem_error_jmp("/b/main_nvshmem/src/host/transport/transport.cpp", 420, "non-zero status: 7",
                              "connect EPS failed")
            + nvshmem_error_jmp("/b/main_nvshmem/src/modules/transport/ibgda/ibgda.cpp", 2234, "NULL value",
                                "Unable to create ah."))
    found = {f.signature.id: f for f in run(text).findings}
    first = found["native-check:nvshmem:src/host/transport/transport.cpp:420"]
    assert first.signature.confidence != native_checks.FOLLOW_CONFIDENCE
    assert "follows from the first NVSHMEM error" not in first.signature.cause
