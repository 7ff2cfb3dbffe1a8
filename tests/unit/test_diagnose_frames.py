"""A raise with no message in the log (diagnose.raise_frames): real MCore checks triggered on CPU, their
message line cut from the log and their line numbers moved (as in another version), are named from the
traceback's innermost frame by file + function + the exception raised; a function found only in another
file is named at a lower confidence as moved there; one in no installed file is said to be not in the
installed version."""

from __future__ import annotations

import io
import json
import re
import traceback
from pathlib import Path

import pytest

from mbridge_ep_overlap.diagnose import diagnose, raise_frames, upstream_checks, upstream_source

UNSEEN2 = Path(__file__).parent / "fixtures" / "failure_reports_unseen2"
BASE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=4, moe_router_topk=2, bf16=True,
            overlap_moe_expert_parallel_comm=True, expert_model_parallel_size=2, moe_token_dispatcher_type="alltoall")
BAD = [dict(num_attention_heads=5, tensor_model_parallel_size=2),  # raise ValueError(
       dict(expert_model_parallel_size=1),  # assert (
       dict(moe_token_dispatcher_type="allgather")]  # assert self.moe_token_dispatcher_type in [


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


def trigger(bad: dict) -> tuple[str, int, str]:
    """(file relative to the site, line, the traceback as printed) of a real TransformerConfig check."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    with pytest.raises((AssertionError, ValueError)) as info:
        TransformerConfig(**{**BASE, **bad})
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    return "megatron/" + frame.filename.split("/megatron/", 1)[1], frame.lineno, "".join(
        traceback.format_exception(info.value))


def without_message(text: str, shift: int, rank_prefix: str = "[rank3]: ") -> str:
    """The traceback cut after its frames (no error line), the frames' line numbers moved by ``shift``."""
    rows = [r for r in text.splitlines() if not re.match(r"^(\w+Error)\b", r)]
    rows = [re.sub(r", line (\d+), in ", lambda m: f", line {int(m.group(1)) + shift}, in ", r) for r in rows]
    return "\n".join(rank_prefix + r for r in rows) + "\n"


@pytest.mark.parametrize("bad", BAD, ids=lambda b: ",".join(b))
@pytest.mark.parametrize("shift", [0, 1])
def test_a_check_whose_message_is_not_in_the_log_is_named_from_its_frame(bad, shift):
    rel, line, text = trigger(bad)
    d = run(without_message(text, shift))
    top = d.findings[0]
    assert top.signature.id == f"upstream-check:{rel}:{line}", [f.signature.id for f in d.findings]
    assert top.signature.confidence == raise_frames.FRAME_CONFIDENCE
    assert "in __post_init__" in top.signature.cause and "Named from the traceback's innermost frame" in top.signature.cause
    (check,) = [c for c in upstream_source.function_checks(rel, "__post_init__") if c.line == line]
    # the condition and the message as the installed source has them
    assert f"requires {check.condition}" in top.signature.cause
    assert check.literal in top.signature.cause
    assert any("(no message in the log)" in e for e in top.evidence)


def test_with_the_message_the_message_still_decides():
    rel, line, text = trigger(BAD[0])
    d = run(text)
    assert d.findings[0].signature.id == f"upstream-check:{rel}:{line}"
    assert d.findings[0].signature.confidence == upstream_checks.EXACT_CONFIDENCE


def test_a_function_found_in_another_file_is_named_as_moved_at_a_lower_confidence():
    rel, line, text = trigger(BAD[0])
    moved = text.replace(rel, rel.replace("transformer/transformer_config.py", "old_layout/transformer_config.py"))
    d = run(without_message(moved, 0))
    top = d.findings[0]
    assert top.signature.id == f"upstream-check:{rel}:{line}"
    assert top.signature.confidence == raise_frames.FUNCTION_CONFIDENCE
    assert f"moved to {rel} from megatron/core/old_layout/transformer_config.py" in top.signature.cause
    assert "Named by the function alone" in top.signature.cause


