"""Calls across releases: a keyword the installed Megatron-Core / Megatron-Bridge passes that the receiving function
does not take (diagnose.passed_keywords), a compiled binding called with an argument list its build does not take
(diagnose.extension_calls), a config section left None (diagnose.none_sections), and an upstream check raised through
another package's frames (diagnose.upstream_checks), and a size that does not divide another (diagnose.divisibility), a name used where it is not
defined (diagnose.name_errors).
Each error text is raised for real here where a CPU can raise it."""

from __future__ import annotations

import io
import traceback

import pytest
import torch

from mbridge_ep_overlap.diagnose import divisibility, name_errors, none_sections, passed_keywords, upstream_source
from mbridge_ep_overlap.diagnose.engine import diagnose


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


def raised(call) -> str:
    try:
        call()
    except (TypeError, AttributeError, RuntimeError) as e:
        return "".join(traceback.format_exception(e))
    raise AssertionError("the call did not raise")


def raised_name_error(call) -> str:
    try:
        call()
    except NameError as e:
        return "".join(traceback.format_exception(e))
    raise AssertionError("the call did not raise")


def raised_assertion(call) -> str:
    try:
        call()
    except AssertionError as e:
        return "".join(traceback.format_exception(e))
    raise RuntimeError("the call did not raise")


class ErnieLikeLayer:
    """A layer written for a release whose TransformerLayer passed no ``is_mtp_layer``."""

    def __init__(self, config, submodules=None, layer_number=1):
        self.config = config


# ---- passed keywords ----------------------------------------------------------------------------------------

def test_a_keyword_the_installed_layer_passes_names_the_passing_call():
    text = raised(lambda: ErnieLikeLayer(config=None, is_mtp_layer=False))
    assert "ErnieLikeLayer.__init__() got an unexpected keyword argument 'is_mtp_layer'" in text
    d = run(text + "    when instantiating ErnieLikeLayer\n    when instantiating TransformerLayer\n")
    assert d.cause_ids[0] == "passed-keyword:is_mtp_layer", d.cause_ids
    f = d.findings[0]
    # the call inside the class being built comes first: MCore's TransformerLayer handing its submodule the keyword
    first = passed_keywords.passing_calls("is_mtp_layer")
    inside = [c for c in first if c.rel == "megatron/core/transformer/transformer_layer.py"]
    assert inside, "the installed TransformerLayer passes is_mtp_layer"
    assert f"{inside[0].rel}:{inside[0].line}" in f.signature.cause
    assert "ErnieLikeLayer (not a function of" in f.signature.cause
    assert "accept 'is_mtp_layer' in ErnieLikeLayer" in f.signature.fix
    assert any("ErnieLikeLayer <- TransformerLayer" in line for line in f.detail)


def test_a_class_the_installed_bridge_defines_with_the_keyword_is_named_as_mixed_releases():
    defined = passed_keywords.defined_there("ErnieMultiTypeMoE", "is_mtp_layer")
    if defined is None:
        pytest.skip("the installed Megatron-Bridge has no ErnieMultiTypeMoE")
    assert defined.takes
    d = run("TypeError: ErnieMultiTypeMoE.__init__() got an unexpected keyword argument 'is_mtp_layer'\n")
    assert d.cause_ids[0] == "passed-keyword:is_mtp_layer"
    assert "the run mixes releases" in d.findings[0].signature.cause


def test_the_bare_words_of_a_report_are_enough():
    d = run("unexpected keyword argument 'pg_collection'\n")
    assert d.cause_ids[0] == "passed-keyword:pg_collection"
    assert "the log does not name it" in d.findings[0].signature.cause


def test_a_keyword_no_installed_call_passes_is_not_named_here():
    assert passed_keywords.passing_calls("zz_no_such_keyword_anywhere") == ()
    text = raised(lambda: ErnieLikeLayer(config=None, zz_no_such_keyword_anywhere=1))
    assert not any(i.startswith("passed-keyword") for i in run(text).cause_ids)


def test_an_installed_function_without_the_keyword_is_left_to_the_other_readers():
    # TransformerConfig takes no is_mtp_layer: a call passing it is an MCore-side error, not an older receiver
    defined = passed_keywords.defined_there("TransformerConfig", "is_mtp_layer")
    assert defined is not None and not defined.takes
    d = run("TypeError: TransformerConfig.__init__() got an unexpected keyword argument 'is_mtp_layer'\n")
    assert not any(i.startswith("passed-keyword") for i in d.cause_ids)


