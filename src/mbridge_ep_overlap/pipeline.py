"""``build(spec) -> Built``: the only pipeline from a ``RunSpec`` to a checked config.

Contract
--------
``build`` resolves the recipe and the target, builds the recipe's config offline (for a
described target inside ``target.simulate``: the recipe sees the cluster's GPUs and TE, and a flex
backend it asks MB's ``apply_flex_dispatcher_backend`` for is recorded, so MB's silent fallback from
it is refused), applies the spec's sizes, configures EP overlap (``core.enable.Session``: the
recipe's own choices kept where the spec makes none) or really turns it off, applies the
Hydra-style overrides, and evaluates the rule table **once** on the result (``resolve="auto"``
re-evaluates after each documented fix). A refusal raises ``EPOverlapError`` listing every violation; a bad spec raises ``UsageError``. The
returned ``Built`` carries the config (finalize-time enforcement installed when overlap is on),
the plan (None with overlap off), the report and the target; ``finalize(built)`` runs MB's real
``runtime_config_update`` for the target reusing that report. ``scripts/run_script.py``, ``plan``,
``launch_slurm.py``, the benchmark and the recipes' tests all go through here.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

from .base.choices import CHOICES
from .base.errors import EPOverlapError, UsageError
from .base.values import get_path
from .core.enable import Options, Session, add_missing_sections, disable_ep_overlap, refuse_malformed
from .core.engine import UNREADABLE, Report, evaluate
from .core.plan import FieldChange, OverlapPlan
from .spec import SIZE_FIELDS, Recipe, RunSpec, resolve_recipe
from .target import shims
from .target.cluster import ClusterEnvironment, describe
from .target.probe import probe
from .target.simulate import on_target
from .target.simulated_finalize import finalize_for
from .target.stack import deep_ep_version, te_version


@dataclass
class Built:
    spec: RunSpec
    recipe: Recipe
    target: ClusterEnvironment
    cfg: Any
    plan: OverlapPlan | None
    report: Report
    changes: list[FieldChange] = dataclasses.field(default_factory=list)
    """Every field the build set (the plan's changes with overlap on; turning it off and the dispatcher's with it off)."""


def resolve_target(spec: RunSpec, recipe: Recipe) -> ClusterEnvironment:
    t = spec.target
    if t.this_machine:
        return probe()
    gpu, num = t.gpu or recipe.entry.gpu, t.num_gpus or recipe.entry.num_gpus
    if gpu is None or num is None:
        recipe.config(spec.hf_config_dir)  # a MODULE:FUNCTION that is no recipe is the first thing to say
        raise UsageError("target", f"{'?' if gpu is None else gpu} x {'?' if num is None else num} GPUs",
                         f"--gpu and --num-gpus (recipe {recipe.name} does not say which cluster it is for)")
    return describe(gpu, num, te_version=te_version(t.te), deep_ep_version=deep_ep_version(t.deep_ep),
                    env_vars=t.exported())


def _apply_sizes(cfg: Any, spec: RunSpec) -> None:
    for name in SIZE_FIELDS:
        value = getattr(spec, name)
        if value is not None:
            setattr(cfg.model, name, value)
    if spec.global_batch_size:
        cfg.train.global_batch_size = spec.global_batch_size
    if spec.micro_batch_size:
        cfg.train.micro_batch_size = spec.micro_batch_size
    if spec.seq_length:
        cfg.model.seq_length = spec.seq_length
        cfg.dataset.seq_length = spec.seq_length
    if spec.max_steps:
        cfg.train.train_iters = spec.max_steps
    if spec.force_balance:
        cfg.model.moe_router_force_load_balancing = True


def apply_overrides(cfg: Any, overrides: tuple[str, ...] | list[str]) -> None:
    """MB's own Hydra-style override machinery; a key that names a whole config section, an unknown
    key or an unresolvable value is bad usage (one line naming the override), never a traceback."""
    if not overrides:
        return
    from megatron.bridge.training.utils.omegaconf_utils import OverridesError, process_config_with_overrides
    from omegaconf.errors import OmegaConfBaseException

    missing = object()
    hydra, fields = [], []
    for item in overrides:
        key = item.partition("=")[0]
        parent_path, _, leaf = key.rpartition(".")
        parent = get_path(cfg, parent_path, missing) if parent_path else cfg
        if parent is missing or parent is None or (not isinstance(parent, dict) and not hasattr(parent, leaf)):
            raise UsageError("override", item, f"an existing config field ({key} is not one)", "unknown")
        if dataclasses.is_dataclass(get_path(cfg, key)):
            raise UsageError("override", item, f"a field inside {key} (it would replace the whole {key} section)",
                             "invalid")
        # a new key of a dict field (env_vars.NAME=1 where the config has no NAME yet, e.g. with EP
        # overlap off): Hydra's "+" adds it, as setting a dict entry does
        hydra.append(f"+{item}" if isinstance(parent, dict) and leaf not in parent else item)
        fields.append((item, key, parent_path, leaf, get_path(cfg, key, None)))
    try:
        process_config_with_overrides(cfg, cli_overrides=hydra)
    except (OverridesError, OmegaConfBaseException, ValueError, TypeError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError("override", " ".join(overrides), f"values Megatron-Bridge can apply ({first})",
                         "invalid") from None
    for item, key, parent_path, leaf, old in fields:  # MB applies a value of any type as it is
        parent = get_path(cfg, parent_path) if parent_path else cfg
        required = _wrong_type(parent, leaf, old, get_path(cfg, key))
        if required:
            raise UsageError(f"override {key}", get_path(cfg, key), f"{required} (the type of {key})", "wrong type for")


def _annotation(parent: Any, leaf: str) -> Any:
    """The declared type of dataclass field ``leaf`` of ``parent``, or None when it cannot be resolved."""
    if not dataclasses.is_dataclass(parent):
        return None
    try:
        return typing.get_type_hints(type(parent)).get(leaf)
    except Exception:  # noqa: BLE001 - a forward reference Python cannot resolve here: judge by the old value
        return None


def _accepts(hint: Any, value: Any) -> bool | None:
    """Whether ``value`` fits scalar type ``hint``: True / False, None when ``hint`` is not one judged here."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        verdicts = [_accepts(h, value) for h in typing.get_args(hint)]
        return True if any(v is True for v in verdicts) else (None if None in verdicts else False)
    if origin is typing.Literal:  # one of named values: a value rule's business, not a type's
        return None
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    return None


