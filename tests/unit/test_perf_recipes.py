"""NVIDIA's own MoE performance recipes (megatron.bridge.perf_recipes), judged on their own cluster.

Every MoE recipe function of MB 0.6.2's perf_recipes is built for the GPU type and count its module
path and name say (``<family>.<gpu>.<module>:<..._<N>gpu_...>``), with the reference software stack
(TE 2.18.0), exactly as ``mbridge-ep-overlap plan --recipe MODULE:FUNCTION`` builds it. Those that
enable EP overlap must be accepted, or refused naming the rule (or upstream check) listed in
``EXPECTED`` - each one a config that really fails on the cluster, with where it fails. Recipes
whose architecture file is neither shipped nor in the hub cache are skipped with that reason.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
import typing

import pytest

from mbridge_ep_overlap.core.provenance import Source
from mbridge_ep_overlap import EPOverlapError, RunSpec, UpstreamRefusal, UsageError, build
from mbridge_ep_overlap.pipeline import finalize
from mbridge_ep_overlap.spec import TargetSpec

HF_CONFIG_DIR = os.environ.get("EP_OVERLAP_HF_CONFIG_DIR")  # more architecture files (not needed in CI)
MOE_FAMILIES = ("deepseek", "glm_moe_dsa", "gpt_oss", "kimi", "nemotronh", "qwen", "qwen_vl")
ROOT = "megatron.bridge.perf_recipes"

# recipe function -> (how it is refused, what names it, where it fails on the cluster)
EXPECTED = {
    # MCore TransformerConfig.__post_init__ (transformer_config.py:1974): the layout "Et*4|(tttt|)*14tmL"
    # has 16 stages, PP4 x VPP4, while the recipe sets VPP 2.
    "deepseek_v3_pretrain_256gpu_gb200_fp8mx_partial_cg_dev_config": (
        UpstreamRefusal, "virtual_pipeline_model_parallel_size conflicts with pipeline_model_parallel_layout"),
    "deepseek_v3_pretrain_256gpu_gb300_fp8mx_partial_cg_dev_config": (
        UpstreamRefusal, "virtual_pipeline_model_parallel_size conflicts with pipeline_model_parallel_layout"),
    # Predicted 257.7 GiB per GPU with overlap on (237.6 off) of B200's 180: unlike every other Qwen3-235B
    # B200 recipe it leaves bias_activation_fusion off, and MCore's unfused SwiGLU keeps three more
    # ffn-wide tensors per routed token (docs/prediction.md "Memory per GPU"). MCore would refuse it
    # anyway at transformer_config.py:1631 (moe_hybridep_num_sms=16 from the base recipe plus
    # moe_deepep_num_sms=20), after the memory rule.
    "qwen3_235b_a22b_pretrain_128gpu_b200_fp8mx_deepep_dev_config": (EPOverlapError, "fits-in-gpu-memory"),
}
# EP x ETP x PP larger than the world: MB's finalize accepts them; MCore's
# parallel_state.initialize_model_parallel raises at job start (shown below, on CPU).
for _name in ("qwen3_235b_a22b_pretrain_64gpu_gb200_fp8mx_config", "qwen3_235b_a22b_pretrain_64gpu_gb200_nvfp4_full_iteration_config",
              "qwen3_235b_a22b_pretrain_64gpu_gb300_fp8mx_config", "qwen3_235b_a22b_pretrain_64gpu_gb300_nvfp4_full_iteration_config",
              "deepseek_v3_pretrain_128gpu_vr200_fp8mx_config"):
    EXPECTED[_name] = (EPOverlapError, "expert-world-divisible")
# MCore turns the NCCL-EP buffer into a ValueError at model build without a capacity factor
# (moe/token_dispatcher.py:1563, _NCCLEPManager); MB's comment says it needs none.
EXPECTED["gpt_oss_120b_pretrain_64gpu_gb200_bf16_ncclep_config"] = (EPOverlapError, "ncclep-capacity-factor")
NO_SCHEDULE_PLAN = "model-has-schedule-plan"  # every qwen_vl recipe: its VLM wrapper model has none


def mcore_finds_no_schedule_plan(provider) -> None:
    """What MCore's combined-1F1B step does at the first step (combined_1f1b.py: get_attr_wrapped_model
    on the model the provider builds): the VLM wrapper class has no build_schedule_plan."""
    from megatron.core.utils import get_attr_wrapped_model

    owner = next(k for k in type(provider).__mro__ if "provide" in k.__dict__)
    model_class = typing.get_type_hints(owner.provide)["return"]
    get_attr_wrapped_model(object.__new__(model_class), "build_schedule_plan")


def mcore_expert_grid_check(model, world_size: int) -> None:
    """Megatron-Core's own expert-grid check at job start (parallel_state.initialize_model_parallel),
    run on CPU with only torch.distributed's world faked: it raises before creating any group."""
    from unittest import mock

    import torch
    from megatron.core import parallel_state

    def no_groups(*args, **kwargs):
        raise AssertionError("the expert-grid check passed: a process group was about to be created")

    with mock.patch.object(torch.distributed, "is_initialized", lambda: True), \
            mock.patch.object(torch.distributed, "get_world_size", lambda *a, **k: world_size), \
            mock.patch.object(torch.distributed, "get_rank", lambda *a, **k: 0), \
            mock.patch.object(torch.distributed, "new_group", no_groups):
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=model.tensor_model_parallel_size,
            pipeline_model_parallel_size=model.pipeline_model_parallel_size,
            context_parallel_size=model.context_parallel_size,
            expert_model_parallel_size=model.expert_model_parallel_size,
            expert_tensor_parallel_size=model.expert_tensor_parallel_size)


