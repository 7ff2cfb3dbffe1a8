"""A static_assert that failed when a kernel was compiled: gcc and nvcc made to print it here, a recorded nvcc run of
HybridEP's JIT on its real header, the clang / nvc++ / JIT formats as their sources print them, and every row of the
table checked against the upstream lines it quotes (fixtures/upstream_text)."""

from __future__ import annotations

import io
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mbridge_ep_overlap.diagnose import installed_headers, static_asserts, upstream_source
from mbridge_ep_overlap.diagnose.engine import diagnose
from mbridge_ep_overlap.diagnose.signatures import all_signatures
from mbridge_ep_overlap.diagnose.signatures.base import FOUND_BY
from mbridge_ep_overlap.diagnose.signatures.compile_checks import (FEEDS, JIT, JIT_SHOWN_BY, STATIC_ASSERT,
                                                                   STATIC_ASSERTS)

FIXTURES = Path(__file__).parent / "fixtures"
UPSTREAM = FIXTURES / "upstream_text"
RECORDED = FIXTURES / "compile_texts" / "hybrid_ep_combine_nvcc.txt"
CAPACITY = next(r for r in STATIC_ASSERTS if r.message == "MAX_NUM_OF_TOKENS_PER_RANK must be multiple of "
                                                          "NUM_OF_TOKENS_PER_CHUNK.")
CAPACITY_ID = f"static-assert:hybridep:{CAPACITY.where}"


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


def top(text: str):
    return run(text).findings[0]


def excerpt(at: str) -> list[str]:
    """The body of an excerpt, its 4-line header checked (test_diagnose_parity's format)."""
    m = re.fullmatch(r"(?P<repo>[\w.-]+/[\w.-]+)@(?P<commit>[0-9a-f]{40}):(?P<path>[\w/.-]+):(?P<first>\d+)-(?P<last>\d+)", at)
    assert m, at
    path = UPSTREAM / m["repo"].split("/")[1] / f"{m['path']}@L{m['first']}-{m['last']}.txt"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[:4] == [f"# repo: {m['repo']}", f"# commit: {m['commit']}", f"# path: {m['path']}",
                         f"# lines: {m['first']}-{m['last']}"], path
    assert len(lines) - 4 == int(m["last"]) - int(m["first"]) + 1, path
    return lines[4:]


# ---- the table against the upstream lines ------------------------------------------------------------------

@pytest.mark.parametrize("row", STATIC_ASSERTS, ids=lambda r: f"{r.library}:{r.where}")
def test_every_row_is_the_statement_at_its_line_in_its_excerpt(row):
    assert row.first <= row.line <= row.last and row.excerpt in STATIC_ASSERT.excerpts
    body = excerpt(row.excerpt)
    parsed = {a.line + row.first - 1: a for a in installed_headers.source_asserts("\n".join(body))}
    assert row.line in parsed, (row.where, body)
    assert parsed[row.line].condition == row.condition, row.where
    assert parsed[row.line].message == row.message, row.where
    assert row.message in "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', " ".join(body[row.line - row.first:])))


@pytest.mark.parametrize("library,feed", [(lib, f) for lib, feeds in FEEDS.items() for f in feeds],
                         ids=lambda x: x if isinstance(x, str) else "+".join(x.names))
def test_what_each_feed_says_is_in_the_upstream_lines(library, feed):
    assert feed.shown_by, feed.names
    for at, text in feed.shown_by:
        assert at in STATIC_ASSERT.excerpts
        assert text in "\n".join(excerpt(at)), (at, text)
    # every parameter a feed names is one the library's conditions use
    used = {n for r in STATIC_ASSERTS if r.library == library for n in re.findall(r"\b\w+\b", r.condition)}
    assert set(feed.names) & used, feed.names


