"""Overlap core: what Megatron-Core 0.19 / Megatron-Bridge 0.6.2 require of any config that turns
``overlap_moe_expert_parallel_comm`` on, plus the traps where upstream silently turns it off."""

from __future__ import annotations

from typing import Any

from ..facts import Facts, accepts_schedule_plan, feeds_packed_sequences, passes_packed_seq_params
from .. import pipeline_split
from .base import Family, Upstream, When, rule, set_to, without


def _choose_vpp(f: Facts) -> list[tuple[str, Any]]:
    """sets model.virtual_pipeline_model_parallel_size to the smallest VPP >= 2 the pipeline split accepts, or a
    layout of PP x VPP stages holding the same layers (``core.pipeline_split``)"""
    return pipeline_split.choose(f.cfg.model).edits


def _vpp_found(f: Facts) -> str:
    """The value shown: VPP as set, and what ``resolve='auto'`` would choose or every candidate it tried."""
    return f"{f.model('virtual_pipeline_model_parallel_size')} (resolve='auto': {pipeline_split.choose(f.cfg.model).words})"


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


def _provider_lacks_schedule_plan(model) -> str | None:
    """Why the model ``cfg.model`` provides has no ``build_schedule_plan`` (None: it has one).

    Only MCore's ``GPTModel`` implements it. A provider whose ``provide`` returns a wrapper (VLM,
    omni, audio), a hybrid/Mamba or non-GPT model, or a distillation pair does not (MB issues
    #4975, #5909); which class owns ``provide`` in the MRO decides, read from MB 0.6.2's providers.
    """
    from megatron.bridge.models.distillation_provider import DistillationProvider
    from megatron.bridge.models.gemma.gemma2_provider import Gemma2ModelProvider
    from megatron.bridge.models.gemma.gemma3_provider import Gemma3ModelProvider
    from megatron.bridge.models.gemma.gemma4_provider import Gemma4ModelProvider
    from megatron.bridge.models.gemma.gemma_provider import GemmaModelProvider
    from megatron.bridge.models.gpt_provider import GPTModelProvider
    from megatron.bridge.models.hybrid.hybrid_provider import HybridModelProvider
    from megatron.bridge.models.mimo_v2_flash.mimo_v2_flash_provider import MiMoV2FlashModelProvider

    returns_gpt_model = {GPTModelProvider, GemmaModelProvider, Gemma2ModelProvider, Gemma3ModelProvider,
                         Gemma4ModelProvider, MiMoV2FlashModelProvider}  # Gemma 4: see moe-layer-code-bypassed
    if isinstance(model, DistillationProvider):
        return "a distillation pair: the teacher's forward never runs in the schedule plan"
    if isinstance(model, HybridModelProvider):
        return "a hybrid/Mamba model (HybridModel)"
    if not isinstance(model, GPTModelProvider):
        return f"{type(model).__name__} does not build a GPTModel"
    owner = next(k for k in type(model).__mro__ if "provide" in k.__dict__)
    return None if owner in returns_gpt_model else f"{owner.__name__}.provide returns a wrapper around the language model"


def _bypassed_layer_code(model) -> str | None:
    """MoE layer classes whose own forward code the schedule plan never calls (it re-implements
    TransformerLayer.forward): Gemma 4's pre-shared-expert and post-FFN norms and layer scalar."""
    from megatron.bridge.models.gemma.gemma4_provider import Gemma4ModelProvider

    return "Gemma4TransformerLayer" if isinstance(model, Gemma4ModelProvider) else None


def _last_layer_is_moe(f: Facts) -> bool:
    """The plan applies the final layer norm inside the last layer's MoE combine; a dense last layer
    skips it (MCore 0.19.2 fine_grained_callables: final_layernorm only in moe_combine)."""
    freq, layers = f.model("moe_layer_freq", 1), f.model("num_layers")
    if isinstance(freq, int):
        return (layers - 1) % freq == 0
    return bool(list(freq)[-1])


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
        required="set (not None) when pipeline_model_parallel_size > 1, or a layout of more than PP stages",
        current=_vpp_found, auto_fix=_choose_vpp,
        upstream=Upstream.MCORE, upstream_match="virtual_pipeline_model_parallel_size must be specified")
def pp_needs_vpp(f: Facts) -> bool:
    """the non-interleaved pipeline schedule has no combined-1F1B path.

    Fix: set model.virtual_pipeline_model_parallel_size (num_layers divisible by PP*VPP, or a
    pipeline layout of PP*VPP stages); resolve='auto' chooses one where one exists.
    """
    return (f.model("pipeline_model_parallel_size") == 1
        or f.model("virtual_pipeline_model_parallel_size") is not None
        or (pipeline_split.implied_vpp(f.cfg.model) or 1) > 1)


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



@family("model-has-schedule-plan", When.OVERLAP, "model", required="a provider whose model is MCore's GPTModel",
        current=lambda f: _provider_lacks_schedule_plan(f.cfg.model))
