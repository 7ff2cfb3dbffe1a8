"""Upstream config errors in general (diagnose.upstream_source, diagnose.upstream_checks) and the
generalised misses: real MCore config checks triggered on CPU are named at the file:line that raised
them; a reworded message names the nearest check at a lower confidence; errors from other packages
are not looked up; extension ABI errors, zero-token reshapes and MCore's NaN detection are named."""

from __future__ import annotations

import dataclasses
import io
import json
import traceback
from pathlib import Path

import pytest

from mbridge_ep_overlap.diagnose import diagnose, docs, upstream_checks, upstream_source
from mbridge_ep_overlap.diagnose.signatures import all_signatures

RECORDED = Path(__file__).parent / "fixtures" / "recorded"
UNSEEN = Path(__file__).parent / "fixtures" / "failure_reports_unseen"
BASE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=4, moe_router_topk=2, bf16=True,
            overlap_moe_expert_parallel_comm=True, expert_model_parallel_size=2, moe_token_dispatcher_type="alltoall")
BAD = [dict(num_attention_heads=5, tensor_model_parallel_size=2),
       dict(expert_model_parallel_size=1),
       dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
       dict(moe_shared_expert_intermediate_size=64, moe_shared_expert_overlap=True),
       dict(moe_token_dispatcher_type="allgather")]


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


def trigger(bad: dict) -> tuple[BaseException, str, int, str]:
    from megatron.core.transformer.transformer_config import TransformerConfig

    with pytest.raises((AssertionError, ValueError, RuntimeError)) as info:
        TransformerConfig(**{**BASE, **bad})
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    rel = "megatron/" + frame.filename.split("/megatron/", 1)[1]
    text = "".join(traceback.format_exception(info.value))
    return info.value, rel, frame.lineno, text


@pytest.mark.parametrize("bad", BAD, ids=lambda b: ",".join(b))
def test_a_real_mcore_check_is_found_at_the_line_that_raised_it(bad):
    err, rel, line, text = trigger(bad)
    match = upstream_source.find(str(err), rel, line)
    assert match and match.exact, str(err)
    assert match.check.where == f"{rel}:{line}"
    assert match.check.condition not in ("", "(unconditional)")
    errors = upstream_checks.RaisedErrors()
    for i, row in enumerate(text.splitlines(), 1):
        errors.feed(row, f"log:{i}")
    (found,) = upstream_checks.findings(errors.errors)
    assert found.signature.id == f"upstream-check:{rel}:{line}"
    assert found.signature.cause.startswith(f"The check at {rel}:{line} requires ")


def test_diagnose_names_a_check_no_hand_written_signature_knows():
    err, rel, line, text = trigger(BAD[0])
    d = run(text)
    top = d.findings[0]
    assert top.signature.id == f"upstream-check:{rel}:{line}" and top.signature.confidence == 0.88
    assert f"the check at {rel}:{line}" in top.signature.fix
    assert any("raised at " in x and f":{line} in " in x for x in top.detail), top.detail


def test_a_hand_written_signature_keeps_its_place_and_no_duplicate_is_added():
    _, _, _, text = trigger(BAD[1])
    d = run(text)
    assert d.cause_ids == ["overlap-needs-expert-parallel"]


def test_the_rule_that_mirrors_a_check_gives_the_fix():
    from mbridge_ep_overlap.core.rules import RULES_BY_ID

    message = "overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute"
    errors = upstream_checks.RaisedErrors()
    errors.feed(f"AssertionError: {message}", "log:1")
    (found,) = upstream_checks.findings(errors.errors)
    assert found.signature.rule == "delay-wgrad-needs-overlap"
    assert found.signature.fix == RULES_BY_ID["delay-wgrad-needs-overlap"].fix
    err, *_ = trigger(BAD[0])  # no rule mirrors the attention-heads check
    errors = upstream_checks.RaisedErrors()
    errors.feed(f"ValueError: {err}", "log:1")
    (found,) = upstream_checks.findings(errors.errors)
    assert found.signature.rule is None and found.signature.fix.startswith("change the configuration so that ")


def test_a_reworded_message_names_the_nearest_check_and_says_so():
    err, rel, line, _ = trigger(BAD[0])
    reworded = str(err).replace("must be a multiple of", "has to be a multiple of the")
    d = run(f"ValueError: {reworded}\n")
    top = d.findings[0]
    assert top.signature.id == f"upstream-check:{rel}:{line}"
    assert top.signature.confidence == upstream_checks.NEAREST_CONFIDENCE
    assert "not the installed version" in top.signature.versions
    assert any("not in the installed version's source" in x for x in top.detail)


