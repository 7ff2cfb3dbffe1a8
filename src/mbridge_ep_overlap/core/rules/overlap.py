"""Overlap core: what Megatron-Core 0.19 / Megatron-Bridge 0.6.2 require of any config that turns
``overlap_moe_expert_parallel_comm`` on, plus the traps where upstream silently turns it off."""

from __future__ import annotations

from typing import Any

from ..facts import Facts, accepts_schedule_plan
from .base import Family, Upstream, When, rule, set_to, without


def _choose_vpp(f: Facts) -> list[tuple[str, Any]]:
    """Smallest VPP >= 2 that splits the layers evenly; none when a custom layout is set."""
    if f.model("pipeline_model_parallel_layout") is not None:
        return []
    layers, pp = f.model("num_layers"), f.model("pipeline_model_parallel_size")
    for vpp in range(2, 9):
        if layers % (pp * vpp) == 0:
            return [("model.virtual_pipeline_model_parallel_size", vpp)]
    return []


_EP_FLAGS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")


def _snapshot(f: Facts):
    co = f.cfg.comm_overlap
    return getattr(co, "user_comm_overlap_cfg", None) if co is not None else None


def _snapshot_current(f: Facts) -> bool:
    co, snap = f.cfg.comm_overlap, _snapshot(f)
    return snap is None or all(getattr(co, n) is None or getattr(co, n) == getattr(snap, n) for n in _EP_FLAGS)


def _model_flag_survives_setup(f: Facts) -> bool:
    co = f.cfg.comm_overlap
    if co is None or not f.model("overlap_moe_expert_parallel_comm"):
        return True
    snap = _snapshot(f)
    return bool(getattr(snap if snap is not None else co, "overlap_moe_expert_parallel_comm"))


family = rule.family(Family.OVERLAP)


@family("ep-size", When.OVERLAP, "model.expert_model_parallel_size", required="> 1", upstream=Upstream.MCORE,
        upstream_match="only supported (when|with) expert")
def ep_size(f: Facts) -> bool:
    """EP overlap hides expert-parallel all-to-all; with EP=1 there is none.

    Fix: set model.expert_model_parallel_size to a divisor of num_moe_experts greater than 1, or
    turn overlap off.
    """
    return (f.model("expert_model_parallel_size") or 1) > 1


@family("num-experts", When.OVERLAP, "model.num_moe_experts", required="> 1", upstream=Upstream.MB_SETUP,
        upstream_match="num_moe_experts|NoneType|expert model parallel|ep_size")
def num_experts(f: Facts) -> bool:
    """EP overlap needs a MoE model.

    Fix: use a MoE model (num_moe_experts > 1) or turn overlap off.
    """
    return (f.model("num_moe_experts") or 0) > 1


@family("dispatcher-type", When.OVERLAP, "model.moe_token_dispatcher_type", required="'alltoall' or 'flex'",
        upstream=Upstream.MCORE, upstream_match="alltoall/flex token dispatcher|'alltoall' or 'flex'")
def dispatcher_type(f: Facts) -> bool:
    """the combined-1F1B schedule only splits alltoall and flex dispatchers.

    Fix: set model.moe_token_dispatcher_type='alltoall' (or call enable_ep_overlap with a
    dispatcher).
    """
    return f.dispatcher in ("alltoall", "flex")


@family("precision", When.OVERLAP, "mixed_precision", required="bf16 or fp16", current=lambda f: f.precision,
        auto_fix=set_to("mixed_precision", "bf16_mixed"), upstream=Upstream.MCORE, upstream_match="bf16 or fp16")
def precision(f: Facts) -> bool:
    """EP overlap is only implemented for bf16/fp16 models.

    Fix: set mixed_precision='bf16_mixed'.
    """
    return f.precision in ("bf16", "fp16")


@family("pp-needs-vpp", When.OVERLAP, "model.virtual_pipeline_model_parallel_size",
        required="set (not None) when pipeline_model_parallel_size > 1", auto_fix=_choose_vpp,
        upstream=Upstream.MCORE, upstream_match="virtual_pipeline_model_parallel_size must be specified")
