"""Runnable EP-overlap recipes (installed as ``mbridge_ep_overlap_recipes``).

Each recipe is a plain zero-argument function returning a Megatron-Bridge ``ConfigContainer``
(the MB base recipe plus the changes its docstring lists). ``REGISTRY`` below is the explicit
list of them: the cluster each is written for and the EP-overlap choices ``build`` applies. It is
published to the library through the entry-point group ``mbridge_ep_overlap.recipes``
(pyproject.toml), so the library never imports this package by name and a user's own package can
publish recipes the same way. Importing this module imports no recipe module (no Megatron).
"""

from mbridge_ep_overlap.spec import RecipeEntry

_ROWS = (  # name, module:function, GPU, GPUs, dispatcher, summary
    ("qwen3_moe_proxy", "proxy:qwen3_moe_proxy", "h200", 2, "alltoall",
     "Small Qwen3-MoE proxy, 2x H200, EP=2, alltoall (default recipe; runs without TE)"),
    ("qwen3_moe_proxy_te", "proxy:qwen3_moe_proxy_te", "h200", 2, "alltoall",
     "The proxy on Transformer Engine layers (TE attention, grouped-GEMM experts, fusions); needs TE"),
    ("qwen3_moe_proxy_packed", "packed:qwen3_moe_proxy_packed", "h200", 2, "alltoall",
     "The TE proxy on packed (THD) sequences from a synthetic packed dataset; needs TE"),
    ("qwen3_30b_a3b", "qwen3:qwen3_30b_a3b", "h100", 16, "alltoall",
     "Qwen3-30B-A3B pretrain, 16x H100, TP1 PP1 EP16, alltoall + EP overlap"),
    ("qwen3_30b_a3b_hybridep", "qwen3:qwen3_30b_a3b_hybridep", "h100", 16, "hybridep",
     "Qwen3-30B-A3B pretrain, 16x H100, TP1 PP1 EP16, flex/HybridEP + EP overlap"),
    ("qwen3_235b_a22b", "qwen3:qwen3_235b_a22b", "h100", 256, "alltoall",
     "Qwen3-235B-A22B pretrain, 256x H100, TP2 PP8 VPP4 EP32, alltoall + EP overlap"),
    ("deepseek_v3", "deepseek:deepseek_v3", "h100", 1024, "deepep",
     "DeepSeek-V3 pretrain, 1024x H100, TP2 PP8 VPP4 EP64, MTP 1, DeepEP + EP overlap"),
)
REGISTRY = {
    name: RecipeEntry(function=f"{__name__}.{function}", gpu=gpu, num_gpus=gpus, dispatcher=dispatcher, summary=summary)
    for name, function, gpu, gpus, dispatcher, summary in _ROWS
}
