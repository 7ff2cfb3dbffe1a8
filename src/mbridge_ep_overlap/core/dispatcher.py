"""The token dispatcher for EP overlap: every fact about it has its owner here.

Contract
--------
* The names (``alltoall``, the flex backends ``deepep``, ``hybridep``, ``ncclep``, and ``auto``)
  are ``base.choices``'s; a name reaching this module is already checked there. No torch or
  Megatron import at module level.
* ``supports_gpu`` is Megatron-Bridge 0.6.2's GPU allow-list of each flex backend, as data (the
  parity tests compare it with MB's own ``apply_flex_dispatcher_backend`` for every catalogued GPU);
  ``availability`` says whether a backend's package is on the target (True / False / None =
  unknown), ``problems`` lists every reason a backend cannot run on a target. The flex rules, the
  decision below and ``doctor`` all call these, so they cannot disagree.
* ``decision_for(settled, model, target, resolve)`` is the one decision path, on the choice
  ``base.choices.settle_choices`` settled (``decide`` settles it first): it turns ``auto``
  into a backend (and says why), keeps the config's own dispatcher when none was requested, and -
  only with ``resolve="auto"`` - falls back to alltoall when the requested backend cannot run on
  the target, recording why. ``apply`` then calls MB's ``apply_flex_dispatcher_backend`` (with the
  target's hardware simulated when planning for another machine) and reports MB's own silent
  fallback, which ``enable`` refuses (``resolve="error"``) or records (``resolve="auto"``).
* A recipe may call ``apply_flex_dispatcher_backend`` itself (MB's own recipes do).
  ``recording_recipe_requests()`` - around every recipe build (``spec.Recipe.config``) - leaves a
  ``RecipeRequest`` on the model config each such call was given: the backend asked for and
  whether MB applied it or silently fell back to alltoall - dropped at the end of the build when the
  recipe set its dispatcher itself afterwards, so the record is the request in force for the config
  the recipe returns. ``recipe_fell_back`` is that fallback
  while the config still holds it (rule ``recipe-flex-fallback`` refuses it); a request MB applied
  makes the recipe's dispatcher "the recipe's" (``decide``; ``Decision.source`` says who chose it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import types
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..base.choices import AUTO, DISPATCHER, FLEX_BACKENDS, MEASURED_DISPATCHERS, REGISTRY, Settled, settle_choices
from .provenance import Source, settled_source

ALLTOALL_FIELDS = {"moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": None}
"""The model fields that select the alltoall dispatcher (no flex backend left behind)."""

# Below this EP size DeepEP was measured slower than alltoall (Megatron-LM issue #1456; 2x H200
# EP 2: 0.75-0.90x of overlap off, docs/benchmarks.md).
DEEPEP_MIN_EP = 16


def supports_gpu(backend: str, gpu_name: str | None, major: int) -> bool:
    """Megatron-Bridge 0.6.2's allow-lists (apply/validate_flex_dispatcher_backend), as data."""
    if backend == "deepep":
        return major in (8, 9) or (gpu_name or "").startswith(("NVIDIA B200", "NVIDIA B300"))
    if backend == "hybridep":
        return major in (8, 9, 10)
    if backend == "ncclep":
        return major in (9, 10)
    return True


def availability(backend: str, target) -> bool | None:
    """Whether the backend's package is on the target: True, False, or None when unknown.
    DeepEP / HybridEP: ``deep_ep`` (with ``HybridEPBuffer``); NCCL EP: a Transformer Engine built
    with NCCL EP (``transformer_engine.pytorch.ep``, NVTE_BUILD_WITH_NCCL_EP=1)."""
    if backend == "ncclep":
        return target.te_nccl_ep
    if backend not in ("deepep", "hybridep"):
        return True
    if target.deep_ep_version is None:
        return None
    if not target.deep_ep_version:
        return False
    if backend == "hybridep":
        return None if target.hybrid_ep_available is None else bool(target.hybrid_ep_available)
    return True


def nvshmem_ok(backend: str, target) -> bool:
    """``deepep`` needs a DeepEP built with NVSHMEM: MCore 0.19 sizes its buffer with
    ``get_rdma_buffer_size_hint``, which a build without it refuses at any EP size."""
    return backend != "deepep" or target.deep_ep_nvshmem is not False


IPC_HEALTH_KEY = "hybridep:USE_MNNVL=0"  # the smoke verdict of HybridEP on CUDA IPC handles


