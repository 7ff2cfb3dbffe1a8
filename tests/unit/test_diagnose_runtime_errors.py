"""CUDA runtime errors, ATen device-side asserts, cuBLAS status and NCCL errors (diagnose.runtime_errors): the texts
triggered on a GPU (fixtures/recorded_texts) named with their kernel, condition, enum and root-cause rank; every row's
text checked against the installed CUDA runtime, cuBLAS headers, torch and NCCL (their strings, read as bytes or
through ctypes) and rdma-core's ibv_wc_status (an excerpt); never a traceback for any line."""

from __future__ import annotations

import ctypes
import io
import random
import re
from pathlib import Path

import pytest

from mbridge_ep_overlap.diagnose import diagnose, runtime_errors
from mbridge_ep_overlap.diagnose.signatures import all_signatures
from mbridge_ep_overlap.diagnose.signatures.runtime import (CUBLAS_STATUSES, CUDA_ERRORS, IBV_WC_NAMES, IBV_WC_STATUS,
                                                            IBV_WC_STATUS_AT, NCCL_RESULTS, SIGNATURES)

RECORDED = Path(__file__).parent / "fixtures" / "recorded_texts"
UPSTREAM = Path(__file__).parent / "fixtures" / "upstream_text"
SITE = Path(__import__("megatron.core").core.__file__).resolve().parents[2]
CUDA = SITE / "nvidia" / "cu13"
CUDART = CUDA / "lib" / "libcudart.so.13"
NCCL_SO = SITE / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
NCCL_H = SITE / "nvidia" / "nccl" / "include" / "nccl.h"
TORCH_CUDA = SITE / "torch" / "lib" / "libtorch_cuda.so"
BY_ID = {s.id: s for s in all_signatures()}
ROWS = [s for s in SIGNATURES]


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


def recorded(case: str) -> str:
    return (RECORDED / f"{case}.txt").read_text()


def found(d, sig_id: str):
    hits = [f for f in d.findings if f.signature.id == sig_id]
    assert hits, [f.signature.id for f in d.findings]
    return hits[0]


def detail(f) -> str:
    return "\n".join(f.detail)


def need(path: Path) -> bytes:
    if not path.is_file():
        pytest.skip(f"{path} is not installed here")
    return path.read_bytes()


def no_prefix(line: str) -> str:
    return re.sub(r"^\[rank\d+\]:", "", line)


# ---- the recorded texts -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case,sig_id,kernel,condition,threads", [
    ("embedding_index_out_of_range", "device-assert-index-select", "indexSelectSmallIndex",
     "srcIndex < srcSelectDimSize", 3),
    ("cross_entropy_target_out_of_range", "device-assert-loss-target", "nll_loss_forward_reduce_cuda_kernel_2d",
     "t >= 0 && t < n_classes", 1),
    ("gather_index_out_of_range", "device-assert-gather-scatter-index", "operator()",
     'idx_dim >= 0 && idx_dim < index_size && "scatter gather kernel index out of bounds"', 3),
    ("scatter_add_index_out_of_range", "device-assert-gather-scatter-index", "operator()",
     'idx_dim >= 0 && idx_dim < index_size && "scatter gather kernel index out of bounds"', 3),
])
def test_a_recorded_device_assert_names_kernel_file_line_and_condition(case, sig_id, kernel, condition, threads):
    d = run(recorded(case))
    assert d.recognised and d.cause_ids[0] == sig_id, d.cause_ids
    top = d.findings[0]
    first = recorded(case).splitlines()[0]
    file, line = re.match(r"/pytorch/(\S+?):(\d+):", first).groups()
    text = detail(top)
    assert f"kernel {kernel} at {file}:{line} asserts `{condition}` (printed by {threads} thread(s)" in text
    assert "may not be where it failed" in text and "CUDA_LAUNCH_BLOCKING=1" in text
    assert "torch/cuda/__init__.py:1162 in synchronize" in text or case.startswith("cross_entropy")
    assert any("CUDA error: device-side assert triggered" in e for e in top.evidence)
    assert "device-assert-without-kernel-line" not in [f.signature.id for f in d.findings]
    assert top.count == threads + 1  # every thread's line, and torch's error


