"""Read a Megatron-Bridge ``ConfigContainer`` the way its finalize will interpret it.

Contract
--------
``Facts`` derives every value the rules read, once per evaluation (each fact is computed on first
use and cached), *before* MB finalizes the config, so that a check made early agrees with what
``runtime_config_update`` will do later:

* the overlap / delayed-wgrad flags come from ``cfg.comm_overlap`` when it exists (its resolved
  value is copied onto the model at setup, overwriting a model-only setting), from the frozen
  ``user_comm_overlap_cfg`` snapshot once ``finalize()`` ran, else from the model;
* precision comes from ``cfg.mixed_precision`` (a recipe's ``"bf16_mixed"`` string is resolved
  with MB's own table); ``model.bf16`` is only consulted when no mixed precision is set;
* environment variables resolve as MB applies them: the launcher's value wins over
  ``cfg.env_vars`` (MB uses ``os.environ.setdefault``);
* world size comes from the target, else ``WORLD_SIZE``; every derived size from ``base.sizes``.

It never mutates the config. ``get_path`` / ``set_path`` are the dotted-path accessors the
engine, ``enable`` and the plan share.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

from ..target.cluster import ClusterEnvironment
from ..base import sizes
from ..base.values import get_path, set_path  # noqa: F401 - the config paths every rule reads, re-exported


def _comm_overlap_flag(cfg: Any, name: str) -> bool:
    co = getattr(cfg, "comm_overlap", None)
    if co is None:
        return bool(getattr(cfg.model, name, False))
    snapshot = getattr(co, "user_comm_overlap_cfg", None)
    value = getattr(snapshot if snapshot is not None else co, name, None)
    return bool(value)  # MB resolves None to False and then writes it onto the model


def resolve_precision(cfg: Any) -> str:
    """"bf16", "fp16" or "fp32" as the model will be after MB applies mixed precision."""
    mp = getattr(cfg, "mixed_precision", None)
    if isinstance(mp, str):
        from megatron.bridge.training.mixed_precision import get_mixed_precision_config

        mp = get_mixed_precision_config(mp)
    source = mp if mp is not None else cfg.model
    if getattr(source, "bf16", False):
        return "bf16"
    if getattr(source, "fp16", False):
        return "fp16"
    return "fp32"


# Set to True on a forward-step function that hands the schedule plan every input the normal path
# gets (packed-sequence parameters included): ``core.forward_step.forward_step`` is one.
PASSES_PACKED_SEQ_PARAMS = "__ep_overlap_passes_packed_seq_params__"


def passes_packed_seq_params(func: Callable | None) -> bool:
    return bool(getattr(func, PASSES_PACKED_SEQ_PARAMS, False))


def feeds_packed_sequences(cfg: Any) -> bool | None:
    """Whether MB 0.6.2 will feed packed (THD) batches, as its own ``_uses_packed_sequence_metadata``
    decides; None when a custom dataset provider may or may not emit ``cu_seqlens``."""
    ds = getattr(cfg, "dataset", None)
    if ds is None:
        return False
    if getattr(ds, "enable_offline_packing", False):
        size = getattr(getattr(ds, "offline_packing_specs", None), "packed_sequence_size", None)
        return size is None or size > 0  # as MB 0.6.2's _uses_packed_sequence_metadata
    if getattr(ds, "enable_in_batch_packing", False) or getattr(ds, "inter_document_masking", False):
        return True
    from megatron.bridge.data.base import DatasetProvider

    return None if isinstance(ds, DatasetProvider) else False


def accepts_schedule_plan(func: Callable) -> bool:
    """Whether a forward-step function can serve MCore's combined-1F1B schedule."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return "return_schedule_plan" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


