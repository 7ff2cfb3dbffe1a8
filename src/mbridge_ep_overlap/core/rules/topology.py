"""Topology and batch: the GPUs must split into whole replicas and expert groups, the global batch
into whole microbatches, and the overlapped schedule needs at least two microbatches to pair."""

from __future__ import annotations

from typing import Any

from ...base.errors import Severity
from ..facts import Facts
from .base import Family, Upstream, When, rule

family = rule.family(Family.TOPOLOGY)


@family("world-size-divisible", When.ALWAYS, "environment.world_size",
        required="divisible by tensor x pipeline x context parallel size",
        needs=lambda f: f.world_size is not None and f.model_parallel_size is not None,
        current=lambda f: f"{f.world_size} GPUs for TP*PP*CP = {f.model_parallel_size}",
        upstream=Upstream.MB_SETUP, upstream_match="is not divisible by total_model_size")
def world_size_divisible(f: Facts) -> bool:
    """the GPUs cannot be split into whole data-parallel replicas.

    Fix: change the number of GPUs or the TP/PP/CP sizes so that world size % (TP*PP*CP) == 0.
    """
    return f.world_size % f.model_parallel_size == 0


@family("expert-world-divisible", When.ALWAYS, "model.expert_model_parallel_size",
        required="world size divisible by EP x ETP x PP",
        needs=lambda f: f.world_size is not None and f.expert_group_size is not None,
        current=lambda f: f"{f.world_size} GPUs for EP*ETP*PP = {f.expert_group_size}")
def expert_world_divisible(f: Facts) -> bool:
    """the GPUs cannot be split into whole expert-parallel groups (finalize accepts it; model-parallel
    init fails on the cluster).

    Fix: pick EP so that world size % (EP*ETP*PP) == 0.
    """
    return f.world_size % f.expert_group_size == 0


@family("global-batch-divisible", When.ALWAYS, "train.global_batch_size",
        required="divisible by micro_batch_size x data-parallel size",
        needs=lambda f: f.data_parallel_size is not None and isinstance(f.train("global_batch_size"), int)
        and isinstance(f.train("micro_batch_size"), int) and f.train("micro_batch_size") > 0,
        current=lambda f: f"{f.train('global_batch_size')} for micro batch {f.train('micro_batch_size')} x DP "
        f"{f.data_parallel_size}",
        upstream=Upstream.MB_SETUP, upstream_match="must be divisible by")
def global_batch_divisible(f: Facts) -> bool:
    """the global batch cannot be split into whole microbatches per data-parallel rank.

    Fix: set train.global_batch_size to a multiple of micro_batch_size * DP.
    """
    return f.num_microbatches is not None


def two_microbatches(f: Facts) -> list[tuple[str, Any]]:
    """sets train.global_batch_size to 2 x micro_batch_size x DP: the smallest multiple of
    micro_batch_size x DP that gives every data-parallel rank two microbatches"""
    return [("train.global_batch_size", 2 * f.train("micro_batch_size") * f.data_parallel_size)]


@family("microbatches", When.OVERLAP, "train.global_batch_size", severity=Severity.WARNING,
        required=">= 2 microbatches per step (global_batch_size / (micro_batch_size * DP))",
        needs=lambda f: f.num_microbatches is not None, current=lambda f: f"{f.num_microbatches} microbatch(es)",
        auto_fix=two_microbatches)
def microbatches(f: Facts) -> bool:
    """with one microbatch the combined-1F1B loop is empty: the step runs, nothing overlaps.

    Fix: raise train.global_batch_size or lower train.micro_batch_size so each DP rank gets >= 2 microbatches
    (resolve='auto' sets global_batch_size to 2 x micro_batch_size x DP).
    """
    return f.num_microbatches >= 2


RULES = family.rules