def test_an_embedding_frame_makes_the_index_assert_a_token_id_past_the_vocabulary():
    lines = recorded("embedding_index_out_of_range").splitlines()
    frames = list(BY_ID["device-assert-token-id-past-vocab"].emitted[1:3])
    text = "\n".join(lines[:4] + frames + lines[4:]) + "\n"
    d = run(text)
    assert d.cause_ids[0] == "device-assert-token-id-past-vocab"
    assert "language_model_embedding.py:111 in forward" in detail(d.findings[0])
    # the recorded script's own file name holds the word, and is not an embedding frame
    assert run(recorded("embedding_index_out_of_range")).cause_ids[0] == "device-assert-index-select"


def test_the_token_id_rows_frame_is_the_installed_megatron_line():
    source = (SITE / "megatron/core/models/common/embeddings/language_model_embedding.py").read_text().splitlines()
    frame, code = BY_ID["device-assert-token-id-past-vocab"].emitted[1:3]
    assert int(re.search(r"line (\d+)", frame).group(1)) == 111 and source[110].strip() == code.strip()


def test_a_device_assert_without_its_kernel_line_says_so_and_advises_launch_blocking():
    text = "\n".join(x for x in recorded("gather_index_out_of_range").splitlines() if "Assertion `" not in x)
    d = run(text)
    f = found(d, "device-assert-without-kernel-line")
    assert f.signature.generic and not d.recognised
    assert "CUDA_LAUNCH_BLOCKING=1" in f.signature.fix and "cudaErrorAssert (710)" in detail(f)


def test_a_recorded_illegal_memory_access_names_the_enum_and_the_async_frame():
    d = run(recorded("illegal_memory_access"))
    assert [f.signature.id for f in d.findings] == ["cuda-illegal-address"]
    assert not d.recognised  # an out-of-bounds access in some kernel: the class, not its cause
    text = detail(d.findings[0])
    assert "cudaErrorIllegalAddress (700): an illegal memory access was encountered" in text
    assert "torch/cuda/__init__.py:1162 in synchronize) may not be where it failed" in text
    assert "compute-sanitizer" in d.findings[0].signature.fix
    assert "DeepEP / HybridEP frames" not in text
    with_deepep = recorded("illegal_memory_access").replace(
        'File "/root/out/texts/illegal_memory_access.py", line 11, in <module>',
        'File "/usr/lib/python3/site-packages/deep_ep/buffer.py", line 420, in dispatch')
    assert "DeepEP / HybridEP frames are in the log (/usr/lib/python3/site-packages/deep_ep/buffer.py:420 in dispatch)" \
        in detail(found(run(with_deepep), "cuda-illegal-address"))