def pp_needs_vpp(f: Facts) -> bool:
    """the non-interleaved pipeline schedule has no combined-1F1B path.

    Fix: set model.virtual_pipeline_model_parallel_size (num_layers divisible by PP*VPP, or a
    pipeline layout).
    """
    return (f.model("pipeline_model_parallel_size") == 1
        or f.model("virtual_pipeline_model_parallel_size") is not None)


@family("full-recompute", When.OVERLAP, "model.recompute_granularity", required="not 'full'",
        auto_fix=set_to("model.recompute_granularity", None), upstream=Upstream.MCORE,
        upstream_match="disable full recomputation")
def full_recompute(f: Facts) -> bool:
    """full activation recompute cannot run inside the overlapped schedule.

    Fix: set model.recompute_granularity=None (or 'selective' without 'moe').
    """
    return f.model("recompute_granularity") != "full"


def _layer_recompute_unset(name: str, message: str, upstream_match: str) -> None:
    """One rule per layer-recompute knob: each must stay None under EP overlap."""

    def check(f: Facts) -> bool:
        return f.model(name) is None

    check.__doc__ = f"{message}.\n\nFix: set model.{name}=None."
    family(name.replace("_", "-"), When.OVERLAP, f"model.{name}", required="None", auto_fix=set_to(f"model.{name}", None),
           upstream=Upstream.MCORE, upstream_match=upstream_match)(check)


_layer_recompute_unset("recompute_method", "a recompute method implies layer recompute, which EP overlap does not support",
                       "disable recomputation method|recompute_method must be")
_layer_recompute_unset("recompute_num_layers", "layer recompute is not supported with EP overlap",
                       "recompute_num_layers must be None")


@family("moe-recompute", When.OVERLAP, "model.recompute_modules", required="without 'moe'",
        auto_fix=lambda f: [("model.recompute_modules", without(f.model("recompute_modules"), "moe"))],
        upstream=Upstream.MCORE, upstream_match="disable moe in recompute_modules")
def moe_recompute(f: Facts) -> bool:
    """recomputing the whole MoE block conflicts with overlapping its dispatch/combine.

    Fix: remove 'moe' from model.recompute_modules (keep e.g. 'moe_act', 'core_attn').
    """
    return "moe" not in (f.model("recompute_modules") or [])


@family("shared-expert-overlap", When.OVERLAP, "model.moe_shared_expert_overlap", required="False",
        auto_fix=set_to("model.moe_shared_expert_overlap", False), upstream=Upstream.MCORE,
        upstream_match="disable moe_shared_expert_overlap")
def shared_expert_overlap(f: Facts) -> bool:
    """shared-expert overlap and EP overlap use the same streams and are mutually exclusive.

    Fix: set model.moe_shared_expert_overlap=False.
    """
    return not f.model("moe_shared_expert_overlap")


@family("mtp-layers", When.OVERLAP, "model.mtp_num_layers", required="None, 0 or 1",
        auto_fix=set_to("model.mtp_num_layers", 1), upstream=Upstream.MCORE,
        upstream_match="MTP supports at most one layer")
def mtp_layers(f: Facts) -> bool:
    """the overlapped schedule supports at most one multi-token-prediction layer.

    Fix: set model.mtp_num_layers to 1 (or 0/None).
    """
    return f.model("mtp_num_layers") in (None, 0, 1)


@family("cuda-graph-moe-scope", When.OVERLAP, "model.cuda_graph_scope",
        required="no 'moe' or 'mlp' module with cuda_graph_impl='transformer_engine'",
        current=lambda f: f.cuda_graph_modules,
        auto_fix=lambda f: [("model.cuda_graph_scope", [m for m in f.cuda_graph_modules if m not in ("moe", "mlp")])],
        upstream=Upstream.MCORE, upstream_match="CUDA graph scope on moe and mlp|moe cuda graph is only supported")
