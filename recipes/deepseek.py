"""DeepSeek-V3 recipe with EP overlap, derived from Megatron-Bridge 0.6.2's base recipe."""

from __future__ import annotations

from megatron.bridge.recipes.deepseek.h100.deepseek_v3 import (
    deepseek_v3_pretrain_1024gpu_h100_bf16_config,
    set_deepseek_v3_pipeline_model_parallel_layout,
)

from mbridge_ep_overlap.target.offline import builds_offline

# 61 decoder layers + embedding + MTP + loss over PP8 x VPP4 = 32 stages (MB's perf-recipe layout).
PP8_VPP4_LAYOUT = "Et|(tt|)*30mL"


@builds_offline
def deepseek_v3():
    """DeepSeek-V3 pretrain, 1024x H100, TP2 PP8 VPP4 EP64, MTP 1, DeepEP + EP overlap.

    Base: ``deepseek_v3_pretrain_1024gpu_h100_bf16_config`` (TP2 PP16 EP64, no VPP, MTP 1,
    flex/HybridEP, ``moe_shared_expert_overlap=True``). With overlap on, the base asserts twice in
    MCore: PP>1 without VPP, and shared-expert overlap on. Changes:
    * PP16 -> 8 and **VPP None -> 4** with pipeline layout ``Et|(tt|)*30mL`` (MB's DSV3 H100
      perf layout): the interleaved schedule is the one with a combined-1F1B path;
    * ``moe_shared_expert_overlap`` True -> False: mutually exclusive with EP overlap;
    * dispatcher DeepEP via ``apply_flex_dispatcher_backend(model, "deepep")``, result checked so a
      silent alltoall fallback cannot leave shared-expert overlap in a broken state;
    * MTP stays 1 (overlap supports at most one MTP layer); delayed wgrad off;
    * ``CUDA_DEVICE_MAX_CONNECTIONS=32``. GBS 4096 / (1024 / 16) DP = 64 microbatches per step;
    * selective recompute of ``["mla_up_proj", "mlp"]`` as NVIDIA's own DeepSeek-V3 H100 perf recipe
      (``megatron.bridge.perf_recipes.deepseek.h100.deepseek_v3``, granularity ``selective``): MCore
      refuses only ``"moe"`` in ``recompute_modules`` with EP overlap (``transformer_config.py:2698``,
      rule ``moe-recompute``); the dense MLP and the MLA up projection are recomputed inside their own
      layers, and NVIDIA's GB200 / GB300 perf recipes run ``mla_up_proj`` recompute with EP overlap on.
    Needs DeepEP built on the nodes.
    """
    cfg = deepseek_v3_pretrain_1024gpu_h100_bf16_config()
    cfg.model.pipeline_model_parallel_size = 8
    cfg.model.virtual_pipeline_model_parallel_size = 4
    set_deepseek_v3_pipeline_model_parallel_layout(cfg.model, PP8_VPP4_LAYOUT)
    cfg.model.recompute_granularity = "selective"
    cfg.model.recompute_modules = ["mla_up_proj", "mlp"]
    return cfg
