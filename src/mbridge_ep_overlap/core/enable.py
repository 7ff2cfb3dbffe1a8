"""``enable_ep_overlap``: turn on MoE EP communication overlap in a Megatron-Bridge config.

Contract
--------
``enable_ep_overlap(cfg, dispatcher=None, delay_wgrad=None, high_priority_a2a=None, resolve=...)``:

* works on a ``ConfigContainer`` whether ``cfg.comm_overlap`` is None (it creates
  ``CommOverlapConfig(tp_comm_overlap=False)``) or already finalized (it updates the frozen
  ``user_comm_overlap_cfg`` snapshot too); flags are set on ``cfg.comm_overlap`` because
  ``CommOverlapConfig.setup()`` copies them onto the model and would revert a model-only flag;
* keeps the recipe's choices where the caller makes none: with ``dispatcher``, ``delay_wgrad`` or
  ``high_priority_a2a`` left ``None`` on a config that already enables overlap, its dispatcher
  (and flex backend), delayed wgrad and all-to-all priority stay, and the plan says "the recipe's";
  without overlap on, the defaults are alltoall, no delayed wgrad, the default-priority stream;
* gives the overlapped schedule's all-to-all stream CUDA high priority unless told otherwise
  (``high_priority_a2a=False``) or the recipe already enabled overlap (then its choice is kept);
* sets ``moe_shared_expert_overlap=False``; decides the dispatcher in one place
  (``dispatcher.decide``) and for a flex backend calls MB's ``apply_flex_dispatcher_backend``,
  refusing MB's silent fallback to alltoall (``resolve="error"``) or recording it
  (``resolve="auto"``); HybridEP's topology variables are set only when HybridEP is what the
  config ends with;
* a flex backend the recipe itself asked MB's ``apply_flex_dispatcher_backend`` for (recorded while
  it was built: ``dispatcher.recording_recipe_requests``) is "the recipe's" when MB applied it;
  when MB silently fell back to alltoall, a ``dispatcher`` given now replaces the recipe's request,
  ``resolve="auto"`` accepts the fallback and records it, and otherwise rule ``recipe-flex-fallback``
  refuses it (``settle_recipe_fallback``);
* puts ``CUDA_DEVICE_MAX_CONNECTIONS`` (``cuda_device_max_connections``: an int from 1 to 32, CUDA's
  range; and HybridEP's NVLink-domain variables) into ``cfg.env_vars`` unless the user already set
  them there; the plan shows each with the value the run gets;
* refuses an argument of the wrong type with ``UsageError`` (``delay_wgrad=1`` is not a bool);
* evaluates the rule table once (``resolve="auto"`` re-evaluates after applying each documented
  fix: of every error, and of a warning that has one - one microbatch per rank gets a global batch
  of two); conflicts the user must decide about raise ``EPOverlapError`` listing all of them; what
  has no fix raises in both modes;
* labels every change and choice of the plan with one ``provenance.Source``: requested (an argument
  given), the recipe's (``Options.recipe_registry``: a registered recipe's choice, or a value the config
  had), default, set by resolve, set by an override (found changed after configuring);
* is atomic: all work happens on a deep copy; only when every check passes are the recorded
  changes replayed onto ``cfg``. If it raises, ``cfg`` is exactly as it was;
* installs finalize-time enforcement (``enforcement.install``) so MB's own
  ``runtime_config_update`` and ``cfg.validate()`` re-run the rules after later overrides.

``Session`` is the same work step by step, for ``build`` (which applies Hydra-style overrides
between configuring and checking, and evaluates once). ``disable_ep_overlap`` is its exact inverse
(every field enable set back to the value it replaced, the created sections removed, the class MB's
again); on a config enable never touched it really turns EP overlap off.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from ..base.choices import (ALLTOALL, CHOICES, DEFAULT, DELAY_WGRAD, DISPATCHER, FLAG, HIGH_PRIORITY_A2A, OPTIONAL_SWITCHES,
                            REGISTRY, Settled, dispatcher_name, resolve_mode, settle_choices)
from ..target.cluster import ClusterEnvironment
from . import dispatcher as dispatchers
from .arguments import require_config, require_target
from .engine import Report, evaluate, malformed
from ..base.errors import EPOverlapError, Severity, UsageError, Violation, require_optional_bool
from .facts import Facts, get_path, set_path
from .plan import FieldChange, OverlapPlan
from .provenance import Source, settled_source
from .rules import RULES_BY_ID
from .rules.flex import expected_hybridep_ranks
from .rules.values import MAX_CONNECTIONS
from ..base.sizes import positive_int
from ..base.values import short

EP_FLAGS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")
# In every paired measurement on 2x H200 the high-priority stream was at least as fast
# (throttled link: +1 to +14%; NVLink: +1%; docs/benchmarks.md), and NVIDIA's perf recipes set it.
HIGH_PRIORITY_DEFAULT = ("high-priority all-to-all stream (never slower in the paired 2x H200 "
                         "measurements, docs/benchmarks.md; high_priority_a2a=False turns it off)")
DEFAULT_MAX_CONNECTIONS = 32


@dataclass(frozen=True)
class Options:
    """What the caller asked for; None = keep the recipe's choice (or the default)."""

    dispatcher: str | None = None
    delay_wgrad: bool | None = None
    high_priority_a2a: bool | None = None
    resolve: str = "error"
    cuda_device_max_connections: int | None = None
    """None: this package's default, ``DEFAULT_MAX_CONNECTIONS``."""
    recipe_registry: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The registered recipe's choices (its registry row: ``CHOICES`` -> value, None = none), used where
    the caller makes none (``base.choices.settle_choices``)."""

    def validated(self) -> "Options":
        resolve_mode(self.resolve)
        if self.dispatcher is not None and self.dispatcher != dispatcher_name(self.dispatcher):
            return dataclasses.replace(self, dispatcher=dispatcher_name(self.dispatcher)).validated()
        connections = positive_int(self.cuda_device_max_connections)
        if self.cuda_device_max_connections is not None and (connections is None or connections > MAX_CONNECTIONS):
            raise UsageError("cuda_device_max_connections", self.cuda_device_max_connections,
                             f"an integer from 1 to {MAX_CONNECTIONS} (CUDA's range)", "invalid")
        for name in OPTIONAL_SWITCHES:
            require_optional_bool(name, getattr(self, name))
        return self


class _Editor:
    """Applies edits to a config and records them (for the plan, and for replay onto the user's)."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.changes: list[FieldChange] = []

    def set(self, path: str, new: Any, reason: str, source: Source) -> bool:
        old = get_path(self.cfg, path)
        if old is new or (_plain(old) and _plain(new) and old == new):
            return False
        set_path(self.cfg, path, new)
        self.changes.append(FieldChange(path, copy.deepcopy(old), copy.deepcopy(new), reason, source))
        return True

    def set_ep_flag(self, name: str, value: bool, reason: str, source: Source) -> None:
        """Set a comm-overlap flag where it survives setup(): public field and frozen snapshot."""
        self.set(f"comm_overlap.{name}", value, reason, source)
        if getattr(self.cfg.comm_overlap, "user_comm_overlap_cfg", None) is not None:
            self.set(f"comm_overlap.user_comm_overlap_cfg.{name}", value, reason + " (finalized snapshot)", source)

    def record_model_diff(self, before: dict[str, Any], reason: str, source: Source) -> None:
        for name, old in before.items():
            new = getattr(self.cfg.model, name)
            if old != new:
                self.changes.append(FieldChange(f"model.{name}", old, new, reason, source))


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, list, tuple, dict))