def cuda_graph_moe_scope(f: Facts) -> bool:
    """a CUDA graph that captures the whole MoE/MLP hides the dispatch the overlap needs to split.

    Fix: use partial graph scopes only: attn, moe_router, moe_preprocess.
    """
    return (f.model("cuda_graph_impl") != "transformer_engine"
        or not {"moe", "mlp"} & set(f.cuda_graph_modules))


@family("dispatch-backward-wgrad-exclusive", When.OVERLAP, "model.overlap_dispatch_backward_with_experts_wgrad",
        required="False", auto_fix=set_to("model.overlap_dispatch_backward_with_experts_wgrad", False),
        upstream=Upstream.MCORE,
        upstream_match="must be disabled when enabling overlap_dispatch_backward|TE version >= 2.3.0")
def dispatch_backward_wgrad_exclusive(f: Facts) -> bool:
    """overlap_dispatch_backward_with_experts_wgrad is the alternative to EP overlap, not an
    addition.

    Fix: set model.overlap_dispatch_backward_with_experts_wgrad=False.
    """
    return not f.model("overlap_dispatch_backward_with_experts_wgrad")


@family("early-attn-release-needs-overlap", When.ALWAYS, "model.ep_overlap_early_attn_memory_release",
        required="False unless EP overlap is on",
        auto_fix=set_to("model.ep_overlap_early_attn_memory_release", False), upstream=Upstream.MCORE,
        upstream_match="must be enabled when enabling ep_overlap_early_attn_memory_release")
def early_attn_release_needs_overlap(f: Facts) -> bool:
    """early attention memory release reorders the overlapped schedule's backward; without EP
    overlap there is none.

    Fix: turn EP overlap on, or set model.ep_overlap_early_attn_memory_release=False.
    """
    return not f.model("ep_overlap_early_attn_memory_release") or f.overlap


@family("model-flag-reverted", When.ALWAYS, "comm_overlap.overlap_moe_expert_parallel_comm",
        required="True when model.overlap_moe_expert_parallel_comm is True",
        auto_fix=set_to("comm_overlap.overlap_moe_expert_parallel_comm", True))
def model_flag_reverted(f: Facts) -> bool:
    """CommOverlapConfig.setup() copies its own value (None -> False) onto the model, silently
    turning overlap off.

    Fix: set cfg.comm_overlap.overlap_moe_expert_parallel_comm=True (enable_ep_overlap does).
    """
    return _model_flag_survives_setup(f)


@family("comm-overlap-snapshot-stale", When.ALWAYS, "comm_overlap.user_comm_overlap_cfg",
        required="equal to comm_overlap's public EP fields",
        current=lambda f: {n: getattr(_snapshot(f), n) for n in _EP_FLAGS},
        auto_fix=lambda f: [(f"comm_overlap.user_comm_overlap_cfg.{n}", getattr(f.cfg.comm_overlap, n))
                            for n in _EP_FLAGS if getattr(f.cfg.comm_overlap, n) is not None])
def comm_overlap_snapshot_stale(f: Facts) -> bool:
    """CommOverlapConfig.finalize() already ran; later edits of its public fields are ignored.

    Fix: edit cfg.comm_overlap.user_comm_overlap_cfg too, or call enable_ep_overlap again.
    """
    return _snapshot_current(f)


@family("forward-step-signature", When.OVERLAP, "forward_step_func", required="accepts return_schedule_plan",
        needs=lambda f: f.forward_step_func is not None,
        current=lambda f: getattr(f.forward_step_func, "__qualname__", repr(f.forward_step_func)))
def forward_step_signature(f: Facts) -> bool:
    """MCore calls forward_step_func(data_iterator, model, return_schedule_plan=True) under EP
    overlap.

    Fix: use megatron.bridge.training.gpt_step.forward_step, or add return_schedule_plan=False and
    return model.build_schedule_plan(...) when True.
    """
    return accepts_schedule_plan(f.forward_step_func)


RULES = family.rules
