"""The EP-overlap rules: one constraint = one entry of ``rules.yaml`` + its check here.

Contract
--------
``RULES`` lists every constraint Megatron-Core 0.19 (``TransformerConfig.__post_init__``) and
Megatron-Bridge 0.6.2 (``CommOverlapConfig`` setup, flex-dispatcher validation) place on
``overlap_moe_expert_parallel_comm`` and ``delay_wgrad_compute``, plus the checks nobody upstream
makes (microbatch count, forward-step signature, ``CUDA_DEVICE_MAX_CONNECTIONS``, TE for delayed
wgrad, DeepEP importability, silently reverted flags). The declarative part of each rule - when it
applies, the field, what is required, message, fix, severity, which upstream check it mirrors and
the fragment of upstream's own message (used by the parity tests so a rule cannot drift from
MCore) - is one entry of ``rules.yaml``; its predicate (and optional documented fix) is the entry
of the same id in ``CHECKS``. Loading refuses a table whose two halves do not match.

A row whose facts are unknown (no GPU described, TE on the target unknown, no world size, no
forward step given) is skipped and reported by ``check_ep_overlap`` as not checked. A row may
carry ``auto_fix``: what ``enable_ep_overlap(..., resolve="auto")`` does about it; rows without
one can only be fixed by the user. The engine (``check.py``) only iterates this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml
from packaging.version import Version

from .dispatcher import DEEPEP_MIN_EP, backend_supports_gpu
from .errors import Severity
from .facts import Facts, accepts_schedule_plan, get_path

Fix = Callable[[Facts], list[tuple[str, Any]]]

UPSTREAM = {
    "mcore": "megatron-core 0.19 TransformerConfig.__post_init__",
    "mb-setup": "megatron-bridge 0.6.2 CommOverlapConfig.setup",
    "mb-flex": "megatron-bridge 0.6.2 validate_flex_dispatcher_backend",
    "ours": "",  # no upstream check: the silent failures this library exists to catch
}
OURS = UPSTREAM["ours"]
WHEN = {
    "overlap": "overlap on",
    "delay_wgrad": "delayed wgrad on",
    "overlap_flex": "overlap on with the flex dispatcher",
    "always": "always",
}



@dataclass(frozen=True)
class Check:
    """The code half of a rule: predicate, facts it needs, value shown, documented fix."""

    ok: Callable[[Facts], bool]
    needs: Callable[[Facts], bool] | None = None  # False => a fact is unknown: not checked
    current: Callable[[Facts], Any] | None = None  # the value reported (default: the field)
    auto_fix: Fix | None = None  # what resolve="auto" does; None => only the user can fix it


@dataclass(frozen=True)
class Rule:
    id: str
    when: str
    field: str
    required: str
    message: str
    fix: str
    check: Check
    severity: Severity = Severity.ERROR
    upstream: str = OURS
    upstream_match: str = ""
    since: str = ""

    @property
    def auto_fix(self) -> Fix | None:
        return self.check.auto_fix

    def applies(self, facts: Facts) -> bool:
        if self.when == WHEN["always"]:
            return True
        if self.when == WHEN["delay_wgrad"]:
            return facts.delay_wgrad
        if self.when == WHEN["overlap_flex"]:
            return facts.overlap and facts.dispatcher == "flex"
        return facts.overlap

    def needs(self, facts: Facts) -> bool:
        return self.check.needs is None or self.check.needs(facts)

    def ok(self, facts: Facts) -> bool:
        return self.check.ok(facts)

    def value(self, facts: Facts) -> Any:
        return self.check.current(facts) if self.check.current else get_path(facts.cfg, self.field)


def _set(path: str, value: Any) -> Fix:
    return lambda facts: [(path, value)]


def _ver_at_least(version: str | None, minimum: str) -> bool:
    try:
        return Version(version) >= Version(minimum)
    except Exception:
        return False


def _te_at_least(minimum: str) -> Callable[[Facts], bool]:
    return lambda f: bool(f.te_usable) and _ver_at_least(f.env.te_version, minimum)


def _te_known(f: Facts) -> bool:
    return f.te_usable is not None


def _wgrad_in_graph_scope(f: Facts) -> bool:
    modules = f.cuda_graph_modules()
    return "attn" in modules or (
        "moe_router" in modules
        and f.model("moe_shared_expert_intermediate_size") is not None
        and not f.model("moe_shared_expert_overlap")
    )


def _delay_off() -> Fix:
    return _set("comm_overlap.delay_wgrad_compute", False)


def _to_alltoall(f: Facts) -> list[tuple[str, Any]]:
    return [("model.moe_token_dispatcher_type", "alltoall"), ("model.moe_flex_dispatcher_backend", None)]


def _choose_vpp(f: Facts) -> list[tuple[str, Any]]:
    """Smallest VPP >= 2 that splits the layers evenly; none when a custom layout is set."""
    if f.model("pipeline_model_parallel_layout") is not None:
        return []
    layers, pp = f.model("num_layers"), f.model("pipeline_model_parallel_size")
    for vpp in range(2, 9):
        if layers % (pp * vpp) == 0:
            return [("model.virtual_pipeline_model_parallel_size", vpp)]
    return []


def _flex_gpu_ok(f: Facts) -> bool:
    return backend_supports_gpu(f.flex_backend, f.env.gpu_name, f.env.compute_capability[0])


def _flex_importable(f: Facts) -> bool:
    if f.flex_backend == "deepep":
        return bool(f.env.deep_ep_version)
    if f.flex_backend == "hybridep":
        return bool(f.env.deep_ep_version) and bool(f.env.hybrid_ep_available)
    return True


def _nvcc_under(cuda_home: str | None) -> bool:
    return bool(cuda_home) and Path(cuda_home, "bin", "nvcc").is_file()


def _expected_hybridep_ranks(f: Facts) -> int:
    return min(f.model("expert_model_parallel_size"), f.env.nvlink_domain_size or 8)


def _model_parallel_size(f: Facts) -> int:
    return f.model("tensor_model_parallel_size") * f.model("pipeline_model_parallel_size") * (
        f.model("context_parallel_size") or 1
    )


def _expert_parallel_size(f: Facts) -> int:
    return (f.model("expert_model_parallel_size") or 1) * (f.model("expert_tensor_parallel_size") or 1) * f.model(
        "pipeline_model_parallel_size"
    )


def _snapshot_matches(name: str) -> Callable[[Facts], bool]:
    def ok(f: Facts) -> bool:
        co = f.cfg.comm_overlap
        snap = getattr(co, "user_comm_overlap_cfg", None) if co is not None else None
        return snap is None or getattr(co, name) is None or getattr(co, name) == getattr(snap, name)

    return ok


def _model_only_flag_ok(name: str) -> Callable[[Facts], bool]:
    def ok(f: Facts) -> bool:
        co = f.cfg.comm_overlap
        if co is None or not f.model(name):
            return True
        snap = getattr(co, "user_comm_overlap_cfg", None)
        return bool(getattr(snap if snap is not None else co, name))

    return ok


_ALLTOALL = Check(lambda f: f.dispatcher in ("alltoall", "flex"), auto_fix=_to_alltoall)
_SNAPSHOT_FIELDS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")

CHECKS: dict[str, Check] = {
    # mirrored from Megatron-Core / Megatron-Bridge: EP overlap on
    "ep-size": Check(lambda f: (f.model("expert_model_parallel_size") or 1) > 1),
    "num-experts": Check(lambda f: (f.model("num_moe_experts") or 0) > 1),
    "dispatcher-type": _ALLTOALL,
    "precision": Check(lambda f: f.precision in ("bf16", "fp16"), current=lambda f: f.precision,
                       auto_fix=_set("mixed_precision", "bf16_mixed")),
    "torch-version": Check(lambda f: _ver_at_least(f.env.torch_version, "2.6.0"),
                           needs=lambda f: f.env.torch_version is not None, current=lambda f: f.env.torch_version),
    "pp-needs-vpp": Check(
        lambda f: f.model("pipeline_model_parallel_size") == 1 or f.model("virtual_pipeline_model_parallel_size") is not None,
        auto_fix=_choose_vpp),
    "full-recompute": Check(lambda f: f.model("recompute_granularity") != "full",
                            auto_fix=_set("model.recompute_granularity", None)),
    "recompute-method": Check(lambda f: f.model("recompute_method") is None, auto_fix=_set("model.recompute_method", None)),
    "recompute-num-layers": Check(lambda f: f.model("recompute_num_layers") is None,
                                  auto_fix=_set("model.recompute_num_layers", None)),
    "moe-recompute": Check(
        lambda f: "moe" not in (f.model("recompute_modules") or []),
        auto_fix=lambda f: [("model.recompute_modules", [m for m in f.model("recompute_modules") if m != "moe"])]),
    "shared-expert-overlap": Check(lambda f: not f.model("moe_shared_expert_overlap"),
                                   auto_fix=_set("model.moe_shared_expert_overlap", False)),
    "mtp-layers": Check(lambda f: f.model("mtp_num_layers") in (None, 0, 1), auto_fix=_set("model.mtp_num_layers", 1)),
    "cuda-graph-moe-scope": Check(
        lambda f: f.model("cuda_graph_impl") != "transformer_engine" or not {"moe", "mlp"} & set(f.cuda_graph_modules()),
        current=lambda f: f.cuda_graph_modules(),
        auto_fix=lambda f: [("model.cuda_graph_scope", [m for m in f.cuda_graph_modules() if m not in ("moe", "mlp")])]),
    "dispatch-backward-wgrad-exclusive": Check(
        lambda f: not f.model("overlap_dispatch_backward_with_experts_wgrad"),
        auto_fix=_set("model.overlap_dispatch_backward_with_experts_wgrad", False)),
    # mirrored: delayed weight-gradient compute
    "delay-wgrad-needs-overlap": Check(lambda f: f.overlap, current=lambda f: f.overlap, auto_fix=_delay_off()),
    "delay-wgrad-needs-te": Check(
        lambda f: bool(f.te_usable) and f.model("transformer_impl") == "transformer_engine", needs=_te_known,
        current=lambda f: f"{f.model('transformer_impl')} (TE {f.env.te_version or 'missing'})", auto_fix=_delay_off()),
    "delay-wgrad-te-grad-reduce": Check(
        lambda f: not (get_path(f.cfg, "ddp.overlap_grad_reduce") or get_path(f.cfg, "comm_overlap.overlap_grad_reduce"))
        or _te_at_least("2.7.0")(f),
        needs=_te_known, auto_fix=_delay_off()),
    "delay-wgrad-te-grad-accum-fusion": Check(
        lambda f: f.model("gradient_accumulation_fusion") is not True or _te_at_least("2.7.0")(f),
        needs=_te_known, auto_fix=_delay_off()),
    "delay-wgrad-te-partial-graph": Check(
        lambda f: f.model("cuda_graph_impl") != "transformer_engine" or _te_at_least("2.10.0")(f),
        needs=_te_known, auto_fix=_delay_off()),
    "delay-wgrad-graph-te": Check(
        lambda f: not _wgrad_in_graph_scope(f) or _te_at_least("2.12.0")(f),
        needs=_te_known, current=lambda f: f.cuda_graph_modules(), auto_fix=_delay_off()),
    "delay-wgrad-graph-grad-accum-fusion": Check(
        lambda f: not _wgrad_in_graph_scope(f) or bool(f.model("gradient_accumulation_fusion")),
        auto_fix=_set("model.gradient_accumulation_fusion", True)),
    "delay-wgrad-graph-attn-bias": Check(
        lambda f: "attn" not in f.cuda_graph_modules() or not (f.model("add_bias_linear") or f.model("add_qkv_bias")),
        auto_fix=_delay_off()),
    # flex dispatcher (DeepEP / HybridEP)
    "flex-backend-set": Check(lambda f: f.model("moe_flex_dispatcher_backend") in ("deepep", "hybridep", "ncclep"),
                              auto_fix=_to_alltoall),
    "flex-backend-gpu": Check(_flex_gpu_ok, needs=lambda f: f.env.has_gpu,
                              current=lambda f: f"{f.flex_backend} on {f.env.gpu_name}", auto_fix=_to_alltoall),
    "flex-backend-importable": Check(
        _flex_importable, needs=lambda f: f.env.deep_ep_version is not None,
        current=lambda f: f"{f.flex_backend} (deep_ep {f.env.deep_ep_version or 'missing'})", auto_fix=_to_alltoall),
    "deepep-built-with-nvshmem": Check(
        lambda f: f.flex_backend != "deepep", needs=lambda f: f.env.deep_ep_nvshmem is False,
        current=lambda f: f"{f.flex_backend} with a DeepEP built without NVSHMEM", auto_fix=_to_alltoall),
    "hybridep-jit-nvcc": Check(
        lambda f: f.flex_backend != "hybridep" or _nvcc_under(f.env_var("CUDA_HOME")),
        needs=lambda f: f.env.source == "probed" and f.env.has_gpu,  # only the GPU node itself can tell
        current=lambda f: f"CUDA_HOME={f.env_var('CUDA_HOME')}"),
    "hybridep-nvlink-domain": Check(
        lambda f: f.flex_backend != "hybridep"
        or f.env_var("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN") in (None, str(_expected_hybridep_ranks(f))),
        needs=lambda f: f.env.nvlink_domain_size is not None,
        current=lambda f: f.env_var("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN")),
    # traps nobody upstream checks
    "model-flag-reverted": Check(_model_only_flag_ok("overlap_moe_expert_parallel_comm"),
                                 auto_fix=_set("comm_overlap.overlap_moe_expert_parallel_comm", True)),
    "comm-overlap-snapshot-stale": Check(
        lambda f: all(_snapshot_matches(n)(f) for n in _SNAPSHOT_FIELDS),
        current=lambda f: {n: getattr(f.cfg.comm_overlap.user_comm_overlap_cfg, n) for n in _SNAPSHOT_FIELDS},
        auto_fix=lambda f: [(f"comm_overlap.user_comm_overlap_cfg.{n}", getattr(f.cfg.comm_overlap, n))
                            for n in _SNAPSHOT_FIELDS if getattr(f.cfg.comm_overlap, n) is not None]),
    "microbatches": Check(lambda f: f.num_microbatches >= 2, needs=lambda f: f.num_microbatches is not None,
                          current=lambda f: f"{f.num_microbatches} microbatch(es)"),
    "forward-step-signature": Check(
        lambda f: accepts_schedule_plan(f.forward_step_func), needs=lambda f: f.forward_step_func is not None,
        current=lambda f: getattr(f.forward_step_func, "__qualname__", repr(f.forward_step_func))),
    "cuda-device-max-connections": Check(lambda f: f.env_var("CUDA_DEVICE_MAX_CONNECTIONS") != "1",
                                         current=lambda f: f.env_var("CUDA_DEVICE_MAX_CONNECTIONS")),
    "tested-versions": Check(
        lambda f: (f.env.mcore_version, f.env.mb_version) == ("0.19.2", "0.6.2"), needs=lambda f: bool(f.env.mcore_version),
        current=lambda f: f"megatron-core {f.env.mcore_version}, megatron-bridge {f.env.mb_version}"),
    "early-attn-release-needs-overlap": Check(
        lambda f: not f.model("ep_overlap_early_attn_memory_release") or f.overlap,
        auto_fix=_set("model.ep_overlap_early_attn_memory_release", False)),
    "ncclep-expert-fc1-offload": Check(
        lambda f: f.flex_backend != "ncclep" or not f.model("fine_grained_activation_offloading")
        or "expert_fc1" not in (f.model("offload_modules") or []),
        auto_fix=lambda f: [("model.offload_modules", [m for m in f.model("offload_modules") if m != "expert_fc1"])]),
    "ncclep-static-shape": Check(lambda f: f.flex_backend != "ncclep" or bool(f.model("moe_ncclep_static_shape"))),
    "world-size-divisible": Check(
        lambda f: f.world_size % _model_parallel_size(f) == 0, needs=lambda f: f.world_size is not None,
        current=lambda f: f"{f.world_size} GPUs for TP*PP*CP = {_model_parallel_size(f)}"),
    "expert-world-divisible": Check(
        lambda f: f.world_size % _expert_parallel_size(f) == 0, needs=lambda f: f.world_size is not None,
        current=lambda f: f"{f.world_size} GPUs for EP*ETP*PP = {_expert_parallel_size(f)}"),
    "global-batch-divisible": Check(
        lambda f: f.cfg.train.global_batch_size % (f.cfg.train.micro_batch_size * f.data_parallel_size) == 0,
        needs=lambda f: f.data_parallel_size is not None,
        current=lambda f: f"{f.cfg.train.global_batch_size} for micro batch {f.cfg.train.micro_batch_size} x DP "
        f"{f.data_parallel_size}"),
    "small-ep-deepep": Check(
        lambda f: f.flex_backend != "deepep" or f.model("expert_model_parallel_size") >= DEEPEP_MIN_EP),
    "small-ep-alltoall": Check(
        lambda f: f.dispatcher != "alltoall" or f.model("expert_model_parallel_size") > 4 or (f.env.num_nodes or 1) > 2),
}


def _load(path: Path = Path(__file__).with_name("rules.yaml")) -> tuple[Rule, ...]:
    entries = yaml.safe_load(path.read_text())
    ids = [e["id"] for e in entries]
    if len(set(ids)) != len(ids) or set(ids) != set(CHECKS):
        # A packaging/programming error, never user input: the two halves of the table disagree.
        raise RuntimeError(f"rules.yaml and CHECKS disagree: {sorted(set(ids) ^ set(CHECKS))} (duplicates: "
                           f"{sorted({i for i in ids if ids.count(i) > 1})})")
    return tuple(
        Rule(
            id=e["id"], when=WHEN[e["when"]], field=e["field"], required=e["required"], message=e["message"],
            fix=e["fix"], check=CHECKS[e["id"]], severity=Severity(e.get("severity", "error")),
            upstream=UPSTREAM[e.get("upstream", "ours")], upstream_match=e.get("upstream_match", ""),
            since=e.get("since", ""),
        )
        for e in entries
    )


RULES: tuple[Rule, ...] = _load()
RULES_BY_ID: dict[str, Rule] = {r.id: r for r in RULES}