def mb_fallback(backend: str, target: ClusterEnvironment) -> Violation:
    """Megatron-Bridge's ``apply_flex_dispatcher_backend`` set alltoall instead of ``backend`` (its
    GPU allow-list; upstream says so only in a rank-0 warning): the refusal, as rule flex-backend-gpu."""
    rule = RULES_BY_ID["flex-backend-gpu"]
    return Violation(
        rule_id=rule.id, severity=Severity.ERROR, field=rule.field,
        current=f"{backend} on {target.gpu_name}", required=rule.required,
        message=f"Megatron-Bridge fell back from {backend} to alltoall (only a rank-0 warning upstream)",
        fix=rule.fix + "; or pass resolve='auto' to accept the fallback", upstream=rule.upstream.value,
    )


def settle_recipe_fallback(cfg: Any, requested: str | None, resolve: str, target: ClusterEnvironment,
                           edit: "_Editor | None" = None) -> Violation | None:
    """MB's silent fallback from the flex backend the recipe itself asked for (``dispatcher.recipe_fell_back``),
    before any dispatcher is set: a dispatcher requested now replaces the recipe's request; with
    ``resolve="auto"`` the alltoall MB left is accepted and the warning returned; otherwise it stays
    for the rule ``recipe-flex-fallback`` to refuse. The record is cleared through ``edit`` (the
    plan lists it, and ``enable_ep_overlap`` replays it onto the caller's config)."""
    request = dispatchers.recipe_fell_back(cfg.model)
    if request is None or (requested is None and resolve != "auto"):
        return None
    rule = RULES_BY_ID["recipe-flex-fallback"]
    warning = dataclasses.replace(rule.violation(Facts(cfg, target)), severity=Severity.WARNING)
    why, source = ((f"dispatcher {requested}", Source.REQUESTED) if requested
                   else ("alltoall accepted", Source.RESOLVE))
    (edit or _Editor(cfg)).set(f"model.{dispatchers.RECIPE_REQUEST}", None,
                               f"{why} (the recipe asked for {request.backend}; MB fell back on {request.gpu_name})", source)
    return None if requested else warning


