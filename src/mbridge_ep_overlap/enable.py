"""``enable_ep_overlap``: turn on MoE EP communication overlap in a Megatron-Bridge config.

Contract
--------
``enable_ep_overlap(cfg, dispatcher=..., delay_wgrad=..., resolve=...)``:

* works on a ``ConfigContainer`` whether ``cfg.comm_overlap`` is None (it creates
  ``CommOverlapConfig(tp_comm_overlap=False)``) or already finalized (it updates the frozen
  ``user_comm_overlap_cfg`` snapshot too); flags are set on ``cfg.comm_overlap`` because
  ``CommOverlapConfig.setup()`` copies them onto the model and would revert a model-only flag;
* sets ``moe_shared_expert_overlap=False``; sets ``delay_wgrad_compute`` and the high-priority
  all-to-all stream (``model.high_priority_a2a_comm_stream``) only as asked;
* for DeepEP/HybridEP calls MB's ``apply_flex_dispatcher_backend`` and refuses MB's silent
  fallback to alltoall (``resolve="error"``) or records it (``resolve="auto"``);
* puts ``CUDA_DEVICE_MAX_CONNECTIONS`` (and HybridEP's NVLink-domain variables) into
  ``cfg.env_vars`` unless the user already set them there;
* conflicts the user must decide about raise ``EPOverlapError`` listing all of them; with
  ``resolve="auto"`` each rule's documented fix is applied and recorded in the plan; what has no
  fix raises in both modes;
* is atomic: all work happens on a deep copy; only when every check passes are the recorded
  changes replayed onto ``cfg``. If it raises, ``cfg`` is exactly as it was;
* installs finalize-time enforcement (``finalize.install``) so MB's own ``runtime_config_update``
  and ``cfg.validate()`` re-run the rules after later overrides.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from . import environment as environment_mod
from . import finalize
from .check import evaluate
from .dispatcher import FLEX_BACKENDS, apply_flex, choose
from .environment import ClusterEnvironment
from .errors import EPOverlapError, Severity, UsageError, Violation
from .facts import Facts, get_path, set_path
from .plan import FieldChange, OverlapPlan
from .rules import RULES_BY_ID

RESOLVE_MODES = ("error", "auto")
EP_FLAGS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")


class _Editor:
    """Applies edits to the trial copy and records them for replay onto the real config."""

    def __init__(self, trial: Any) -> None:
        self.trial = trial
        self.changes: list[FieldChange] = []

    def set(self, path: str, new: Any, reason: str) -> None:
        old = get_path(self.trial, path)
        if old is new or (_plain(old) and _plain(new) and old == new):
            return
        set_path(self.trial, path, new)
        self.changes.append(FieldChange(path, copy.deepcopy(old), copy.deepcopy(new), reason))

    def set_ep_flag(self, name: str, value: bool, reason: str) -> None:
        """Set a comm-overlap flag where it survives setup(): public field and frozen snapshot."""
        self.set(f"comm_overlap.{name}", value, reason)
        if getattr(self.trial.comm_overlap, "user_comm_overlap_cfg", None) is not None:
            self.set(f"comm_overlap.user_comm_overlap_cfg.{name}", value, reason + " (finalized snapshot)")

    def record_model_diff(self, before: dict[str, Any], reason: str) -> None:
        for name, old in before.items():
            new = getattr(self.trial.model, name)
            if old != new:
                self.changes.append(FieldChange(f"model.{name}", old, new, reason))


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, list, tuple, dict))


def enable_ep_overlap(
    cfg: Any,
    dispatcher: str = "alltoall",
    *,
    delay_wgrad: bool = False,
    high_priority_a2a: bool = False,
    resolve: str = "error",
    cuda_device_max_connections: int = 32,
    environment: ClusterEnvironment | None = None,
    forward_step_func: Callable | None = None,
) -> OverlapPlan:
    """Turn on EP overlap in ``cfg`` (mutated in place) and return the plan of what changed."""
    if resolve not in RESOLVE_MODES:
        raise UsageError("resolve mode", resolve, RESOLVE_MODES)
    if not isinstance(cuda_device_max_connections, int) or cuda_device_max_connections < 1:
        raise UsageError("cuda_device_max_connections", cuda_device_max_connections, "an integer >= 1")
    if not isinstance(delay_wgrad, bool):
        raise UsageError("delay_wgrad", delay_wgrad, (True, False))
    if not isinstance(high_priority_a2a, bool):
        raise UsageError("high_priority_a2a", high_priority_a2a, (True, False))
    env = environment or environment_mod.current()
    ep = getattr(cfg.model, "expert_model_parallel_size", 1) or 1
    choice = choose(dispatcher, env, ep)

    trial = copy.deepcopy(cfg)
    edit = _Editor(trial)
    plan = OverlapPlan(
        dispatcher=choice.dispatcher,
        dispatcher_reason=choice.reason,
        delay_wgrad=delay_wgrad,
        resolve=resolve,
        environment=_describe_env(env),
    )
    fallback = _configure(edit, plan, choice.dispatcher, delay_wgrad, high_priority_a2a, cuda_device_max_connections, env)
    report = _resolve(edit, env, forward_step_func, resolve)
    if fallback is not None and resolve == "error":
        raise EPOverlapError([fallback, *report.violations], "enable_ep_overlap")  # every reason at once
    if report.errors:
        raise EPOverlapError(report.violations, "enable_ep_overlap")
    if fallback is not None:
        plan.dispatcher = "alltoall"
        plan.warnings.append(fallback)
        plan.notes.append(f"resolve='auto': MB fell back from {choice.dispatcher} to alltoall on {env.gpu_name}")
    plan.warnings += [v for v in report.violations if v.severity is not Severity.ERROR]
    plan.not_checked = report.not_checked
    plan.changes = edit.changes

    for change in edit.changes:  # the commit: replay onto the user's object graph
        set_path(cfg, change.path, copy.deepcopy(get_path(trial, change.path)))
    finalize.install(cfg)
    return plan


def _configure(
    edit: _Editor,
    plan: OverlapPlan,
    dispatcher: str,
    delay_wgrad: bool,
    high_priority_a2a: bool,
    max_connections: int,
    env: ClusterEnvironment,
) -> Violation | None:
    """The changes enable always makes. Returns the violation when MB fell back to alltoall."""
    from megatron.bridge.training.comm_overlap import CommOverlapConfig

    trial = edit.trial
    if trial.comm_overlap is None:
        edit.set("comm_overlap", CommOverlapConfig(tp_comm_overlap=False), "recipe had no CommOverlapConfig")
    edit.set_ep_flag("overlap_moe_expert_parallel_comm", True, "EP overlap requested")
    edit.set_ep_flag("delay_wgrad_compute", delay_wgrad, "delayed wgrad is a separate opt-in")
    edit.set("model.moe_shared_expert_overlap", False, "mutually exclusive with EP overlap")
    if high_priority_a2a:
        edit.set("model.high_priority_a2a_comm_stream", True,
                 "high-priority all-to-all stream (throttled link, comm-bound shape: 1.30x vs 1.14x, docs/benchmarks.md)")

    fallback = None
    if dispatcher in FLEX_BACKENDS:
        names = ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_shared_expert_overlap")
        before = {n: getattr(trial.model, n) for n in names}
        ok = apply_flex(trial.model, dispatcher, env)
        edit.record_model_diff(before, f"apply_flex_dispatcher_backend(model, {dispatcher!r})")
        if not ok:
            rule = RULES_BY_ID["flex-backend-gpu"]
            fallback = Violation(
                rule_id=rule.id,
                severity=Severity.ERROR,
                field=rule.field,
                current=f"{dispatcher} on {env.gpu_name}",
                required=rule.required,
                message=f"Megatron-Bridge fell back from {dispatcher} to alltoall (only a rank-0 warning upstream)",
                fix=rule.fix + "; or pass resolve='auto' to accept the fallback",
                upstream=rule.upstream,
            )
        elif not env.has_gpu:
            plan.notes.append(f"GPU unknown here: the {dispatcher} GPU allow-list is checked at finalize on the GPU node")
    else:
        edit.set("model.moe_token_dispatcher_type", "alltoall", "dispatcher='alltoall'")
        edit.set("model.moe_flex_dispatcher_backend", None, "no flex backend with alltoall")

    _set_env(edit, plan, "CUDA_DEVICE_MAX_CONNECTIONS", str(max_connections), "A2A stream must not be serialised")
    if trial.model.moe_token_dispatcher_type == "flex" and trial.model.moe_flex_dispatcher_backend == "hybridep":
        domain = env.nvlink_domain_size or 8
        ep = trial.model.expert_model_parallel_size
        _set_env(edit, plan, "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", str(min(ep, domain)), "HybridEP topology")
        _set_env(edit, plan, "NVLINK_DOMAIN_SIZE", str(domain), "HybridEP topology")
        _set_env(edit, plan, "USE_MNNVL", "1" if domain > 8 else "0", "HybridEP multi-node NVLink")
    return fallback


def _set_env(edit: _Editor, plan: OverlapPlan, name: str, value: str, reason: str) -> None:
    existing = (edit.trial.env_vars or {}).get(name)
    if existing is not None:
        plan.env_vars_kept[name] = str(existing)
        return
    edit.set(f"env_vars.{name}", value, reason)
    plan.env_vars[name] = value


def _resolve(edit: _Editor, env: ClusterEnvironment, forward_step_func, resolve: str):
    """Evaluate; with resolve='auto' apply each failing rule's documented fix until stable."""
    for _ in range(len(RULES_BY_ID)):
        report = evaluate(edit.trial, env, forward_step_func)
        if resolve != "auto" or not report.errors:
            return report
        applied = False
        for violation in report.errors:
            rule = RULES_BY_ID[violation.rule_id]
            if rule.auto_fix is None:
                continue
            for path, value in rule.auto_fix(Facts(edit.trial, env, forward_step_func)):
                before = len(edit.changes)
                edit.set(path, value, f"resolve='auto': {rule.id}: {rule.message}")
                applied |= len(edit.changes) > before
        if not applied:
            return report
    return report


def _describe_env(env: ClusterEnvironment) -> str:
    gpu = f"{env.gpu_name} (sm{env.compute_capability[0]}{env.compute_capability[1]})" if env.has_gpu else "no GPU known"
    world = f", world size {env.world_size}" if env.world_size else ""
    return f"{env.source}: {gpu}{world}"



def disable_ep_overlap(cfg: Any) -> list[FieldChange]:
    """Really turn EP overlap and delayed wgrad off: comm_overlap fields, its snapshot and the model.

    (MB's ``--moe_a2a_overlap false`` is a no-op, Megatron-Bridge issue 6006.) Returns the changes.
    """
    edit = _Editor(cfg)  # no atomicity needed: every edit is an independent reset to False
    if cfg.comm_overlap is not None:
        for name in EP_FLAGS:
            edit.set_ep_flag(name, False, "EP overlap turned off")
    for name in EP_FLAGS:
        edit.set(f"model.{name}", False, "EP overlap turned off")
    return edit.changes
