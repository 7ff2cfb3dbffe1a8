"""diagnose on messages the installed version words differently and on native C asserts: a message another
version cut or extended at its end names the installed check by its start (``upstream_source.leading_likeness``);
the ``else`` of an if / elif chain requires one of the chain's tests; a traceback frame whose message no
installed check raises is named with lower confidence and says so; glibc's failed-``assert`` text (triggered
for real through ``__assert_fail``) is read as a native check with its library from the path."""

from __future__ import annotations

import ast
import ctypes.util
import subprocess
import sys

import pytest

from mbridge_ep_overlap.diagnose import diagnose, native_checks, upstream_source
from mbridge_ep_overlap.diagnose.raise_frames import FRAME_CONFIDENCE, FUNCTION_CONFIDENCE


def _run(tmp_path, text: str):
    log = tmp_path / "run.log"
    log.write_text(text)
    return diagnose([str(log)])


def _check(literal: str) -> upstream_source.Check:
    return upstream_source.Check("megatron/core/x.py", 1, "ValueError", "c", literal, "", "f")


def test_a_message_cut_after_its_first_value_names_the_check_by_its_start():
    check = _check("Invalid backend: ...Please set --moe-flex-dispatcher-backend to deepep, hybridep, or ncclep")
    assert upstream_source.leading_likeness("Invalid backend: None", check) == 1.0
    # more than one token after the start is another message, not a cut one
    assert upstream_source.leading_likeness("Invalid backend: None was given here", check) == 0.0
    # too little literal text before the value to tell checks apart
    assert upstream_source.leading_likeness("Bad: x", _check("Bad: ...because")) == 0.0


def test_a_message_reworded_at_its_end_names_the_check_by_a_long_shared_start():
    check = _check("Expert bias for aux-loss-free routing only supports 'sigmoid' and 'sqrtsoftplus' score functions.")
    near = upstream_source.leading_likeness(
        "Expert bias for aux-loss-free routing only supports sigmoid score function.", check)
    assert upstream_source.NEAREST_MIN_RATIO < near < 1.0
    assert upstream_source.leading_likeness("Expert bias is not supported", check) == 0.0


def test_an_older_expert_bias_message_names_the_installed_check_not_a_neighbour(tmp_path):
    # Megatron-LM #1971's log: MCore then allowed only sigmoid; the installed one words the same check anew
    d = _run(tmp_path, 'File "megatron/core/transformer/transformer_config.py", line 1307, in __post_init__\n'
                       "[rank7]:     raise ValueError(\n"
                       "[rank7]: ValueError: Expert bias for aux-loss-free routing only supports sigmoid score "
                       "function. Please set --moe-router-score-function sigmoid for sigmoid score function.\n")
    top = d.findings[0]
    assert "moe_router_enable_expert_bias" in top.signature.cause and "moe_router_score_function" in top.signature.cause
    assert "fp16" not in top.signature.cause
    assert top.signature.confidence < FRAME_CONFIDENCE  # not the installed wording: said, and less sure


def test_the_else_of_an_elif_chain_requires_one_of_the_chain(tmp_path):
    source = ("def f(x):\n    if x == 'a':\n        pass\n    elif x == 'b':\n        pass\n"
              "    else:\n        raise ValueError(f'Invalid backend name given: {x}')\n")
    checks = upstream_source._file_checks(ast.parse(source), "megatron/core/x.py")
    assert [c.condition for c in checks] == ["x == 'a' or x == 'b'"]
    # the real one: MCore's flex dispatcher backend check
    d = _run(tmp_path, "ValueError: Invalid backend: None\n")
    cause = d.findings[0].signature.cause
    assert all(f"moe_flex_dispatcher_backend == '{b}'" in cause for b in ("deepep", "hybridep", "ncclep"))


def test_a_frame_whose_message_no_installed_check_raises_says_so(tmp_path):
    d = _run(tmp_path, 'File "/x/megatron/core/transformer/transformer_config.py", line 1315, in __post_init__\n'
                       "    raise ValueError(\n"
                       "ValueError: a message no release of Megatron-Core has ever raised at all\n")
    top = d.findings[0]
    assert top.signature.confidence == FUNCTION_CONFIDENCE
    assert "the log's message is in no installed check" in top.signature.cause
    assert any("its message is in no installed check: a message no release" in x for x in top.detail)


def _glibc_assert(file: str, line: int, function: str, condition: str) -> str:
    """What glibc prints for a failed ``assert``: __assert_fail called for real in a child process (it aborts)."""
    libc = ctypes.util.find_library("c")
    if libc is None:
        pytest.skip("no C library to call __assert_fail in")
    code = ("import ctypes, sys; libc = ctypes.CDLL(sys.argv[1]); "
            "libc.__assert_fail(sys.argv[2].encode(), sys.argv[3].encode(), int(sys.argv[4]), sys.argv[5].encode())")
    r = subprocess.run([sys.executable, "-c", code, libc, condition, file, str(line), function],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    return r.stderr.strip()


def test_glibc_failed_assert_is_a_native_check_with_its_library_from_the_path(tmp_path):
    text = _glibc_assert("/path/to/DeepEP/csrc/hybrid_ep/buffer/internode.cu", 167,
                         "void setup_qp_init_attr(int)", "tx_depth > 0 && tx_depth < 65536")
    assert "Assertion `tx_depth > 0 && tx_depth < 65536' failed." in text
    c = native_checks.parse(text)
    assert (c.library, c.file, c.line) == ("deep-ep", "csrc/hybrid_ep/buffer/internode.cu", 167)
    assert c.function == "void setup_qp_init_attr(int)" and c.condition == "tx_depth > 0 && tx_depth < 65536"
    # a log that wrapped the file and line onto the line before (as Megatron-LM #3999 quotes it)
    path, rest = text.split(": void ", 1)
    d = _run(tmp_path, f"{path}:\nvoid {rest}\n")
    assert d.exit_code == 1
    assert d.findings[0].signature.id == "native-check:deep-ep:csrc/hybrid_ep/buffer/internode.cu:167"
    assert "requires tx_depth > 0 && tx_depth < 65536" in d.findings[0].signature.cause


def test_an_assert_in_other_native_code_is_named_by_its_file():
    text = _glibc_assert("/src/app/main.cpp", 12, "int main()", "n > 0")
    c = native_checks.parse(text)
    assert (c.library, c.file, c.line, c.condition) == ("native code", "main.cpp", 12, "n > 0")