def _missing_sections(cfg: Any) -> list[tuple[str, Any, str]]:
    from megatron.bridge.training.comm_overlap import CommOverlapConfig

    out = []
    if cfg.comm_overlap is None:
        out.append(("comm_overlap", CommOverlapConfig(tp_comm_overlap=False), "recipe had no CommOverlapConfig"))
    if cfg.env_vars is None:
        out.append(("env_vars", {}, "recipe had no env_vars"))
    return out


def add_missing_sections(cfg: Any) -> None:
    """The sections ``enable`` creates when a recipe has none (a CommOverlapConfig, an env_vars dict)."""
    for path, value, _ in _missing_sections(cfg):
        set_path(cfg, path, value)


def hybridep_environment(cfg: Any, target: ClusterEnvironment) -> dict[str, tuple[str, str]]:
    """The variables HybridEP needs for the target's topology: name -> (value, why). USE_MNNVL=0 on
    NVLink domains of <= 8 GPUs keeps its buffers on CUDA IPC handles (README: the fabric path)."""
    domain = target.nvlink_domain_size or 8
    ranks = expected_hybridep_ranks(cfg.model.expert_model_parallel_size or 1, domain)
    return {"NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": (str(ranks), "HybridEP topology"),
            "NVLINK_DOMAIN_SIZE": (str(domain), "HybridEP topology"),
            "USE_MNNVL": ("1" if domain > 8 else "0", "HybridEP multi-node NVLink")}


def refuse_malformed(cfg: Any, target: ClusterEnvironment, forward_step_func: Callable | None, context: str) -> None:
    """Nothing is configured on a config whose values the rules cannot read: when a value rule fails
    (``engine.malformed``, cheap), every violation the table finds is raised (``EPOverlapError``)."""
    if any(v.severity is Severity.ERROR for v in malformed(cfg, target)):
        report = evaluate(cfg, target, forward_step_func)
        report.overlap = True  # judged on the way to turning overlap on: the refusal says so
        report.raise_for_errors(context)


