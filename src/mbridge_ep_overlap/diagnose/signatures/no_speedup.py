"""No speed-up: the run trains, but EP overlap hides nothing. Read from the effective facts every
rank writes at start (``base.run_files``) and from upstream's own warnings. Every no-speed-up finding
also says what the step-time model predicted for the run's config (``diagnose.prediction``: the
plan.json beside the logs), or that no config is there."""

from __future__ import annotations

from .base import Signature


def _connections_ok(facts: dict) -> bool | None:
    """One hardware queue only matters when there is communication to overlap."""
    value = facts.get("cuda_device_max_connections")
    if not facts.get("overlap_moe_expert_parallel_comm"):
        return True
    return None if value is None else str(value) != "1"


def _microbatches_ok(facts: dict) -> bool | None:
    value = facts.get("microbatches_per_step")
    if not facts.get("overlap_moe_expert_parallel_comm"):
        return True
    return None if not isinstance(value, int) else value >= 2


def _overlap_on(facts: dict) -> bool | None:
    value = facts.get("overlap_moe_expert_parallel_comm")
    return None if value is None else bool(value) and facts.get("moe_token_dispatcher_type") in ("alltoall", "flex")


SIGNATURES = (
    Signature(
        id="cuda-device-max-connections-1", symptom="no-speedup",
        patterns=(r"CUDA_DEVICE_MAX_CONNECTIONS(=| is | ?: ?)['\"]?1\b(?!\d)",),
        cause="CUDA_DEVICE_MAX_CONNECTIONS=1 in the training processes: one hardware queue serialises the "
              "communication stream behind compute, so the all-to-all cannot overlap.",
        fix="export CUDA_DEVICE_MAX_CONNECTIONS=32 in the job (or unset it: MB sets 32 for overlap with "
            "setdefault, so a launcher's exported 1 wins)",
        source="installed:megatron/core/distributed/param_and_grad_buffer.py",
        emitted=("CUDA_DEVICE_MAX_CONNECTIONS=1",), confidence=0.8, rule="cuda-device-max-connections",
        found_by="facts", facts_pass=_connections_ok,
        facts_keys=("overlap_moe_expert_parallel_comm", "cuda_device_max_connections")),
    Signature(
        id="one-microbatch-per-rank", symptom="no-speedup", patterns=(),
        cause="One microbatch per rank per step: the combined 1F1B schedule pairs one microbatch's forward with "
              "another's backward, so with one there is nothing to overlap.",
        fix="raise train.global_batch_size (or lower micro_batch_size) to give >= 2 microbatches per rank; "
            "`plan --resolve auto` picks one",
        source="installed:megatron/core/pipeline_parallel/combined_1f1b.py", emitted=(),
        confidence=0.85, rule="microbatches", found_by="facts", facts_pass=_microbatches_ok,
        facts_keys=("overlap_moe_expert_parallel_comm", "microbatches_per_step")),
    Signature(
        id="overlap-not-active", symptom="no-speedup", patterns=(),
        cause="The process ran with EP overlap off or with a dispatcher that cannot overlap, whatever was asked.",
        fix="`verify-log` / `plan` show what the config holds; enable_ep_overlap(cfg) before training",
        source="installed:megatron/core/transformer/transformer_config.py", emitted=(),
        confidence=0.9, rule="dispatcher-type", found_by="runs", facts_pass=_overlap_on),
    Signature(
        id="overlap-gained-nothing", symptom="no-speedup", patterns=(),
        cause="The overlap run is not faster than the reference run, and the facts name no reason "
              "(overlap on, >= 2 microbatches, CUDA_DEVICE_MAX_CONNECTIONS not 1): the all-to-all may be "
              "too small a share of the step to hide.",
        fix="`plan --predict` for this config gives the step-time model's expected gain; `bench` records a "
            "profiler window on rank 0 that shows the all-to-all share of the step",
        source="installed:megatron/core/pipeline_parallel/combined_1f1b.py", emitted=(),
        confidence=0.3, generic=True, found_by="runs"),
    Signature(
        id="ncclep-dynamic-shape-serialises", symptom="no-speedup",
        patterns=(r"overlap_moe_expert_parallel_comm with ncclep and moe_ncclep_static_shape=False",),
        cause="NCCL EP with dynamic shapes does a device-to-host sync that serialises the 1F1B overlap.",
        fix="model.moe_ncclep_static_shape=true (needs the fused op on sm100+)",
        source="installed:megatron/core/transformer/transformer_config.py",
        emitted=("UserWarning: overlap_moe_expert_parallel_comm with ncclep and moe_ncclep_static_shape=False: "
                 "get_permuted_hidden_states_by_experts does a device-to-host sync that serializes the 1F1B "
                 "overlap (correct, but loses the overlap benefit). Set moe_ncclep_static_shape=True for the "
                 "overlapped path (needs the fused op on sm100+).",),
        confidence=0.85, rule="ncclep-static-shape", versions="megatron-core 0.19"),
)
