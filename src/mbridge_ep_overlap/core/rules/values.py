"""Config values: the types and ranges every other check (ours and upstream's) takes for granted.

A size of 0 reaches Megatron as a ``ZeroDivisionError``, a string where a count belongs as a
``TypeError`` deep in a rule or in MCore, a negative size as a silently negative data-parallel
size. These rules name the field, the value and what is required instead. The engine evaluates
them first; when one fails, a later rule that cannot even read the malformed value is reported as
"not checked" rather than crashing.

Where an integer is required, a float is refused, integral or not (``4096.0``, ``2.5``, ``inf``,
``nan``): the count rules accept ``int`` only. The upper bound is ``INT64_MAX`` = 2**63 - 1, the
largest signed 64-bit integer, for every size and for the tokens per step (global batch x
sequence length): torch and numpy hold shapes, positions, sample and token counts as int64, so a
larger value cannot run at all (``torch.arange(2**63)`` raises), and it is ~10 orders of
magnitude above any real run (the largest published steps are ~1e8 tokens, vocabularies ~1e6).
Megatron-Bridge 0.6.2's finalize accepts such values (Python ints do not overflow); the parity
cases name where they fail later."""

from __future__ import annotations

import re
from typing import Any

from ..facts import Facts
from ...base.sizes import INT64_MAX, positive_int, shown
from .base import Family, Upstream, When, rule

family = rule.family(Family.VALUES)

PARALLEL_SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                  "expert_model_parallel_size", "expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size")
OPTIONAL_SIZES = ("expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size")  # None: derived upstream
MODEL_SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")
# every integer size of the model the values rules read (the int64 bound applies to each)
MODEL_INTEGERS = (*PARALLEL_SIZES, *MODEL_SHAPE, "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
                  "ffn_hidden_size", "num_query_groups", "kv_channels", "vocab_size", "mtp_num_layers",
                  "moe_shared_expert_intermediate_size")
BATCH = ("global_batch_size", "micro_batch_size")
MAX_CONNECTIONS = 32
"""CUDA's documented range for CUDA_DEVICE_MAX_CONNECTIONS is 1 to 32 (default 8; CUDA C Programming
Guide, CUDA environment variables)."""