class Session:
    """One ``enable_ep_overlap`` on ``cfg`` (edited in place): configure, check once, finish."""

    def __init__(self, cfg: Any, options: Options, target: ClusterEnvironment,
                 forward_step_func: Callable | None = None) -> None:
        self.cfg = cfg
        self.options = options  # checked where the run was described (RunSpec.validated, enable_ep_overlap)
        self.target = target
        self.forward_step_func = forward_step_func
        self.edit = _Editor(cfg)
        self.decision: dispatchers.Decision | None = None
        self.fallback: Violation | None = None  # MB's silent allow-list fallback, refused with resolve='error'
        self.recipe_fallback: str | None = None  # the recipe's backend MB fell back from (accepted by resolve='auto')
        self.notes: list[str] = []
        self.warnings: list[Violation] = []
        self.env_vars: dict[str, str] = {}
        self.env_vars_kept: dict[str, str] = {}
        self.delay_reason = ""
        self.delay_source = Source.DEFAULT
        self.planned: dict[str, bool] = {}  # delayed wgrad and stream priority as configuring left them
        self.high_priority_source = Source.DEFAULT
        self._settled: dict[str, Settled] | None = None

    def settled(self, already_on: bool) -> dict[str, Settled]:
        """Each choice settled once for the session (``base.choices.settle_choices``): the caller's,
        the registry row's, the config's own (when it already enables overlap; its dispatcher also
        when the recipe asked MB for it and MB applied it), the default."""
        if self._settled is None:
            opts, model = self.options, self.cfg.model
            config = {DISPATCHER: dispatchers.config_dispatcher(model, already_on)}
            if already_on:
                facts = Facts(self.cfg, self.target)
                config.update({DELAY_WGRAD: facts.delay_wgrad,
                               HIGH_PRIORITY_A2A: bool(facts.model("high_priority_a2a_comm_stream"))})
            self._settled = settle_choices({name: getattr(opts, name) for name in CHOICES}, opts.recipe_registry, config)
        return self._settled

    # ---- configure -------------------------------------------------------------------------
    def configure(self) -> "Session":
        cfg, opts, edit = self.cfg, self.options, self.edit
        require_config(cfg)
        already_on = Facts(cfg, self.target).overlap
        for path, value, reason in _missing_sections(cfg):
            edit.set(path, value, reason, Source.DEFAULT)
        edit.set_ep_flag("overlap_moe_expert_parallel_comm", True, "EP overlap on", Source.REQUESTED)

        settled = self.settled(already_on)
        delay = settled[DELAY_WGRAD]
        self.delay_source = settled_source(delay)
        self.delay_reason = "delayed wgrad is a separate opt-in" if delay.source == DEFAULT else ""
        edit.set_ep_flag("delay_wgrad_compute", delay.value, self.delay_reason or "delayed wgrad",
                        self.delay_source)
        edit.set("model.moe_shared_expert_overlap", False, "EP overlap on: shared-expert overlap is mutually exclusive "
                 "with it", Source.REQUESTED)
        priority = settled[HIGH_PRIORITY_A2A]
        self.high_priority_source = settled_source(priority)
        if priority.source == DEFAULT:
            edit.set("model.high_priority_a2a_comm_stream", True, HIGH_PRIORITY_DEFAULT, Source.DEFAULT)
        elif priority.source in (FLAG, REGISTRY):
            edit.set("model.high_priority_a2a_comm_stream", priority.value,
                     f"{'high' if priority.value else 'default'}-priority all-to-all stream",
                     self.high_priority_source)
        self.configure_dispatcher(overlap=True, keep_current=already_on)
        connections = opts.cuda_device_max_connections
        recipe_value = str((cfg.env_vars or {}).get("CUDA_DEVICE_MAX_CONNECTIONS"))
        # the caller's value wins over the recipe's; so does 32 over a recipe's 1, which would serialise
        # the all-to-all stream behind compute (overlap asked for, nothing hidden: rule
        # cuda-device-max-connections); any other value of the recipe is kept
        self._set_env("CUDA_DEVICE_MAX_CONNECTIONS", str(connections or DEFAULT_MAX_CONNECTIONS),
                      "the A2A stream must not be serialised" + (" (the recipe's 1 would serialise it)"
                                                                 if connections is None and recipe_value == "1" else ""),
                      Source.DEFAULT if connections is None else Source.REQUESTED,
                      replace=connections is not None or recipe_value == "1")
        self.set_dispatcher_environment()
        facts = Facts(cfg, self.target)
        self.planned = {"delay_wgrad": facts.delay_wgrad, "high_priority": bool(facts.model("high_priority_a2a_comm_stream"))}
        return self

    def configure_dispatcher(self, *, overlap: bool, keep_current: bool = False) -> None:
        """The one place the dispatcher is configured, with EP overlap on or off; every edit is
        recorded (``self.edit``). Overlap off: no dispatcher asked for keeps the config's own, and
        a named one is set as asked (``auto`` ranks dispatchers for the overlapped schedule and is
        refused by ``RunSpec.validated``); overlap on: ``dispatcher.decide``."""
        requested, resolve = self.options.dispatcher, self.options.resolve
        settled = self.settled(keep_current)[DISPATCHER]
        asked = dispatchers.recipe_fell_back(self.cfg.model)
        named = settled.value if settled.source in (FLAG, REGISTRY) else None
        accepted = settle_recipe_fallback(self.cfg, named, resolve, self.target, self.edit)
        if accepted is not None:
            self.warnings.append(accepted)
            self.recipe_fallback = asked.backend
            self.notes.append(f"resolve='auto': MB fell back from the recipe's {asked.backend} to alltoall on "
                              f"{asked.gpu_name}")
        if not overlap and requested is None:
            return
        decision = (dispatchers.decision_for(settled, self.cfg.model, self.target, resolve)
                    if overlap else dispatchers.Decision(requested, ""))
        self.decision = decision
        self.notes += [f"resolve='auto': {why}" for why in decision.fallbacks]
        model = self.cfg.model
        why = f": {decision.reason}" if decision.reason else ""
        if decision.dispatcher == ALLTOALL:
            for name, value in dispatchers.ALLTOALL_FIELDS.items():
                self.edit.set(f"model.{name}", value, f"dispatcher alltoall{why}", decision.source)
            return
        backend = decision.dispatcher
        names = ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_shared_expert_overlap")
        before = {n: getattr(model, n) for n in names}
        applied = dispatchers.apply(model, backend, self.target)
        fell_back_accepted = not applied and self.options.resolve == "auto"
        self.edit.record_model_diff(
            before, f"apply_flex_dispatcher_backend(model, {backend!r}){why}"
            + (f": MB fell back to alltoall on {self.target.gpu_name}" if fell_back_accepted else ""),
            Source.RESOLVE if fell_back_accepted else decision.source)
        if applied:
            if not self.target.has_gpu:
                self.notes.append(f"GPU unknown here: the {backend} GPU allow-list is checked at finalize on the GPU node")
            return
        fell_back = mb_fallback(backend, self.target)
        if self.options.resolve == "error":
            self.fallback = fell_back
        else:
            self.warnings.append(dataclasses.replace(fell_back, severity=Severity.WARNING))
            self.notes.append(f"resolve='auto': MB fell back from {backend} to alltoall on {self.target.gpu_name}")

    def set_dispatcher_environment(self) -> None:
        """The variables the configured dispatcher needs (HybridEP's topology), unless already set."""
        if Facts(self.cfg, self.target).flex_backend != "hybridep":
            return
        if self.cfg.env_vars is None:
            self.edit.set("env_vars", {}, "recipe had no env_vars", Source.DEFAULT)
        for name, (value, reason) in hybridep_environment(self.cfg, self.target).items():
            self._set_env(name, value, reason, Source.DEFAULT)

    def _set_env(self, name: str, value: str, reason: str, source: Source, replace: bool = False) -> None:
        existing = (self.cfg.env_vars or {}).get(name)
        if existing is not None and not (replace and str(existing) != value):
            self.env_vars_kept[name] = str(existing)
            return
        self.edit.set(f"env_vars.{name}", value, reason, source)
        self.env_vars[name] = value

    # ---- check -----------------------------------------------------------------------------
    def check(self) -> Report:
        """Evaluate the table once; with resolve='auto' apply the fix of each failing rule (an error, or a
        warning that has one: one microbatch per rank) until stable."""
        for _ in range(len(RULES_BY_ID)):
            report = evaluate(self.cfg, self.target, self.forward_step_func)
            fixable = [v for v in report.violations if v.severity is not Severity.ADVICE
                       and (v.severity is Severity.ERROR or RULES_BY_ID[v.rule_id].auto_fix)]
            if self.options.resolve != "auto" or not fixable:
                return report
            applied = False
            facts = Facts(self.cfg, self.target, self.forward_step_func)
            for violation in fixable:
                rule = RULES_BY_ID[violation.rule_id]
                for path, value in (rule.auto_fix(facts) if rule.auto_fix else []):
                    applied |= self.edit.set(path, value, f"{rule.id}: {rule.message} (found {short(violation.current, 240)})",
                                             Source.RESOLVE)
            if not applied:
                return report
        return report

    # ---- finish ----------------------------------------------------------------------------
    def finish(self, report: Report, context: str = "enable_ep_overlap") -> OverlapPlan:
        """Raise for every error at once, or return the plan of the config as it now is."""
        if self.fallback is not None:
            raise EPOverlapError([self.fallback, *report.violations], context)
        report.raise_for_errors(context)
        facts = Facts(self.cfg, self.target)
        final = facts.dispatcher_name
        planned = {**self.env_vars, **self.env_vars_kept}
        runs_with = {name: facts.env_var(name) for name in planned}  # after overrides, the launcher's first
        reason, source = self.decision.reason, self.decision.source
        if final != self.decision.dispatcher:
            reason, source = "after enable", Source.OVERRIDE
        if self.warnings and final == "alltoall" and self.decision.dispatcher != "alltoall":
            reason, source = f"MB fell back from {self.decision.dispatcher}", Source.RESOLVE
        elif self.recipe_fallback and final == self.decision.dispatcher == "alltoall":
            reason, source = f"MB fell back from the recipe's {self.recipe_fallback} request", Source.RESOLVE
        delay_source = self.delay_source if facts.delay_wgrad == self.planned["delay_wgrad"] else Source.OVERRIDE
        high_priority = bool(facts.model("high_priority_a2a_comm_stream"))
        priority_source = (self.high_priority_source if high_priority == self.planned["high_priority"]
                           else Source.OVERRIDE)
        return OverlapPlan(
            dispatcher=final,
            dispatcher_reason=reason,
            dispatcher_source=source,
            delay_wgrad=facts.delay_wgrad,
            delay_wgrad_reason=self.delay_reason,
            delay_wgrad_source=delay_source,
            high_priority_a2a=high_priority,
            high_priority_a2a_source=priority_source,
            resolve=self.options.resolve,
            settled_by={name: choice.source for name, choice in (self._settled or {}).items()},
            environment=self.target.summary(),
            changes=list(self.edit.changes),
            env_vars={k: v for k, v in self.env_vars.items() if runs_with[k] == v},
            env_vars_kept={k: v for k, v in self.env_vars_kept.items() if runs_with[k] == v},
            env_vars_changed={k: runs_with[k] for k, v in planned.items() if runs_with[k] != v},
            warnings=self.warnings + [v for v in report.violations if v.severity is not Severity.ERROR],
            notes=list(self.notes),
            not_checked=list(report.not_checked),
        )