def _moe_recipe_functions() -> list[str]:
    from mbridge_ep_overlap.target import shims

    shims.install()
    names = []
    for family in MOE_FAMILIES:
        package = importlib.import_module(f"{ROOT}.{family}")
        for info in pkgutil.walk_packages(package.__path__, f"{ROOT}.{family}."):
            if info.ispkg or info.name.rsplit(".", 1)[-1] == "common":
                continue
            module = importlib.import_module(info.name)
            names += [f"{info.name}:{n}" for n, fn in vars(module).items()
                      if n.endswith("_config") and inspect.isfunction(fn) and fn.__module__ == info.name
                      and not inspect.signature(fn).parameters]
    return sorted(names)


RECIPES = _moe_recipe_functions()


def _target(name: str) -> TargetSpec:
    gpu = name.split(":")[0].split(".")[-2]
    num = int(re.search(r"_(\d+)gpus?_", name).group(1))
    return TargetSpec(gpu=gpu, num_gpus=num)


def test_the_recipes_are_found():
    assert len(RECIPES) > 250 and any("deepseek_v3_pretrain_256gpu_gb200_fp8mx_config" in r for r in RECIPES)


@pytest.mark.parametrize("name", RECIPES, ids=[r.split(".", 3)[-1] for r in RECIPES])
def test_overlap_recipe_verdict_on_its_own_cluster(name):
    from mbridge_ep_overlap.spec import resolve_recipe
    from mbridge_ep_overlap.target.cluster import describe
    from mbridge_ep_overlap.target.simulate import simulate

    target = _target(name)
    try:
        with simulate(describe(target.gpu, target.num_gpus)):
            cfg = resolve_recipe(name).config(HF_CONFIG_DIR)
    except UsageError as e:  # an architecture file not shipped, or MB 0.6.2's missing nemotronh/te_quant.cfg
        pytest.skip(f"cannot be built here: {e}")
    if not (cfg.comm_overlap and cfg.comm_overlap.overlap_moe_expert_parallel_comm):
        pytest.skip("does not enable EP overlap")
    function = name.split(":")[1]
    spec = RunSpec(recipe=name, target=target, hf_config_dir=HF_CONFIG_DIR)
    if ".qwen_vl." in name:
        with pytest.raises(EPOverlapError, match=NO_SCHEDULE_PLAN):
            build(spec)
        with pytest.raises(RuntimeError, match="couldn't find attribute build_schedule_plan"):
            mcore_finds_no_schedule_plan(cfg.model)
        return
    if function in EXPECTED:
        kind, needle = EXPECTED[function]
        with pytest.raises(kind, match=re.escape(needle)):
            finalize(build(spec))
        if needle == "expert-world-divisible":  # what the cluster would do
            with pytest.raises(RuntimeError, match="is not divisible by expert_tensor_model_pipeline_parallel size"):
                mcore_expert_grid_check(cfg.model, target.num_gpus)
        return
    built = build(spec)  # refused by a rule: EPOverlapError names it (add it to EXPECTED if it is right)
    assert built.plan.dispatcher_source is Source.RECIPE
    assert built.plan.delay_wgrad == bool(cfg.comm_overlap.delay_wgrad_compute)
    summary = finalize(built).summary
    assert summary["overlap_moe_expert_parallel_comm"] is True
    assert summary["moe_token_dispatcher_type"] == cfg.model.moe_token_dispatcher_type
    assert built.cfg.model.transformer_impl == "transformer_engine"  # never rewritten for the dry run


