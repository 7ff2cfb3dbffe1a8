"""Dry runs for a described target: fake its hardware and version gates, nothing else.

Contract
--------
``simulate(target)`` is the one place where the target is faked. Inside it:

* ``torch.cuda.is_available`` / ``get_device_properties`` / ``get_device_capability`` /
  ``get_device_name`` / ``device_count`` / ``current_device`` answer as the target's GPUs, and
  ``WORLD_SIZE`` is its world size;
* the target's launcher variables are in ``os.environ``;
* Transformer Engine is the target's: the version Megatron-Core caches for every
  ``is_te_min_version`` check (``megatron.core.utils._te_version``), MB's ``comm_overlap.HAVE_TE``,
  the build-time probe that picks ``gradient_accumulation_fusion``'s default, and - only where TE
  is not really installed here - stand-ins for the TE symbols finalize looks up without calling
  (fused RoPE, fused permutation, ``FusedAdam``'s signature), so a config for a TE cluster is
  built and judged as that cluster will build and judge it.

The user's config is never rewritten: recipes are built inside ``simulate`` too, so what a dry run
writes is the config the cluster will run. Everything patched is restored on exit, ``os.environ``
included. ``current()`` returns the simulated target inside, a probe of this machine outside.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import sys
import types
from typing import Any, Iterator

from .cluster import ClusterEnvironment
from ..base.gpus import GPU_CATALOG, match

_SIMULATED: contextvars.ContextVar[ClusterEnvironment | None] = contextvars.ContextVar(
    "mbridge_ep_overlap_simulated_target", default=None
)

# TE symbols MCore 0.19.2's finalize checks for presence only (None without TE): the module and names.
_TE_PRESENCE_CHECKS = {
    "megatron.core.models.common.embeddings.rope_utils": ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd"),
    "megatron.core.transformer.moe.moe_utils": ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                                                "fused_sort_chunks_by_index_with_probs", "fused_unpermute"),
}
_TE_MODULES = ("transformer_engine", "transformer_engine.pytorch", "transformer_engine.pytorch.optimizers")


def current() -> ClusterEnvironment:
    """The simulated target inside ``simulate()``, else a probe of this machine."""
    from .probe import probe

    return _SIMULATED.get() or probe()


class Patches:
    """setattr (and sys.modules entries) with restore, in reverse order (no unittest.mock in
    production code); ``core.dispatcher`` uses it too, to watch a recipe's dispatcher request."""

    _ABSENT = object()

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def set(self, obj: Any, name: str, value: Any) -> None:
        self._saved.append((obj, name, getattr(obj, name, self._ABSENT)))
        setattr(obj, name, value)

    def modules(self, modules: dict[str, types.ModuleType]) -> None:
        for name, module in modules.items():
            self._saved.append((sys.modules, name, sys.modules.get(name, self._ABSENT)))
            sys.modules[name] = module

    def restore(self) -> None:
        while self._saved:
            obj, name, value = self._saved.pop()
            if obj is sys.modules:
                if value is self._ABSENT:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = value
            elif value is self._ABSENT:
                delattr(obj, name)
            else:
                setattr(obj, name, value)


def _fake_hardware(patches: Patches, env: ClusterEnvironment) -> None:
    import torch

    known = match(env.gpu_name) or GPU_CATALOG["h100"]  # memory / SM count only
    props = types.SimpleNamespace(
        name=env.gpu_name, major=env.compute_capability[0], minor=env.compute_capability[1],
        total_memory=known.memory_gib << 30, multi_processor_count=known.multiprocessors,
    )
    patches.set(torch.cuda, "is_available", lambda: True)
    patches.set(torch.cuda, "get_device_properties", lambda *a, **k: props)
    patches.set(torch.cuda, "get_device_capability", lambda *a, **k: env.compute_capability)
    patches.set(torch.cuda, "get_device_name", lambda *a, **k: env.gpu_name)
    patches.set(torch.cuda, "device_count", lambda: env.gpus_per_node or 1)
    patches.set(torch.cuda, "current_device", lambda: 0)


def _te_stand_in(*args, **kwargs):
    raise RuntimeError("mbridge_ep_overlap.target.simulate: a TE stand-in for a dry run was called")


class _FusedAdamSignature:
    """What MCore's optimizer config inspects of TE's FusedAdam (parameter names), nothing more."""

    def __init__(self, params=None, master_weight_dtype=None, exp_avg_dtype=None, exp_avg_sq_dtype=None,
                 use_decoupled_grad=False, **kwargs):
        _te_stand_in()


def _fake_te(patches: Patches, te_version: str) -> None:
    """The target's Transformer Engine: its version everywhere MCore/MB ask, and its presence."""
    from packaging.version import Version

    import megatron.core.utils as mcore_utils
    from megatron.bridge.training import comm_overlap
    from megatron.bridge.utils import fusions

    from .probe import te_version_here

    patches.set(mcore_utils, "_te_version", Version(te_version or "0.0.0"))
    patches.set(comm_overlap, "HAVE_TE", bool(te_version))
    probe = fusions.can_enable_gradient_accumulation_fusion  # a dataclass default_factory: captured by
    patches.set(probe, "__code__", (lambda: True).__code__ if te_version else (lambda: False).__code__)  # identity
    if not te_version or te_version_here():
        return  # no TE on the target, or the real one is here: nothing to stand in for
    for module_name, names in _TE_PRESENCE_CHECKS.items():
        module = importlib.import_module(module_name)
        for name in names:
            patches.set(module, name, _te_stand_in)
    patches.modules(_te_modules(te_version))


def _te_modules(te_version: str) -> dict[str, types.ModuleType]:
    te, pytorch, optimizers = (types.ModuleType(name) for name in _TE_MODULES)
    te.__path__, pytorch.__path__ = [], []
    te.__version__ = te_version
    optimizers.FusedAdam = _FusedAdamSignature
    te.pytorch, pytorch.optimizers = pytorch, optimizers
    return dict(zip(_TE_MODULES, (te, pytorch, optimizers)))


def on_target(env: ClusterEnvironment) -> contextlib.AbstractContextManager:
    """``simulate(env)`` for a described target that is not simulated already, else nothing: a
    build enters the target's simulation once, and the steps inside it (MB's flex-backend call, a
    recipe's build) run in that one."""
    if not env.described or _SIMULATED.get() is env:
        return contextlib.nullcontext(env)
    return simulate(env)


@contextlib.contextmanager
def simulate(env: ClusterEnvironment) -> Iterator[ClusterEnvironment]:
    """Fake the hardware, world size, launcher variables and TE version gates of ``env``."""
    saved_environ = dict(os.environ)
    token = _SIMULATED.set(env)
    patches = Patches()
    try:
        if env.has_gpu:
            _fake_hardware(patches, env)
        if env.te_version is not None:
            _fake_te(patches, env.te_version)
        if env.world_size:
            os.environ["WORLD_SIZE"] = str(env.world_size)
        os.environ.update({k: str(v) for k, v in env.env_vars.items()})
        yield env
    finally:
        patches.restore()
        _SIMULATED.reset(token)
        os.environ.clear()
        os.environ.update(saved_environ)
