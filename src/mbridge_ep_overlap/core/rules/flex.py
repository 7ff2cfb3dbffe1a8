"""Flex dispatchers (DeepEP, HybridEP, NCCL EP): what MB's ``apply_flex_dispatcher_backend`` and
MCore require of them, and what only shows up on the GPU node (a missing package, a DeepEP built
without NVSHMEM, HybridEP's run-time compiler and topology variables). The facts themselves live
in ``core.dispatcher``; these rules only read them. A flex backend fails the same way with overlap
off, so the rules that are not about the overlapped path apply whenever the flex dispatcher is set
(``When.FLEX``), and a dispatcher that failed this node's smoke check is refused whatever the
overlap setting; the ncclep overlap-path rules apply with overlap on only."""

from __future__ import annotations

from pathlib import Path

from .. import dispatcher
from ...base.choices import FLEX_BACKENDS, NAMED_DISPATCHERS
from ...base.errors import Severity
from ..facts import Facts
from .base import Family, Upstream, When, rule, without


def _nvcc_under(cuda_home: str | None) -> bool:
    return bool(cuda_home) and Path(cuda_home, "bin", "nvcc").is_file()


def expected_hybridep_ranks(ep: int, nvlink_domain_size: int | None) -> int:
    """HybridEP's ranks per NVLink domain: the EP group, capped by the domain (8 when unknown)."""
    return min(ep, nvlink_domain_size or 8)


family = rule.family(Family.FLEX)


@family("flex-backend-set", When.FLEX, "model.moe_flex_dispatcher_backend",
        required="'deepep', 'hybridep' or 'ncclep'")
def flex_backend_set(f: Facts) -> bool:
    """the flex dispatcher has no backend; Megatron-Bridge 0.6.2 does not fall back.

    Fix: call enable_ep_overlap(cfg, dispatcher='deepep'|'hybridep'|'ncclep'|'alltoall').
    """
    return f.model("moe_flex_dispatcher_backend") in FLEX_BACKENDS


@family("flex-backend-gpu", When.FLEX, "model.moe_flex_dispatcher_backend",
        required="DeepEP: sm80/sm90/B200/B300; HybridEP: sm80/sm90/sm100; "
                "NCCL EP: sm90/sm100",
        needs=lambda f: f.env.has_gpu, current=lambda f: f"{f.flex_backend} on {f.env.gpu_name}",
        upstream=Upstream.MB_FLEX, upstream_match="is supported for")
def flex_backend_gpu(f: Facts) -> bool:
    """the flex backend does not support this GPU (apply_flex_dispatcher_backend would silently fall
    back to alltoall).

    Fix: use dispatcher='alltoall' on this GPU (GB200/GB300: 'hybridep').
    """
    return dispatcher.supports_gpu(f.flex_backend, f.env.gpu_name, f.env.compute_capability[0])


def _recipe_fallback(f: Facts) -> str:
    request = dispatcher.recipe_fell_back(f.cfg.model)
    if request is None:
        return dispatcher.current_dispatcher(f.cfg.model) or str(f.dispatcher)
    allowed = [d for d in NAMED_DISPATCHERS if not f.env.has_gpu
               or dispatcher.supports_gpu(d, f.env.gpu_name, f.env.compute_capability[0])]
    return (f"alltoall: the recipe asked for {request.backend}, Megatron-Bridge fell back on {request.gpu_name} "
            f"(the GPU allow-lists there: {', '.join(allowed)})")


@family("recipe-flex-fallback", When.ALWAYS, "model.moe_token_dispatcher_type",
        required="the flex backend the recipe asked apply_flex_dispatcher_backend for, or a dispatcher chosen "
                 "explicitly", current=_recipe_fallback)
