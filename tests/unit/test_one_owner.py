"""Each run choice is decided once: a traced dry run checks the dispatcher name once, validates
the spec once, settles the overlap choices once (``base.choices.settle_choices``), loads and calls
the recipe function once and enters the target's simulation once per build; the choices' names have
one owner (``base.choices``)."""

from __future__ import annotations

import collections
import contextlib

import pytest

from mbridge_ep_overlap.base import choices


@pytest.fixture
def counted(monkeypatch):
    """Counters on the steps a build must take once each."""
    from mbridge_ep_overlap import spec as spec_module
    from mbridge_ep_overlap.core import dispatcher as dispatcher_module
    from mbridge_ep_overlap.core import enable as enable_module
    from mbridge_ep_overlap.target import simulate as simulate_module

    counts: collections.Counter = collections.Counter()

    def counting(key, function):
        def wrapper(*args, **kwargs):
            counts[key] += 1
            return function(*args, **kwargs)
        return wrapper

    checked_name = counting("dispatcher name checked", choices.dispatcher_name)
    for module in (choices, spec_module):
        monkeypatch.setattr(module, "dispatcher_name", checked_name)
    settled = counting("choices settled", choices.settle_choices)
    for module in (choices, enable_module, dispatcher_module):
        monkeypatch.setattr(module, "settle_choices", settled)
    monkeypatch.setattr(spec_module.RunSpec, "_checked", counting("spec validated", spec_module.RunSpec._checked))
    load = spec_module.Recipe._load
    monkeypatch.setattr(spec_module.Recipe, "_load",
                        lambda self: counting("recipe function called", load(self)) if not counts.update(
                            ["recipe function loaded"]) else None)
    simulate = simulate_module.simulate

    @contextlib.contextmanager
    def counted_simulate(env):
        counts["target simulated"] += 1
        with simulate(env) as entered:
            yield entered

    monkeypatch.setattr(simulate_module, "simulate", counted_simulate)
    return counts


