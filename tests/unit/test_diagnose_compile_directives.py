"""Builds stopped by the toolchain, made to print here: a header's ``#error`` (the installed torch's C++ standard check,
diagnose.error_directives), nvlink linking for another architecture than the objects were compiled for
(diagnose.device_links), and a static_assert quoted the short way a report or a JIT wrapper prints it
(diagnose.static_asserts)."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest

from mbridge_ep_overlap.diagnose import error_directives, installed_headers
from mbridge_ep_overlap.diagnose.engine import diagnose

TORCH_INCLUDE = Path(__import__("torch").__file__).resolve().parent / "include"


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


def _built(command: list[str], cwd: Path) -> str:
    """What a build log shows: the command line, then the tool's output."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd)
    return " ".join(command) + "\n" + done.stdout + done.stderr


# ---- #error ---------------------------------------------------------------------------------------------------

def _standard_check() -> installed_headers.SourceAssert:
    found = [d for d in installed_headers.installed_directives() if error_directives.ASKS_STANDARD.search(d.message)
             and d.rel.endswith("torch/all.h")]
    if not found:
        pytest.skip("the installed torch has no C++-standard #error in torch/all.h")
    return found[0]


def test_an_older_standard_than_the_torch_headers_need_is_named_with_the_flag(tmp_path):
    cc = shutil.which("g++")
    if cc is None:
        pytest.skip("no C++ compiler here")
    check = _standard_check()
    need = error_directives.ASKS_STANDARD.search(check.message).group(1)
    older = {"17": "14", "20": "17"}.get(need, "11")
    (tmp_path / "t.cpp").write_text("#include <torch/all.h>\n")
    text = _built([cc, f"-std=c++{older}", "-Wfatal-errors", "-fsyntax-only", f"-I{TORCH_INCLUDE}",
                   f"-I{TORCH_INCLUDE}/torch/csrc/api/include", "-c", "t.cpp"], tmp_path)
    assert "#error" in text and check.message in text  # the compiler printed the installed header's words
    d = run(text)
    assert d.cause_ids[0] == f"error-directive:{check.rel}", d.cause_ids
    f = d.findings[0]
    assert f"older than C++{need}" in f.signature.cause and f"-std=c++{older}" in f.signature.cause
    assert f"-std=c++{older}" in f.signature.fix and f.signature.confidence == error_directives.KNOWN_CONFIDENCE
    assert any(f"{check.rel}:{check.line}" in line for line in f.detail)


def test_another_releases_wording_names_the_installed_header_as_the_nearest():
    check = _standard_check()
    need = int(error_directives.ASKS_STANDARD.search(check.message).group(1))
    reworded = check.message.replace(f"C++{need}", f"C++{need + 3}").rstrip(".")
    d = run(f"#error {reworded}\n")
    f = d.findings[0]
    assert f.signature.id == f"error-directive:{check.rel}"
    assert f"C++{need + 3}" in f.signature.fix
    assert any("words it differently" in line for line in f.detail)


def test_a_directive_in_no_installed_header_is_named_from_its_words_at_lower_confidence():
    f = run("foo.h:3:2: error: #error zz unknown platform for this library\n").findings[0]
    assert f.signature.id == "error-directive:foo.h"
    assert f.signature.confidence == error_directives.UNKNOWN_CONFIDENCE


# ---- nvlink ---------------------------------------------------------------------------------------------------

def test_a_device_link_without_the_compile_architecture_is_named(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc here")
    (tmp_path / "k.cu").write_text("__global__ void k(int* x) { x[0] = 1; }\n")
    text = _built([nvcc, "-rdc=true", "-gencode", "arch=compute_90,code=sm_90", "-c", "k.cu", "-o", "k.o"], tmp_path)
    text += _built([nvcc, "-dlink", "k.o", "-o", "dlink.o"], tmp_path)  # the link given no architecture
    if "SM Arch" not in text:
        pytest.skip(f"this nvcc links for the compiled architecture by default: {text[-300:]}")
    d = run(text)
    arch = text.split("SM Arch ('", 1)[1].split("'", 1)[0]
    assert d.cause_ids[0] == f"device-link:{arch}", d.cause_ids
    f = d.findings[0]
    assert "compiled for sm_90" in f.signature.cause and "(sm_90)" in f.signature.fix
    assert any("k.o" in line for line in f.detail)


def test_cuobjdump_showing_only_the_linked_architecture_is_said():
    text = ("nvlink warning : SM Arch ('sm_75') not found in 'build/a.o'\n"
            "nvlink warning : SM Arch ('sm_75') not found in 'build/b.o'\n"
            "ELF file    1: ext.1.sm_75.cubin\n")
    f = run(text).findings[0]
    assert "2 object(s)" in f.signature.cause
    assert any("the linked sm_75 only" in line for line in f.detail)


# ---- a static_assert quoted the short way --------------------------------------------------------------------------

def test_a_static_assert_with_the_header_name_alone_and_the_message_below_is_named():
    text = ('hybrid_ep_backend.cuh: static assertion failed:\n'
            '"MAX_NUM_OF_TOKENS_PER_RANK must be multiple of NUM_OF_TOKENS_PER_CHUNK"\n'
            "  MAX_NUM_OF_TOKENS_PER_RANK=672, NUM_OF_TOKENS_PER_CHUNK=64   (672 = 64 * 10.5)\n")
    d = run(text)
    assert d.cause_ids[0].startswith("static-assert:hybridep:csrc/hybrid_ep/backend/hybrid_ep_backend.cuh:"), d.cause_ids
    f = d.findings[0]
    assert "672 % 64 == 0" in f.signature.cause and "false" in f.signature.cause
    assert any("hybrid_ep_backend.cuh (no line given)" in line for line in f.detail)