def test_a_traceback_only_through_other_packages_is_not_looked_up():
    text = ('Traceback (most recent call last):\n  File "/opt/DeepEP/deep_ep/buffer.py", line 10, in dispatch\n'
            "RuntimeError: num_attention_heads (5) must be a multiple of tensor_model_parallel_size (2).\n")
    assert not any(f.signature.id.startswith("upstream-check") for f in run(text).findings)


def test_an_unrelated_message_names_no_check():
    assert not run("RuntimeError: the quick brown fox jumped over the lazy dog twice\n").findings


def test_zero_element_view_is_what_torch_emits_and_is_named():
    import torch

    with pytest.raises(RuntimeError) as info:
        torch.empty(0, 64).view([128, 1, 64])
    with pytest.raises(RuntimeError) as reshape:
        torch.empty(0, 64).reshape(-1, 0)
    for message in (str(info.value), str(reshape.value)):
        assert run(f"[rank3]: RuntimeError: {message}\n").cause_ids[0] == "zero-tokens-reshape"


@pytest.mark.parametrize("line, sig_id", [
    ("ImportError: /env/lib/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by /x/te.so)",
     "extension-needs-newer-libstdcxx"),
    ("ImportError: /x/deep_ep_cpp.cpython-310-x86_64-linux-gnu.so: undefined symbol: _ZNKSt7__cxx1112basic_stringIcE",
     "extension-needs-newer-libstdcxx"),
    ("ImportError: /x/transformer_engine_torch.so: undefined symbol: _ZN2at4_ops5empty4callEv",
     "extension-built-for-other-torch"),
])
def test_extension_import_abi_errors(line, sig_id):
    assert run(line + "\n").cause_ids[0] == sig_id


def test_nan_recording_is_numerics_with_the_iteration_not_a_hang():
    truth = json.loads((RECORDED / "nan" / "injected-fault.json").read_text())
    d = diagnose([str(RECORDED / "nan")])
    assert d.findings[0].signature.symptom == "numerics"
    # MB logs 1-based iterations; the injector counts the step from 0
    assert f"rank {truth['rank']}: nan at iteration {truth['step'] + 1}" in "\n".join(d.findings[0].detail)


def test_a_hang_names_the_layer_or_says_it_is_not_in_the_evidence():
    hang = diagnose([str(RECORDED / "hang")])
    assert any(x.startswith("layer (the watchdog's last MoE position): rank 0: MoE layer ")
               for x in hang.findings[0].detail)
    timeout = diagnose([str(RECORDED / "nccl_timeout")])
    nccl = next(f for f in timeout.findings if f.signature.id == "nccl-watchdog-timeout")
    assert any(x.startswith("layer (the watchdog's last MoE position): rank 0: MoE layer ") for x in nccl.detail)


def test_unseen_labels_are_what_diagnose_names_today():
    rows = {r.id: r for r in docs.unseen_rows(UNSEEN)}
    for line in (UNSEEN / "labels.tsv").read_text().splitlines()[1:]:
        report, top, _hit, *_ = line.split("\t")
        assert rows[report].named == top, (report, rows[report].named)


def test_the_template_row_is_listed():
    assert "upstream-check" in {s.id for s in all_signatures()}


PREDICTION = {"dispatcher": "alltoall", "gpu": "h200", "num_gpus": 8, "off_step_s": 1.25, "on_step_s": 1.2,
              "speedup": 1.0417, "confidence": "validated: BF16 on Hopper (docs/prediction.md)"}


def test_no_gain_reports_the_prediction_plan_json_records(tmp_path):
    import shutil

    run_dir = tmp_path / "no_gain"
    shutil.copytree(RECORDED / "no_gain", run_dir)
    (run_dir / "job.plan.json").write_text(json.dumps({"prediction": PREDICTION}))
    d = diagnose([str(run_dir)])
    slow = [f for f in d.findings if f.signature.symptom == "no-speedup"]
    assert slow
    words = "\n".join(slow[0].detail)
    assert "alltoall on 8x h200, step 1.250 s with overlap off, 1.200 s on, speed-up 1.042x" in words


def test_no_gain_says_when_the_config_has_no_prediction(tmp_path):
    from mbridge_ep_overlap.diagnose import prediction

    assert "no config beside the logs" in prediction.lines([str(tmp_path)])[0]
    (tmp_path / "job.config.yaml").write_text("model: {}\n")
    assert "names neither the GPU nor the world size" in prediction.lines([str(tmp_path)])[0]
    (tmp_path / "job.plan.json").write_text(json.dumps({"prediction": {"error": "GPU x: not in the GPU catalogue"}}))
    assert "no prediction for this config (GPU x: not in the GPU catalogue)" in prediction.lines([str(tmp_path)])[0]
    (tmp_path / "job.plan.json").write_text("{not json")
    assert "could not be read" in prediction.lines([str(tmp_path)])[0]


