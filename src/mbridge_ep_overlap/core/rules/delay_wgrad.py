"""Delayed weight-gradient compute (``delay_wgrad_compute``): it only exists inside the overlapped
schedule, only with Transformer Engine layers, and TE minimum versions gate its combinations."""

from __future__ import annotations

from ..facts import Facts, get_path
from .base import Family, Upstream, When, rule, set_to, te_at_least, te_known

_DELAY_OFF = set_to("comm_overlap.delay_wgrad_compute", False)


def _wgrad_in_graph_scope(f: Facts) -> bool:
    modules = f.cuda_graph_modules
    return ("attn" in modules or (
        "moe_router" in modules
        and f.model("moe_shared_expert_intermediate_size") is not None
        and not f.model("moe_shared_expert_overlap")
        ))


def _grad_reduce_overlapped(f: Facts) -> bool:
    return bool(get_path(f.cfg, "ddp.overlap_grad_reduce") or get_path(f.cfg, "comm_overlap.overlap_grad_reduce"))


family = rule.family(Family.DELAY_WGRAD)


@family("delay-wgrad-needs-overlap", When.DELAY_WGRAD, "comm_overlap.overlap_moe_expert_parallel_comm",
        required="True when delay_wgrad_compute is on", current=lambda f: f.overlap, auto_fix=_DELAY_OFF,
        upstream=Upstream.MB_SETUP,
        upstream_match="overlap_moe_expert_parallel_comm (is required for|must be enabled when enabling) delay_wgrad")
def delay_wgrad_needs_overlap(f: Facts) -> bool:
    """delayed wgrad only has something to overlap inside the EP-overlap schedule.

    Fix: turn EP overlap on, or set comm_overlap.delay_wgrad_compute=False.
    """
    return f.overlap


@family("delay-wgrad-needs-te", When.DELAY_WGRAD, "model.transformer_impl",
        required="'transformer_engine' with Transformer Engine installed", needs=te_known,
        current=lambda f: f"{f.model('transformer_impl')} (TE {f.env.te_version or 'missing'})",
        auto_fix=_DELAY_OFF)
def delay_wgrad_needs_te(f: Facts) -> bool:
    """local (non-TE) linear layers implement backward_dw() as a no-op, so delayed wgrad silently
    does nothing.

    Fix: install Transformer Engine and use the TE layer spec, or set
    comm_overlap.delay_wgrad_compute=False.
    """
    return bool(f.te_usable) and f.model("transformer_impl") == "transformer_engine"


@family("delay-wgrad-te-grad-reduce", When.DELAY_WGRAD, "ddp.overlap_grad_reduce",
        required="TE >= 2.7.0 when overlap_grad_reduce is on", needs=te_known, auto_fix=_DELAY_OFF,
        upstream=Upstream.MB_SETUP, upstream_match="TE version >= 2.7.0 is required for overlap_grad_reduce")
def delay_wgrad_te_grad_reduce(f: Facts) -> bool:
    """delayed wgrad with overlapped gradient reduce needs TE 2.7.

    Fix: upgrade Transformer Engine to >= 2.7.0, or set ddp.overlap_grad_reduce=False.
    """
    return not _grad_reduce_overlapped(f) or te_at_least("2.7.0")(f)


@family("delay-wgrad-te-grad-accum-fusion", When.DELAY_WGRAD, "model.gradient_accumulation_fusion",
        required="TE >= 2.7.0 when gradient_accumulation_fusion is on", needs=te_known, auto_fix=_DELAY_OFF,
        upstream=Upstream.MB_SETUP,
        upstream_match="TE version >= 2.7.0 is required for gradient_accumulation_fusion")
def delay_wgrad_te_grad_accum_fusion(f: Facts) -> bool:
    """delayed wgrad with fused gradient accumulation needs TE 2.7.

    Fix: upgrade Transformer Engine to >= 2.7.0, or set model.gradient_accumulation_fusion=False.
    """
    return f.model("gradient_accumulation_fusion") is not True or te_at_least("2.7.0")(f)


@family("delay-wgrad-te-partial-graph", When.DELAY_WGRAD, "model.cuda_graph_impl",
        required="TE >= 2.10.0 with cuda_graph_impl='transformer_engine'", needs=te_known, auto_fix=_DELAY_OFF,
        upstream=Upstream.MCORE, upstream_match="TE version >= 2.10.0 is required for delay_wgrad_compute")
def delay_wgrad_te_partial_graph(f: Facts) -> bool:
    """delayed wgrad inside TE CUDA graphs needs TE 2.10.

    Fix: upgrade Transformer Engine to >= 2.10.0, or set model.cuda_graph_impl='none'.
    """
    return f.model("cuda_graph_impl") != "transformer_engine" or te_at_least("2.10.0")(f)


@family("delay-wgrad-graph-te", When.DELAY_WGRAD, "model.cuda_graph_scope",
        required="TE >= 2.12.0 when an attn (or shared-expert moe_router) graph holds weight gradients",
        needs=te_known, current=lambda f: f.cuda_graph_modules, auto_fix=_DELAY_OFF, upstream=Upstream.MB_SETUP,
        upstream_match="CUDA graph with delay_wgrad_compute requires TE version >= 2.12.0")
def delay_wgrad_graph_te(f: Facts) -> bool:
    """graphed weight-gradient GEMMs with delayed wgrad need TE 2.12.

    Fix: upgrade Transformer Engine to >= 2.12.0, or drop the 'attn' graph scope.
    """
    return not _wgrad_in_graph_scope(f) or te_at_least("2.12.0")(f)


@family("delay-wgrad-graph-grad-accum-fusion", When.DELAY_WGRAD, "model.gradient_accumulation_fusion",
        required="True when weight gradients are inside a CUDA graph",
        auto_fix=set_to("model.gradient_accumulation_fusion", True), upstream=Upstream.MB_SETUP,
        upstream_match="requires gradient_accumulation_fusion")
def delay_wgrad_graph_grad_accum_fusion(f: Facts) -> bool:
    """default gradient accumulation has no static addresses, which CUDA graphs need.

    Fix: set model.gradient_accumulation_fusion=True.
    """
    return not _wgrad_in_graph_scope(f) or bool(f.model("gradient_accumulation_fusion"))


@family("delay-wgrad-graph-attn-bias", When.DELAY_WGRAD, "model.add_bias_linear",
        required="False (and add_qkv_bias False) with an 'attn' CUDA graph", auto_fix=_DELAY_OFF,
        upstream=Upstream.MB_SETUP, upstream_match="does not support attention bias")
def delay_wgrad_graph_attn_bias(f: Facts) -> bool:
    """graphed attention with delayed wgrad does not support attention bias.

    Fix: set model.add_bias_linear=False and model.add_qkv_bias=False, or drop the 'attn' graph
    scope.
    """
    return ("attn" not in f.cuda_graph_modules
        or not (f.model("add_bias_linear") or f.model("add_qkv_bias")))


RULES = family.rules