def test_a_function_in_no_installed_file_is_said_to_be_not_in_the_installed_version():
    log = json.loads((UNSEEN2 / "megatron-lm-1643.json").read_text())["log"]
    top = run(log).findings[0]
    rel = "megatron/core/distributed/custom_fsdp/param_and_grad_buffer.py"
    assert top.signature.id == f"upstream-check:{rel}:disable_shard_param_to_function"
    assert top.signature.confidence == raise_frames.ABSENT_CONFIDENCE
    assert not upstream_source.defining_files("disable_shard_param_to_function")
    version = upstream_source.installed_version(rel)
    assert re.fullmatch(r"megatron-core \d+\.\d+\.\d+\S*", version)
    assert f"disable_shard_param_to_function is not in the installed {version}" in top.signature.cause
    # the frame that called it is what the check refused: the router's dtype cast of its weight
    assert "megatron/core/transformer/moe/router.py:71 in gating" in top.signature.cause
    assert "self.weight.to(router_dtype)" in top.signature.cause


def test_a_frame_outside_megatron_or_not_a_raise_line_is_not_named():
    errors = upstream_checks.RaisedErrors()
    for row in ['Traceback (most recent call last):',
                '  File "/usr/lib/python3.12/site-packages/deep_ep/buffer.py", line 10, in dispatch',
                '    raise RuntimeError(',
                'Traceback (most recent call last):',
                '  File "/x/megatron/core/transformer/moe/router.py", line 71, in gating',
                '    logits = torch.nn.functional.linear(input, self.weight)']:
        errors.feed(row, "log")
    errors.finish()
    assert errors.errors == []


def test_function_checks_keep_raises_without_a_message():
    rel, _, _ = trigger(BAD[0])
    checks = upstream_source.function_checks(rel, "__post_init__")
    assert checks and all(c.function == "__post_init__" and c.file == rel for c in checks)
    assert len(checks) >= len([c for c in upstream_source.file_checks(rel) if c.function == "__post_init__"])


# ---- an assert outside MCore / MB: named from the line the traceback prints ------------------------------------
def _raised_in_package(tmp_path, body: str) -> str:
    """A real traceback of an assert in a package folder (as DeepEP's deep_ep/buffer.py would print it)."""
    package = tmp_path / "site-packages" / "deep_ep"
    package.mkdir(parents=True)
    source = package / "buffer.py"
    source.write_text(f"def __init__(num_qps_per_rank):\n    {body}\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    try:
        namespace["__init__"](0)
    except AssertionError:
        return traceback.format_exc()
    raise AssertionError("the assert did not fail")


def test_an_assert_in_another_package_is_named_from_its_line(tmp_path):
    text = _raised_in_package(tmp_path, 'assert num_qps_per_rank > 0, f"num_qps_per_rank={num_qps_per_rank}"')
    d = run(text)
    f = d.findings[0]
    assert f.signature.id == "failed-assert:deep_ep/buffer.py:2"
    assert "requires num_qps_per_rank > 0 (num_qps_per_rank=0); it failed" in f.signature.cause
    assert f.signature.symptom == "config-error" and not f.signature.generic


def test_a_bare_assert_in_another_package_is_named_too(tmp_path):
    text = _raised_in_package(tmp_path, "assert num_qps_per_rank > 0")
    assert text.rstrip().endswith("AssertionError")
    d = run(text)
    assert d.cause_ids == ["failed-assert:deep_ep/buffer.py:2"]
    assert "no message" in d.findings[0].detail[0]


def test_an_assert_in_megatron_is_not_a_failed_assert_of_another_package():
    from megatron.core.transformer.transformer_config import TransformerConfig

    try:
        TransformerConfig(**{**BASE, "expert_model_parallel_size": 1})
    except AssertionError:
        text = traceback.format_exc()
    ids = run(text).cause_ids
    assert ids[0] == "overlap-needs-expert-parallel"  # the hand-written row for this MCore assert
    assert not any(i.startswith("failed-assert:") for i in ids)