def test_the_enum_is_read_from_the_message_when_torch_prints_no_search_line():
    d = run("Traceback (most recent call last):\nRuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert [f.signature.id for f in d.findings] == ["cuda-illegal-address"]
    assert "cudaErrorIllegalAddress (700)" in detail(d.findings[0])
    d = run("RuntimeError: CUDA error: some message no runtime prints\n")
    assert [f.signature.id for f in d.findings] == ["cuda-runtime-error"] and not d.recognised


def test_a_recorded_peer_exit_names_the_remote_error_and_the_root_cause_rank():
    d = run(recorded("nccl_peer_exited"))
    assert d.cause_ids[0] == "nccl-remote-error"
    text = detail(d.findings[0])
    assert "NCCL result ncclRemoteError (6), NCCL 2.28.9" in text
    assert "NCCL's last error: socketProgress: Connection closed by remote peer localhost<34454>" in text
    assert re.search(r"the first rank to exit \(torchrun's Root Cause, \S+:55\): rank 1 \(local_rank: 1\) on localhost, "
                     r"exit code 3 \(pid: 643\)", text), text


def test_a_sigkilled_rank_is_not_read_as_a_runtime_error():
    d = run(recorded("rank_sigkilled"))
    assert not any(f.signature.found_by == "runtime-error" for f in d.findings)


def test_a_closed_socket_alone_is_a_remote_error_without_a_root_cause():
    line = recorded("nccl_peer_exited").splitlines()[6]
    d = run(line + "\n")
    f = found(d, "nccl-remote-error")
    assert "peer localhost<34454> was closed by the peer" in detail(f)
    assert "no torchrun Root Cause in the evidence" in detail(f)


# ---- synthetic lines of exactly the real formats ------------------------------------------------------------------
@pytest.mark.parametrize("line,sig_id,name,code", [
    ("NCCL WARN NET/IB: Got completion from peer 10.1.2.3<40123> with status=IBV_WC_RETRY_EXC_ERR(12) "
     "opcode=IBV_WC_SEND(0) vendor_err=129  hca mlx5_1", "nccl-ib-retry-exceeded", "IBV_WC_RETRY_EXC_ERR", 12),
    ("NCCL WARN NET/IB/GIN: Got completion from peer 10.1.2.3<40123> with status=12 opcode=0 len=0 vendor err 129 "
     "(Send) hca mlx5_1", "nccl-ib-retry-exceeded", "IBV_WC_RETRY_EXC_ERR", 12),
    ("NCCL WARN NET/IB : Got completion from peer 10.1.2.3<40123> with status=4 opcode=1 len=0 vendor err 81 (Write)",
     "nccl-ib-local-protection", "IBV_WC_LOC_PROT_ERR", 4),
    ("NCCL WARN NET/IB/GIN: Got completion from peer 10.1.2.3<40123> with status=5 opcode=0 len=0 vendor err 249 "
     "(Send) hca mlx5_0", "nccl-ib-flushed", "IBV_WC_WR_FLUSH_ERR", 5),
    ("NCCL WARN NET/IB: Got completion from peer 10.1.2.3<40123> with status=IBV_WC_GENERAL_ERR(21) "
     "opcode=IBV_WC_SEND(0) vendor_err=0  hca mlx5_0", "nccl-ib-completion-error", "IBV_WC_GENERAL_ERR", 21),
])
def test_an_infiniband_completion_status_is_named_in_both_formats(line, sig_id, name, code):
    d = run(f"[2026-12-03 01:05:31] node2:642:660 [0] transport/net_ib.cc:2312 {line}\n")
    f = found(d, sig_id)
    assert f"InfiniBand completion status {name} ({code}) from peer 10.1.2.3<40123>" in detail(f)


def test_a_cublas_status_names_the_status_and_the_function():
    d = run("RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmStridedBatchedEx( handle, "
            "opa, opb, m, n, k, alpha_ptr, a, CUDA_R_16F, lda, stridea, b, CUDA_R_16F, ldb, strideb, beta_ptr, c, "
            "std::is_same_v<C_Dtype, float> ? CUDA_R_32F : CUDA_R_16F, ldc, stridec, num_batches, compute_type, "
            "CUBLAS_GEMM_DEFAULT_TENSOR_OP)`\n")
    assert d.cause_ids == ["cublas-not-supported"]
    assert "cuBLAS CUBLAS_STATUS_NOT_SUPPORTED (15) when calling cublasGemmStridedBatchedEx" in detail(d.findings[0])
    assert not any(f.signature.id.startswith("cuda-") for f in d.findings)  # not read as a CUDA runtime error too


def test_the_caching_allocator_s_out_of_memory_ranks_above_what_follows_from_it():
    oom = BY_ID["cuda-out-of-memory"].emitted[0]
    d = run(oom + "\nRuntimeError: CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`\n")
    assert d.cause_ids[:2] == ["cuda-out-of-memory", "cublas-not-initialized"]


def test_nccl_out_of_memory_from_its_cuda_failure():
    d = run("\n".join(BY_ID["nccl-out-of-memory"].emitted) + "\n")
    assert d.cause_ids[0] == "nccl-out-of-memory"
    assert "NCCL's last error: Cuda failure 2 'out of memory'" in detail(d.findings[0])
    assert "nccl-unhandled-cuda-error" not in d.cause_ids
    warn = "node1:12:34 [3] NCCL WARN Cuda failure 'out of memory'\n"
    assert run(warn).cause_ids == ["nccl-out-of-memory"]


def test_torch_s_nccl_check_is_still_named_as_the_native_check_first():
    line = BY_ID["nccl-system-error"].emitted[0]
    d = run(line + "\n")
    assert d.cause_ids[0].startswith("native-check:nccl:") and "nccl-system-error" in d.cause_ids


def test_stream_capture_names_moe_advice_only_with_moe_frames():
    error = "torch.AcceleratorError: CUDA error: operation not permitted when stream is capturing\n"
    plain = detail(found(run("Traceback (most recent call last):\n" + error), "cuda-graph-capture-unsupported-op"))
    assert "no MoE / token-dispatcher frame" in plain
    moe = ('Traceback (most recent call last):\n  File "/x/megatron/core/transformer/moe/token_dispatcher.py", line 9, '
           'in token_dispatch\n    num = tokens.sum().item()\n' + error)
    assert "the frames are the MoE layer's (/x/megatron/core/transformer/moe/token_dispatcher.py:9 in token_dispatch)" \
        in detail(found(run(moe), "cuda-graph-capture-unsupported-op"))


def test_no_kernel_image_is_left_to_the_existing_signature():
    d = run("torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device\n"
            "Search for `cudaErrorNoKernelImageForDevice' in https://docs.nvidia.com/cuda/ for more information.\n")
    assert d.cause_ids == ["kernels-not-built-for-this-gpu"]
    assert not any(f.signature.found_by == "runtime-error" for f in d.findings)


# ---- parity: every row's text -------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", ROWS, ids=lambda s: s.id)
def test_each_row_s_emitted_text_raises_it(sig):
    assert sig.found_by == "runtime-error" and not sig.patterns and sig.emitted
    d = run("\n".join(sig.emitted) + "\n")
    assert sig.id in [f.signature.id for f in d.findings], (sig.id, [f.signature.id for f in d.findings])


def _recorded_lines() -> set[str]:
    return {no_prefix(x).strip() for p in RECORDED.glob("*.txt") for x in p.read_text().splitlines()}


_ASSERT_FIELDS = re.compile(r"^(\S+?):(\d+): (.+?): block: \[([\d,]+)\], thread: \[([\d,]+)\] Assertion `(.+)` failed\.$")


def test_the_assert_rows_text_is_recorded_or_in_the_recorded_format():
    lines = _recorded_lines()
    recorded_assert = next(x for x in lines if "Assertion `" in x)
    for s in ROWS:
        if not s.id.startswith("device-assert-"):
            continue
        for line in s.emitted:
            if line.strip() in lines:
                continue
            if "Assertion `" in line:  # another kernel's: the recorded line with its fields swapped
                mine, theirs = _ASSERT_FIELDS.match(line), _ASSERT_FIELDS.match(recorded_assert)
                assert mine and theirs, line
                rebuilt = recorded_assert
                for a, b in zip(theirs.groups(), mine.groups()):
                    rebuilt = rebuilt.replace(a, b, 1)
                assert rebuilt == line, line
                continue
            assert s.id == "device-assert-token-id-past-vocab" and ("File " in line or "word_embeddings" in line), line


def test_cuda_error_table_is_the_installed_runtime_s():
    data, header = need(CUDART), (CUDA / "include" / "driver_types.h").read_text()
    runtime = ctypes.CDLL(str(CUDART))
    runtime.cudaGetErrorString.restype = ctypes.c_char_p
    runtime.cudaGetErrorName.restype = ctypes.c_char_p
    for name, (code, message, sig_id) in CUDA_ERRORS.items():
        assert re.search(rf"\b{name}\s*=\s*{code},", header), f"driver_types.h has no {name} = {code}"
        assert runtime.cudaGetErrorName(code).decode() == name
        assert runtime.cudaGetErrorString(code).decode() == message and message.encode() in data
        assert sig_id is None or sig_id in BY_ID
    for sig_id in {v[2] for v in CUDA_ERRORS.values() if v[2]}:  # each row's emitted error is its table's message
        messages = {m for _, m, s in CUDA_ERRORS.values() if s == sig_id}
        said = [re.search(r"CUDA error: (.+)$", x).group(1) for x in BY_ID[sig_id].emitted if "CUDA error: " in x]
        assert said and set(said) <= messages, (sig_id, said)
    for s in ROWS:
        for line in s.emitted:
            if m := re.search(r"Search for `(\w+)'", line):
                assert m.group(1) in CUDA_ERRORS and m.group(1).encode() in data


def missing_from(names, header: str) -> list[str]:
    """The names a meaning table gives that the header does not define (an enumerator: ``NAME =`` or ``NAME,``)."""
    return [n for n in names if not re.search(rf"^\s*(?:typedef enum \{{\s*)?{n}\s*(?:=|,)", header, re.M)]


def test_a_meaning_table_naming_an_enum_the_header_lacks_fails():
    headers = [CUDA / "include" / "driver_types.h", CUDA / "include" / "cublas_api.h", NCCL_H]
    if not all(h.is_file() for h in headers):
        pytest.skip("the CUDA / NCCL headers are not installed here")
    driver, cublas, nccl = (h.read_text() for h in headers)
    verbs = "\n".join((UPSTREAM / "rdma-core" / "libibverbs" / "verbs.h@L489-514.txt").read_text().splitlines()[4:])
    tables = [(CUDA_ERRORS, driver), (CUBLAS_STATUSES, cublas), (NCCL_RESULTS, nccl), (IBV_WC_STATUS, verbs)]
    for table, header in tables:
        assert missing_from(table, header) == [], missing_from(table, header)
        assert missing_from([*table, "cudaErrorNotAnEnum", "CUBLAS_STATUS_NOT_AN_ENUM", "ncclNotAResult",
                             "IBV_WC_NOT_A_STATUS"], header) != []  # the check fails on a name the header lacks


def test_cublas_statuses_are_the_installed_header_s_and_torch_prints_them():
    data = need(TORCH_CUDA)
    header = (CUDA / "include" / "cublas_api.h").read_text()
    assert b"CUDA error: " in data
    for status, (code, sig_id) in CUBLAS_STATUSES.items():
        assert re.search(rf"\b{status} = {code}\b", header), status
        assert status.encode() in data or status == "CUBLAS_STATUS_LICENSE_ERROR", status
        assert sig_id in BY_ID
    for s in ROWS:
        for line in s.emitted:
            if m := re.search(r"CUDA error: (CUBLAS_STATUS_\w+)( when calling `.*`)$", line):
                assert m.group(1) in CUBLAS_STATUSES and m.group(2).encode() in data, line


def test_nccl_results_are_the_installed_nccl_s_and_torch_s():
    so, torch_data = need(NCCL_SO), need(TORCH_CUDA)
    header = NCCL_H.read_text()
    nccl = ctypes.CDLL(str(NCCL_SO))
    nccl.ncclGetErrorString.restype = ctypes.c_char_p
    for name, (code, message, sig_id) in NCCL_RESULTS.items():
        assert re.search(rf"\b{name}\s*=\s*{code},", header), name
        assert nccl.ncclGetErrorString(code).decode() == message and message.encode() in so
        assert sig_id in BY_ID
    assert b"NCCL error: " in torch_data and b", NCCL version " in torch_data and b"Last error:" in torch_data
    lines = _recorded_lines()
    for s in ROWS:
        if not s.id.startswith("nccl-") or s.id.startswith("nccl-ib-"):
            continue
        for line in s.emitted:
            text = no_prefix(line).strip()
            if re.match(r"^nccl\w+: ", text):  # torch's detail string for the result
                assert line.encode() in torch_data, line
            elif text.startswith(("Cuda failure", "socketProgress")) or " NCCL WARN " in text:
                fmt = {"Cuda": b"Cuda failure %d '%s'", "sock": b"socketProgress: Connection closed by remote peer %s"}
                assert fmt["Cuda" if "Cuda failure" in text else "sock"] in so, line
            elif "NCCL error" in text:
                message = re.search(r"NCCL error(?: in: [^,]+,|:) (.+), NCCL version", text).group(1)
                assert message in {m for _, m, _ in NCCL_RESULTS.values()}, line
                assert text in lines or "NCCL error in: " in text, line
            else:
                assert text == "Last error:", line


def _format_regex(fmt: bytes) -> re.Pattern:
    parts = re.split(rb"%(?:l{0,2}[dusx]|p)", fmt)
    return re.compile(".*?".join(re.escape(p.decode()) for p in parts))


def test_the_ib_rows_lines_render_the_installed_nccl_formats():
    so = need(NCCL_SO)
    formats = [re.search(rb"NET/IB: Got completion from peer %s with status=%s\(%d\)[^\x00]*", so),
               re.search(rb"NET/IB/GIN: Got completion from peer %s with status=%d[^\x00]*", so)]
    assert all(formats), "the installed libnccl.so.2 no longer has both completion formats"
    patterns = [_format_regex(m.group(0)) for m in formats]
    for s in ROWS:
        if s.id.startswith("nccl-ib-"):
            for line in s.emitted:
                said = line.split(" NCCL WARN ", 1)[1]
                assert any(p.fullmatch(said) for p in patterns), line
                name = re.search(r"status=(?:(IBV_WC_\w+)\()?(\d+)", said)
                code = int(name.group(2))
                assert name.group(1) in (None, IBV_WC_NAMES[code])
                assert IBV_WC_STATUS.get(IBV_WC_NAMES[code], (code, "nccl-ib-completion-error"))[1] == s.id


def test_ibv_wc_status_names_are_rdma_core_s():
    repo, rest = IBV_WC_STATUS_AT.split("@")
    commit, path, span = rest.split(":")
    copy = UPSTREAM / repo.split("/")[1] / f"{path}@L{span}.txt"
    body = copy.read_text().splitlines()[4:]
    assert body[0].strip() == "enum ibv_wc_status {" and body[-1].strip() == "};"
    names = tuple(x.strip().rstrip(",") for x in body[1:-1])
    assert all("=" not in n for n in names)  # values count from 0 in order
    assert names == IBV_WC_NAMES
    for name, (value, sig_id) in IBV_WC_STATUS.items():
        assert names.index(name) == value and sig_id in BY_ID


# ---- never a traceback ----------------------------------------------------------------------------------------------
EDGE = ["CUDA error: ", "CUDA error:", "Search for `cudaError' in", "Search for `cudaErrorIllegalAddress'",
        "x.cu:1: k: block: [], thread: [] Assertion `` failed.", ":0: : block: [0,0,0], thread: [0,0,0] Assertion `a` failed.",
        "NCCL error: ", "NCCL error in: , , NCCL version ", "ncclRemoteError: ", "Last error:", "Last error: x",
        "NCCL WARN NET/IB: Got completion from peer  with status=(99999)", "Got completion from peer x with status=999",
        "Cuda failure '' ", "Cuda failure 99999 'x'", "Root Cause (first observed failure):", "  rank : ", "  exitcode : x",
        "CUDA error: CUBLAS_STATUS_ when calling `", "frame #0: ", '  File "", line 1, in ', "Connection closed by remote peer",
        "\x00\udcff", "`" * 5000, "Assertion `" + "block: [" * 2000,
        " a.cu:1: k: block: [0,0,0], thread: [0,0,0] Assertion `x" * 300]  # a long line of unclosed asserts


def test_no_line_makes_the_reader_raise():
    rnd = random.Random(7)
    pieces = ["CUDA error: ", "Assertion `", "block: [0,0,0], thread: [", "` failed.", "NCCL error: ", "ncclRemoteError: ",
              "Last error:", "Cuda failure ", "'", "Got completion from peer ", "status=", "(", ")", "IBV_WC_", "12",
              "Root Cause (first observed failure)", "rank : ", "File \"", "\", line ", ", in ", "frame #", ".cu:",
              "CUBLAS_STATUS_", " when calling `", "Search for `", "\n", " ", "x"]
    lines = EDGE + ["".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 40))) for _ in range(400)]
    errors = runtime_errors.RuntimeErrors()
    for i, line in enumerate(lines):
        errors.feed(line, f"log:{i}")
    runtime_errors.findings(errors)
    d = run("\n".join(x.replace("\udcff", "?") for x in lines) + "\n")
    assert d.exit_code in (0, 1)


def test_an_older_nccl_text_without_the_debug_hint_is_named():
    d = run("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:825, unhandled system "
            "error, NCCL version 2.7.8")
    assert "nccl-system-error" in [f.signature.id for f in d.findings]