def test_a_dry_run_decides_each_choice_once(counted, tmp_path, capsys):
    from mbridge_ep_overlap.tools.run import main

    rc = main(["--recipe", "qwen3_30b_a3b", "--dryrun", "--dispatcher", "alltoall", "--out", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    # one simulation for the build, one for MB's finalize (a step of its own)
    assert dict(counted) == {"dispatcher name checked": 1, "spec validated": 1, "recipe function loaded": 1,
                             "recipe function called": 1, "target simulated": 2, "choices settled": 1}


def test_a_flex_backend_is_applied_inside_the_builds_one_simulation(counted):
    from mbridge_ep_overlap.pipeline import build
    from mbridge_ep_overlap.spec import RunSpec, TargetSpec

    built = build(RunSpec(recipe="qwen3_30b_a3b", dispatcher="HybridEP", target=TargetSpec(gpu="h100", num_gpus=16)))
    assert built.plan.dispatcher == "hybridep"
    assert counted["target simulated"] == 1 and counted["dispatcher name checked"] == 1
    assert counted["recipe function called"] == 1 and counted["choices settled"] == 1


@pytest.mark.parametrize("overlap", [True, False])
def test_a_build_settles_the_choices_once_and_the_plan_says_where_each_came_from(counted, overlap):
    from mbridge_ep_overlap.pipeline import build
    from mbridge_ep_overlap.spec import RunSpec, TargetSpec, resolve_recipe

    spec = RunSpec(recipe="qwen3_30b_a3b", ep_overlap=overlap, dispatcher="alltoall",
                   target=TargetSpec(gpu="h100", num_gpus=16))
    built = build(spec)
    assert counted["choices settled"] == 1
    if not overlap:
        assert built.plan is None
        return
    entry = resolve_recipe("qwen3_30b_a3b").entry
    assert built.plan.settled_by["dispatcher"] == "flag"
    assert built.plan.settled_by["delay_wgrad"] == ("default" if entry.delay_wgrad is None else "recipe registry")
    assert built.plan.to_dict()["settled_by"] == built.plan.settled_by
    assert set(built.plan.settled_by) == set(choices.CHOICES)


def test_settling_takes_the_flag_then_the_registry_then_the_config_then_the_default():
    settle = choices.settle_choices
    flags = {"dispatcher": "deepep", "delay_wgrad": None, "high_priority_a2a": None}
    got = settle(flags, {"delay_wgrad": True, "dispatcher": "hybridep"}, {"high_priority_a2a": False, "delay_wgrad": False})
    assert got == {"dispatcher": choices.Settled("deepep", "flag"),
                   "delay_wgrad": choices.Settled(True, "recipe registry"),
                   "high_priority_a2a": choices.Settled(False, "config")}
    assert settle({}) == {name: choices.Settled(value, "default") for name, value in choices.CHOICE_DEFAULTS.items()}
    # False is a choice, not "none given"
    assert settle({"delay_wgrad": False}, {"delay_wgrad": True})["delay_wgrad"] == choices.Settled(False, "flag")


def test_overlap_off_records_the_dispatcher_edits_it_makes():
    from mbridge_ep_overlap.pipeline import build
    from mbridge_ep_overlap.spec import RunSpec, TargetSpec

    spec = RunSpec(recipe="qwen3_30b_a3b", ep_overlap=False, target=TargetSpec(gpu="h100", num_gpus=16))
    built = build(spec.replace(dispatcher="alltoall"))  # the recipe's config is flex/HybridEP
    assert built.plan is None and built.cfg.model.moe_token_dispatcher_type == "alltoall"
    assert {"model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend"} <= {c.path for c in built.changes}
    built = build(spec.replace(dispatcher="hybridep"))
    assert built.cfg.env_vars["USE_MNNVL"] == "0"
    assert "env_vars.USE_MNNVL" in {c.path for c in built.changes}


def test_the_registry_default_is_settled_where_the_others_are_and_says_so():
    from mbridge_ep_overlap.pipeline import build
    from mbridge_ep_overlap.spec import RunSpec, resolve_recipe

    entry = resolve_recipe("qwen3_30b_a3b").entry
    assert entry.dispatcher is not None
    built = build(RunSpec(recipe="qwen3_30b_a3b"))
    assert built.plan.dispatcher == entry.dispatcher
    assert built.plan.dispatcher_reason == "its registry row"
    assert built.plan.dispatcher_source.value == "the recipe's"


def test_the_names_have_one_owner():
    from mbridge_ep_overlap import spec
    from mbridge_ep_overlap.core import dispatcher
    from mbridge_ep_overlap.predict import inputs
    from mbridge_ep_overlap.runtime import flags
    from mbridge_ep_overlap.lab import smoke

    assert choices.DISPATCHERS == (*choices.NAMED_DISPATCHERS, choices.AUTO)
    assert dispatcher.FLEX_BACKENDS is choices.FLEX_BACKENDS and spec.DISPATCHERS is choices.DISPATCHERS
    assert inputs.DISPATCHERS is choices.NAMED_DISPATCHERS and smoke.BACKENDS is choices.MEASURED_DISPATCHERS
    assert flags.ON_OFF is choices.ON_OFF


@pytest.mark.parametrize("given, canonical", [("DeepEP", "deepep"), ("AUTO", "auto"), ("alltoall", "alltoall")])
def test_a_dispatcher_name_is_case_insensitive(given, canonical):
    assert choices.dispatcher_name(given) == canonical


@pytest.mark.parametrize("given", ["deep-ep", 3, None, ""])
def test_an_unknown_dispatcher_is_one_usage_error_listing_the_names(given):
    from mbridge_ep_overlap.base.errors import UsageError

    with pytest.raises(UsageError, match="alltoall"):
        choices.dispatcher_name(given)
