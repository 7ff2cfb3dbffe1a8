"""Let ``import megatron.bridge`` (and its ``pretrain``) work where optional packages are missing.

Contract
--------
Megatron-Bridge 0.6.2 imports two optional packages unconditionally at module level, although
nothing on the EP-overlap path uses them there:

* Transformer Engine: ``import transformer_engine.pytorch`` in ``megatron.bridge.peft.lora_layers``
  and ``megatron.bridge.models.gpt_full_te_layer_autocast_spec`` (both reached by the package
  ``__init__``), so without TE nothing of the bridge imports;
* nvidia-resiliency-ext: ``from nvidia_resiliency_ext.inprocess import CallWrapper`` in
  ``megatron.bridge.training.pretrain``, used only as a type annotation. The newest release on
  PyPI (0.4.1) cannot simply be installed: megatron-core 0.19.2 asserts NVRx >= 0.6.0 at import.

Nothing is installed at import: ``install()`` is called explicitly by the modules that import
Megatron-Bridge (``core.enforcement``, the tools' MB entry points). It adds one import hook that answers an
import of such a package with a placeholder
module **only** while one of the importers listed for it in ``SHIMS`` is executing, and only when
the real package is missing. It promises:

* inactive for a package whose real distribution imports (``installed()`` says which are active);
* nobody else sees a placeholder: Megatron-Core's ``HAVE_TE`` flags stay False, a later
  ``import transformer_engine`` from anywhere else still raises ``ImportError``, and a placeholder
  left in ``sys.modules`` is removed at the next import by any other module;
* every attribute of a placeholder is a class whose construction or call raises
  ``MissingOptionalPackage`` naming the package.

It refuses everything else: features that really need TE (delayed wgrad, fused permutation, TE
layer specs) or NVRx (in-process restart) stay unavailable, and our rules say so.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import types
from dataclasses import dataclass

_MARK = "__mbridge_ep_overlap_placeholder__"


@dataclass(frozen=True)
class Shim:
    package: str
    modules: tuple[str, ...]  # the placeholder module names handed out
    importers: frozenset[str]  # the only modules that may receive them
    real_module: str  # what must import for the real package to count as installed


SHIMS: tuple[Shim, ...] = (
    Shim(
        package="transformer_engine",
        modules=("transformer_engine", "transformer_engine.pytorch"),
        importers=frozenset(
            {"megatron.bridge.peft.lora_layers", "megatron.bridge.models.gpt_full_te_layer_autocast_spec"}
        ),
        real_module="transformer_engine.pytorch",
    ),
    Shim(
        package="nvidia_resiliency_ext",
        modules=("nvidia_resiliency_ext", "nvidia_resiliency_ext.inprocess"),
        importers=frozenset({"megatron.bridge.training.pretrain"}),
        real_module="nvidia_resiliency_ext.inprocess",
    ),
)


class MissingOptionalPackage(RuntimeError):
    """Raised when code touches a placeholder object."""


def _placeholder_class(name: str) -> type:
    def _raise(*_args, **_kwargs):
        raise MissingOptionalPackage(
            f"'{name}' is a placeholder from mbridge_ep_overlap.target.shims: the package is not "
            "installed. Install it to use this feature."
        )

    class _Meta(type):
        def __getattr__(cls, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _placeholder_class(f"{name}.{attr}")

    # A class, so that module-level subclassing like ``class LoRALinear(te.Linear)`` still works.
    return _Meta(name, (), {"__init__": _raise, "__call__": _raise})


class _PlaceholderLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def __getattr__(attr: str):  # noqa: N807 - the module-level __getattr__ of PEP 562
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _placeholder_class(f"{spec.name}.{attr}")

        module.__getattr__ = __getattr__
        setattr(module, _MARK, True)
        return module

    def exec_module(self, module):
        return None


def _importing_module() -> str:
    """Name of the innermost module that is not import machinery or this module."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith(("importlib", "_frozen_importlib")) or name == __name__):
            return name
        frame = frame.f_back
    return ""


def _purge(modules) -> None:
    for name in modules:
        if getattr(sys.modules.get(name), _MARK, False):
            del sys.modules[name]


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, shims: tuple[Shim, ...]) -> None:
        self.shims = shims

    def find_spec(self, fullname, path=None, target=None):
        importer = _importing_module()
        for shim in self.shims:
            if importer in shim.importers:
                if fullname in shim.modules:
                    return importlib.machinery.ModuleSpec(fullname, _PlaceholderLoader(), is_package=True)
            else:
                _purge(shim.modules)  # never let a placeholder leak to anyone else
        return None


def _real_package_imports(shim: Shim) -> bool:
    import torch  # noqa: F401  (real TE needs torch's libraries loaded first)

    _purge(shim.modules)
    try:
        __import__(shim.real_module)
    except Exception:  # noqa: BLE001 - ImportError, or OSError for broken CUDA libraries
        return False
    return not getattr(sys.modules.get(shim.package), _MARK, False)


def real_te_available() -> bool:
    """Whether the real Transformer Engine PyTorch package imports here."""
    return _real_package_imports(SHIMS[0])


def _finder() -> _Finder | None:
    return next((f for f in sys.meta_path if isinstance(f, _Finder)), None)


def installed() -> tuple[str, ...]:
    """The packages currently answered by placeholders for their importers."""
    finder = _finder()
    return tuple(s.package for s in finder.shims) if finder else ()


def _drop_optional_te_probe(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not (message.startswith("Import of ") and "transformer_engine" in message)


def missing_packages() -> tuple[Shim, ...]:
    """The shims whose real package does not import here (the ones ``install`` activates)."""
    return tuple(s for s in SHIMS if not _real_package_imports(s))


def install() -> tuple[str, ...]:
    """Activate the shims whose real package is missing. Returns the active package names.

    The allowed importers are imported right here, and the placeholders purged right after, so a
    placeholder never outlives this call in ``sys.modules`` (an import finds a cached module
    before any finder is asked, so purging lazily would not be enough).
    """
    if _finder() is None:
        missing = missing_packages()
        if any(s.package == "transformer_engine" for s in missing):
            # Without TE, MB logs a full traceback at INFO for each optional TE symbol it probes
            # (e.g. FP8GlobalStateManager). Expected here; keep it out of users' output. A filter,
            # not a level: MB sets its loggers' levels itself.
            logging.getLogger("megatron.bridge.utils.import_utils").addFilter(_drop_optional_te_probe)
        if missing:
            sys.meta_path.insert(0, _Finder(missing))
            try:
                for shim in missing:
                    for importer in sorted(shim.importers):
                        __import__(importer)
            finally:
                for shim in missing:
                    _purge(shim.modules)
    return installed()
