"""Run Megatron-Bridge's real finalize (``runtime_config_update``) for a target.

Contract: ``finalize_for(cfg, target)`` runs MB's ``runtime_config_update(cfg)`` - inside
``simulate(target)`` for a described target (its hardware and TE faked, nothing else), as it is
on the target's own node - and returns the finalized EP-overlap fields (``summarize``). The config
is never rewritten for the dry run: what is finalized (and written as YAML) is what the cluster
runs. Our refusals propagate as ``EPOverlapError``; MB/MCore's own bare checks that no rule covers
are re-raised as ``UpstreamRefusal`` naming upstream's exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..base import sizes
from ..base.errors import EPOverlapError, UpstreamRefusal
from ..base.values import get_path, jsonable
from .cluster import ClusterEnvironment
from .simulate import on_target

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
    ("seq_length", "model.seq_length"),
    ("hidden_size", "model.hidden_size"),
    ("num_attention_heads", "model.num_attention_heads"),
    ("kv_channels", "model.kv_channels"),
    ("num_moe_experts", "model.num_moe_experts"),
    ("moe_router_topk", "model.moe_router_topk"),
    ("moe_ffn_hidden_size", "model.moe_ffn_hidden_size"),
    ("high_priority_a2a_comm_stream", "model.high_priority_a2a_comm_stream"),
)


@dataclass
class FinalizeResult:
    summary: dict[str, Any]

    def lines(self) -> list[str]:
        return [f"{k}: {v}" for k, v in self.summary.items()]


def summarize(cfg: Any, exported: dict[str, str] | None = None) -> dict[str, Any]:
    """The finalized EP-overlap fields of ``cfg`` as JSON-safe values (what dry runs print and
    ``evidence.RunRecorder`` records); ``CUDA_DEVICE_MAX_CONNECTIONS`` as the run gets it - the job's
    ``exported`` value wins over ``cfg.env_vars`` (MB sets only what is not exported)."""
    out = {name: get_path(cfg, path) for name, path in SUMMARY_FIELDS}
    mbs = sizes.num_microbatches(out["global_batch_size"], out["micro_batch_size"], out["data_parallel_size"])
    if mbs is not None:
        out["num_microbatches"] = mbs
    out["CUDA_DEVICE_MAX_CONNECTIONS"] = ((exported or {}).get("CUDA_DEVICE_MAX_CONNECTIONS")
                                          or (cfg.env_vars or {}).get("CUDA_DEVICE_MAX_CONNECTIONS"))
    return {k: jsonable(v) for k, v in out.items()}


def finalize_for(cfg: Any, env: ClusterEnvironment) -> FinalizeResult:
    from megatron.bridge.training.config import runtime_config_update

    try:
        with on_target(env):
            runtime_config_update(cfg)
    except EPOverlapError:
        raise
    except (AssertionError, ValueError, TypeError, ZeroDivisionError, AttributeError, RuntimeError) as e:
        raise UpstreamRefusal(e) from e  # MB/MCore's own bare checks
    return FinalizeResult(summarize(cfg, env.env_vars))