def _named_from_traceback(err: BaseException) -> tuple[str, str]:
    frame = traceback.extract_tb(err.__traceback__)[-1]
    where = "megatron/" + frame.filename.split("/megatron/", 1)[1] + f":{frame.lineno}"
    d = run("".join(traceback.format_exception(err)))
    ids = [f.signature.id for f in d.findings if f.signature.id.startswith("upstream-check:")]
    return where, (ids or ["-"])[0]


def test_a_real_mb_check_is_named_at_the_line_that_raised_it():
    import types

    from megatron.bridge.training.utils.moe_token_drop import apply_moe_token_drop

    provider = types.SimpleNamespace(num_moe_experts=4, moe_token_dispatcher_type="flex",
                                     moe_router_load_balancing_type="aux_loss")
    with pytest.raises(AssertionError) as info:
        apply_moe_token_drop(provider)
    where, named = _named_from_traceback(info.value)
    assert where.startswith("megatron/bridge/") and named == f"upstream-check:{where}"


def test_an_mb_validation_error_is_found_in_mb_source():
    import types
    from unittest import mock

    from megatron.bridge.training import flex_dispatcher_backend as flex

    cfg = types.SimpleNamespace(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep")
    gpu = types.SimpleNamespace(name="Tesla V100-SXM2-32GB", major=7, minor=0)
    with mock.patch("torch.cuda.get_device_properties", return_value=gpu), pytest.raises(ValueError) as info:
        flex.validate_flex_dispatcher_backend(cfg)
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    rel = "megatron/" + frame.filename.split("/megatron/", 1)[1]
    match = upstream_source.find(str(info.value), rel, frame.lineno)
    assert match and match.exact and match.check.where == f"{rel}:{frame.lineno}"


# ---- an error printed as its repr, Ray's suffix, a check the installed version only warns about -----------------------
def _warned_sites(limit: int = 6) -> list[upstream_source.Check]:
    """warnings.warn sites of the installed MCore with a whole literal message no check raises."""
    rels = [rel for rel, text in upstream_source.sources() if rel.startswith("megatron/core/") and "warnings.warn(" in text]
    out = []
    for rel in rels:
        for c in upstream_source.file_warnings(rel):
            if "..." not in c.literal and len(c.literal) > 40 and c.condition != "(unconditional)":
                found = upstream_source.find(c.literal)
                if found and found.check == c:
                    out.append(c)
        if len(out) >= limit:
            break
    return out


def test_warned_sites_are_read_from_the_installed_source():
    sites = _warned_sites()
    assert len(sites) >= 3
    assert all(s.kind == upstream_source.WARNED for s in sites)


def test_a_raised_message_the_installed_version_only_warns_about_is_named_at_the_warning():
    site = _warned_sites(1)[0]
    d = run(f"ValueError: {site.literal}\n")
    top = d.findings[0]
    assert top.signature.id == f"upstream-check:{site.where}"
    assert "only warns" in top.signature.cause and site.condition in top.signature.cause
    assert f"upstream warning: {site.where} (warnings.warn): avoided when {site.condition}" in top.detail


def test_an_error_printed_as_its_repr_inside_another_line_and_ray_repeats_are_read():
    line = ("megatron.bridge.utils.instantiate_utils.InstantiationException: Error in call to target 'x.Provider': "
            "[repeated 7x across cluster]\n")
    err, rel, lineno, _ = trigger(BAD[0])
    d = run(line + f"{type(err).__name__}({str(err)!r}) [repeated 7x across cluster]\n")
    assert d.findings and d.findings[0].signature.id == f"upstream-check:{rel}:{lineno}"


def test_a_repr_of_an_unrelated_error_names_no_check():
    assert not [f for f in run("RuntimeError('the weather station is offline today')\n").findings
                if f.signature.id.startswith("upstream-check:")]


def test_a_checked_size_computed_from_others_is_shown_as_the_installed_code_computes_it():
    """MCore's expert-grid check tests one product; the finding says which sizes make it (the installed source's
    assignment above the check), so the user sees that EP, ETP and PP together exceed the GPUs."""
    d = diagnose(["-"], stdin=io.BytesIO(
        b"RuntimeError: world_size (8) is not divisible by expert_tensor_model_pipeline_parallel size (16)\n"))
    top = d.findings[0]
    assert top.signature.id.startswith("upstream-check:megatron/core/parallel_state.py")
    for factor in ("expert_tensor_parallel_size", "expert_model_parallel_size", "pipeline_model_parallel_size"):
        assert factor in top.signature.cause
    assert any(x.startswith("computed in the installed source as: expert_tensor_model_pipeline_parallel_size = ")
               for x in top.detail)
    check = next(c for c in upstream_source.checks() if c.where == top.signature.id.removeprefix("upstream-check:"))
    assert upstream_source.operands(dataclasses.replace(check, condition="world_size > 0")) == ()  # a parameter


def test_a_raising_line_whose_message_moved_is_named_where_the_installed_source_has_it():
    """The log shows the assert line of an older release (another line number, no message line of its own): its
    literal message is found in the installed source word for word, so that check is named, not the nearest line."""
    log = ('Traceback (most recent call last):\n'
           '  File "/old/Megatron-LM/megatron/core/datasets/blended_megatron_dataset_config.py", line 72, in __post_init__\n'
           '    assert self.split is None, "split and blend_per_split are incompatible"\n'
           'AssertionError\n')
    d = diagnose(["-"], stdin=io.BytesIO(log.encode()))
    top = d.findings[0]
    assert "requires self.split is None" in top.signature.cause, d.cause_ids
    src = dict(upstream_source.sources())["megatron/core/datasets/blended_megatron_dataset_config.py"]
    line = top.signature.id.rsplit(":", 1)[1]
    assert "split and blend_per_split are incompatible" in "\n".join(src.splitlines()[int(line) - 1:int(line) + 1])


def test_an_exception_retyped_with_its_message_in_parentheses_is_looked_up():
    d = diagnose(["-"], stdin=io.BytesIO(b"AssertionError (Param is not in the bucket group)\n"))
    assert d.cause_ids[0].startswith("upstream-check:megatron/core/distributed/param_and_grad_buffer.py:"), d.cause_ids
    assert "param in self.param_to_bucket" in d.findings[0].signature.cause
    # the bucket check the report retyped so is a known failure now, named by its row
    d = diagnose(["-"], stdin=io.BytesIO(b"AssertionError (Communication call has not been issued for this bucket)\n"))
    assert d.cause_ids[0] == "grad-bucket-never-issued"


def test_short_frames_listed_under_the_error_choose_the_installed_file():
    """A report retypes the frames short under the error ("FILE.py:LINE in FUNCTION"): the file that holds them
    decides between installed checks worded alike (MCore's MTP layer and a model copy in Megatron-Bridge)."""
    log = ("ValueError: Invalid activation recompute method.\n"
           "  multi_token_prediction.py:1035 in _checkpointed_forward\n"
           "  multi_token_prediction.py:1088 in forward\n")
    d = diagnose(["-"], stdin=io.BytesIO(log.encode()))
    assert d.cause_ids[0].startswith("upstream-check:megatron/core/transformer/multi_token_prediction.py:"), d.cause_ids
    alone = diagnose(["-"], stdin=io.BytesIO(b"ValueError: Invalid activation recompute method.\n"))
    assert alone.cause_ids[0].startswith("upstream-check:")  # without them: some installed check of those words


def test_a_value_the_installed_choice_does_not_accept_names_the_release_that_knows_it():
    """An if / elif chain over string values: the run's value is none of them. Installed Megatron-Bridge 0.6.2's
    DeepSeek-V4 bridge names 'dsv4_hybrid', which the installed Megatron-Core 0.19.2's spec chooser refuses."""
    from megatron.core.models.gpt import experimental_attention_variant_module_specs as specs

    src = Path(specs.__file__).read_text()
    assert 'f"Invalid experimental attention variant: {config.experimental_attention_variant}"' in src
    known = diagnose(["-"], stdin=io.BytesIO(b"ValueError: Invalid experimental attention variant: dsv4_hybrid\n"))
    cause = known.findings[0].signature.cause
    assert "The run's value 'dsv4_hybrid' is none of those the installed megatron-core" in cause
    assert "('gated_delta_net', 'dsa')" in cause and "megatron/bridge/models/deepseek/" in cause
    assert "version skew" in cause and "'dsv4_hybrid'" in known.findings[0].signature.fix
    nowhere = diagnose(["-"], stdin=io.BytesIO(b"ValueError: Invalid experimental attention variant: no_such_one\n"))
    assert "no installed Megatron package uses it" in nowhere.findings[0].signature.cause


def test_a_value_only_the_refusing_package_quotes_elsewhere_is_not_called_a_skew():
    d = diagnose(["-"], stdin=io.BytesIO(b"ValueError: Invalid data_parallel_sharding_strategy: full\n"))
    cause = d.findings[0].signature.cause
    assert "The run's value 'full' is none of those" in cause and "no installed Megatron package uses it" in cause
