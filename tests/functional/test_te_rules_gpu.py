"""The Transformer-Engine-only rules against what really happens on the GPU node.

* ``delay-wgrad-needs-te``: our rule refuses delayed wgrad on local layers because their
  ``backward_dw`` is a no-op. ``local-forced_delay_wgrad`` trains the local proxy with delayed wgrad
  forced on *past* our check (``force_delay_wgrad.py``; MB's and MCore's own checks accept it) and
  shows the schedule did call the delayed-wgrad path while nothing was deferred: no TE weight-gradient
  GEMM queued, no weight gradient changed inside ``backward_dw`` (they were all computed in the normal
  backward), and losses equal overlap off. ``te-delay_wgrad`` - the same config on TE layers, which
  our rule accepts - queues and executes real deferred GEMMs that write the weight gradients.
* The TE version gates: on this node our probe's TE version is Megatron-Core's ``get_te_version()``,
  every gate rule's verdict equals Megatron-Core's own ``is_te_min_version`` for its threshold, and
  ``te-features-need-te``'s verdict matches whether Transformer Engine imports (and MCore's HAVE_TE).
"""

from __future__ import annotations

import copy
import re

import pytest
from functional_suite import STEPS, te_problem

from mbridge_ep_overlap.lab.numerics import compare_losses, losses_from_summary

pytestmark = pytest.mark.gpu

# gate rule id -> how to make its condition hold on an overlap + delayed-wgrad config (as the parity tests do)
GATE_CONDITIONS = {
    "delay-wgrad-te-grad-reduce": {"ddp.overlap_grad_reduce": True},
    "delay-wgrad-te-grad-accum-fusion": {"model.gradient_accumulation_fusion": True},
    "delay-wgrad-te-partial-graph": {"model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_scope": ["moe_router"]},
    "delay-wgrad-graph-te": {"model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_scope": ["attn"],
                             "model.gradient_accumulation_fusion": True},
}
THRESHOLD = re.compile(r"TE >= (\d+\.\d+(?:\.\d+)?)")


def _needs_te():
    if te_problem():
        pytest.skip(te_problem())


def _rules_on_this_node(recipe: str, delay_wgrad: bool):
    """The rule table's report for ``recipe`` with overlap (and delayed wgrad) on, this node as target."""
    from mbridge_ep_overlap.target import shims

    shims.install()
    from mbridge_ep_overlap.core.engine import evaluate
    from mbridge_ep_overlap.core.enable import Options, Session
    from mbridge_ep_overlap.core.forward_step import forward_step
    from mbridge_ep_overlap.spec import resolve_recipe
    from mbridge_ep_overlap.target.probe import probe

    target = probe()
    cfg = resolve_recipe(recipe).config()
    Session(cfg, Options(dispatcher="alltoall", delay_wgrad=delay_wgrad), target, forward_step).configure()
    return cfg, target, evaluate(cfg, target, forward_step)


@pytest.mark.runs("local-off", "local-forced_delay_wgrad")
def test_delay_wgrad_on_local_layers_defers_nothing(suite):
    _, _, report = _rules_on_this_node("qwen3_moe_proxy", delay_wgrad=True)
    refused = [v.rule_id for v in report.errors]
    assert "delay-wgrad-needs-te" in refused, f"our rule should refuse delayed wgrad on local layers: {refused}"

    run = suite.result("local-forced_delay_wgrad")
    baseline = suite.result("local-off")
    s = run.summary
    w = s["wgrad"]
    print(f"\nforced: {s.get('forced')}\nlocal layers, delayed wgrad forced on: {w}\nlayer classes "
          f"{s['layer_stack']['module_classes']}")
    assert s["finalized"]["delay_wgrad_compute"] is True, "delayed wgrad was not really on in the forced run"
    assert s["combined_schedule_calls"]["combined_1f1b_schedule_for_no_pipelining"] == STEPS
    assert w["node_backward_dw_delayed"] > 0, f"the schedule never took the delayed-wgrad path: {w}"
    assert w["te_wgrad_deferred"] in (0, None), f"a TE weight-gradient GEMM was deferred on local layers: {w}"
    assert w["probe"]["changed"] == 0, f"a weight gradient changed inside backward_dw on local layers: {w}"
    assert w["probe"]["unchanged"] == w["node_backward_dw_delayed"]
    assert w["probe"]["grads_present_before"] > 0, f"weight gradients were not computed in the normal backward: {w}"
    ref, _ = losses_from_summary(baseline.summary)
    cand, skipped = losses_from_summary(s)
    parity = compare_losses(ref, cand, skipped=skipped)
    print(parity.table(ref, cand, names=("off", "forced delay")))
    assert parity.ok, parity.problems