def _bad(values: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    return {k: _show(v) for k, v in values.items() if not (v is None and k in optional) and positive_int(v) is None}


def _show(value: Any) -> Any:
    """A value for a violation: an int beyond 64 bits by its size (a 10**5000 cannot even be printed)."""
    return shown(value) if isinstance(value, int) and abs(value).bit_length() > 64 else value


def _bad_parallel(f: Facts) -> dict[str, Any]:
    return _bad({n: f.model(n) for n in PARALLEL_SIZES}, OPTIONAL_SIZES)


def _bad_batch(f: Facts) -> dict[str, Any]:
    return _bad({n: f.train(n) for n in BATCH})


def _bad_shape(f: Facts) -> dict[str, Any]:
    return _bad({n: f.model(n) for n in MODEL_SHAPE})


def _experts(f: Facts) -> int | None:
    return positive_int(f.model("num_moe_experts"))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _beyond_int64(f: Facts) -> dict[str, str]:
    """Integer sizes outside the signed 64-bit range, shown by size (a 10**5000 cannot be printed)."""
    values = {**{f"model.{n}": f.model(n) for n in MODEL_INTEGERS}, **{f"train.{n}": f.train(n) for n in BATCH}}
    return {k: shown(v) for k, v in values.items() if _is_int(v) and not -INT64_MAX - 1 <= v <= INT64_MAX}


def _in_int64(value: Any) -> int | None:
    value = positive_int(value)
    return value if value is not None and value <= INT64_MAX else None


def _optional_count(value: Any) -> bool:
    """None (upstream derives it) or an int >= 1; bools, floats and strings are not counts."""
    return value is None or positive_int(value) is not None


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


@family("sizes-fit-int64", When.ALWAYS, "model.* / train.* integer sizes",
        required="at most 2**63 - 1 (the largest signed 64-bit integer)", current=_beyond_int64, sanity=True)
def sizes_fit_int64(f: Facts) -> bool:
    """a size is beyond 2**63 - 1, more than any run can have: finalize accepts it (Python ints do not
    overflow), then torch and numpy, which hold sizes as int64, cannot (MCore 0.19.2
    models/common/embeddings/rotary_pos_embedding.py:131 torch.arange(seq_length) raises; MB 0.6.2
    data/loaders.py:127 makes train_iters x global_batch_size the sample count MCore's
    datasets/gpt_dataset.py:754 builds a numpy index of).

    Fix: set the size the model and the run really have (each well below 2**63 - 1).
    """
    return not _beyond_int64(f)


@family("tokens-per-step-fit-int64", When.ALWAYS, "train.global_batch_size x model.seq_length",
        required="at most 2**63 - 1 tokens per step", sanity=True,
        needs=lambda f: _in_int64(f.train("global_batch_size")) is not None
        and _in_int64(f.model("seq_length")) is not None,
        current=lambda f: f"{f.train('global_batch_size')} x {f.model('seq_length')} = "
        f"{shown(f.train('global_batch_size') * f.model('seq_length'))} tokens")
def tokens_per_step_fit_int64(f: Facts) -> bool:
    """one step would carry more than 2**63 - 1 tokens, more than any run can count: finalize accepts
    it, then MCore 0.19.2 counts the tokens its dataset must serve as num_samples x sequence_length
    (datasets/gpt_dataset.py:690, at least one step's worth) and indexes them with int64 numpy arrays.

    Fix: lower train.global_batch_size or model.seq_length to the run's real values.
    """
    return f.train("global_batch_size") * f.model("seq_length") <= INT64_MAX


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


@family("moe-ffn-hidden-size", When.ALWAYS, "model.moe_ffn_hidden_size",
        required="None (MCore uses ffn_hidden_size) or an integer >= 1", sanity=True)
def moe_ffn_hidden_size(f: Facts) -> bool:
    """the experts' hidden size is neither None nor a positive integer: finalize accepts it, then MCore
    0.19.2 builds the expert weights with it when the model is constructed (transformer/moe/experts.py:212,
    a negative width fails there after the job started; 0 builds experts that output nothing).

    Fix: set model.moe_ffn_hidden_size to the experts' FFN width (an integer), or None to use
    ffn_hidden_size (transformer_config.py:1534).
    """
    return _optional_count(f.model("moe_ffn_hidden_size"))


@family("num-query-groups", When.ALWAYS, "model.num_query_groups",
        required="None (multi-head attention) or an integer >= 1", sanity=True)
def num_query_groups(f: Facts) -> bool:
    """the number of query groups is neither None nor a positive integer: MCore 0.19.2's finalize check
    (transformer_config.py:1338) passes 0 and -1 (0 % TP == 0), then the attention layer divides the
    heads by it when the model is constructed (transformer/attention.py:353-359: ZeroDivisionError at 0,
    negative heads per partition at -1).

    Fix: set model.num_query_groups to the model's key-value head count, or None for multi-head
    attention (transformer_config.py:1335).
    """
    return _optional_count(f.model("num_query_groups"))


@family("kv-channels", When.ALWAYS, "model.kv_channels",
        required="None (hidden_size // num_attention_heads) or an integer >= 1", sanity=True)
def kv_channels(f: Facts) -> bool:
    """the attention head width is neither None nor a positive integer: finalize accepts it, then MCore
    0.19.2 builds zero- or negative-width heads when the model is constructed (transformer/attention.py:333;
    at 0 the softmax scale 1/sqrt(head width) divides by zero, transformer/dot_product_attention.py:85).

    Fix: set model.kv_channels to the head width (an integer), or None for hidden_size // num_attention_heads
    (transformer_config.py:1332).
    """
    return _optional_count(f.model("kv_channels"))


@family("vocab-size", When.ALWAYS, "model.vocab_size", required="None (the tokenizer's) or an integer >= 1",
        sanity=True)
def vocab_size(f: Facts) -> bool:
    """the vocabulary size is neither None nor a positive integer: finalize accepts it, then MB 0.6.2
    refuses it only at setup, once the tokenizer is built (training/setup.py:295 -> :707, "cannot be
    smaller than tokenizer's vocab_size"), after the job started.

    Fix: set model.vocab_size to the tokenizer's vocabulary size or more, or None to take the
    tokenizer's (training/setup.py:702).
    """
    return _optional_count(f.model("vocab_size"))


@family("moe-capacity-factor", When.ALWAYS, "model.moe_expert_capacity_factor",
        required="None or a negative number (dropless), or a finite number > 0 and at most 2**63 - 1", sanity=True)
def moe_capacity_factor(f: Facts) -> bool:
    """the expert capacity factor cannot work: at 0 every token is dropped (MCore 0.19.2 accepts it;
    transformer/moe/moe_utils.py:256 gives a capacity of 0), and inf, nan, a non-number or a factor so
    large that tokens x top-k / experts x factor overflows (above 2**63 - 1 it can) fail in that
    math.ceil at the first step. A negative factor is upstream's own spelling of dropless (MCore
    turns it into None, transformer_config.py:1660-1662; MB 0.6.2's apply_moe_token_drop likewise,
    training/utils/moe_token_drop.py:53) and is accepted.

    Fix: set model.moe_expert_capacity_factor to a positive factor such as 1.0, or None for dropless
    MoE.
    """
    value = f.model("moe_expert_capacity_factor")
    if value is None:
        return True
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:  # nan
        return False
    return -INT64_MAX <= value < 0 or 0 < value <= INT64_MAX  # int/float comparison is exact and never overflows


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


def _bad_names(value: dict) -> list:
    return [k for k in value if not isinstance(k, str) or not k]


def _env_vars_shape(f: Facts) -> str:
    value = getattr(f.cfg, "env_vars", None)
    if isinstance(value, dict):
        bad = _bad_names(value)
        return f"a dict with names that are not non-empty strings {bad[:3]!r}" if bad else "a dict"
    return type(value).__name__


@family("env-vars-type", When.ALWAYS, "env_vars", required="None or a dict of variable names (non-empty str) to values",
        sanity=True, current=_env_vars_shape,
        upstream=Upstream.MB_FINALIZE, upstream_match="has no attribute 'items'")
def env_vars_type(f: Facts) -> bool:
    """cfg.env_vars is not a dict of variable names, so the launcher variables the plan needs cannot
    be put there (MB's finalize also refuses an empty name).

    Fix: set cfg.env_vars to a dict (or leave it None: enable_ep_overlap creates one).
    """
    value = getattr(f.cfg, "env_vars", None)
    return value is None or (isinstance(value, dict) and not _bad_names(value))


def _env_scalar(value: Any) -> bool:
    """What Megatron-Bridge exports (str, int, float, bool), an int only within 64 bits."""
    if isinstance(value, int) and not isinstance(value, bool):
        return -INT64_MAX - 1 <= value <= INT64_MAX
    return isinstance(value, (str, float, bool))


def _bad_env_values(f: Facts) -> dict[str, str]:
    value = getattr(f.cfg, "env_vars", None)
    if not isinstance(value, dict):
        return {}  # env-vars-type names it
    return {str(k): shown(v) if isinstance(v, int) else type(v).__name__ for k, v in value.items()
            if not _env_scalar(v)}


@family("env-var-values", When.ALWAYS, "env_vars", required="each value a str, int, float or bool (an int within "
        "64 bits)", sanity=True, current=_bad_env_values,
        upstream=Upstream.MB_FINALIZE, upstream_match="must have a scalar value")
def env_var_values(f: Facts) -> bool:
    """a cfg.env_vars value is not one a process environment can hold: MB 0.6.2's finalize refuses None,
    lists and objects (training/config.py:1848 apply_environment_variables); an int beyond 64 bits no
    variable takes (beyond 4300 digits str() itself refuses it); and a launcher that exports the
    variables before the job starts (launch_slurm.py) would write None or an object's repr.

    Fix: set each value in cfg.env_vars to a string (or a number or bool), or remove the variable.
    """
    return not _bad_env_values(f)


@family("cuda-device-max-connections-value", When.ALWAYS, "env_vars.CUDA_DEVICE_MAX_CONNECTIONS",
        required=f"unset, or an integer from 1 to {MAX_CONNECTIONS} (CUDA's range)", sanity=True,
        current=lambda f: f.env_var("CUDA_DEVICE_MAX_CONNECTIONS"))
def cuda_device_max_connections_value(f: Facts) -> bool:
    """CUDA_DEVICE_MAX_CONNECTIONS (as the run gets it: the launcher's value, else cfg.env_vars) is not
    a connection count CUDA documents (1 to 32): what CUDA makes of it is undefined, so how many
    streams run concurrently - the all-to-all's overlap with compute - cannot be said.

    Fix: set CUDA_DEVICE_MAX_CONNECTIONS to an integer from 1 to 32 (32 for EP overlap), or leave it unset.
    """
    value = f.env_var("CUDA_DEVICE_MAX_CONNECTIONS")
    return value is None or (re.fullmatch(r"[0-9]{1,2}", value) is not None and 1 <= int(value) <= MAX_CONNECTIONS)


RULES = family.rules