# ---- compiled bindings ----------------------------------------------------------------------------------------

def test_a_pybind11_binding_called_with_other_arguments_is_named_with_its_overloads():
    text = raised(lambda: torch._C._jit_set_profiling_executor("x"))  # a pybind11 binding of the installed torch
    assert "incompatible function arguments" in text
    d = run(text)
    assert d.cause_ids[0] == "extension-call:_jit_set_profiling_executor", d.cause_ids
    f = d.findings[0]
    assert "different releases" in f.signature.cause
    assert "the build supports: (arg0: bool) -> bool" in f.detail
    assert "invoked with: 'x'" in f.detail


def test_a_transformer_engine_binding_is_named_for_its_package_from_the_frames():
    text = ('  File "/usr/lib/python3/dist-packages/transformer_engine/pytorch/module/base.py", line 201, in initialize_ub\n'
            "    ub_obj = tex.UbufP2PCommOverlap(sample_buffer, rank, world_size)\n"
            "TypeError: UbufP2PCommOverlap(): incompatible function arguments. The following argument types are supported:\n"
            "    1. () -> None\n")
    f = run(text).findings[0]
    assert f.signature.id == "extension-call:UbufP2PCommOverlap"
    assert "a pybind11 binding of Transformer Engine" in f.signature.cause
    assert any("takes no arguments at all" in line for line in f.detail)


# ---- a config section left None -----------------------------------------------------------------------------

def test_a_field_set_on_a_section_left_none_names_the_section(proxy_cfg):
    proxy_cfg.comm_overlap = None

    def override():
        proxy_cfg.comm_overlap.overlap_moe_expert_parallel_comm = True

    text = raised(override)
    assert "'NoneType' object has no attribute 'overlap_moe_expert_parallel_comm'" in text
    d = run(text)
    assert d.cause_ids[0] == "none-section:comm_overlap.overlap_moe_expert_parallel_comm", d.cause_ids
    f = d.findings[0]
    assert f.signature.confidence == none_sections.CONFIDENCE  # the printed line chose the section
    assert "cfg.comm_overlap = CommOverlapConfig(...)" in f.signature.fix
    assert type(proxy_cfg).__name__ == none_sections.CONTAINER


def test_only_optional_sections_that_declare_the_field_are_candidates():
    assert [s.field for s in none_sections.sections("overlap_moe_expert_parallel_comm")] == ["comm_overlap"]
    assert none_sections.sections("zz_no_such_field") == ()
    assert not any(i.startswith("none-section") for i in
                   run("AttributeError: 'NoneType' object has no attribute 'zz_no_such_field'\n").cause_ids)


# ---- an upstream check raised through another package's frames ------------------------------------------------

def _expert_grid_check() -> upstream_source.Check:
    return next(c for c in upstream_source.checks() if c.file == "megatron/core/parallel_state.py"
                and "expert_tensor_model_pipeline_parallel size" in c.literal)


def test_an_upstream_message_word_for_word_is_named_through_a_wrapper_frame():
    check = _expert_grid_check()
    text = ('  File "/data/slime/slime/backends/megatron_utils/actor.py", line 62, in init\n'
            "    init(args)\n"
            "    raise RuntimeError(\n"
            'RuntimeError: world_size (8) is not divisible by expert_tensor_model_pipeline_parallel size (16)"\n')
    d = run(text)
    assert d.cause_ids[0] == f"upstream-check:{check.where}", d.cause_ids
    assert any("no megatron frame is shown" in line for line in d.findings[0].detail)


def test_a_generic_upstream_wording_is_not_named_through_a_wrapper_frame():
    text = ('  File "/opt/venv/lib/python3.12/site-packages/lightning/pytorch/strategies/ddp.py", line 154, in setup\n'
            "    self.setup_distributed()\n"
            "RuntimeError: decoder world_size (4) is not divisible by expert_tensor_model_pipeline_parallel size (8)\n")
    # MCore's ensure_divisibility ('{} is not divisible by {}') fits the words, but says nothing of this check
    assert not any(i.startswith("upstream-check:megatron/core/utils.py") for i in run(text).cause_ids)