@dataclass
class Facts:
    cfg: Any
    env: ClusterEnvironment
    forward_step_func: Callable | None = None

    def model(self, name: str, default: Any = None) -> Any:
        return getattr(self.cfg.model, name, default)

    def train(self, name: str) -> Any:
        return getattr(getattr(self.cfg, "train", None), name, None)

    @cached_property
    def overlap(self) -> bool:
        return _comm_overlap_flag(self.cfg, "overlap_moe_expert_parallel_comm")

    @cached_property
    def delay_wgrad(self) -> bool:
        return _comm_overlap_flag(self.cfg, "delay_wgrad_compute")

    @cached_property
    def precision(self) -> str:
        return resolve_precision(self.cfg)

    @property
    def dispatcher(self) -> str:
        return self.model("moe_token_dispatcher_type")

    @property
    def flex_backend(self) -> str | None:
        return self.model("moe_flex_dispatcher_backend") if self.dispatcher == "flex" else None

    @property
    def dispatcher_name(self) -> str:
        """The user-facing dispatcher: 'alltoall', a flex backend name, or MCore's type as is."""
        return self.flex_backend or self.dispatcher

    def env_var(self, name: str) -> str | None:
        """The value the training process will see: launcher/described env first, then cfg.env_vars."""
        if name in self.env.env_vars:
            return str(self.env.env_vars[name])
        if self.env.source == "probed" and name in os.environ:
            return os.environ[name]
        env_vars = getattr(self.cfg, "env_vars", None)
        value = env_vars.get(name) if isinstance(env_vars, dict) else None
        return None if value is None else str(value)

    @cached_property
    def world_size(self) -> int | None:
        if self.env.world_size:
            return self.env.world_size
        ws = os.environ.get("WORLD_SIZE", "")
        return int(ws) if ws.isdigit() and int(ws) > 0 else None

    @cached_property
    def model_parallel_size(self) -> int | None:
        return sizes.model_parallel_size(self.model("tensor_model_parallel_size"),
                                         self.model("pipeline_model_parallel_size"), self.model("context_parallel_size"))

    @cached_property
    def expert_group_size(self) -> int | None:
        return sizes.expert_group_size(self.model("expert_model_parallel_size"),
                                       self.model("expert_tensor_parallel_size"),
                                       self.model("pipeline_model_parallel_size"))

    @cached_property
    def data_parallel_size(self) -> int | None:
        return sizes.data_parallel_size(self.world_size, self.model("tensor_model_parallel_size"),
                                        self.model("pipeline_model_parallel_size"), self.model("context_parallel_size"))

    @cached_property
    def num_microbatches(self) -> int | None:
        return sizes.num_microbatches(self.train("global_batch_size"), self.train("micro_batch_size"),
                                      self.data_parallel_size)

    @cached_property
    def cuda_graph_modules(self) -> list[str]:
        from megatron.bridge.utils.cuda_graph import cuda_graph_module_names

        if self.model("cuda_graph_impl", "none") == "none":
            return []
        return cuda_graph_module_names(self.cfg.model)

    @property
    def te_usable(self) -> bool | None:
        """True/False when known; None when the target's TE is unknown."""
        if self.env.te_version is None:
            return None
        return bool(self.env.te_version)

    @cached_property
    def prediction(self):
        """The predicted step time of this config on the target (``core.prediction.ConfigPrediction``),
        made at most once per evaluation; None when it cannot be made (GPU or world size unknown, a
        GPU kind without a hardware model, a config or dispatcher the model does not cover)."""
        from .prediction import CannotPredict, for_config

        try:
            return for_config(self.cfg, self.env, precision=self.precision)
        except (CannotPredict, ValueError, TypeError, KeyError, AttributeError):  # precision unreadable too
            return None

    @cached_property
    def memory(self):
        """The predicted peak memory per GPU (``predict.memory.MemoryPrediction``), made at most once per
        evaluation; None when it cannot be made (GPU or world size unknown, a config the model does not
        cover, a hybrid Mamba model)."""
        from .prediction import CannotPredict, memory_for_config

        try:
            return memory_for_config(self.cfg, self.env, precision=self.precision)
        except (CannotPredict, ValueError, TypeError, KeyError, AttributeError):  # precision unreadable too
            return None