# ---- every MoE recipe three ways: its own dispatcher, --dispatcher alltoall, overlap off ----------------
WAYS = {"own": {}, "alltoall": {"dispatcher": "alltoall"}, "off": {"ep_overlap": False}}
ON = ("own", "alltoall")
# Every refusal that is a real one: (recipe function pattern or a test of the recipe's config, ways, what
# refuses, why it is real). A
# refusal a recipe gets that no row allows fails the test - above all recipe-flex-fallback, which an
# H100 base recipe's DeepEP request MB fell back from must not raise once the GB200/GB300 recipe has
# set its own dispatcher.
REAL_REFUSALS = [
    (r"^nemotronh_56b_", ON, {"ep-size", "num-experts"}, "a dense hybrid model: no experts, nothing to overlap"),
    (r"^nemotron", ON, {"model-has-schedule-plan"},
     "MCore's hybrid (Mamba) model has no build_schedule_plan: the overlapped schedule cannot run it"),
    (r"^nemotron_3_5_lightning_", ON, {"mtp-layers"}, "multi-token prediction layers are not overlapped by MCore 0.19"),
    (r"^nemotron_3(_5_lightning|_nano)_pretrain_16gpu_h100_", ON, {"moe-recompute"},
     "recomputing MoE layers is refused by MCore's overlapped schedule"),
    (r"^nemotronh_56b_pretrain_256gpu_(b200|gb300)_bf16_", tuple(WAYS), {"global-batch-divisible"},
     "the global batch is not a multiple of micro batch x data-parallel size on 256 GPUs"),
    (r"^(qwen3_235b_a22b_pretrain_64gpu_gb[23]00_(fp8mx|fp8cs|nvfp4|bf16)|deepseek_v3_pretrain_(64gpu_h100|128gpu_vr200))",
     tuple(WAYS), {"expert-world-divisible"},
     "EP x ETP x PP exceeds the world: MCore's initialize_model_parallel raises at job start"),
    (r"^(deepseek_v3_pretrain_256gpu_b200_(bf16|fp8cs|fp8mx_large_scale)|qwen3_235b_a22b_pretrain_(256|64)gpu_"
     r"|gpt_oss_120b_pretrain_64gpu_h100_)", ON,
     {"pp-needs-vpp"}, "pipeline parallelism without a virtual pipeline: MCore's combined 1F1B needs interleaving"),
    (r"_partial_cg_dev_config$", tuple(WAYS),
     {"upstream: virtual_pipeline_model_parallel_size conflicts with pipeline_model_parallel_layout"},
     "the recipe's layout has 16 stages (PP4 x VPP4) but it sets VPP 2"),
    (r"_deepep_dev_config$", tuple(WAYS), {"upstream: Conflicting deprecated SM-count knobs"},
     "the base recipe sets moe_hybridep_num_sms, this one adds moe_deepep_num_sms"),
    (r"^qwen3_235b_a22b_pretrain_128gpu_b200_fp8mx_deepep_dev_config$", tuple(WAYS), {"fits-in-gpu-memory"},
     "predicted 257.7 GiB per GPU with overlap on, 237.6 off, of 180: the unfused SwiGLU (bias_activation_fusion "
     "off, unlike the other B200 recipes) at micro batch 3 with PP4 x VPP2 warm-up"),
    (lambda cfg: cfg.model.moe_paged_stash, ("alltoall",), {"upstream: moe_expert_rank_capacity_factor requires"},
     "moe_paged_stash needs a per-rank capacity factor, which MCore accepts only with hybridep or ncclep"),
    (r"^gpt_oss_20b_", tuple(WAYS),
     {"upstream: --data-cache-path must be provided when using --dataloader-fast-cache-load"},
     "the GPT-OSS 20B perf recipes set dataset.fast_cache_load (perf_recipes/gpt_oss/common.py) and no "
     "data_cache_path: MB's finalize asserts until the launch passes one"),
    (r"^gpt_oss_20b_pretrain_8gpu_vr200_fp8mx_config$", ON, {"ep-size"},
     "EP 1: there is no expert-parallel all-to-all to overlap"),
    (r"_ncclep_config$", ("own", "off"), {"ncclep-capacity-factor"},
     "MCore's NCCL-EP buffer needs a capacity factor at model build (moe/token_dispatcher.py:1563), whatever "
     "the overlap"),
    (r"^qwen3_30b_a3b_pretrain_16gpu_gb200_fp8mx_paged_stash_dev_config$", ("own",),
     {"upstream: moe_expert_rank_capacity_factor"}, "MCore refuses the recipe's capacity factor as the recipe sets it"),
]