def enable_ep_overlap(
    cfg: Any,
    dispatcher: str | None = None,
    *,
    delay_wgrad: bool | None = None,
    high_priority_a2a: bool | None = None,
    resolve: str = "error",
    cuda_device_max_connections: int | None = None,
    environment: ClusterEnvironment | None = None,
    forward_step_func: Callable | None = None,
) -> OverlapPlan:
    """Turn on EP overlap in ``cfg`` (mutated in place) and return the plan of what changed."""
    from ..target.simulate import current
    from . import enforcement

    options = Options(dispatcher, delay_wgrad, high_priority_a2a, resolve, cuda_device_max_connections).validated()
    require_config(cfg)
    require_target(environment)
    target = environment or current()
    refuse_malformed(cfg, target, forward_step_func, "enable_ep_overlap")
    session = Session(copy.deepcopy(cfg), options, target, forward_step_func).configure()
    plan = session.finish(session.check())
    undo = getattr(cfg, UNDO, None)
    undo = undo if isinstance(undo, Undo) else Undo(enforcement_installed=not enforcement.is_installed(cfg))
    for change in session.edit.changes:  # the commit: replay onto the user's object graph
        undo.replaced.append((change.path, copy.deepcopy(get_path(cfg, change.path, ABSENT))))
        set_path(cfg, change.path, copy.deepcopy(get_path(session.cfg, change.path)))
    enforcement.install(cfg)
    object.__setattr__(cfg, UNDO, undo)
    return plan


