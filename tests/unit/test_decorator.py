"""``@ep_overlap(...)`` on a shipped recipe: the recipe's config with ``enable_ep_overlap`` applied."""

from __future__ import annotations

import pytest

from mbridge_ep_overlap import EPOverlapError, UsageError, check_ep_overlap, describe, enable_ep_overlap, ep_overlap
from mbridge_ep_overlap_recipes.qwen3 import qwen3_30b_a3b

H100X16 = describe("h100", 16, deep_ep_version="1.2.1")


@pytest.mark.parametrize("options,dispatcher_type,backend", [
    (dict(dispatcher="hybridep", environment=H100X16), "flex", "hybridep"),
    (dict(dispatcher="alltoall", environment=H100X16), "alltoall", None),
    (dict(dispatcher="deepep", environment=H100X16, high_priority_a2a=False), "flex", "deepep"),
])
def test_decorated_shipped_recipe_returns_its_config_with_overlap_applied(options, dispatcher_type, backend):
    decorated = ep_overlap(**options)(qwen3_30b_a3b)
    cfg = decorated()
    expected = qwen3_30b_a3b()
    plan = enable_ep_overlap(expected, **options)
    assert type(cfg) is type(expected)
    assert cfg.comm_overlap.overlap_moe_expert_parallel_comm is True
    assert (cfg.model.moe_token_dispatcher_type, cfg.model.moe_flex_dispatcher_backend) == (dispatcher_type, backend)
    for change in plan.changes:  # every field the plan sets, set the same way by the decorator
        head, _, last = change.path.rpartition(".")
        section = cfg
        for part in head.split("."):
            section = section[part] if isinstance(section, dict) else getattr(section, part)
        assert (section[last] if isinstance(section, dict) else getattr(section, last)) == change.new, change.path
    assert [v.rule_id for v in check_ep_overlap(cfg, environment=H100X16) if v.severity.value == "error"] == []


def test_decorator_keeps_the_recipe_reachable_and_named():
    decorated = ep_overlap(dispatcher="alltoall", environment=H100X16)(qwen3_30b_a3b)
    assert decorated.__wrapped__ is qwen3_30b_a3b
    assert decorated.__name__ == qwen3_30b_a3b.__name__ and decorated.__doc__ == qwen3_30b_a3b.__doc__
    assert decorated.__wrapped__().comm_overlap.overlap_moe_expert_parallel_comm is not True  # undecorated


def test_refused_config_raises_epoverlaperror_with_its_violations():
    @ep_overlap(dispatcher="alltoall", delay_wgrad=True, environment=describe("h100", 16, te_version=""))
    def recipe():
        return qwen3_30b_a3b()

    with pytest.raises(EPOverlapError) as e:
        recipe()
    assert e.value.violations, "a refusal lists its violations"


@pytest.mark.parametrize("make,words", [
    (lambda: ep_overlap(dispatcher="hybirdep"), "dispatcher"),
    (lambda: ep_overlap(delay_wgrad="yes"), "delay_wgrad"),
    (lambda: ep_overlap(resolve="fix"), "resolve"),
    (lambda: ep_overlap(cuda_device_max_connections=0), "cuda_device_max_connections"),
    (lambda: ep_overlap(environment="h100"), "environment"),
    (lambda: ep_overlap(dispatch="alltoall"), "dispatch"),
    (lambda: ep_overlap(qwen3_30b_a3b), "without parentheses"),
    (lambda: ep_overlap()(42), "@ep_overlap target"),
])
def test_bad_arguments_are_one_usage_error_when_the_decorator_is_made(make, words):
    with pytest.raises(UsageError) as e:
        make()
    assert words in str(e.value) and len(str(e.value).splitlines()) == 1


def test_a_recipe_returning_no_config_is_a_usage_error():
    with pytest.raises(UsageError):
        ep_overlap(dispatcher="alltoall", environment=H100X16)(lambda: {"model": None})()


def test_decorated_recipe_is_a_recipe_for_the_pipeline(monkeypatch):
    import sys
    import types

    from mbridge_ep_overlap import RunSpec, build

    module = types.ModuleType("decorated_recipes_for_test")
    module.recipe = ep_overlap(dispatcher="alltoall", environment=H100X16)(qwen3_30b_a3b)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    built = build(RunSpec(recipe=f"{module.__name__}:recipe"), target=H100X16)
    assert built.plan is not None and built.cfg.comm_overlap.overlap_moe_expert_parallel_comm is True
    assert built.cfg.model.moe_token_dispatcher_type == "alltoall"
