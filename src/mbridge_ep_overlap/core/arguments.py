"""What a caller hands the library, checked before anything reads it.

Contract: ``require_config(cfg)`` accepts a Megatron-Bridge ``ConfigContainer`` whose sections EP
overlap edits or reads have their types, else raises ``UsageError`` naming the section;
``require_target(environment)`` accepts a ``ClusterEnvironment`` or None. ``enable``, ``engine``
and ``spec`` call these (a leaf of ``core``: it imports no other module of ``core``). Megatron is
imported only inside ``require_config`` (start-up speed).
"""

from __future__ import annotations

from typing import Any

from ..base.errors import UsageError
from ..target.cluster import ClusterEnvironment


def require_config(cfg: Any) -> None:
    """A Megatron-Bridge ConfigContainer whose sections EP overlap edits or reads have their types,
    or UsageError naming the section (not an AttributeError deep inside): ``cfg.train = None`` is
    the same usage error as ``cfg.model = None``. Values inside the sections are the value rules'
    business (``rules.values``, checked before any edit)."""
    from megatron.bridge.training.comm_overlap import CommOverlapConfig
    from megatron.bridge.training.config import ConfigContainer
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.training.config import DistributedInitConfig, SchedulerConfig, TrainingConfig

    if not isinstance(cfg, ConfigContainer):
        raise UsageError("config", type(cfg).__name__, "a Megatron-Bridge ConfigContainer (what an MB recipe returns)",
                         "invalid")
    sections = (("model", TransformerConfig, "a model provider (a TransformerConfig, e.g. GPTModelProvider)"),
                ("comm_overlap", (CommOverlapConfig, type(None)), "a CommOverlapConfig or None"),
                # the sections every ConfigContainer has, which the rules and MB's finalize read unguarded
                ("train", TrainingConfig, "a TrainingConfig"), ("optimizer", OptimizerConfig, "an OptimizerConfig"),
                ("ddp", DistributedDataParallelConfig, "a DistributedDataParallelConfig"),
                ("dist", DistributedInitConfig, "a DistributedInitConfig"),
                ("scheduler", SchedulerConfig, "a SchedulerConfig"))
    for name, kind, allowed in sections:
        value = getattr(cfg, name, None)
        if not isinstance(value, kind):
            plain = isinstance(value, (str, float, type(None))) or (isinstance(value, int) and value.bit_length() <= 64)
            shown = value if plain else type(value).__name__
            raise UsageError(f"config section cfg.{name}", shown, allowed, "invalid")


def require_target(environment: Any) -> None:
    if environment is not None and not isinstance(environment, ClusterEnvironment):
        raise UsageError("environment", environment,
                         "a ClusterEnvironment from describe(gpu, num_gpus) or probe(), or None for this machine",
                         "invalid")
