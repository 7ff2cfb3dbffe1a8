"""Make ``import megatron.bridge`` work on machines without Transformer Engine (TE).

Contract
--------
megatron-bridge 0.6.2 imports ``transformer_engine.pytorch`` unconditionally in exactly two
modules that its package ``__init__`` reaches (``IMPORTERS`` below), although nothing on the
EP-overlap path calls TE there. Without TE the whole bridge fails to import, which would make
this library unusable on CPU login nodes, in CI, and on GPU nodes built without TE that run the
local (non-TE) layer spec.

``install()`` adds one import hook that answers ``import transformer_engine[.pytorch]`` with a
placeholder module **only** while one of those two modules is executing its imports. It promises:

* inactive when the real TE imports: ``install()`` then returns False and changes nothing;
* Megatron-Core never sees the placeholder: its ``HAVE_TE`` flags stay False and a later
  ``import transformer_engine`` from anywhere else still raises ``ImportError``;
* the placeholder is removed from ``sys.modules`` as soon as any other module imports TE,
  and every attribute of it raises ``RuntimeError`` if called, naming this module.

It refuses everything else: it never stubs TE for Megatron-Core, for user code, or for any
feature that needs TE (delayed wgrad, fused permutation, TE layer specs). Those stay visibly
unavailable and our rules say so.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

# The only modules allowed to receive the placeholder (megatron-bridge 0.6.2).
IMPORTERS = frozenset(
    {
        "megatron.bridge.peft.lora_layers",
        "megatron.bridge.models.gpt_full_te_layer_autocast_spec",
    }
)
PLACEHOLDER_NAMES = ("transformer_engine", "transformer_engine.pytorch")
_MARK = "__mbridge_ep_overlap_te_placeholder__"


class TransformerEngineMissing(RuntimeError):
    """Raised when code touches a placeholder TE object."""


def _missing(name: str):
    def _raise(*_args, **_kwargs):
        raise TransformerEngineMissing(
            f"transformer_engine is not installed; '{name}' is a placeholder from "
            "mbridge_ep_overlap.te_compat so that megatron.bridge can be imported. "
            "Install Transformer Engine to use TE features."
        )

    return _raise


class _PlaceholderType(type):
    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _placeholder_class(f"{cls.__name__}.{attr}")


def _placeholder_class(name: str) -> type:
    # A class (not a function) so that module-level subclassing like
    # ``class LoRALinear(te.Linear)`` in the importer still works; instantiating it raises.
    return _PlaceholderType(name, (), {"__init__": _missing(name), "__call__": _missing(name)})


def _module_getattr(module_name: str):
    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _placeholder_class(f"{module_name}.{attr}")

    return __getattr__


class _PlaceholderLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        setattr(module, _MARK, True)
        return module

    def exec_module(self, module):
        return None


def _importer_is_allowed() -> bool:
    """True when the innermost non-import-machinery frame belongs to an allowed importer."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name in IMPORTERS:
            return True
        if not (name.startswith(("importlib", "_frozen_importlib")) or name == __name__):
            return False
        frame = frame.f_back
    return False


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        allowed = _importer_is_allowed()
        if not allowed:
            # Never let a placeholder left by an allowed importer leak to anyone else.
            for name in PLACEHOLDER_NAMES:
                if getattr(sys.modules.get(name), _MARK, False):
                    del sys.modules[name]
        if fullname in PLACEHOLDER_NAMES and allowed:
            return importlib.machinery.ModuleSpec(fullname, _PlaceholderLoader(), is_package=True)
        return None


def real_te_available() -> bool:
    """Whether the real Transformer Engine PyTorch package imports here."""
    import torch  # noqa: F401  (real TE needs torch's libraries loaded first)

    for name in PLACEHOLDER_NAMES:
        if getattr(sys.modules.get(name), _MARK, False):
            del sys.modules[name]
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # ImportError, or OSError for broken CUDA libraries
        return False
    return not getattr(sys.modules.get("transformer_engine"), _MARK, False)


def is_installed() -> bool:
    return any(isinstance(f, _Finder) for f in sys.meta_path)


def install() -> bool:
    """Install the hook if TE is missing. Returns True when the hook is (now) active."""
    if is_installed():
        return True
    if real_te_available():
        return False
    sys.meta_path.insert(0, _Finder())
    return True


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
    for name in PLACEHOLDER_NAMES:
        if getattr(sys.modules.get(name), _MARK, False):
            del sys.modules[name]


# Fields that need Transformer Engine at finalize or model build, and their TE-free values.
# Used only to *dry-run* a production recipe's finalize on a machine without TE (CPU login
# nodes, CI); every change is reported to the user. None of them is an EP-overlap field.
TE_ONLY_MODEL_FIELDS = {
    "transformer_impl": "local",
    "moe_permute_fusion": False,
    "moe_router_fusion": False,
    "apply_rope_fusion": False,
    "gradient_accumulation_fusion": False,
    "persist_layer_norm": False,
    "cross_entropy_loss_fusion": False,
    "cross_entropy_fusion_impl": "native",
    "use_te_rng_tracker": False,
    "cuda_graph_impl": "none",
    "use_transformer_engine_full_layer_spec": False,
    "use_transformer_engine_op_fuser": False,
}


def without_te(cfg) -> list[tuple[str, object, object]]:
    """Switch a config's TE-only features off in place; return ``(path, old, new)`` for each change."""
    import torch
    from megatron.bridge.models.gpt_provider import local_layer_spec

    changes = []

    def set_(obj, prefix, name, value):
        if hasattr(obj, name) and getattr(obj, name) != value:
            changes.append((f"{prefix}.{name}", getattr(obj, name), value))
            setattr(obj, name, value)

    for name, value in TE_ONLY_MODEL_FIELDS.items():
        set_(cfg.model, "model", name, value)
    if getattr(cfg.model, "transformer_layer_spec", None) is not local_layer_spec:
        changes.append(("model.transformer_layer_spec", cfg.model.transformer_layer_spec, local_layer_spec))
        cfg.model.transformer_layer_spec = local_layer_spec
    opt = cfg.optimizer
    if getattr(opt, "use_precision_aware_optimizer", False):
        set_(opt, "optimizer", "use_precision_aware_optimizer", False)
        for name in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            set_(opt, "optimizer", name, torch.float32)
    if cfg.comm_overlap is not None:
        set_(cfg.comm_overlap, "comm_overlap", "tp_comm_overlap", False)
        snapshot = getattr(cfg.comm_overlap, "user_comm_overlap_cfg", None)
        if snapshot is not None:
            set_(snapshot, "comm_overlap.user_comm_overlap_cfg", "tp_comm_overlap", False)
    return changes