UNDO = "ep_overlap_undo"
"""The ``ConfigContainer`` attribute holding what ``enable_ep_overlap`` replaced (an attribute, not a
dataclass field: no YAML, override or upstream code sees it)."""
ABSENT = type("Absent", (), {"__repr__": lambda self: "<absent>", "__deepcopy__": lambda self, memo: self})()
"""A value that was not there (an ``env_vars`` key, a model attribute): undone by removing it."""


@dataclass
class Undo:
    """What ``enable_ep_overlap`` replaced on a config, in order; several enables append."""

    enforcement_installed: bool
    """True: enable installed the enforcement class (the config was MB's class before)."""
    replaced: list[tuple[str, Any]] = dataclasses.field(default_factory=list)
    """(dotted path, the value before) for every field enable set, in the order it set them."""


def _restore(cfg: Any, path: str, value: Any) -> None:
    if value is not ABSENT:
        set_path(cfg, path, copy.deepcopy(value))
        return
    head, _, last = path.rpartition(".")
    parent = get_path(cfg, head) if head else cfg
    if isinstance(parent, dict):
        parent.pop(last, None)
    elif parent is not None and last in getattr(parent, "__dict__", {}):
        delattr(parent, last)


def disable_ep_overlap(cfg: Any) -> list[FieldChange]:
    """Undo ``enable_ep_overlap`` exactly, or turn EP overlap off on a config enable never touched.

    * After ``enable_ep_overlap(cfg, ...)`` (one or several): every field enable set is put back to
      the value it replaced, in reverse order - the ``comm_overlap`` it created removed again,
      ``cfg.env_vars`` keys it added removed, the dispatcher, ``high_priority_a2a_comm_stream``,
      ``moe_shared_expert_overlap`` and the recipe's recorded flex request restored - and the class
      is MB's again when enable installed the enforcement. The config then equals the one enable
      was given (fields changed since by someone else and not by enable stay as they are).
    * On a config enable never touched (a recipe that enables overlap itself): EP overlap and delayed
      wgrad really off - the ``comm_overlap`` flags, its finalized snapshot and the model's (MB's
      ``--moe_a2a_overlap false`` is a no-op, Megatron-Bridge issue 6006); nothing else changes.

    Returns the changes made (path, old, new, reason).
    """
    from . import enforcement  # function-level for start-up speed: it imports Megatron-Bridge

    require_config(cfg)
    undo = cfg.__dict__.pop(UNDO, None)
    if isinstance(undo, Undo):
        changes = []
        for path, value in reversed(undo.replaced):
            current = get_path(cfg, path, ABSENT)
            _restore(cfg, path, value)
            changes.append(FieldChange(path, None if current is ABSENT else current, None if value is ABSENT else value,
                                       "enable_ep_overlap undone", Source.REQUESTED))
        if undo.enforcement_installed:
            enforcement.remove(cfg)
        return changes
    edit = _Editor(cfg)  # no atomicity needed: every edit is an independent reset to False
    if cfg.comm_overlap is not None:
        for name in EP_FLAGS:
            edit.set_ep_flag(name, False, "EP overlap turned off", Source.REQUESTED)
    for name in EP_FLAGS:
        edit.set(f"model.{name}", False, "EP overlap turned off", Source.REQUESTED)
    return edit.changes
