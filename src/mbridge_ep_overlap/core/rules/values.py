"""Config values: the types and ranges every other check (ours and upstream's) takes for granted.

A size of 0 reaches Megatron as a ``ZeroDivisionError``, a string where a count belongs as a
``TypeError`` deep in a rule or in MCore, a negative size as a silently negative data-parallel
size. These rules name the field, the value and what is required instead. The engine evaluates
them first; when one fails, a later rule that cannot even read the malformed value is reported as
"not checked" rather than crashing."""

from __future__ import annotations

from typing import Any

from ..facts import Facts
from ..sizes import positive_int
from .base import Family, Upstream, When, rule

family = rule.family(Family.VALUES)

PARALLEL_SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                  "expert_model_parallel_size", "expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size")
OPTIONAL_SIZES = ("expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size")  # None: derived upstream
MODEL_SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")


def _bad(values: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    return {k: v for k, v in values.items() if not (v is None and k in optional) and positive_int(v) is None}


def _bad_parallel(f: Facts) -> dict[str, Any]:
    return _bad({n: f.model(n) for n in PARALLEL_SIZES}, OPTIONAL_SIZES)


def _bad_batch(f: Facts) -> dict[str, Any]:
    return _bad({n: f.train(n) for n in ("global_batch_size", "micro_batch_size")})


def _bad_shape(f: Facts) -> dict[str, Any]:
    return _bad({n: f.model(n) for n in MODEL_SHAPE})


def _experts(f: Facts) -> int | None:
    return positive_int(f.model("num_moe_experts"))


@family("parallel-sizes", When.ALWAYS, "model.*_parallel_size",
        required="integers >= 1 (virtual pipeline and expert tensor parallel size may be None)",
        current=_bad_parallel, sanity=True, upstream=Upstream.MB_FINALIZE, upstream_match="by zero")
def parallel_sizes(f: Facts) -> bool:
    """a parallel size is not a positive integer: MB divides by it (ZeroDivisionError at 0) or derives a
    negative data-parallel size from it (accepted at -1).

    Fix: set each of TP, PP, CP, EP (and ETP, VPP when set) to an integer >= 1.
    """
    return not _bad_parallel(f)


@family("batch-sizes", When.ALWAYS, "train.*_batch_size", required="integers >= 1", current=_bad_batch,
        sanity=True, upstream=Upstream.MB_FINALIZE, upstream_match="by zero")
def batch_sizes(f: Facts) -> bool:
    """the global or micro batch size is not a positive integer.

    Fix: set train.global_batch_size and train.micro_batch_size to integers >= 1.
    """
    return not _bad_batch(f)


@family("model-shape", When.ALWAYS, "model.num_layers / hidden_size / num_attention_heads / seq_length",
        required="integers >= 1", current=_bad_shape, sanity=True,
        upstream=Upstream.MCORE, upstream_match="by zero")
def model_shape(f: Facts) -> bool:
    """a model dimension is not a positive integer (MCore divides by the layer count and the head
    count; MB asserts on a zero sequence length without saying which field).

    Fix: set model.num_layers, hidden_size, num_attention_heads and seq_length to integers >= 1.
    """
    return not _bad_shape(f)


@family("moe-experts-value", When.ALWAYS, "model.num_moe_experts", required="None (dense) or an integer >= 1",
        sanity=True, upstream=Upstream.MB_FINALIZE, upstream_match="not supported between")
def moe_experts_value(f: Facts) -> bool:
    """the number of experts is neither None nor a positive integer.

    Fix: set model.num_moe_experts to the model's expert count (an integer), or None for a dense model.
    """
    return f.model("num_moe_experts") is None or _experts(f) is not None


@family("experts-divisible-by-ep", When.ALWAYS, "model.num_moe_experts",
        required="divisible by expert_model_parallel_size",
        needs=lambda f: _experts(f) is not None and positive_int(f.model("expert_model_parallel_size")) is not None,
        current=lambda f: f"{f.model('num_moe_experts')} experts at EP {f.model('expert_model_parallel_size')}")
def experts_divisible_by_ep(f: Facts) -> bool:
    """the experts cannot be split evenly over the expert-parallel ranks (finalize accepts it;
    Megatron-Core asserts when it builds the MoE layer, after the job started).

    Fix: pick expert_model_parallel_size as a divisor of num_moe_experts.
    """
    return _experts(f) % f.model("expert_model_parallel_size") == 0


@family("router-topk", When.ALWAYS, "model.moe_router_topk", required="an integer from 1 to num_moe_experts",
        needs=lambda f: _experts(f) is not None,
        current=lambda f: f"top-{f.model('moe_router_topk')} of {f.model('num_moe_experts')} experts")
def router_topk(f: Facts) -> bool:
    """each token is routed to more experts than the model has, or to none.

    Fix: set model.moe_router_topk between 1 and num_moe_experts.
    """
    topk = positive_int(f.model("moe_router_topk"))
    return topk is not None and topk <= _experts(f)


@family("recompute-modules-type", When.ALWAYS, "model.recompute_modules", required="None or a list of module names",
        sanity=True, upstream=Upstream.MCORE, upstream_match="not iterable")
def recompute_modules_type(f: Facts) -> bool:
    """recompute_modules is not a list of module names.

    Fix: set model.recompute_modules to a list such as [core_attn, moe_act], or None.
    """
    value = f.model("recompute_modules")
    return value is None or (isinstance(value, (list, tuple)) and all(isinstance(m, str) for m in value))


@family("mixed-precision-known", When.ALWAYS, "mixed_precision",
        required="None, a MixedPrecisionConfig or a recipe name Megatron-Bridge knows (e.g. bf16_mixed)",
        sanity=True, upstream=Upstream.MB_FINALIZE, upstream_match="Unknown mixed-precision recipe")
def mixed_precision_known(f: Facts) -> bool:
    """the mixed-precision recipe name is not one Megatron-Bridge knows.

    Fix: use a name from megatron.bridge.training.mixed_precision (bf16_mixed, bf16_with_fp8_delayed_scaling_mixed,
    ...), or a MixedPrecisionConfig.
    """
    name = getattr(f.cfg, "mixed_precision", None)
    if not isinstance(name, str):
        return True
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    try:
        get_mixed_precision_config(name)
    except (ValueError, KeyError):
        return False
    return True


@family("env-vars-type", When.ALWAYS, "env_vars", required="None or a dict of variable names to values",
        sanity=True, current=lambda f: type(getattr(f.cfg, "env_vars", None)).__name__,
        upstream=Upstream.MB_FINALIZE, upstream_match="has no attribute 'items'")
def env_vars_type(f: Facts) -> bool:
    """cfg.env_vars is not a dict, so the launcher variables the plan needs cannot be put there.

    Fix: set cfg.env_vars to a dict (or leave it None: enable_ep_overlap creates one).
    """
    value = getattr(f.cfg, "env_vars", None)
    return value is None or (isinstance(value, dict) and all(isinstance(k, str) for k in value))


RULES = family.rules