def model_has_schedule_plan(f: Facts) -> bool:
    """the model has no build_schedule_plan (only MCore's GPTModel does): training fails with a
    RuntimeError at the first step, after model build and checkpoint load.

    Fix: turn EP overlap off for this model (hybrid/Mamba, VLM, omni, audio, distillation).
    """
    return _provider_lacks_schedule_plan(f.cfg.model) is None


@family("moe-layer-code-bypassed", When.OVERLAP, "model", required="a MoE layer without its own forward code",
        current=lambda f: _bypassed_layer_code(f.cfg.model))
def moe_layer_code_bypassed(f: Facts) -> bool:
    """the overlapped schedule re-implements the layer's forward and skips this model's own layer code:
    outputs are silently wrong.

    Fix: turn EP overlap off for this model.
    """
    return _bypassed_layer_code(f.cfg.model) is None


@family("last-layer-dense", When.OVERLAP, "model.moe_layer_freq", required="the last decoder layer a MoE layer",
        needs=lambda f: isinstance(f.model("num_layers"), int), current=lambda f: f.model("moe_layer_freq"))
def last_layer_dense(f: Facts) -> bool:
    """the last decoder layer is dense: the overlapped schedule applies the final layer norm only in a
    MoE layer's combine, so the output head silently reads un-normalised hidden states.

    Fix: make the last layer a MoE layer (moe_layer_freq), or turn EP overlap off.
    """
    return _last_layer_is_moe(f)


@family("packed-sequences-forward-step", When.OVERLAP, "forward_step_func",
        required="a forward step that passes packed_seq_params to build_schedule_plan (mbridge_ep_overlap.forward_step)",
        needs=lambda f: f.forward_step_func is not None and feeds_packed_sequences(f.cfg) is not None,
        current=lambda f: getattr(f.forward_step_func, "__qualname__", repr(f.forward_step_func)))
def packed_sequences_forward_step(f: Facts) -> bool:
    """with packed (THD) sequences MB 0.6.2's forward step builds the schedule plan without
    packed_seq_params: attention silently crosses sequence boundaries under overlap (fixed upstream after
    0.6.2, MB #5470).

    Fix: train with mbridge_ep_overlap.forward_step (scripts/run_script.py does), or turn overlap off.
    """
    return not feeds_packed_sequences(f.cfg) or passes_packed_seq_params(f.forward_step_func)


@family("packed-sequences-mtp", When.OVERLAP, "model.mtp_num_layers", required="0 or None with packed sequences",
        needs=lambda f: feeds_packed_sequences(f.cfg) is not None)
def packed_sequences_mtp(f: Facts) -> bool:
    """multi-token prediction with packed sequences is not supported by the overlapped schedule (MCore
    asserts at the first step; with MB's stock forward step it silently trains unpacked).

    Fix: set model.mtp_num_layers=None, or do not pack sequences, or turn overlap off.
    """
    return not feeds_packed_sequences(f.cfg) or not f.model("mtp_num_layers")


@family("inter-document-masking", When.OVERLAP, "dataset.inter_document_masking", required="False")
def inter_document_masking(f: Facts) -> bool:
    """MB 0.6.2 turns the cu_seqlens of MCore's inter-document masking into empty packed parameters,
    and the overlapped path raises nothing: attention silently crosses document boundaries.

    Fix: set dataset.inter_document_masking=False (pack with MB's offline packing instead), or turn
    overlap off.
    """
    return not getattr(getattr(f.cfg, "dataset", None), "inter_document_masking", False)


@family("hybrid-context-parallel", When.OVERLAP, "model.hybrid_context_parallel", required="False")
def hybrid_context_parallel(f: Facts) -> bool:
    """MCore picks the overlapped schedule before the hybrid-context-parallel one: that scheduler is
    silently replaced.

    Fix: set model.hybrid_context_parallel=False, or turn overlap off.
    """
    return not f.model("hybrid_context_parallel")


@family("decentralized-process-groups", When.OVERLAP, "dist.use_decentralized_pg", required="False")
def decentralized_process_groups(f: Facts) -> bool:
    """the overlapped schedule computes the loss from global parallel state, which decentralized process
    groups never initialise: training fails at the first step.

    Fix: set dist.use_decentralized_pg=False, or turn overlap off.
    """
    return not getattr(getattr(f.cfg, "dist", None), "use_decentralized_pg", False)


@family("cpu-offloading", When.OVERLAP, "model.cpu_offloading", required="False",
        auto_fix=set_to("model.cpu_offloading", False))
def cpu_offloading(f: Facts) -> bool:
    """activation CPU offloading lives in TransformerBlock.forward, which the overlapped schedule never
    calls: the memory saving asked for silently does not happen.

    Fix: set model.cpu_offloading=False (fine-grained offloading works with overlap), or turn overlap off.
    """
    return not f.model("cpu_offloading")


RULES = family.rules
