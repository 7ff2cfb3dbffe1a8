"""``RunSpec``: the one typed description of a run, and how a recipe name becomes a config.

Contract
--------
* ``RunSpec`` (frozen, keyword-only) is everything that decides the config a run trains with:
  the recipe, EP overlap on/off, dispatcher, delayed wgrad, all-to-all priority, resolve mode,
  parallel sizes, batch and sequence sizes, Hydra-style overrides, and the target (``TargetSpec``:
  the cluster's GPU type and count and its software stack, or this machine). ``None`` means "the
  recipe's choice". ``validated()`` refuses a bad value with one ``UsageError`` naming it and returns
  the spec with names in their canonical spelling (GPU kinds and dispatchers are case-insensitive:
  ``H100`` is ``h100``, ``DeepEP`` is ``deepep``); every
  front end (``run_script.py``, ``plan``, ``launch_slurm.py``, the benchmark) builds a spec and
  hands it to ``pipeline.build`` - none re-parses another's command line.
* A recipe is a registered name (``RecipeEntry`` in a registry published under the entry-point
  group ``mbridge_ep_overlap.recipes``: this project's ``recipes/`` package, or a user's) or
  ``MODULE:FUNCTION`` naming any zero-argument function returning a Megatron-Bridge
  ``ConfigContainer`` (MB's recipes, NVIDIA's ``perf_recipes``, a user's own module).
  ``resolve_recipe`` finds it without importing Megatron (a malformed ``MODULE:FUNCTION`` is refused
  by ``validated()`` first, in a fraction of a second; an unknown name with the closest registered
  names); ``Recipe.config()`` builds it offline,
  recording its own calls of MB's ``apply_flex_dispatcher_backend`` (``core.dispatcher``).

Nothing here imports torch or Megatron at module level.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from .base.choices import AUTO, DISPATCHERS, NAMED_DISPATCHERS, OPTIONAL_SWITCHES, dispatcher_name, resolve_mode
from .base.errors import UsageError, require_optional_bool
from .base.sizes import positive_int
from .base.gpus import GPU_CATALOG, canonical_gpu
from .core.arguments import require_config
from .core.dispatcher import recording_recipe_requests
from .target import shims
from .target.offline import offline_architectures
from .target.stack import is_version, require_possible_te

RECIPE_ENTRY_POINTS = "mbridge_ep_overlap.recipes"
SIZE_FIELDS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
               "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size")
_BATCH_FIELDS = ("global_batch_size", "micro_batch_size", "seq_length", "max_steps")


@dataclass(frozen=True, kw_only=True)
class TargetSpec:
    """Where the run will execute. ``this_machine``: probe it (training on the GPU node);
    otherwise a described cluster: ``gpu`` x ``num_gpus`` (default: the recipe's) with its stack."""

    this_machine: bool = False
    gpu: str | None = None
    num_gpus: int | None = None
    te: str | None = None
    """Transformer Engine on the target: a version, "none", or None for the reference stack."""
    deep_ep: str | None = None
    """DeepEP on the target: a version, "none", or None for unknown."""
    env: tuple[str, ...] = ()
    """The job's exported environment ("KEY=VALUE"): an exported value wins over cfg.env_vars (MB's
    setdefault), so the rules judge it."""

    def replace(self, **changes: Any) -> "TargetSpec":
        return dataclasses.replace(self, **changes)

    def exported(self) -> dict[str, str]:
        """``env`` as a dict (a later KEY=VALUE wins, as in a shell)."""
        return dict(item.split("=", 1) for item in self.env)

    def validated(self) -> "TargetSpec":
        if not isinstance(self.this_machine, bool):
            raise UsageError("this_machine", self.this_machine, (True, False), "invalid")
        if self.gpu is not None and (not isinstance(self.gpu, str) or canonical_gpu(self.gpu) not in GPU_CATALOG):
            raise UsageError("GPU", self.gpu, sorted(GPU_CATALOG))
        if self.gpu is not None and self.gpu != canonical_gpu(self.gpu):
            return dataclasses.replace(self, gpu=canonical_gpu(self.gpu)).validated()
        if self.num_gpus is not None and positive_int(self.num_gpus) is None:
            raise UsageError("number of GPUs", self.num_gpus, "an integer >= 1", "invalid")
        for name in ("te", "deep_ep"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and (value == "none" or is_version(value))):
                raise UsageError(f"{name} version", value, "a version such as 2.10.0 (PEP 440, no blanks), or 'none'",
                                 "invalid")
        require_possible_te(self.te)
        if isinstance(self.env, str) or not isinstance(self.env, (tuple, list)):
            raise UsageError("exported environment", self.env, "a tuple of 'KEY=VALUE' strings", "invalid")
        for item in self.env:
            if not isinstance(item, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", item, re.S):
                raise UsageError("exported environment", item, "KEY=VALUE with a variable name, e.g. "
                                 "CUDA_DEVICE_MAX_CONNECTIONS=32", "malformed")
            if "\n" in item or "\0" in item:
                raise UsageError("exported environment", item, "a value on one line", "malformed")
        if self.this_machine and self.env:  # a run on this machine reads its own environment
            raise UsageError("exported environment", list(self.env), "none for a run on this machine (it reads its "
                             "own environment: export the variables before launching)", "invalid")
        return self


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    recipe: str
    """A registered recipe name or MODULE:FUNCTION."""
    ep_overlap: bool = True
    dispatcher: str | None = None
    """alltoall, deepep, hybridep, ncclep or auto; None: the recipe's."""
    delay_wgrad: bool | None = None
    high_priority_a2a: bool | None = None
    resolve: str = "error"
    tensor_model_parallel_size: int | None = None
    pipeline_model_parallel_size: int | None = None
    virtual_pipeline_model_parallel_size: int | None = None
    context_parallel_size: int | None = None
    expert_model_parallel_size: int | None = None
    expert_tensor_parallel_size: int | None = None
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    seq_length: int | None = None
    max_steps: int | None = None
    force_balance: bool = False
    """moe_router_force_load_balancing (benchmarks)."""
    overrides: tuple[str, ...] = ()
    """Hydra-style key=value overrides, applied after EP overlap is configured."""
    target: TargetSpec = field(default_factory=TargetSpec)
    hf_config_dir: str | None = None
    """Folder with <org>--<model>/config.json architecture files (else the shipped ones, the hub cache)."""

    def replace(self, **changes: Any) -> "RunSpec":
        return dataclasses.replace(self, **changes)

    def validated(self) -> "RunSpec":
        """This spec with names canonical, checked once: the spec returned is marked, and a later
        call on it (``build`` after a front end) returns it as it is."""
        if self.__dict__.get(_CHECKED):
            return self
        checked = self._checked()
        object.__setattr__(checked, _CHECKED, True)  # not a field: equality, replace and YAML ignore it
        return checked

    def _checked(self) -> "RunSpec":
        if not isinstance(self.recipe, str) or not self.recipe:
            raise UsageError("recipe", self.recipe, "a registered recipe name or MODULE:FUNCTION")
        if ":" in self.recipe:
            _check_function_path(self.recipe)  # before anything imports Megatron (seconds)
        if not isinstance(self.target, TargetSpec):
            raise UsageError("target", self.target, "a TargetSpec (gpu=..., num_gpus=..., te=..., deep_ep=...)", "invalid")
        if isinstance(self.overrides, str) or not isinstance(self.overrides, (tuple, list)):
            raise UsageError("overrides", self.overrides, "a tuple of 'key=value' strings", "invalid")
        if self.hf_config_dir is not None and (not isinstance(self.hf_config_dir, str) or not self.hf_config_dir):
            raise UsageError("hf_config_dir", self.hf_config_dir, "a folder path (str) or None", "invalid")
        spec = self  # with its names canonical
        if self.dispatcher is not None:
            name = dispatcher_name(self.dispatcher)
            if name != self.dispatcher:
                spec = self.replace(dispatcher=name)
        resolve_mode(self.resolve)
        for name in ("ep_overlap", "force_balance"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(name, getattr(self, name), (True, False), "invalid")
        for name in OPTIONAL_SWITCHES:
            require_optional_bool(name, getattr(self, name))
        if not self.ep_overlap:
            if spec.dispatcher == AUTO:  # auto ranks dispatchers for the overlapped schedule
                raise UsageError("dispatcher", AUTO, f"a named dispatcher ({', '.join(NAMED_DISPATCHERS)}) "
                                 "or none while EP overlap is off", "invalid")
            for name, neutral in (("delay_wgrad", False), ("high_priority_a2a", False)):
                if getattr(self, name) not in (None, neutral):  # would be silently meaningless
                    raise UsageError(name, getattr(self, name), f"{neutral} or None while EP overlap is off", "invalid")
        for name in (*SIZE_FIELDS, *_BATCH_FIELDS):
            value = getattr(self, name)
            if value is not None and positive_int(value) is None:
                raise UsageError(name, value, "an integer >= 1", "invalid")
        for item in self.overrides:
            key, sep, _ = str(item).partition("=")
            if not isinstance(item, str) or not sep or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", key):
                raise UsageError("override", item, "key=value with a dotted field path, e.g. train.train_iters=10",
                                 "malformed")
        target = self.target.validated()
        return spec if target is self.target else spec.replace(target=target)


_CHECKED = "_ep_overlap_checked"


# ---- recipes -----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RecipeEntry:
    """A registered recipe: its function (MODULE:FUNCTION), the cluster it is written for and the
    EP-overlap choices ``build`` applies to it (None: the config's own)."""

    function: str
    gpu: str
    num_gpus: int
    dispatcher: str | None = "alltoall"
    delay_wgrad: bool | None = False
    high_priority_a2a: bool | None = None
    summary: str = ""


@dataclass(frozen=True)
class Recipe:
    name: str
    entry: RecipeEntry
    _loaded: list = field(default_factory=list, compare=False, repr=False)
    """The function once loaded: ``function()`` imports and checks it once per ``Recipe``."""

    def function(self) -> Callable[[], Any]:
        if not self._loaded:
            self._loaded.append(self._load())
        return self._loaded[0]

    def _load(self) -> Callable[[], Any]:
        module_name, attr = _check_function_path(self.entry.function)
        shims.install()  # recipe modules import Megatron-Bridge
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise UsageError("recipe module", module_name, f"an importable module ({type(e).__name__}: {e})") from None
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - the module's own code failed while importing
            raise UsageError("recipe module", module_name,
                             f"a module that imports cleanly; importing it raised {_first_line(e)}", "failing") from None
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise UsageError("recipe function", self.entry.function, f"a function defined in {module_name}")
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # builtins without a signature
            params = []
        if any(p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            raise UsageError("recipe function", self.entry.function, "a function callable with no arguments", "invalid")
        return fn

    def config(self, hf_config_dir: str | None = None) -> Any:
        """The recipe's ``ConfigContainer``, built with the architecture files available offline."""
        from megatron.bridge.training.config import ConfigContainer

        fn = self.function()
        with offline_architectures(hf_config_dir), recording_recipe_requests():  # MB's silent flex fallback, seen
            try:
                cfg = fn()
            except UsageError:
                raise
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # noqa: BLE001 - the recipe cannot be built here (a missing file, a bad value, sys.exit)
                raise UsageError("recipe function", self.entry.function,
                                 f"a recipe that builds here; it raised {_first_line(e)}", "failing") from None
        if not isinstance(cfg, ConfigContainer):
            raise UsageError("recipe function", self.entry.function,
                             f"a function returning a ConfigContainer (it returned {type(cfg).__name__})", "invalid")
        try:
            require_config(cfg)
        except UsageError as e:
            raise UsageError("recipe function", self.entry.function, f"a well-formed config ({e})", "invalid") from None
        return cfg


def _check_function_path(text: str) -> tuple[str, str]:
    """(module, function) of ``MODULE:FUNCTION``, or the usage error naming it - no import needed."""
    module_name, _, attr = text.partition(":")
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", module_name) or not re.fullmatch(r"[A-Za-z_]\w*", attr):
        raise UsageError("recipe", text, "a registered recipe name or MODULE:FUNCTION "
                         "(an absolute dotted module path, a function name)", "malformed")
    return module_name, attr


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def registered_recipes() -> dict[str, RecipeEntry]:
    """Every registry published under the ``mbridge_ep_overlap.recipes`` entry-point group."""
    out: dict[str, RecipeEntry] = {}
    for ep in importlib.metadata.entry_points(group=RECIPE_ENTRY_POINTS):
        out.update(ep.load())
    return out


_NAME_GPU = re.compile(r"_(\d+)gpus?_([a-z0-9]+?)(?:_|$)")


def _infer_cluster(function: str) -> tuple[str | None, int | None]:
    """GPU kind and count from an MB recipe name such as ``..._256gpu_gb200_fp8mx_config``."""
    m = _NAME_GPU.search(function.rpartition(":")[2])
    if not m:
        return None, None
    gpu = m.group(2) if m.group(2) in GPU_CATALOG else None
    return gpu, int(m.group(1))


def resolve_recipe(name: str) -> Recipe:
    if ":" in name:
        gpu, num = _infer_cluster(name)
        return Recipe(name, RecipeEntry(function=name, gpu=gpu, num_gpus=num, dispatcher=None, delay_wgrad=None))
    registry = registered_recipes()
    if name not in registry:
        raise UsageError("recipe", name, _recipe_choices(name, registry))
    return Recipe(name, registry[name])


def _recipe_choices(name: str, registry: dict[str, RecipeEntry]) -> str:
    """The allowed recipes, the names closest to a misspelt one first."""
    every = ", ".join([*sorted(registry), "MODULE:FUNCTION"])
    by_lower = {n.lower(): n for n in registry}
    close = [by_lower[n] for n in difflib.get_close_matches(str(name).lower(), list(by_lower), n=3, cutoff=0.75)]
    return f"{', '.join(close)} (closest to it); every one: {every}" if close else every


__all__ = ["RunSpec", "TargetSpec", "RecipeEntry", "Recipe", "resolve_recipe", "registered_recipes", "DISPATCHERS"]