@pytest.mark.runs("te-delay_wgrad")
def test_delay_wgrad_on_te_layers_defers_real_work(suite):
    _needs_te()
    _, _, report = _rules_on_this_node("qwen3_moe_proxy_te", delay_wgrad=True)
    assert not report.errors, f"our rules refuse delayed wgrad on TE layers here: {[v.line() for v in report.errors]}"
    w = suite.result("te-delay_wgrad").summary["wgrad"]
    print(f"\nTE layers, delayed wgrad on: {w}")
    assert w["te_wgrad_deferred"] > 0 and w["te_wgrad_executed"] == w["te_wgrad_deferred"], w
    assert w["probe"]["changed"] > 0, w


def test_te_version_gates_match_megatron_core():
    _needs_te()
    from megatron.core.utils import get_te_version, is_te_min_version
    from packaging.version import Version

    from mbridge_ep_overlap.core.facts import Facts, get_path
    from mbridge_ep_overlap.core.rules import RULES

    cfg, target, _ = _rules_on_this_node("qwen3_moe_proxy_te", delay_wgrad=True)
    ours, theirs = Version(target.te_version), Version(str(get_te_version()))
    print(f"\nTE version: our probe {target.te_version}, Megatron-Core get_te_version() {get_te_version()}")
    assert ours.public == theirs.public, f"probe says TE {ours}, Megatron-Core says {theirs}"

    gates = {r.id: r for r in RULES if THRESHOLD.search(r.required)}
    assert set(gates) == set(GATE_CONDITIONS), f"TE gate rules without a GPU check: {set(gates) ^ set(GATE_CONDITIONS)}"
    for rule_id, rule in gates.items():
        gated = copy.deepcopy(cfg)
        for path, value in GATE_CONDITIONS[rule_id].items():
            section, _, name = path.rpartition(".")
            setattr(get_path(gated, section), name, value)
        facts = Facts(gated, target)
        threshold = THRESHOLD.search(rule.required).group(1)
        assert rule.applies(facts) and rule.checkable(facts), f"{rule_id}: its condition does not hold"
        verdict, mcore = rule.ok(facts), is_te_min_version(threshold)
        print(f"{rule_id:36s} TE >= {threshold:7s}: ours {verdict}, is_te_min_version {mcore}")
        assert verdict == mcore, f"{rule_id}: our verdict {verdict}, Megatron-Core's is_te_min_version({threshold}) {mcore}"


def test_te_features_need_te_matches_the_import():
    from mbridge_ep_overlap.target.shims import real_te_available

    te_imports = real_te_available()
    cfg, target, report = _rules_on_this_node("qwen3_moe_proxy_te", delay_wgrad=False)
    refused = "te-features-need-te" in [v.rule_id for v in report.errors]
    print(f"\nTransformer Engine imports: {te_imports}; probe TE {target.te_version!r}; rule refuses: {refused}")
    assert refused is (not te_imports)
    if te_imports:
        from megatron.core.extensions import transformer_engine as mcore_te

        assert getattr(mcore_te, "HAVE_TE", True), "Megatron-Core's TE extension says HAVE_TE=False"