# ---- a size that does not divide another ----------------------------------------------------------------------

def test_megatron_cores_own_divisibility_check_is_read_for_its_numbers():
    from megatron.core.utils import ensure_divisibility

    text = raised_assertion(lambda: ensure_divisibility(256, 3))
    assert "256 is not divisible by 3" in text
    d = run(text)
    named = [f for f in d.findings if "divisible" in " ".join(f.evidence)]
    assert named, d.cause_ids
    words = " ".join([named[0].signature.fix, *named[0].detail])
    assert "(1, 2, 4, 8)" in words  # the divisors of 256 nearest 3


def test_named_sizes_give_the_values_that_divide():
    d = run("AssertionError: n_physical_experts=256 must be divisible by ep_size=3. Adjust num_redundant_experts.\n")
    f = d.findings[0]
    assert f.signature.id == "divisibility:ep-size"
    assert "256 % 3 = 1" in f.signature.cause
    assert "set ep_size to a value that divides 256 (1, 2, 4, 8)" in f.signature.fix


def test_a_product_of_parallel_sizes_against_the_gpu_count_names_each_factors_choices():
    d = run("The expert-parallel grid is incompatible with requested 128 GPUs: the world size must be divisible by "
            "ETP * EP * PP (1 * 64 * 4 = 256).\n")
    f = d.findings[0]
    assert f.signature.id == "divisibility:etp-ep-pp"
    assert "128 GPUs is not a multiple of ETP x EP x PP = 1 x 64 x 4 = 256" in f.signature.cause
    assert "EP=32 or 16" in f.signature.fix and "PP=2 or 1" in f.signature.fix


def test_sizes_that_do_divide_are_no_finding():
    assert not any(i.startswith("divisibility") for i in run("AssertionError: 256 is not divisible by 4\n").cause_ids)
    assert divisibility.factor_choices(128, (("EP", 64), ("PP", 4))) == ["EP=32 or 16 (with the others kept)",
                                                                        "PP=2 or 1 (with the others kept)"]
    assert divisibility.divisors_near(256, 3) == [1, 2, 4, 8]


def test_a_divisor_named_in_several_words_and_a_message_wrapped_before_it_are_read():
    one_line = "ValueError: The output_size of gate's and up's weight = 192 is not divisible by weight quantization block_n = 128."
    wrapped = one_line.replace(" divisible by", " divisible\nby")
    for text in (one_line, wrapped):
        f = next(f for f in run(text + "\n").findings if f.signature.id.startswith("divisibility"))
        assert f.signature.id == "divisibility:weight-quantization-block-n"
        assert "weight 192 is not a multiple of weight quantization block_n 128 (192 % 128 = 64)" in f.signature.cause
        assert f.evidence[0].endswith(one_line) and ":1: " in f.evidence[0]


# ---- a name used where it is not defined ----------------------------------------------------------------------

def _uses_an_undefined_name():
    return undefined_token_indices.view(-1)  # noqa: F821 - the bug this test raises


def test_a_name_error_is_named_as_a_bug_of_the_raising_code_with_its_frame():
    text = raised_name_error(_uses_an_undefined_name)
    assert "NameError: name 'undefined_token_indices' is not defined" in text
    f = run(text).findings[0]
    assert f.signature.id == "name-error:undefined_token_indices"
    assert "in _uses_an_undefined_name" in f.signature.cause and "not a configuration error" in f.signature.cause
    assert f.signature.confidence == name_errors.CONFIDENCE


def test_a_name_the_installed_function_binds_says_the_installed_release_has_it():
    site = next(b for b in name_errors.binding_sites("sorted_indices") if b.rel.endswith("moe/moe_utils.py"))
    text = (f'  File "/usr/local/lib/python3.12/dist-packages/{site.rel}", line {site.line + 5}, in {site.scope}\n'
            "    permuted_input = tokens.index_select(0, sorted_indices)\n"
            "NameError: name 'sorted_indices' is not defined\n")
    f = run(text).findings[0]
    assert f.signature.id == "name-error:sorted_indices"
    assert f"binds it in the same function ({site.rel}:{site.line})" in f.signature.cause
    assert "(megatron)" in f.signature.cause and "the installed megatron-core" in f.signature.fix