def health(backend: str, target, env_vars: dict | None = None) -> str | None:
    """This node's smoke verdict for ``backend`` ("usable", "crashed (SIGSEGV) in ...", ...), None when
    no check ran. HybridEP takes its CUDA-IPC verdict when USE_MNNVL=0 will be set: by the plan on an
    NVLink domain of at most 8 GPUs (``enable``), or by the launcher / ``env_vars``."""
    verdicts = getattr(target, "dispatcher_health", None)
    if not verdicts:
        return None
    env = {"USE_MNNVL": "0" if (target.nvlink_domain_size or 8) <= 8 else "1", **target.env_vars, **(env_vars or {})}
    if backend == "hybridep" and str(env.get("USE_MNNVL")).strip().lower() in ("0", "false") and IPC_HEALTH_KEY in verdicts:
        return verdicts[IPC_HEALTH_KEY]
    return verdicts.get(backend)


def problems(backend: str, target) -> list[str]:
    """Every known reason ``backend`` cannot run EP overlap on ``target`` (empty: none known)."""
    verdict = health(backend, target)
    out = [] if verdict in (None, "usable") else [f"{backend} failed this node's smoke check: {verdict}"]
    if backend == "alltoall":
        return out
    if target.has_gpu and not supports_gpu(backend, target.gpu_name, target.compute_capability[0]):
        out.append(f"{target.gpu_name} is outside the {backend} GPU allow-list (MB would fall back to alltoall)")
    if availability(backend, target) is False:
        if backend == "ncclep":
            out.append("Transformer Engine there has no NCCL EP (transformer_engine.pytorch.ep; build TE with "
                       "NVTE_BUILD_WITH_NCCL_EP=1)")
        else:
            out.append("deep_ep is not importable" if not target.deep_ep_version
                       else f"deep_ep {target.deep_ep_version} has no HybridEPBuffer (build DeepEP's hybrid-ep branch)")
    if not nvshmem_ok(backend, target):
        out.append(f"deep_ep {target.deep_ep_version} was built without NVSHMEM: Megatron-Core 0.19's DeepEP buffer "
                   "sizing fails on it at any EP size (rebuild it with NVSHMEM: NVSHMEM_DIR set or the nvidia-nvshmem wheel installed)")
    return out


_REGISTERED = "its registry row"


@dataclass(frozen=True)
class Decision:
    dispatcher: str  # 'alltoall' or a flex backend
    reason: str
    fallbacks: list[str] = field(default_factory=list)  # why a requested backend was replaced (resolve='auto')
    source: Source = Source.REQUESTED  # who chose it (the plan's provenance word)


def current_dispatcher(model) -> str | None:
    """The config's own dispatcher in user-facing terms, None when it is not one overlap can split."""
    kind = getattr(model, "moe_token_dispatcher_type", None)
    if kind == "flex":
        backend = getattr(model, "moe_flex_dispatcher_backend", None)
        return backend if backend in FLEX_BACKENDS else None
    return "alltoall" if kind == "alltoall" else None


def _auto(target, ep: int, model=None) -> Decision:
    if not target.has_gpu:
        return Decision("alltoall", "auto: GPU unknown, alltoall is the dispatcher every GPU supports")
    # Rank by the step-time model (core.prediction) among the backends that can run and are installed,
    # when the model's shape is known and the GPU kind is modelled; else the rules below. A flex
    # backend wins only when it is predicted more than the model's error (CLEAR_MARGIN) faster than
    # alltoall, so auto never picks what the predicted-gain advice would advise against.
    from types import SimpleNamespace

    from .prediction import CLEAR_MARGIN, CannotPredict, for_config, secs, step_s

    usable = [d for d in MEASURED_DISPATCHERS
              if not problems(d, target) and availability(d, target) is True]
    if model is not None and len(usable) > 1:
        assume = {"micro_batch_size": 1, "num_microbatches": 8}  # the batch is not in the model
        try:
            ranked = for_config(SimpleNamespace(model=model), target, dispatcher="alltoall",
                                assume=assume).predicted(usable)
        except CannotPredict:
            ranked = []
        if ranked:
            best, steps = ranked[0][0], dict(ranked)
            if best != "alltoall" and step_s(steps["alltoall"]) <= step_s(steps[best]) * (1 + CLEAR_MARGIN):
                best = "alltoall"  # within the model's error: the dispatcher every GPU supports
            listed = ", ".join(f"{d} {secs(step_s(p))}" for d, p in ranked)
            return Decision(best, f"auto: predicted step on {target.world_size}x {target.gpu_name}: {listed}; a flex "
                            f"backend only when > {CLEAR_MARGIN:.0%} faster than alltoall (step-time model, MBS 1 and "
                            "8 microbatches assumed; docs/prediction.md)")
    major, name = target.compute_capability[0], target.gpu_name or ""
    if (target.nvlink_domain_size or 8) > 8 and supports_gpu("hybridep", name, major):
        if availability("hybridep", target):
            return Decision("hybridep", f"auto: {name} NVLink domain of {target.nvlink_domain_size}, HybridEP importable")
        return Decision("alltoall", f"auto: {name} would use HybridEP, but it is {_availability_text(target)}")
    if supports_gpu("deepep", name, major):
        if ep < DEEPEP_MIN_EP:
            return Decision("alltoall", f"auto: EP={ep} < {DEEPEP_MIN_EP}: alltoall is as fast as DeepEP at small EP")
        if availability("deepep", target) and nvshmem_ok("deepep", target):
            return Decision("deepep", f"auto: {name}, EP={ep}, DeepEP {target.deep_ep_version} importable")
        return Decision("alltoall", f"auto: {name} EP={ep} would use DeepEP, but it is {_availability_text(target)}")
    return Decision("alltoall", f"auto: {name} (sm{major}x) is outside the DeepEP/HybridEP allow-lists")


