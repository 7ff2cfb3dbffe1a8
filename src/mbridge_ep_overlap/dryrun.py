"""Run Megatron-Bridge's real finalize (``runtime_config_update``) for a described cluster.

Contract: ``finalize_for(cfg, env)`` runs MB's ``runtime_config_update(cfg)`` with only the
hardware faked (``environment.simulate``: GPU properties and world size) and returns the
finalized EP-overlap fields. When Transformer Engine is not installed on *this* machine and the
config uses TE-only features, those are switched off first (``te_compat.without_te``) and every
such change is returned, so the user sees exactly what differs from a run on the real cluster;
EP-overlap fields are never touched by that step. Errors from finalize propagate unchanged
(ours are ``EPOverlapError``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .environment import ClusterEnvironment, simulate
from .te_compat import real_te_available, without_te

SUMMARY_FIELDS = (
    ("overlap_moe_expert_parallel_comm", "model.overlap_moe_expert_parallel_comm"),
    ("delay_wgrad_compute", "model.delay_wgrad_compute"),
    ("moe_token_dispatcher_type", "model.moe_token_dispatcher_type"),
    ("moe_flex_dispatcher_backend", "model.moe_flex_dispatcher_backend"),
    ("moe_shared_expert_overlap", "model.moe_shared_expert_overlap"),
    ("tensor_model_parallel_size", "model.tensor_model_parallel_size"),
    ("pipeline_model_parallel_size", "model.pipeline_model_parallel_size"),
    ("virtual_pipeline_model_parallel_size", "model.virtual_pipeline_model_parallel_size"),
    ("context_parallel_size", "model.context_parallel_size"),
    ("expert_model_parallel_size", "model.expert_model_parallel_size"),
    ("expert_tensor_parallel_size", "model.expert_tensor_parallel_size"),
    ("data_parallel_size", "comm_overlap.data_parallel_size"),
    ("global_batch_size", "train.global_batch_size"),
    ("micro_batch_size", "train.micro_batch_size"),
    ("bf16", "model.bf16"),
)


@dataclass
class FinalizeResult:
    summary: dict[str, Any]
    te_adaptations: list[tuple[str, Any, Any]] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"{k}: {v}" for k, v in self.summary.items()]


def summarize(cfg: Any) -> dict[str, Any]:
    from .facts import get_path

    out = {name: get_path(cfg, path) for name, path in SUMMARY_FIELDS}
    dp = out.get("data_parallel_size")
    if dp and out["global_batch_size"] and out["micro_batch_size"]:
        out["num_microbatches"] = out["global_batch_size"] // (out["micro_batch_size"] * dp)
    out["CUDA_DEVICE_MAX_CONNECTIONS"] = (cfg.env_vars or {}).get("CUDA_DEVICE_MAX_CONNECTIONS")
    return out


def finalize_for(cfg: Any, env: ClusterEnvironment, *, adapt_missing_te: bool = True) -> FinalizeResult:
    from megatron.bridge.training.config import runtime_config_update

    adaptations = without_te(cfg) if adapt_missing_te and not real_te_available() else []
    with simulate(env):
        runtime_config_update(cfg)
    return FinalizeResult(summarize(cfg), adaptations)