def _refusals(spec: RunSpec) -> set[str]:
    try:
        finalize(build(spec))
    except EPOverlapError as e:
        return {v.rule_id for v in e.violations if v.severity.name == "ERROR"}
    except UpstreamRefusal as e:
        return {f"upstream: {str(e)}"}
    return set()


def _allowed(function: str, cfg, way: str) -> tuple[set[str], list[str]]:
    allowed, why = set(), []
    for when, ways, refusals, reason in REAL_REFUSALS:
        if way in ways and (when(cfg) if callable(when) else re.search(when, function)):
            allowed |= refusals
            why.append(reason)
    return allowed, why


def _is_allowed(refusal: str, allowed: set[str]) -> bool:
    return refusal in allowed or (refusal.startswith("upstream: ")
                                  and any(a.startswith("upstream: ") and a[10:] in refusal for a in allowed))


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("name", [r for r in RECIPES if ".qwen_vl." not in r],
                         ids=[r.split(".", 3)[-1] for r in RECIPES if ".qwen_vl." not in r])
def test_no_false_refusal_three_ways(name, way):
    from mbridge_ep_overlap.spec import resolve_recipe
    from mbridge_ep_overlap.target.cluster import describe
    from mbridge_ep_overlap.target.simulate import simulate

    target = _target(name)
    try:
        with simulate(describe(target.gpu, target.num_gpus)):
            cfg = resolve_recipe(name).config(HF_CONFIG_DIR)
    except UsageError as e:
        pytest.skip(f"cannot be built here: {e}")
    refusals = _refusals(RunSpec(recipe=name, target=target, hf_config_dir=HF_CONFIG_DIR, **WAYS[way]))
    assert "recipe-flex-fallback" not in refusals
    allowed, _ = _allowed(name.split(":")[1], cfg, way)
    assert [r for r in refusals if not _is_allowed(r, allowed)] == []


def test_gb300_qwen3_recipes_are_not_refused_for_the_base_recipes_deepep_request():
    """The reported case: the H100 base recipe asks apply_flex_dispatcher_backend for DeepEP (MB falls
    back on GB300), then the GB300 recipe sets flex/HybridEP itself; alltoall chosen now is no fallback."""
    from mbridge_ep_overlap.core.dispatcher import recipe_request
    from mbridge_ep_overlap.spec import resolve_recipe
    from mbridge_ep_overlap.target.cluster import describe
    from mbridge_ep_overlap.target.simulate import simulate

    name = f"{ROOT}.qwen.gb300.qwen3_moe:qwen3_30b_a3b_pretrain_8gpu_gb300_bf16_config"
    with simulate(describe("gb300", 8)):
        cfg = resolve_recipe(name).config()
    assert (cfg.model.moe_token_dispatcher_type, cfg.model.moe_flex_dispatcher_backend) == ("flex", "hybridep")
    assert recipe_request(cfg.model) is None  # the base recipe's DeepEP request is no longer in force
    for way in WAYS.values():
        assert _refusals(RunSpec(recipe=name, target=TargetSpec(gpu="gb300", num_gpus=8), **way)) == set()


def test_every_real_refusal_row_names_a_recipe():
    functions = [r.split(":")[1] for r in RECIPES]
    stale = [when for when, *_ in REAL_REFUSALS if isinstance(when, str) and not any(re.search(when, f) for f in functions)]
    assert stale == []
