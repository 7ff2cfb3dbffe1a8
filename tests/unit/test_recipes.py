"""Shipped recipes: built offline, finalized by MB for their stated cluster with overlap on."""

from __future__ import annotations

import socket

import pytest

from mbridge_ep_overlap import RunSpec, build, enable_ep_overlap
from mbridge_ep_overlap.pipeline import finalize
from mbridge_ep_overlap.spec import registered_recipes, resolve_recipe
from mbridge_ep_overlap.target.cluster import describe
from mbridge_ep_overlap.target.simulate import simulate

RECIPES = registered_recipes()
NAMES = sorted(RECIPES)


@pytest.fixture
def no_network(monkeypatch):
    """Any socket connection fails: the build must not reach the hub."""

    def refuse(*args, **kwargs):
        raise OSError("network disabled in this test")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_all_issue_recipes_are_registered():
    assert {"qwen3_30b_a3b", "qwen3_30b_a3b_hybridep", "qwen3_235b_a22b", "deepseek_v3", "qwen3_moe_proxy"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_recipe_builds_offline_and_finalizes_with_overlap_on(name, no_network):
    entry = RECIPES[name]
    built = build(RunSpec(recipe=name))
    assert built.plan is not None and built.cfg.comm_overlap.overlap_moe_expert_parallel_comm is True
    result = finalize(built)
    s = result.summary
    assert s["overlap_moe_expert_parallel_comm"] is True
    assert s["delay_wgrad_compute"] is False
    assert s["moe_shared_expert_overlap"] is False
    assert s["num_microbatches"] >= 2
    assert s["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    expected = {"alltoall": "alltoall", "deepep": "flex", "hybridep": "flex"}[entry.dispatcher]
    assert s["moe_token_dispatcher_type"] == expected
    if expected == "flex":
        assert s["moe_flex_dispatcher_backend"] == entry.dispatcher
    # The dry run never rewrites the config: a TE recipe stays on TE layers in what is finalized.
    assert built.cfg.model.transformer_impl == ("local" if name == "qwen3_moe_proxy" else "transformer_engine")


@pytest.mark.parametrize(
    "name,parallel",
    [("qwen3_30b_a3b", (1, 1, None, 16)), ("qwen3_235b_a22b", (2, 8, 4, 32)), ("deepseek_v3", (2, 8, 4, 64))],
)
def test_recipe_parallel_layout(name, parallel):
    m = resolve_recipe(name).config().model
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
            m.virtual_pipeline_model_parallel_size, m.expert_model_parallel_size) == parallel


@pytest.mark.parametrize(
    "base_recipe,gpus,match",
    [
        ("megatron.bridge.recipes.deepseek.h100.deepseek_v3:deepseek_v3_pretrain_1024gpu_h100_bf16_config", 1024,
         "virtual_pipeline_model_parallel_size must be specified"),
        ("megatron.bridge.recipes.qwen.h100.qwen3_moe:qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config", 256,
         "virtual_pipeline_model_parallel_size must be specified"),
    ],
)
def test_mb_base_recipes_assert_with_overlap_on_without_our_changes(base_recipe, gpus, match):
    """The skill's snippet on MB's base recipe: Megatron asserts (PP>1 without VPP)."""
    import importlib

    from megatron.bridge.training.comm_overlap import CommOverlapConfig
    from megatron.bridge.training.config import runtime_config_update

    from mbridge_ep_overlap.target.offline import offline_architectures

    module, fn = base_recipe.split(":")
    with simulate(describe("h100", gpus)):  # the cluster's GPUs and TE, as build() builds recipes
        with offline_architectures():
            cfg = getattr(importlib.import_module(module), fn)()
        cfg.comm_overlap = cfg.comm_overlap or CommOverlapConfig(tp_comm_overlap=False)
        cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
        with pytest.raises(AssertionError, match=match):
            runtime_config_update(cfg)


def test_deepseek_base_recipe_is_refused_by_us_before_megatron_asserts():
    from mbridge_ep_overlap import EPOverlapError
    from mbridge_ep_overlap.target.offline import offline_architectures
    from megatron.bridge.recipes.deepseek.h100.deepseek_v3 import deepseek_v3_pretrain_1024gpu_h100_bf16_config

    with offline_architectures():
        cfg = deepseek_v3_pretrain_1024gpu_h100_bf16_config()
    with pytest.raises(EPOverlapError) as excinfo:
        enable_ep_overlap(cfg, "alltoall", environment=describe("h100", 1024))
    assert "pp-needs-vpp" in {v.rule_id for v in excinfo.value.violations}


def test_unknown_hub_id_is_refused_offline():
    from megatron.bridge import AutoBridge

    from mbridge_ep_overlap.base.errors import UsageError
    from mbridge_ep_overlap.target.offline import offline_architectures

    with offline_architectures(), pytest.raises(UsageError, match="offline build"):
        AutoBridge.from_hf_pretrained("someone/not-shipped")