def recipe_flex_fallback(f: Facts) -> bool:
    """the recipe called Megatron-Bridge's apply_flex_dispatcher_backend for a flex backend outside that
    GPU's allow-list, and MB silently left the dispatcher alltoall (a rank-0 warning only): the run
    would not use the dispatcher its recipe asks for.

    Fix: choose a dispatcher the target supports explicitly (--dispatcher alltoall, or another the value
    lists; API: dispatcher='alltoall'), or build the recipe for a GPU its backend supports;
    resolve='auto' accepts the fallback and records it.
    """
    return dispatcher.recipe_fell_back(f.cfg.model) is None


@family("flex-backend-importable", When.FLEX, "model.moe_flex_dispatcher_backend",
        required="deep_ep importable (with HybridEPBuffer for 'hybridep'); TE with NCCL EP for 'ncclep'",
        needs=lambda f: dispatcher.availability(f.flex_backend, f.env) is not None,
        current=lambda f: f"{f.flex_backend} (deep_ep {f.env.deep_ep_version or 'missing'})")
def flex_backend_importable(f: Facts) -> bool:
    """the flex backend's package is not installed; the model fails at construction.

    Fix: install DeepEP built for this machine (README, section DeepEP), or use
    dispatcher='alltoall'.
    """
    return dispatcher.availability(f.flex_backend, f.env) is True


@family("deepep-built-with-nvshmem", When.FLEX, "model.moe_flex_dispatcher_backend",
        required="a DeepEP built with NVSHMEM for 'deepep' (any EP size)",
        needs=lambda f: f.flex_backend != "deepep" or f.env.deep_ep_nvshmem is not None,
        current=lambda f: f"{f.flex_backend} with a DeepEP built without NVSHMEM")
def deepep_built_with_nvshmem(f: Facts) -> bool:
    """Megatron-Core 0.19 sizes every DeepEP buffer with Config.get_rdma_buffer_size_hint, which a
    DeepEP built without NVSHMEM refuses even for one node (DeepEP: "NVSHMEM is disable during
    compilation"); the first MoE layer fails.

    Fix: rebuild DeepEP with NVSHMEM (its setup.py uses NVSHMEM_DIR or the installed nvidia-nvshmem
    wheel; README section DeepEP), or use dispatcher='hybridep' / 'alltoall'.
    """
    return dispatcher.nvshmem_ok(f.flex_backend, f.env)


@family("hybridep-jit-nvcc", When.FLEX, "env_vars.CUDA_HOME",
        required="$CUDA_HOME/bin/nvcc present on the GPU node for 'hybridep'",
        needs=lambda f: f.env.source == "probed" and f.env.has_gpu,
        current=lambda f: f"CUDA_HOME={f.env_var('CUDA_HOME')}")
def hybridep_jit_nvcc(f: Facts) -> bool:
    """HybridEP JIT-compiles its dispatch/combine kernels with $CUDA_HOME/bin/nvcc at the first MoE
    layer; without it training fails there, after model setup.

    Fix: export CUDA_HOME=<CUDA toolkit root> on every node (scripts/gpu/env.sh does), or use
    dispatcher='alltoall'.
    """
    return f.flex_backend != "hybridep" or _nvcc_under(f.env_var("CUDA_HOME"))


@family("hybridep-nvlink-domain", When.FLEX, "env_vars.NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN",
        severity=Severity.WARNING, required="min(EP, NVLink domain size)",
        needs=lambda f: f.env.nvlink_domain_size is not None,
        current=lambda f: f.env_var("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"))
def hybridep_nvlink_domain(f: Facts) -> bool:
    """HybridEP's ranks-per-NVLink-domain must match the topology (performance, and sometimes
    correctness, suffer).

    Fix: export NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=min(EP, GPUs per NVLink domain).
    """
    return (f.flex_backend != "hybridep" or f.env_var("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN") in (
        None, str(expected_hybridep_ranks(f.model("expert_model_parallel_size"), f.env.nvlink_domain_size))))