def test_the_jit_marks_are_what_the_jit_compilers_print():
    for at, text in JIT_SHOWN_BY:
        assert text in "\n".join(excerpt(at))
        printed = text.replace("%s", "/root/.deepep/x.cu(3): error: static assertion failed")
        assert any(mark.search(printed) for mark, _ in static_asserts.JIT_MARKS), text
    assert set(JIT) == {r.library for r in STATIC_ASSERTS if r.jit}


def test_the_row_is_declared():
    assert STATIC_ASSERT in all_signatures() and "static-assert" in FOUND_BY
    assert STATIC_ASSERT.symptom == "install" and STATIC_ASSERT.confidence == static_asserts.KNOWN_CONFIDENCE
    libraries = {r.library for r in STATIC_ASSERTS}
    assert {"HybridEP", "DeepEP", "DeepEP V2", "Transformer Engine"} <= libraries
    assert {r.at.split("@")[0] for r in STATIC_ASSERTS} == {"deepseek-ai/DeepEP", "NVIDIA/TransformerEngine"}


# ---- the compilers here, made to print it ---------------------------------------------------------------------

def _compile(tmp_path: Path, name: str, code: str, compiler: str, *flags: str) -> str:
    exe = shutil.which(compiler)
    if exe is None:
        pytest.skip(f"no {compiler} on this machine")
    source = tmp_path / name
    source.write_text(code)
    done = subprocess.run([exe, *flags, "-c", str(source), "-o", str(tmp_path / "t.o")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode != 0, done.stdout
    return done.stdout + done.stderr


def _hybrid_ep_like(line: str) -> str:
    """A template over HybridEP's parameter names with the table's statement, instantiated with the recorded values."""
    return ("template <int NUM_OF_TOKENS_PER_CHUNK, int HIDDEN_DIM, int MAX_NUM_OF_TOKENS_PER_RANK>\n"
            "struct combine_kernel {\n" + line + "\n};\n"
            "combine_kernel<64, 7168, 4112> k;\n")


def test_gcc_names_the_hybrid_ep_static_assert(tmp_path):
    body = excerpt(CAPACITY.excerpt)
    statement = body[CAPACITY.line - CAPACITY.first]
    text = _compile(tmp_path, "hybrid_ep_backend.cuh", _hybrid_ep_like(statement), "g++", "-x", "c++")
    assert "error: static assertion failed: MAX_NUM_OF_TOKENS_PER_RANK must be multiple" in text, text
    f = top(text)
    assert f.signature.id == CAPACITY_ID
    assert f.signature.confidence == static_asserts.KNOWN_CONFIDENCE
    assert "HybridEP's kernel failed to compile at run time" in f.signature.cause
    assert "requires MAX_NUM_OF_TOKENS_PER_RANK % NUM_OF_TOKENS_PER_CHUNK == 0" in f.signature.cause
    assert f.signature.fix == CAPACITY.fix
    assert any(d.startswith("with the run's values the compiler reads it as") for d in f.detail), f.detail


def test_gcc_an_unknown_static_assert_is_named_generically(tmp_path):
    code = ('template <int N> struct Tile { static_assert(N % 8 == 0, "tile must be a multiple of 8"); };\n'
            "Tile<12> t;\nstatic_assert(sizeof(char) == 2);\n")
    text = _compile(tmp_path, "my_kernel.cpp", code, "g++")
    d = run(text)
    ids = d.cause_ids
    assert len(ids) == 2 and all(i.startswith("static-assert:") for i in ids), ids
    first = next(f for f in d.findings if "tile must be a multiple of 8" in f.signature.cause)
    assert first.signature.confidence == static_asserts.UNKNOWN_CONFIDENCE
    assert "my_kernel.cpp:1 requires N % 8 == 0" in first.signature.cause
    assert "none of the known static_asserts" in first.signature.cause
    bare = next(f for f in d.findings if f is not first)
    assert "requires sizeof(char) == 2 (no message)" in bare.signature.cause  # the condition from gcc's source line
    # a build says so
    built = run(text + "error: command '/usr/bin/g++' failed with exit code 1\n")
    assert all("failed in a build" in f.signature.cause or "in a build:" in f.signature.cause for f in built.findings)


def test_gcc_c_static_assert_message_is_unquoted(tmp_path):
    text = _compile(tmp_path, "k.c", '_Static_assert(sizeof(int) == 8, "NVTE_BUILD_NUM_PHILOX_ROUNDS must be a positive '
                                     'integer.");\n', "gcc")
    assert 'static assertion failed: "NVTE_BUILD' in text, text  # C: gcc quotes the message
    f = top(text)
    assert f.signature.id.startswith("static-assert:transformer-engine:transformer_engine/common/common.h:")
    assert "Transformer Engine's kernel failed to compile" in f.signature.cause


def test_nvcc_names_the_values_it_instantiated(tmp_path):
    statement = excerpt(CAPACITY.excerpt)[CAPACITY.line - CAPACITY.first]
    text = _compile(tmp_path, "hybrid_ep_backend.cuh", _hybrid_ep_like(statement), "nvcc", "-x", "cu")
    assert re.search(r'hybrid_ep_backend\.cuh\(\d+\): error: static assertion failed with "MAX_NUM_OF_TOKENS_PER_RANK', text)
    f = top(text)
    assert f.signature.id == CAPACITY_ID
    assert "it reads 4112 % 64 == 0: 16 == 0, false" in f.signature.cause, f.signature.cause


# ---- a recorded nvcc run of HybridEP's JIT on the real header ---------------------------------------------------

def test_the_recorded_jit_compile_of_hybrid_ep():
    text = RECORDED.read_text()
    f = top(text)
    sig = f.signature
    assert sig.id == CAPACITY_ID and sig.symptom == "install"
    assert "at run time (HybridEP's JIT: a source in its JIT folder)" in sig.cause
    assert ("with the run's values (MAX_NUM_OF_TOKENS_PER_RANK=4112, NUM_OF_TOKENS_PER_CHUNK=64) it reads "
            "4112 % 64 == 0: 16 == 0, false") in sig.cause
    assert CAPACITY.cause in sig.cause and sig.fix == CAPACITY.fix
    assert sig.source == f"https://github.com/deepseek-ai/DeepEP/blob/{CAPACITY.at.split('@')[1]}/{CAPACITY.path}#L4573"
    assert "the log's file: /tmp/hep/deep_ep/backend/hybrid_ep_backend.cuh:4552 (the quoted release has it at line 4573: " \
           "another version)" in f.detail
    # what feeds MAX_NUM_OF_TOKENS_PER_RANK, read in the installed Megatron-Core
    for needle in ("HYBRIDEP_TOKEN_ALIGNMENT = ", "max_num_of_tokens_per_rank=num_tokens"):
        rel, line = next((rel, src[:src.index(needle)].count("\n") + 1) for rel, src in upstream_source.sources()
                         if needle in src)
        assert any(d.startswith("the installed megatron-core") and f"{rel}:{line}:" in d for d in f.detail), needle
    # with HybridEP's own error after it, the compile is told from its nvcc run
    thrown = ("RuntimeError: Failed to compile the code, compile command: /usr/local/cuda/bin/nvcc -std=c++17 "
              "-gencode=arch=compute_90,code=sm_90 -O3 --expt-relaxed-constexpr  -Xcompiler -fPIC -shared ...\n")
    assert "at run time (HybridEP's JIT: its nvcc run failed)" in top(thrown + text).signature.cause


# ---- the other formats, as their sources print them -------------------------------------------------------------

V2_ROW = next(r for r in STATIC_ASSERTS if r.library == "DeepEP V2" and r.condition == "kNumExperts % kNumRanks == 0")
FORMATS = {
    "clang 16+": ("/x/hybrid_ep_backend.cuh:4573:3: error: static assertion failed due to requirement "
                  "'4112 % 64 == 0': MAX_NUM_OF_TOKENS_PER_RANK must be multiple of NUM_OF_TOKENS_PER_CHUNK.", CAPACITY_ID),
    "clang 15-": ("/x/hybrid_ep_backend.cuh:4573:3: error: static_assert failed due to requirement '4112 % 64 == 0' "
                  '"MAX_NUM_OF_TOKENS_PER_RANK must be multiple of NUM_OF_TOKENS_PER_CHUNK."', CAPACITY_ID),
    "nvc++": ('"/x/deep_ep/backend/hybrid_ep_backend.cuh", line 4573: error: static assertion failed with '
              '"MAX_NUM_OF_TOKENS_PER_RANK must be multiple of NUM_OF_TOKENS_PER_CHUNK."', CAPACITY_ID),
    "DeepEP V2 JIT": ('NVCC compilation failed: /usr/local/lib/python3.12/dist-packages/deep_ep/include/deep_ep/impls/'
                      'dispatch.cuh(47): error: static assertion failed with "Invalid number of experts or ranks"',
                      f"static-assert:deepep-v2:{V2_ROW.where}"),
    "error numbers on": ('/x/hybrid_ep_backend.cuh(4573): error #1574-D: static assertion failed with '
                         '"MAX_NUM_OF_TOKENS_PER_RANK must be multiple of NUM_OF_TOKENS_PER_CHUNK."', CAPACITY_ID),
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_compiler_format(name):
    text, wanted = FORMATS[name]
    f = top(text + "\n")
    assert f.signature.id == wanted, (name, f.signature.id)
    if name.startswith("clang"):
        assert "it reads 4112 % 64 == 0" in f.signature.cause
    if name == "DeepEP V2 JIT":
        assert "at run time (DeepEP V2's JIT: its nvcc run failed)" in f.signature.cause
        assert "kNumExperts comes from the buffer's number of experts (Megatron-Core: num_moe_experts)" in f.signature.cause


def test_clang_wrapped_onto_the_next_line_and_nvrtc():
    wrapped = ("/x/transformer_engine/common/normalization/common.cpp:214:3: error: \n"
               '      static_assert failed "CUDNN_FRONTEND_VERSION should be at least 1.6.1!"\n')
    assert top(wrapped).signature.id == "static-assert:transformer-engine:transformer_engine/common/normalization/common.cpp:214"
    nvrtc = 'default_program(26): error: static assertion failed with "forward and backward activation are mutually exclusive"\n'
    f = top(nvrtc)
    assert "at run time (NVRTC)" in f.signature.cause and f.signature.confidence == static_asserts.UNKNOWN_CONFIDENCE


def test_a_pasted_statement_alone_is_named_a_little_less_surely():
    pasted = ("  static_assert(MAX_NUM_OF_TOKENS_PER_RANK % NUM_OF_TOKENS_PER_CHUNK == 0,\n"
              '                "MAX_NUM_OF_TOKENS_PER_RANK must be multiple of NUM_OF_TOKENS_PER_CHUNK.");\n')
    f = top(pasted)
    assert f.signature.id == CAPACITY_ID
    assert f.signature.confidence == pytest.approx(static_asserts.KNOWN_CONFIDENCE - static_asserts.PASTED_DISCOUNT)
    macro = '    EP_STATIC_ASSERT(kNumExperts % kNumRanks == 0, "Invalid number of experts or ranks");\n'
    assert top(macro).signature.id == f"static-assert:deepep-v2:{V2_ROW.where}"
    # a commented-out statement, and the macro's own definition, are not a failure
    assert not run('  //static_assert(HIDDEN_DIM % 2 == 0, "x");\n#define EP_STATIC_ASSERT(cond, reason) '
                   'static_assert(cond, reason)\n').problem


def test_one_message_in_several_files_is_told_apart_by_the_file():
    v1 = '/opt/DeepEP/csrc/kernels/internode_ll.cu(594): error: static assertion failed with "Invalid hidden"\n'
    assert top(v1).signature.id == "static-assert:deepep:csrc/kernels/internode_ll.cu:594"
    v2 = '/x/deep_ep/include/deep_ep/impls/hybrid_combine.cuh(219): error: static assertion failed with "Invalid hidden"\n'
    assert top(v2).signature.id == "static-assert:deepep-v2:deep_ep/include/deep_ep/impls/hybrid_combine.cuh:219"


def test_a_static_assert_of_the_installed_headers():
    rows = [r for r in installed_headers.installed() if r.message and r.rel.startswith("torch/include/")
            and "INVALID TYPE" not in r.message]
    if not rows:
        pytest.skip("no torch headers installed here")
    r = rows[0]
    line = f'/usr/local/lib/python3.12/dist-packages/{r.rel}:{r.line}:5: error: static assertion failed: {r.message}\n'
    f = top(line)
    assert f.signature.id == f"static-assert:torch:{r.rel}:{r.line}", f.signature.id
    assert f.signature.confidence == static_asserts.INSTALLED_CONFIDENCE
    assert f.signature.source == f"installed:{r.rel}"
    assert f"installed here: {r.rel}:{r.line} (torch " in f.detail[0]


def test_a_line_a_hand_written_signature_names_is_left_to_it():
    for sig_id in ("deepep-built-for-other-nvl-peers", "torch-op-schema-integral-type"):
        (sig,) = [s for s in all_signatures() if s.id == sig_id]
        assert run(sig.emitted[0] + "\n").cause_ids == [sig_id]


def test_the_condition_worked_out_with_cs_integer_rules():
    assert static_asserts.evaluate("A % B == 0", {"A": "-7", "B": "2"}) == "-7 % 2 == 0: -1 == 0, false"
    assert static_asserts.evaluate("A / B >= 2", {"A": "-7", "B": "2"}) == "-7 / 2 >= 2: -3 >= 2, false"
    assert static_asserts.evaluate("sizeof(T) % 16 == 0", {"T": "4"}) == ""
    assert static_asserts.evaluate("A % B == 0", {"A": "1", "B": "0"}) == ""
    assert static_asserts.evaluate("A ** 99 == 0", {"A": "9"}) == ""


GARBAGE = [
    "error: static assertion failed", "error: static assertion failed: ", 'x(1): error: static assertion failed with "',
    "static_assert(", "static_assert(((((((", 'static_assert(a, "' + "x" * 5000, "  static_assert(" + "(" * 3000,
    '(999999999999): error: static assertion failed with ""', ':0:0: error: static assertion failed: ' + "é" * 300,
    "error: static_assert failed due to requirement '", "error: static assertion failed due to requirement ''",
    "[with A=" + "1, A=" * 3000 + "]", 'a.cu(1): error: static assertion failed with "m"\n  [with X=<<<<, Y=2]',
    'a.cu(1): error: static assertion failed with "m"\n  static_assert(X / 0 == 1, "m");\n  [with X=4]',
    "note: the comparison reduces to ‘", 'EP_STATIC_ASSERT(, "");', "static_assert(\"\")",
    'x.cuh(1): error: static assertion failed with "Invalid hidden"\n' * 30,
]


@pytest.mark.parametrize("text", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_never_raises(text):
    run(text + "\n").lines()


def test_random_bytes_around_the_formats_never_raise():
    rng = random.Random(11)
    words = ["error: ", "static assertion failed", " with \"", "static_assert(", "EP_STATIC_ASSERT(", ", \"", "\");",
             "(", ")", "\n", "[with ", "=", "4112", "NUM_OF_TOKENS_PER_CHUNK", " % ", " == 0", "hybrid_ep_backend.cuh",
             ":4573:3: ", "(4573): ", "Failed to compile the code, compile command: ", "  3 | ", "due to requirement '",
             "'", "default_program(2)"]
    for _ in range(60):
        text = "".join(rng.choice(words) if rng.random() < 0.85 else chr(rng.randrange(1, 0x3000)) for _ in range(80))
        run(text).lines()