def _availability_text(target) -> str:
    return "not known to be installed on the target" if target.deep_ep_version is None else "not usable there"


def decide(requested: str | None, model, target, resolve: str, keep_current: bool,
           registered: str | None = None) -> Decision:
    """The dispatcher overlap will use, and why: ``requested`` (the caller's), the registered recipe's
    choice (``registered``, its registry row), the config's own (``config_dispatcher``), else
    alltoall - settled by ``base.choices.settle_choices`` - then ``decision_for`` it."""
    settled = settle_choices({DISPATCHER: requested}, {DISPATCHER: registered},
                             {DISPATCHER: config_dispatcher(model, keep_current)})[DISPATCHER]
    return decision_for(settled, model, target, resolve)


def config_dispatcher(model, keep_current: bool) -> str | None:
    """The config's own dispatcher when overlap keeps it: the config already enables overlap
    (``keep_current``) or the recipe asked MB's ``apply_flex_dispatcher_backend`` for it and MB
    applied it - and it is one overlap can split; else None."""
    asked = recipe_request(model)
    return current_dispatcher(model) if keep_current or (asked is not None and asked.applied) else None


def decision_for(settled: Settled, model, target, resolve: str) -> Decision:
    """The dispatcher of a settled choice (``base.choices.settle_choices``): ``auto`` turned into a
    backend (``_auto``), the registry row's named so; with ``resolve="auto"`` alltoall instead of a
    backend that cannot run on the target, recording why."""
    ep = getattr(model, "expert_model_parallel_size", None) or 1
    source = settled_source(settled)
    if settled.value == AUTO:  # a name checked where the run was described (RunSpec, Options): dispatcher_name
        decision = dataclasses.replace(_auto(target, ep, model), source=source)
    else:
        decision = Decision(settled.value, _REGISTERED if settled.source == REGISTRY else "", source=source)
    if resolve == "auto" and decision.dispatcher != "alltoall":
        why = [p for p in problems(decision.dispatcher, target) if "allow-list" not in p]
        if why:  # the allow-list fallback is MB's own, seen by `apply`
            return Decision("alltoall", f"{decision.dispatcher} cannot run on the target",
                            [f"{decision.dispatcher} -> alltoall: {w}" for w in why], source=Source.RESOLVE)
    return decision


def apply(model, backend: str, target) -> bool:
    """Call MB's ``apply_flex_dispatcher_backend``; True when flex really got set (False: MB fell back)."""
    from megatron.bridge.training.flex_dispatcher_backend import apply_flex_dispatcher_backend

    from ..target.simulate import on_target

    with on_target(target):  # within the build's own simulation of the target, else one of its own
        apply_flex_dispatcher_backend(model, backend)
    return model.moe_token_dispatcher_type == "flex" and model.moe_flex_dispatcher_backend == backend


# ---- a recipe's own request ----------------------------------------------------------------------
RECIPE_REQUEST = "ep_overlap_recipe_request"
"""The model-config attribute holding the recipe's ``RecipeRequest``: an attribute, not a dataclass
field, so no YAML, override or upstream code sees it; a deep copy keeps it."""


