"""The EP-overlap rule table: one constraint, one row.

Contract
--------
``RULES`` lists every constraint Megatron-Core 0.19 (``TransformerConfig.__post_init__``) and
Megatron-Bridge 0.6.2 (``CommOverlapConfig`` setup, flex-dispatcher validation) place on
``overlap_moe_expert_parallel_comm`` and ``delay_wgrad_compute``, plus the checks nobody upstream
makes (microbatch count, forward-step signature, ``CUDA_DEVICE_MAX_CONNECTIONS``, TE for delayed
wgrad, DeepEP importability, silently reverted flags). Each row says when it applies, what it
checks, what is required, the fix, and which upstream check it mirrors (``upstream`` and the
fragment of upstream's own message, used by the parity tests so a row cannot drift from MCore).

A row whose facts are unknown (no GPU described, TE on the target unknown, no world size, no
forward step given) is skipped and reported by ``check_ep_overlap`` as not checked. A row may
carry ``auto_fix``: what ``enable_ep_overlap(..., resolve="auto")`` does about it; rows without
one can only be fixed by the user. The engine (``check.py``) only iterates this table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from packaging.version import Version

from .dispatcher import backend_supports_gpu
from .errors import Severity
from .facts import Facts, accepts_schedule_plan, get_path

Fix = Callable[[Facts], list[tuple[str, Any]]]

MCORE = "megatron-core 0.19 TransformerConfig.__post_init__"
MB_SETUP = "megatron-bridge 0.6.2 CommOverlapConfig.setup"
MB_FLEX = "megatron-bridge 0.6.2 validate_flex_dispatcher_backend"
OURS = ""  # no upstream check: these are the silent failures this library exists to catch

# When a row applies.
OVERLAP = "overlap on"
DELAY = "delayed wgrad on"
OVERLAP_FLEX = "overlap on with the flex dispatcher"
ALWAYS = "always"



@dataclass(frozen=True)
class Rule:
    id: str
    when: str
    field: str
    required: str
    message: str
    fix: str
    ok: Callable[[Facts], bool]
    severity: Severity = Severity.ERROR
    upstream: str = OURS
    upstream_match: str = ""  # regex fragment of upstream's message (parity tests)
    needs: Callable[[Facts], bool] = lambda f: True  # False => facts unknown, not checked
    current: Callable[[Facts], Any] | None = None
    auto_fix: Fix | None = None
    since: str = ""  # upstream version that introduced the check, where it matters

    def applies(self, facts: Facts) -> bool:
        if self.when == ALWAYS:
            return True
        if self.when == DELAY:
            return facts.delay_wgrad
        if self.when == OVERLAP_FLEX:
            return facts.overlap and facts.dispatcher == "flex"
        return facts.overlap

    def value(self, facts: Facts) -> Any:
        return self.current(facts) if self.current else get_path(facts.cfg, self.field)


def _set(path: str, value: Any) -> Fix:
    return lambda facts: [(path, value)]


def _ver_at_least(version: str | None, minimum: str) -> bool:
    try:
        return Version(version) >= Version(minimum)
    except Exception:
        return False


def _te_at_least(minimum: str) -> Callable[[Facts], bool]:
    return lambda f: bool(f.te_usable) and _ver_at_least(f.env.te_version, minimum)


def _te_known(f: Facts) -> bool:
    return f.te_usable is not None


def _wgrad_in_graph_scope(f: Facts) -> bool:
    modules = f.cuda_graph_modules()
    return "attn" in modules or (
        "moe_router" in modules
        and f.model("moe_shared_expert_intermediate_size") is not None
        and not f.model("moe_shared_expert_overlap")
    )


def _delay_off() -> Fix:
    return _set("comm_overlap.delay_wgrad_compute", False)


def _to_alltoall(f: Facts) -> list[tuple[str, Any]]:
    return [("model.moe_token_dispatcher_type", "alltoall"), ("model.moe_flex_dispatcher_backend", None)]


def _choose_vpp(f: Facts) -> list[tuple[str, Any]]:
    """Smallest VPP >= 2 that splits the layers evenly; none when a custom layout is set."""
    if f.model("pipeline_model_parallel_layout") is not None:
        return []
    layers, pp = f.model("num_layers"), f.model("pipeline_model_parallel_size")
    for vpp in range(2, 9):
        if layers % (pp * vpp) == 0:
            return [("model.virtual_pipeline_model_parallel_size", vpp)]
    return []


def _flex_gpu_ok(f: Facts) -> bool:
    return backend_supports_gpu(f.flex_backend, f.env.gpu_name, f.env.compute_capability[0])


def _flex_importable(f: Facts) -> bool:
    if f.flex_backend == "deepep":
        return bool(f.env.deep_ep_version)
    if f.flex_backend == "hybridep":
        return bool(f.env.deep_ep_version) and bool(f.env.hybrid_ep_available)
    return True


def _expected_hybridep_ranks(f: Facts) -> int:
    return min(f.model("expert_model_parallel_size"), f.env.nvlink_domain_size or 8)


def _snapshot_differs(name: str) -> Callable[[Facts], bool]:
    def ok(f: Facts) -> bool:
        co = f.cfg.comm_overlap
        snap = getattr(co, "user_comm_overlap_cfg", None) if co is not None else None
        return snap is None or getattr(co, name) is None or getattr(co, name) == getattr(snap, name)

    return ok


def _model_only_flag_ok(name: str) -> Callable[[Facts], bool]:
    def ok(f: Facts) -> bool:
        co = f.cfg.comm_overlap
        if co is None or not f.model(name):
            return True
        snap = getattr(co, "user_comm_overlap_cfg", None)
        return bool(getattr(snap if snap is not None else co, name))

    return ok


RULES: tuple[Rule, ...] = (
    # ---- mirrored from Megatron-Core / Megatron-Bridge: EP overlap on -------------------------
    Rule(
        id="ep-size",
        when=OVERLAP,
        field="model.expert_model_parallel_size",
        required="> 1",
        message="EP overlap hides expert-parallel all-to-all; with EP=1 there is none",
        fix="set model.expert_model_parallel_size to a divisor of num_moe_experts greater than 1, or turn overlap off",
        ok=lambda f: (f.model("expert_model_parallel_size") or 1) > 1,
        upstream=MCORE,
        upstream_match="only supported (when|with) expert",
    ),
    Rule(
        id="num-experts",
        when=OVERLAP,
        field="model.num_moe_experts",
        required="> 1",
        message="EP overlap needs a MoE model",
        fix="use a MoE model (num_moe_experts > 1) or turn overlap off",
        ok=lambda f: (f.model("num_moe_experts") or 0) > 1,
        upstream=MB_SETUP,
        upstream_match="num_moe_experts|NoneType|expert model parallel|ep_size",
    ),
    Rule(
        id="dispatcher-type",
        when=OVERLAP,
        field="model.moe_token_dispatcher_type",
        required="'alltoall' or 'flex'",
        message="the combined-1F1B schedule only splits alltoall and flex dispatchers",
        fix="set model.moe_token_dispatcher_type='alltoall' (or call enable_ep_overlap with a dispatcher)",
        ok=lambda f: f.dispatcher in ("alltoall", "flex"),
        upstream=MCORE,
        upstream_match="alltoall/flex token dispatcher|'alltoall' or 'flex'",
        auto_fix=_to_alltoall,
    ),
    Rule(
        id="precision",
        when=OVERLAP,
        field="mixed_precision",
        required="bf16 or fp16",
        message="EP overlap is only implemented for bf16/fp16 models",
        fix="set mixed_precision='bf16_mixed'",
        ok=lambda f: f.precision in ("bf16", "fp16"),
        current=lambda f: f.precision,
        upstream=MCORE,
        upstream_match="bf16 or fp16",
        auto_fix=_set("mixed_precision", "bf16_mixed"),
    ),
    Rule(
        id="torch-version",
        when=OVERLAP,
        field="environment.torch_version",
        required=">= 2.6.0",
        message="EP overlap hangs with torch < 2.6.0",
        fix="upgrade PyTorch to 2.6 or newer",
        ok=lambda f: _ver_at_least(f.env.torch_version, "2.6.0"),
        needs=lambda f: f.env.torch_version is not None,
        current=lambda f: f.env.torch_version,
        upstream=MCORE,
        upstream_match="hang issue with torch version",
    ),
    Rule(
        id="pp-needs-vpp",
        when=OVERLAP,
        field="model.virtual_pipeline_model_parallel_size",
        required="set (not None) when pipeline_model_parallel_size > 1",
        message="the non-interleaved pipeline schedule has no combined-1F1B path",
        fix="set model.virtual_pipeline_model_parallel_size (num_layers divisible by PP*VPP, or a pipeline layout)",
        ok=lambda f: f.model("pipeline_model_parallel_size") == 1
        or f.model("virtual_pipeline_model_parallel_size") is not None,
        upstream=MCORE,
        upstream_match="virtual_pipeline_model_parallel_size must be specified",
        auto_fix=_choose_vpp,
    ),
    Rule(
        id="full-recompute",
        when=OVERLAP,
        field="model.recompute_granularity",
        required="not 'full'",
        message="full activation recompute cannot run inside the overlapped schedule",
        fix="set model.recompute_granularity=None (or 'selective' without 'moe')",
        ok=lambda f: f.model("recompute_granularity") != "full",
        upstream=MCORE,
        upstream_match="disable full recomputation",
        auto_fix=_set("model.recompute_granularity", None),
    ),
    Rule(
        id="recompute-method",
        when=OVERLAP,
        field="model.recompute_method",
        required="None",
        message="a recompute method implies layer recompute, which EP overlap does not support",
        fix="set model.recompute_method=None",
        ok=lambda f: f.model("recompute_method") is None,
        upstream=MCORE,
        upstream_match="disable recomputation method|recompute_method must be",
        auto_fix=_set("model.recompute_method", None),
    ),
    Rule(
        id="recompute-num-layers",
        when=OVERLAP,
        field="model.recompute_num_layers",
        required="None",
        message="layer recompute is not supported with EP overlap",
        fix="set model.recompute_num_layers=None",
        ok=lambda f: f.model("recompute_num_layers") is None,
        upstream=MCORE,
        upstream_match="recompute_num_layers must be None",
        auto_fix=_set("model.recompute_num_layers", None),
    ),
    Rule(
        id="moe-recompute",
        when=OVERLAP,
        field="model.recompute_modules",
        required="without 'moe'",
        message="recomputing the whole MoE block conflicts with overlapping its dispatch/combine",
        fix="remove 'moe' from model.recompute_modules (keep e.g. 'moe_act', 'core_attn')",
        ok=lambda f: "moe" not in (f.model("recompute_modules") or []),
        upstream=MCORE,
        upstream_match="disable moe in recompute_modules",
        since="megatron-core 0.17",
        auto_fix=lambda f: [("model.recompute_modules", [m for m in f.model("recompute_modules") if m != "moe"])],
    ),
    Rule(
        id="shared-expert-overlap",
        when=OVERLAP,
        field="model.moe_shared_expert_overlap",
        required="False",
        message="shared-expert overlap and EP overlap use the same streams and are mutually exclusive",
        fix="set model.moe_shared_expert_overlap=False",
        ok=lambda f: not f.model("moe_shared_expert_overlap"),
        upstream=MCORE,
        upstream_match="disable moe_shared_expert_overlap",
        auto_fix=_set("model.moe_shared_expert_overlap", False),
    ),
    Rule(
        id="mtp-layers",
        when=OVERLAP,
        field="model.mtp_num_layers",
        required="None, 0 or 1",
        message="the overlapped schedule supports at most one multi-token-prediction layer",
        fix="set model.mtp_num_layers to 1 (or 0/None)",
        ok=lambda f: f.model("mtp_num_layers") in (None, 0, 1),
        upstream=MCORE,
        upstream_match="MTP supports at most one layer",
        auto_fix=_set("model.mtp_num_layers", 1),
    ),
    Rule(
        id="cuda-graph-moe-scope",
        when=OVERLAP,
        field="model.cuda_graph_scope",
        required="no 'moe' or 'mlp' module with cuda_graph_impl='transformer_engine'",
        message="a CUDA graph that captures the whole MoE/MLP hides the dispatch the overlap needs to split",
        fix="use partial graph scopes only: attn, moe_router, moe_preprocess",
        ok=lambda f: f.model("cuda_graph_impl") != "transformer_engine"
        or not {"moe", "mlp"} & set(f.cuda_graph_modules()),
        current=lambda f: f.cuda_graph_modules(),
        upstream=MCORE,
        upstream_match="CUDA graph scope on moe and mlp|moe cuda graph is only supported",
        auto_fix=lambda f: [
            ("model.cuda_graph_scope", [m for m in f.cuda_graph_modules() if m not in ("moe", "mlp")])
        ],
    ),
    Rule(
        id="dispatch-backward-wgrad-exclusive",
        when=OVERLAP,
        field="model.overlap_dispatch_backward_with_experts_wgrad",
        required="False",
        message="overlap_dispatch_backward_with_experts_wgrad is the alternative to EP overlap, not an addition",
        fix="set model.overlap_dispatch_backward_with_experts_wgrad=False",
        ok=lambda f: not f.model("overlap_dispatch_backward_with_experts_wgrad"),
        upstream=MCORE,
        upstream_match="must be disabled when enabling overlap_dispatch_backward|TE version >= 2.3.0",
        auto_fix=_set("model.overlap_dispatch_backward_with_experts_wgrad", False),
    ),
    # ---- mirrored: delayed weight-gradient compute --------------------------------------------
    Rule(
        id="delay-wgrad-needs-overlap",
        when=DELAY,
        field="comm_overlap.overlap_moe_expert_parallel_comm",
        required="True when delay_wgrad_compute is on",
        message="delayed wgrad only has something to overlap inside the EP-overlap schedule",
        fix="turn EP overlap on, or set comm_overlap.delay_wgrad_compute=False",
        ok=lambda f: f.overlap,
        current=lambda f: f.overlap,
        upstream=MB_SETUP,
        upstream_match="overlap_moe_expert_parallel_comm (is required for|must be enabled when enabling) delay_wgrad",
        auto_fix=_delay_off(),
    ),
    Rule(
        id="delay-wgrad-needs-te",
        when=DELAY,
        field="model.transformer_impl",
        required="'transformer_engine' with Transformer Engine installed",
        message="local (non-TE) linear layers implement backward_dw() as a no-op, so delayed wgrad silently does nothing",
        fix="install Transformer Engine and use the TE layer spec, or set comm_overlap.delay_wgrad_compute=False",
        ok=lambda f: bool(f.te_usable) and f.model("transformer_impl") == "transformer_engine",
        needs=_te_known,
        current=lambda f: f"{f.model('transformer_impl')} (TE {f.env.te_version or 'missing'})",
        auto_fix=_delay_off(),
    ),
    Rule(
        id="delay-wgrad-te-grad-reduce",
        when=DELAY,
        field="ddp.overlap_grad_reduce",
        required="TE >= 2.7.0 when overlap_grad_reduce is on",
        message="delayed wgrad with overlapped gradient reduce needs TE 2.7",
        fix="upgrade Transformer Engine to >= 2.7.0, or set ddp.overlap_grad_reduce=False",
        ok=lambda f: not (get_path(f.cfg, "ddp.overlap_grad_reduce") or get_path(f.cfg, "comm_overlap.overlap_grad_reduce"))
        or _te_at_least("2.7.0")(f),
        needs=_te_known,
        upstream=MB_SETUP,
        upstream_match="TE version >= 2.7.0 is required for overlap_grad_reduce",
        auto_fix=_delay_off(),
    ),
    Rule(
        id="delay-wgrad-te-grad-accum-fusion",
        when=DELAY,
        field="model.gradient_accumulation_fusion",
        required="TE >= 2.7.0 when gradient_accumulation_fusion is on",
        message="delayed wgrad with fused gradient accumulation needs TE 2.7",
        fix="upgrade Transformer Engine to >= 2.7.0, or set model.gradient_accumulation_fusion=False",
        ok=lambda f: f.model("gradient_accumulation_fusion") is not True or _te_at_least("2.7.0")(f),
        needs=_te_known,
        upstream=MB_SETUP,
        upstream_match="TE version >= 2.7.0 is required for gradient_accumulation_fusion",
        auto_fix=_delay_off(),
    ),
    Rule(
        id="delay-wgrad-te-partial-graph",
        when=DELAY,
        field="model.cuda_graph_impl",
        required="TE >= 2.10.0 with cuda_graph_impl='transformer_engine'",
        message="delayed wgrad inside TE CUDA graphs needs TE 2.10",
        fix="upgrade Transformer Engine to >= 2.10.0, or set model.cuda_graph_impl='none'",
        ok=lambda f: f.model("cuda_graph_impl") != "transformer_engine" or _te_at_least("2.10.0")(f),
        needs=_te_known,
        upstream=MCORE,
        upstream_match="TE version >= 2.10.0 is required for delay_wgrad_compute",
        auto_fix=_delay_off(),
    ),
    Rule(
        id="delay-wgrad-graph-te",
        when=DELAY,
        field="model.cuda_graph_scope",
        required="TE >= 2.12.0 when an attn (or shared-expert moe_router) graph holds weight gradients",
        message="graphed weight-gradient GEMMs with delayed wgrad need TE 2.12",
        fix="upgrade Transformer Engine to >= 2.12.0, or drop the 'attn' graph scope",
        ok=lambda f: not _wgrad_in_graph_scope(f) or _te_at_least("2.12.0")(f),
        needs=_te_known,
        current=lambda f: f.cuda_graph_modules(),
        upstream=MB_SETUP,
        upstream_match="CUDA graph with delay_wgrad_compute requires TE version >= 2.12.0",
        auto_fix=_delay_off(),
    ),
    Rule(
        id="delay-wgrad-graph-grad-accum-fusion",
        when=DELAY,
        field="model.gradient_accumulation_fusion",
        required="True when weight gradients are inside a CUDA graph",
        message="default gradient accumulation has no static addresses, which CUDA graphs need",
        fix="set model.gradient_accumulation_fusion=True",
        ok=lambda f: not _wgrad_in_graph_scope(f) or bool(f.model("gradient_accumulation_fusion")),
        upstream=MB_SETUP,
        upstream_match="requires gradient_accumulation_fusion",
        auto_fix=_set("model.gradient_accumulation_fusion", True),
    ),
    Rule(
        id="delay-wgrad-graph-attn-bias",
        when=DELAY,
        field="model.add_bias_linear",
        required="False (and add_qkv_bias False) with an 'attn' CUDA graph",
        message="graphed attention with delayed wgrad does not support attention bias",
        fix="set model.add_bias_linear=False and model.add_qkv_bias=False, or drop the 'attn' graph scope",
        ok=lambda f: "attn" not in f.cuda_graph_modules()
        or not (f.model("add_bias_linear") or f.model("add_qkv_bias")),
        upstream=MB_SETUP,
        upstream_match="does not support attention bias",
        auto_fix=_delay_off(),
    ),
    # ---- flex dispatcher (DeepEP / HybridEP) ----------------------------------------------------
    Rule(
        id="flex-backend-set",
        when=OVERLAP_FLEX,
        field="model.moe_flex_dispatcher_backend",
        required="'deepep' or 'hybridep'",
        message="the flex dispatcher has no backend; Megatron-Bridge 0.6.2 does not fall back",
        fix="call enable_ep_overlap(cfg, dispatcher='deepep'|'hybridep'|'alltoall')",
        ok=lambda f: f.model("moe_flex_dispatcher_backend") in ("deepep", "hybridep", "ncclep"),
        auto_fix=_to_alltoall,
    ),
    Rule(
        id="flex-backend-gpu",
        when=OVERLAP_FLEX,
        field="model.moe_flex_dispatcher_backend",
        required="DeepEP: sm80/sm90/B200/B300; HybridEP: sm80/sm90/sm100",
        message="the flex backend does not support this GPU (apply_flex_dispatcher_backend would silently fall back to alltoall)",
        fix="use dispatcher='alltoall' on this GPU (GB200/GB300: 'hybridep')",
        ok=_flex_gpu_ok,
        needs=lambda f: f.env.has_gpu,
        current=lambda f: f"{f.flex_backend} on {f.env.gpu_name}",
        upstream=MB_FLEX,
        upstream_match="is supported for",
        auto_fix=_to_alltoall,
    ),
    Rule(
        id="flex-backend-importable",
        when=OVERLAP_FLEX,
        field="model.moe_flex_dispatcher_backend",
        required="deep_ep importable (with HybridEPBuffer for 'hybridep')",
        message="the flex backend's package is not installed; the model fails at construction",
        fix="install DeepEP built for this machine (README, section DeepEP), or use dispatcher='alltoall'",
        ok=_flex_importable,
        needs=lambda f: f.env.deep_ep_version is not None,
        current=lambda f: f"{f.flex_backend} (deep_ep {f.env.deep_ep_version or 'missing'})",
        auto_fix=_to_alltoall,
    ),
    Rule(
        id="hybridep-nvlink-domain",
        when=OVERLAP_FLEX,
        field="env_vars.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN",
        required="min(EP, NVLink domain size)",
        message="HybridEP's ranks-per-NVLink-domain must match the topology (performance, and sometimes correctness, suffer)",
        fix="export NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=min(EP, GPUs per NVLink domain)",
        ok=lambda f: f.flex_backend != "hybridep"
        or f.env_var("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN") in (None, str(_expected_hybridep_ranks(f))),
        severity=Severity.WARNING,
        needs=lambda f: f.env.nvlink_domain_size is not None,
        current=lambda f: f.env_var("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"),
    ),
    # ---- traps nobody upstream checks -----------------------------------------------------------
    Rule(
        id="model-flag-reverted",
        when=ALWAYS,
        field="comm_overlap.overlap_moe_expert_parallel_comm",
        required="True when model.overlap_moe_expert_parallel_comm is True",
        message="CommOverlapConfig.setup() copies its own value (None -> False) onto the model, silently turning overlap off",
        fix="set cfg.comm_overlap.overlap_moe_expert_parallel_comm=True (enable_ep_overlap does)",
        ok=_model_only_flag_ok("overlap_moe_expert_parallel_comm"),
        auto_fix=_set("comm_overlap.overlap_moe_expert_parallel_comm", True),
    ),
    Rule(
        id="comm-overlap-snapshot-stale",
        when=ALWAYS,
        field="comm_overlap.user_comm_overlap_cfg",
        required="equal to comm_overlap's public EP fields",
        message="CommOverlapConfig.finalize() already ran; later edits of its public fields are ignored",
        fix="edit cfg.comm_overlap.user_comm_overlap_cfg too, or call enable_ep_overlap again",
        ok=lambda f: _snapshot_differs("overlap_moe_expert_parallel_comm")(f)
        and _snapshot_differs("delay_wgrad_compute")(f),
        current=lambda f: {
            n: getattr(f.cfg.comm_overlap.user_comm_overlap_cfg, n)
            for n in ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")
        },
        auto_fix=lambda f: [
            (f"comm_overlap.user_comm_overlap_cfg.{n}", getattr(f.cfg.comm_overlap, n))
            for n in ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")
            if getattr(f.cfg.comm_overlap, n) is not None
        ],
    ),
    Rule(
        id="microbatches",
        when=OVERLAP,
        field="train.global_batch_size",
        required=">= 2 microbatches per step (global_batch_size / (micro_batch_size * DP))",
        message="with one microbatch the combined-1F1B loop is empty: the step runs, nothing overlaps",
        fix="raise train.global_batch_size or lower train.micro_batch_size so each DP rank gets >= 2 microbatches",
        ok=lambda f: f.num_microbatches >= 2,
        severity=Severity.WARNING,
        needs=lambda f: f.num_microbatches is not None,
        current=lambda f: f"{f.num_microbatches} microbatch(es)",
    ),
    Rule(
        id="forward-step-signature",
        when=OVERLAP,
        field="forward_step_func",
        required="accepts return_schedule_plan",
        message="MCore calls forward_step_func(data_iterator, model, return_schedule_plan=True) under EP overlap",
        fix="use megatron.bridge.training.gpt_step.forward_step, or add return_schedule_plan=False and return model.build_schedule_plan(...) when True",
        ok=lambda f: accepts_schedule_plan(f.forward_step_func),
        needs=lambda f: f.forward_step_func is not None,
        current=lambda f: getattr(f.forward_step_func, "__qualname__", repr(f.forward_step_func)),
    ),
    Rule(
        id="cuda-device-max-connections",
        when=OVERLAP,
        field="env_vars.CUDA_DEVICE_MAX_CONNECTIONS",
        required="> 1 (32 recommended)",
        message="CUDA_DEVICE_MAX_CONNECTIONS=1 serialises the all-to-all stream behind compute (about half the gain lost)",
        fix="export CUDA_DEVICE_MAX_CONNECTIONS=32 before the process starts (a launcher value wins over cfg.env_vars)",
        ok=lambda f: f.env_var("CUDA_DEVICE_MAX_CONNECTIONS") != "1",
        severity=Severity.WARNING,
        current=lambda f: f.env_var("CUDA_DEVICE_MAX_CONNECTIONS"),
    ),
    Rule(
        id="tested-versions",
        when=OVERLAP,
        field="environment.mcore_version",
        required="megatron-core 0.19.2 with megatron-bridge 0.6.2",
        message="these rules mirror the tested pair; other versions may check differently",
        fix="install megatron-core==0.19.2 and megatron-bridge==0.6.2",
        ok=lambda f: (f.env.mcore_version, f.env.mb_version) == ("0.19.2", "0.6.2"),
        severity=Severity.WARNING,
        needs=lambda f: bool(f.env.mcore_version),
        current=lambda f: f"megatron-core {f.env.mcore_version}, megatron-bridge {f.env.mb_version}",
    ),
    Rule(
        id="small-ep-alltoall",
        when=OVERLAP,
        field="model.expert_model_parallel_size",
        required="EP > 4, or more than 2 nodes, or a flex dispatcher",
        message="with EP <= 4 over alltoall on <= 2 nodes the all-to-all is cheap; overlap measured 0.88-0.97x on NVLink",
        fix="benchmark before keeping it (mbridge-ep-overlap bench); MB docs advise against overlap here",
        ok=lambda f: f.dispatcher != "alltoall"
        or f.model("expert_model_parallel_size") > 4
        or (f.env.num_nodes or 1) > 2,
        severity=Severity.ADVICE,
    ),
)

RULES_BY_ID: dict[str, Rule] = {r.id: r for r in RULES}
assert len(RULES_BY_ID) == len(RULES), "rule ids must be unique"  # a programming error, not user input
