"""recipes/deepseek.py keeps NVIDIA's selective recompute of the published DeepSeek-V3 H100 perf recipe
and is accepted with EP overlap on its own cluster; 'moe' recompute would be refused."""

from __future__ import annotations

import pytest

from mbridge_ep_overlap import EPOverlapError, RunSpec, build
from mbridge_ep_overlap.pipeline import finalize
from mbridge_ep_overlap.spec import TargetSpec

NVIDIA = "megatron.bridge.perf_recipes.deepseek.h100.deepseek_v3:deepseek_v3_pretrain_1024gpu_h100_bf16_config"
SPEC = RunSpec(recipe="deepseek_v3", target=TargetSpec(gpu="h100", num_gpus=1024, deep_ep="1.2.1"))


def test_recompute_is_the_published_recipe_one_and_overlap_is_accepted():
    from mbridge_ep_overlap.spec import resolve_recipe

    nvidia = resolve_recipe(NVIDIA).config(None).model  # built offline, as plan builds it
    built = build(SPEC)
    summary = finalize(built).summary
    m = built.cfg.model
    assert (m.recompute_granularity, m.recompute_modules) == (nvidia.recompute_granularity, nvidia.recompute_modules)
    assert m.recompute_modules == ["mla_up_proj", "mlp"] and m.recompute_granularity == "selective"
    assert summary["overlap_moe_expert_parallel_comm"] is True


def test_moe_recompute_would_be_refused(monkeypatch):
    import mbridge_ep_overlap_recipes.deepseek as recipe

    base = recipe.deepseek_v3

    def with_moe():
        cfg = base()
        cfg.model.recompute_modules = ["mla_up_proj", "mlp", "moe"]
        return cfg

    monkeypatch.setattr(recipe, "deepseek_v3", with_moe)
    with pytest.raises(EPOverlapError, match="moe-recompute"):
        finalize(build(SPEC))