@dataclass(frozen=True)
class RecipeRequest:
    """One call of MB's ``apply_flex_dispatcher_backend`` made by a recipe while it was built."""

    backend: str
    applied: bool
    """False: MB left the dispatcher alltoall (its GPU allow-list; upstream says so only in a rank-0 warning)."""
    gpu_name: str | None
    """The GPU MB judged (the simulated target's in a dry run); None: no CUDA, MB applies any backend."""
    left: tuple[Any, Any] = (None, None)
    """(moe_token_dispatcher_type, moe_flex_dispatcher_backend) as MB's call left them. When the recipe
    sets its dispatcher itself afterwards, the fields differ at the end of the build and the request
    is superseded: ``recording_recipe_requests`` drops it (a later alltoall set by this tool must not
    revive it)."""

    def __str__(self) -> str:
        return f"{self.backend} on {self.gpu_name or 'no GPU'}: " + (
            "applied" if self.applied else "Megatron-Bridge fell back to alltoall")


def recipe_request(model) -> RecipeRequest | None:
    value = getattr(model, RECIPE_REQUEST, None)
    return value if isinstance(value, RecipeRequest) else None


def recipe_fell_back(model) -> RecipeRequest | None:
    """The recipe's request MB silently replaced with alltoall, while the config still holds that alltoall."""
    request = recipe_request(model)
    return request if request is not None and not request.applied and current_dispatcher(model) == "alltoall" else None


def _gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_properties(0).name if torch.cuda.is_available() else None


def _run_as_mb_function(model_config, moe_flex_dispatcher_backend=None):
    """Becomes the code of MB's function while recording, so every reference to it - its module's, a
    name imported from it, a closure - is watched. It runs with MB's module globals, where
    ``recording_recipe_requests`` puts the recorder under this name."""
    return _ep_overlap_record_request(model_config, moe_flex_dispatcher_backend)  # noqa: F821


@contextlib.contextmanager
def recording_recipe_requests() -> Iterator[None]:
    """While a recipe builds: each call of MB's ``apply_flex_dispatcher_backend`` for a MoE model leaves a
    ``RecipeRequest`` on the model config it was given. Re-entrant (the outer recording records).
    One thread at a time: a recipe built on another thread while this one records is recorded only
    until this recording ends (the pipeline, bench and tune build their configs one after another)."""
    from megatron.bridge.training import flex_dispatcher_backend as mb

    from ..target.simulate import Patches

    function = mb.apply_flex_dispatcher_backend
    if (not isinstance(function, types.FunctionType) or function.__code__ is _run_as_mb_function.__code__
            or function.__closure__):
        yield  # already recording, or replaced by someone else: nothing to watch
        return
    upstream = types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__)
    upstream.__kwdefaults__ = function.__kwdefaults__
    signature = inspect.signature(function)

    recorded: list[Any] = []

    def record(*args, **kwargs):
        upstream(*args, **kwargs)
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        model, backend = call.arguments["model_config"], call.arguments["moe_flex_dispatcher_backend"]
        if backend in FLEX_BACKENDS and getattr(model, "num_moe_experts", None):  # MB skips a dense model
            left = _dispatcher_fields(model)
            applied = left == ("flex", backend)
            with contextlib.suppress(AttributeError, TypeError):  # a frozen or slotted config cannot carry it
                setattr(model, RECIPE_REQUEST, RecipeRequest(backend, applied, _gpu_name(), left))
                recorded.append(model)

    patches = Patches()
    patches.set(mb, "_ep_overlap_record_request", record)
    patches.set(function, "__code__", _run_as_mb_function.__code__)
    try:
        yield
    finally:
        patches.restore()
        for model in recorded:
            _drop_superseded_request(model)


def _dispatcher_fields(model) -> tuple[Any, Any]:
    return getattr(model, "moe_token_dispatcher_type", None), getattr(model, "moe_flex_dispatcher_backend", None)


def _drop_superseded_request(model) -> RecipeRequest | None:
    """At the end of a recipe's build: forget its recorded request when the recipe set the dispatcher
    fields itself after the call (NVIDIA's GB200/GB300 recipes build on an H100 base recipe that
    asks for DeepEP, then set flex/HybridEP directly). Returns the request dropped, if any."""
    request = recipe_request(model)
    if request is None or _dispatcher_fields(model) == request.left:
        return None
    with contextlib.suppress(AttributeError, TypeError):
        delattr(model, RECIPE_REQUEST)
    return request
