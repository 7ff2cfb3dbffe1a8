"""diagnose.unpacking: a call's result unpacked into another number of names than it gives, read against the installed
Megatron-Bridge / Megatron-Core function of that name. The tracebacks are Python's own, raised here."""

from __future__ import annotations

import io
import traceback

from mbridge_ep_overlap.diagnose import unpacking
from mbridge_ep_overlap.diagnose.engine import diagnose


class _Bridge:
    """Stands in for another release's AutoBridge whose export_hf_weights yields three values."""

    def __init__(self, width: int) -> None:
        self.width = width

    def export_hf_weights(self, model, show_progress=False):
        yield tuple(range(self.width))


def _raised(fn) -> str:
    try:
        fn()
    except ValueError:
        return traceback.format_exc()
    raise AssertionError("no ValueError")


def _two(bridge):
    for name, param in bridge.export_hf_weights(None, show_progress=False):
        return name, param


def _three(bridge):
    for name, param, extra in bridge.export_hf_weights(None, show_progress=False):
        return name, param, extra


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


def test_the_installed_function_says_what_it_gives():
    g = unpacking.gives("export_hf_weights")
    assert g and g[0].count == 2 and g[0].what == "HFWeightTuple (param_name, weight)"
    assert g[0].rel == "megatron/bridge/models/conversion/auto_bridge.py"


def test_a_caller_that_fits_the_installed_release_names_a_skew_of_the_runs_package():
    text = _raised(lambda: _two(_Bridge(3)))
    assert "ValueError: too many values to unpack (expected 2)" in text
    d = run(text)
    top = d.findings[0]
    assert top.signature.id == "unpack-mismatch:export_hf_weights"
    assert "gives HFWeightTuple (param_name, weight): the caller fits the installed release" in top.signature.cause
    assert "for name, param in bridge.export_hf_weights(None, show_progress=False):" in " ".join(top.detail)


def test_a_caller_written_for_another_release_than_the_installed_one_is_told_so():
    text = _raised(lambda: _three(_Bridge(2)))
    assert "not enough values to unpack (expected 3, got 2)" in text
    top = run(text).findings[0]
    assert top.signature.id == "unpack-mismatch:export_hf_weights"
    assert "it gave 2" not in top.signature.cause and "gave 2. In the installed" in top.signature.cause
    assert "2 values, so the caller was written for another release" in top.signature.cause
    assert top.signature.fix.startswith("unpack the 2 values the installed export_hf_weights gives")


def test_a_function_no_installed_package_defines_is_named_from_the_callers_line_alone():
    def local_triple():
        return 1, 2, 3

    def caller():
        a, b = local_triple()
        return a, b

    top = run(_raised(caller)).findings[0]
    assert top.signature.id == "unpack-mismatch:local_triple"
    assert top.signature.confidence == unpacking.UNPLACED_CONFIDENCE
    assert "the caller was written for another release of the package that defines local_triple" in top.signature.cause


def test_builtins_and_names_whose_installed_definitions_disagree_are_not_placed():
    def caller():
        table = {"a": (1, 2, 3)}
        for k, v in table.values():
            return k, v

    top = run(_raised(caller)).findings[0]
    assert top.signature.id == "unpack-mismatch:values" and top.signature.confidence == unpacking.UNPLACED_CONFIDENCE
    assert unpacking.gives("items") == []
    several = unpacking.gives("get_batch")
    assert len({g.count for g in several}) > 1  # installed MCore / MB define get_batch with 6, 7 and 8 values
    text = "    tokens, labels = get_batch(data_iterator)\nValueError: too many values to unpack (expected 2)\n"
    assert run(text).findings[0].signature.confidence == unpacking.UNPLACED_CONFIDENCE


def test_an_absurd_count_is_not_read():
    text = "ValueError: not enough values to unpack (expected " + "9" * 5000 + ", got 2)\n"
    assert not any(i.startswith("unpack-mismatch") for i in run(text).cause_ids)
