"""Dry runs for a described target: fake its hardware and version gates, nothing else.

Contract
--------
``simulate(target)`` is the one place where the target is faked. Inside it:

* ``torch.cuda.is_available`` / ``get_device_properties`` / ``get_device_capability`` /
  ``device_count`` answer as the target's GPUs, and ``WORLD_SIZE`` is its world size;
* the target's launcher variables are in ``os.environ``;
* the Transformer Engine version checks Megatron-Bridge and Megatron-Core make while finalizing
  (``is_te_min_version`` where they bound it) answer for the target's TE version, so a config for
  a TE cluster is judged as the cluster will judge it even where TE is not installed.

The user's config is never rewritten. Everything patched is restored on exit, ``os.environ``
included. ``current()`` returns the simulated target inside, a probe of this machine outside.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import types
from typing import Any, Callable, Iterator

from .cluster import ClusterEnvironment
from .gpus import GPU_CATALOG, match

_SIMULATED: contextvars.ContextVar[ClusterEnvironment | None] = contextvars.ContextVar(
    "mbridge_ep_overlap_simulated_target", default=None
)

# Where MB 0.6.2 / MCore 0.19.2 bound ``is_te_min_version`` by name on their finalize path.
TE_VERSION_GATES = (
    "megatron.bridge.training.comm_overlap",
    "megatron.core.transformer.transformer_config",
)


def current() -> ClusterEnvironment:
    """The simulated target inside ``simulate()``, else a probe of this machine."""
    from .probe import probe

    return _SIMULATED.get() or probe()


class _Patches:
    """setattr with restore, in reverse order (no unittest.mock in production code)."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def set(self, obj: Any, name: str, value: Any) -> None:
        self._saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def restore(self) -> None:
        while self._saved:
            obj, name, value = self._saved.pop()
            setattr(obj, name, value)


def te_min_version(te_version: str) -> Callable[..., bool]:
    """``is_te_min_version`` as a target with TE ``te_version`` ("" = none) answers it."""
    from packaging.version import Version

    def is_te_min_version(version, check_equality: bool = True) -> bool:
        if not te_version:
            return False
        have, want = Version(te_version), Version(str(version))
        return have >= want if check_equality else have > want

    return is_te_min_version


def _fake_hardware(patches: _Patches, env: ClusterEnvironment) -> None:
    import torch

    known = match(env.gpu_name) or GPU_CATALOG["h100"]  # memory / SM count only
    props = types.SimpleNamespace(
        name=env.gpu_name, major=env.compute_capability[0], minor=env.compute_capability[1],
        total_memory=known.memory_gib << 30, multi_processor_count=known.multiprocessors,
    )
    patches.set(torch.cuda, "is_available", lambda: True)
    patches.set(torch.cuda, "get_device_properties", lambda *a, **k: props)
    patches.set(torch.cuda, "get_device_capability", lambda *a, **k: env.compute_capability)
    patches.set(torch.cuda, "device_count", lambda: env.gpus_per_node or 1)


def _fake_te_gates(patches: _Patches, te_version: str) -> None:
    gate = te_min_version(te_version)
    for module_name in TE_VERSION_GATES:
        module = importlib.import_module(module_name)
        if hasattr(module, "is_te_min_version"):
            patches.set(module, "is_te_min_version", gate)


@contextlib.contextmanager
def simulate(env: ClusterEnvironment) -> Iterator[ClusterEnvironment]:
    """Fake the hardware, world size, launcher variables and TE version gates of ``env``."""
    saved_environ = dict(os.environ)
    token = _SIMULATED.set(env)
    patches = _Patches()
    try:
        if env.has_gpu:
            _fake_hardware(patches, env)
        if env.te_version is not None:
            _fake_te_gates(patches, env.te_version)
        if env.world_size:
            os.environ["WORLD_SIZE"] = str(env.world_size)
        os.environ.update({k: str(v) for k, v in env.env_vars.items()})
        yield env
    finally:
        patches.restore()
        _SIMULATED.reset(token)
        os.environ.clear()
        os.environ.update(saved_environ)