def _wrong_type(parent: Any, leaf: str, old: Any, new: Any) -> str | None:
    """The type an override's value should have had (``'int'``), or None when it fits. Judged by the
    field's declared type where it is a scalar one, else by the type of the value it replaced; a
    ``null`` is left to the value rules (they say which fields must be set), and so is a dict entry
    (``env_vars`` takes any scalar)."""
    if new is None or isinstance(parent, dict):
        return None
    hint = _annotation(parent, leaf)
    verdict = _accepts(hint, new) if hint is not None else None
    if verdict is None and isinstance(old, (bool, int, float, str)):
        hint, verdict = type(old), _accepts(type(old), new)
    return None if verdict is not False else _type_name(hint)


def _type_name(hint: Any) -> str:
    """``int``, ``int or null`` (Optional[int]), ``int or float``: the declared type in a user's words."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _checked_arguments(spec: Any, target: Any) -> tuple[RunSpec, ClusterEnvironment | None]:
    if not isinstance(spec, RunSpec):
        raise UsageError("spec", spec, "a RunSpec(recipe=..., ...)", "invalid")
    if target is not None and not isinstance(target, ClusterEnvironment):
        raise UsageError("target", target, "a ClusterEnvironment (describe(gpu, num_gpus) or probe()) or None", "invalid")
    return spec.validated(), target


def build(spec: RunSpec, *, target: ClusterEnvironment | None = None,
          forward_step_func: Callable | None = None) -> Built:
    """``forward_step_func``: the step the run will train with (default: ``mbridge_ep_overlap.forward_step``)."""
    spec, target = _checked_arguments(spec, target)
    shims.install()
    recipe = resolve_recipe(spec.recipe)
    recipe.function()  # an unknown module or function is bad usage before anything else is asked
    target = target or resolve_target(spec, recipe)
    with on_target(target):  # the one simulation of a described target for the whole build
        return _build(spec, recipe, target, forward_step_func)


def _build(spec: RunSpec, recipe: Recipe, target: ClusterEnvironment, forward_step_func: Callable | None) -> Built:
    from .core import enforcement  # function-level for start-up speed: both import Megatron-Bridge
    from .core.forward_step import forward_step

    forward_step_func = forward_step_func or forward_step  # the step scripts/run_script.py trains with

    cfg = recipe.config(spec.hf_config_dir)
    _apply_sizes(cfg, spec)
    entry = recipe.entry
    if spec.ep_overlap:
        options = Options(  # each choice settled in one place (base.choices.settle_choices, in the Session)
            dispatcher=spec.dispatcher,
            delay_wgrad=spec.delay_wgrad,
            high_priority_a2a=spec.high_priority_a2a,
            resolve=spec.resolve,
            recipe_registry={name: getattr(entry, name) for name in CHOICES},
        )
        # The values judged are the ones the run gets (an override may mend a recipe's value): the
        # table runs after the overrides. A malformed value that configuring had to read first is
        # judged the same way, on the recipe's config built afresh with the overrides applied (only
        # on this failure path: configuring has already edited ``cfg``).
        try:
            session = Session(cfg, options, target, forward_step_func).configure()
        except UNREADABLE:
            pristine = recipe.config(spec.hf_config_dir)
            _apply_sizes(pristine, spec)
            add_missing_sections(pristine)
            apply_overrides(pristine, spec.overrides)
            refuse_malformed(pristine, target, forward_step_func, "build")
            raise  # no value rule names it: a gap in the rules, shown as it is
        apply_overrides(cfg, spec.overrides)
        report = session.check()
        plan = session.finish(report, "build")
        if spec.overrides:
            plan.notes.append(f"overrides applied after enable_ep_overlap: {' '.join(spec.overrides)}")
        enforcement.install(cfg)
        return Built(spec, recipe, target, cfg, plan, report, list(plan.changes))
    changes = disable_ep_overlap(cfg)
    if spec.dispatcher and not getattr(cfg.model, "num_moe_experts", None):
        raise UsageError("--dispatcher", spec.dispatcher, f"a MoE model (recipe {recipe.name} has no experts: "
                         "num_moe_experts is unset)", "invalid")
    # the dispatcher as with overlap on (``Session.configure_dispatcher``): a recipe's flex request MB
    # fell back from is replaced by --dispatcher or accepted by resolve='auto'; MB's silent fallback
    # from a requested backend is refused (resolve='error') or a warning
    session = Session(cfg, Options(dispatcher=spec.dispatcher, resolve=spec.resolve), target, forward_step_func)
    session.configure_dispatcher(overlap=False)
    if session.decision is not None:
        session.set_dispatcher_environment()
    apply_overrides(cfg, spec.overrides)
    report = evaluate(cfg, target, forward_step_func)
    report.violations[:0] = session.warnings
    if session.fallback is not None:
        raise EPOverlapError([session.fallback, *report.violations], "build", overlap=False)
    report.raise_for_errors("build")
    return Built(spec, recipe, target, cfg, None, report, changes + session.edit.changes)


def finalize(built: Built):
    """MB's real ``runtime_config_update`` of ``built.cfg`` for its target (hardware and version
    gates simulated for a described target), reusing the build's rule evaluation."""
    from .core import enforcement  # function-level for start-up speed: it imports Megatron-Bridge

    with enforcement.already_checked(built.cfg, built.report):
        return finalize_for(built.cfg, built.target)