@family("ncclep-expert-fc1-offload", When.OVERLAP_FLEX, "model.offload_modules",
        required="without 'expert_fc1' with the ncclep backend",
        auto_fix=lambda f: [("model.offload_modules", without(f.model("offload_modules"), "expert_fc1"))],
        upstream=Upstream.MCORE, upstream_match="ncclep does not support offloading")
def ncclep_expert_fc1_offload(f: Facts) -> bool:
    """offloading expert_fc1 makes it keep the raw bf16 input, which the ncclep overlap path frees
    eagerly.

    Fix: remove 'expert_fc1' from model.offload_modules (or turn fine_grained_activation_offloading
    off).
    """
    return (f.flex_backend != "ncclep" or not f.model("fine_grained_activation_offloading")
        or "expert_fc1" not in (f.model("offload_modules") or []))


@family("ncclep-static-shape", When.OVERLAP_FLEX, "model.moe_ncclep_static_shape", severity=Severity.WARNING,
        required="True with the ncclep backend")
def ncclep_static_shape(f: Facts) -> bool:
    """without static shapes ncclep does a device-to-host sync that serialises the overlap
    (Megatron-Core only warns).

    Fix: set model.moe_ncclep_static_shape=True (needs the fused op on sm100+).
    """
    return f.flex_backend != "ncclep" or bool(f.model("moe_ncclep_static_shape"))



@family("ncclep-capacity-factor", When.FLEX, "model.moe_expert_rank_capacity_factor",
        required="set (a float, e.g. 1.5) with the ncclep backend")
def ncclep_capacity_factor(f: Facts) -> bool:
    """NCCL EP sizes each rank's receive buffer from moe_expert_rank_capacity_factor; without it
    Megatron-Core refuses when it builds the MoE layer (finalize accepts it: MB 0.6.2's own
    gpt-oss NCCL-EP perf recipe fails there).

    Fix: set model.moe_expert_rank_capacity_factor generously (exceeding it hard-traps), or use another dispatcher.
    """
    return f.flex_backend != "ncclep" or f.model("moe_expert_rank_capacity_factor") is not None


@family("ncclep-static-shape-fused-gemm", When.FLEX, "model.use_transformer_engine_op_fuser",
        required="True, with moe_grouped_gemm, when moe_ncclep_static_shape is on")
def ncclep_static_shape_fused_gemm(f: Facts) -> bool:
    """NCCL EP's static shapes need the fused grouped GEMM over device-side expert counts (the TE op
    fuser and grouped GEMM); Megatron-Core refuses at model build.

    Fix: set model.use_transformer_engine_op_fuser=True and model.moe_grouped_gemm=True, or moe_ncclep_static_shape=False.
    """
    return (f.flex_backend != "ncclep" or not f.model("moe_ncclep_static_shape")
            or bool(f.model("use_transformer_engine_op_fuser") and f.model("moe_grouped_gemm")))



@family("dispatcher-healthy", When.ALWAYS, "model.moe_token_dispatcher_type",
        required="a dispatcher whose buffer and round trip passed this node's smoke check",
        needs=lambda f: dispatcher.health(f.dispatcher_name, f.env, _plan_env(f)) is not None,
        current=lambda f: f"{f.dispatcher_name}: {dispatcher.health(f.dispatcher_name, f.env, _plan_env(f))}")
def dispatcher_healthy(f: Facts) -> bool:
    """the dispatcher failed `mbridge-ep-overlap doctor --smoke` on this node (a crash, a hang or a
    wrong result in a two-rank dispatch/combine round trip): training would fail the same way.

    Fix: use a dispatcher the smoke check passed (the verdict names the stage and cause), or fix the node
    and run doctor --smoke again.
    """
    return dispatcher.health(f.dispatcher_name, f.env, _plan_env(f)) == "usable"


def _plan_env(f: Facts) -> dict:
    env_vars = getattr(f.cfg, "env_vars", None)
    return {k: str(v) for k, v in env_vars.items()} if isinstance(env_vars, dict) else {}


RULES = family.rules
