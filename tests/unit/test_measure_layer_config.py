"""scripts/gpu/measure_layer.py's model config, built on CPU: the recipe read offline, shrunk to one GPU's share
(TP = PP = CP = EP = 1, the recipe's local experts as the whole expert set, every layer MoE), the recipe's own
attention and precision kept - so a broken override fails here, before any GPU time is spent."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mbridge_ep_overlap.target import shims
from mbridge_ep_overlap.target.cluster import describe
from mbridge_ep_overlap.target.simulate import simulate

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts" / "gpu"))
import measure_layer  # noqa: E402 - the script, from its folder

L = "megatron.bridge.perf_recipes"


@pytest.mark.parametrize(("recipe", "precision", "experts", "window", "fp8"), [
    (f"{L}.gpt_oss.h100.gpt_oss:gpt_oss_120b_pretrain_64gpu_h100_bf16_config", "bf16", 128 // 8, (127, 0), None),
    (f"{L}.qwen.h100.qwen3_moe:qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", "bf16", 128 // 16, None, None),
    (f"{L}.qwen.h100.qwen3_moe:qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config", "recipe", 128 // 16, None, "hybrid"),
])
def test_the_recipe_is_shrunk_to_one_gpus_share(recipe, precision, experts, window, fp8):
    shims.install()
    with simulate(describe("h200", 1)):
        cfg = measure_layer._recipe(recipe)
        ep = cfg.model.expert_model_parallel_size
        m, shape = measure_layer._provider(cfg, 2, cfg.model.seq_length, precision)
    assert (m.num_layers, m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size,
            m.expert_model_parallel_size) == (2, 1, 1, 1, 1)
    assert m.num_moe_experts == experts and shape == {"experts_local": experts, "ep_of_recipe": ep,
                                                      "raised_to_topk": False}
    facts = measure_layer._facts(m)
    assert facts["window_size"] == (repr(window) if window else None)
    assert facts["fp8"] == fp8
    assert m.overlap_moe_expert_parallel_comm is False and m.moe_token_dispatcher_type == "alltoall"
