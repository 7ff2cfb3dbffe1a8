"""What the step-time model reads: the finalized training shape and the target cluster.

Contract
--------
* ``StepInputs`` - one finalized configuration, everything per *model replica* (the model's
  shape, the parallel sizes, the microbatches per step, the dispatcher). Frozen, keyword-only.
  ``StepInputs.from_summary(summary)`` builds it from a flat dict whose keys are Megatron /
  Megatron-Bridge field names (``hidden_size``, ``expert_model_parallel_size``,
  ``moe_token_dispatcher_type`` ...: what ``finalize`` writes into a run summary and what the
  bench ``results.json`` rows carry under ``finalized``). A missing field takes the default listed
  in ``FIELD_DEFAULTS`` (or a value guessed from other fields) and its name is recorded in
  ``defaults_used``, so a prediction always says what it assumed. DP and the microbatches per
  step come from the summary, else from ``base.sizes`` (DP = world size / (TP x PP x CP),
  microbatches = GBS / (MBS x DP)); an exact derivation is not a default.
* A Megatron-Bridge ``ConfigContainer`` is read in ``core.prediction_inputs.from_config``, which
  hands the same field names to ``from_summary`` (one mapping for both): nothing here reads a config.
* ``Cluster`` - the target machine: GPU kind (a key of ``hardware.json``), number of GPUs, GPUs
  per node and NVLink-domain size (``None``: the GPU kind's default), and optional ``LinkSpec``
  overrides for the link inside the NVLink domain and the link between domains.
* Refused inputs: ``StepInputs`` raises ``ValueError`` naming the field for a size that is not an
  integer (a bool, ``2.5``, ``inf``, ``nan``, a string), is below its minimum, or exceeds
  ``INT64_MAX`` (2**63 - 1, the largest signed 64-bit integer: torch and numpy hold sizes, shapes
  and token counts as int64, so no run can have more), and for more than ``INT64_MAX`` tokens per
  step; ``from_summary`` converts integral floats (``4096.0``) and numeric strings and refuses the
  rest the same way. So every size the model multiplies is a real run's, and its float arithmetic
  stays finite.

Nothing here imports anything outside the standard library (``base.sizes`` is plain arithmetic).
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from ..base import sizes
from ..base.choices import NAMED_DISPATCHERS
from . import precision as _precision_of

DISPATCHERS = NAMED_DISPATCHERS
INT64_MAX, shown = sizes.INT64_MAX, sizes.shown  # the bound on every size and on the tokens per step
MAX_LAYER_PATTERN = 1 << 20  # a Megatron-LM layer-pattern string expands to at most this many layers here
TRANSFORMER_IMPLS = ("transformer_engine", "local")

# Defaults for fields a summary may lack. Sources: Megatron-Core 0.19.2 TransformerConfig /
# ModelParallelConfig defaults (num_query_groups = heads, kv_channels = hidden / heads, parallel
# sizes 1) and Megatron-Bridge's recipe defaults (bf16, TE layers, overlap_grad_reduce=True in
# recipes/common.py). Shape fields without a sensible default (hidden_size, seq_length ...) are
# required.
FIELD_DEFAULTS: dict[str, Any] = {
    "num_layers": 4,  # the bench proxy recipe's depth (hf_configs/...qwen3-moe-proxy)
    "num_query_groups": None,  # -> num_attention_heads (MHA)
    "kv_channels": None,  # -> hidden_size // num_attention_heads
    "moe_shared_expert_intermediate_size": None,
    "ffn_hidden_size": None,  # -> 4 * hidden_size, only used by dense layers
    "num_dense_layers": 0,
    "vocab_size": 32768,  # the proxy recipe's vocabulary
    "mtp_num_layers": 0,
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "virtual_pipeline_model_parallel_size": None,
    "context_parallel_size": 1,
    "expert_tensor_parallel_size": 1,
    "bytes_per_element": 2,  # bf16
    "dispatcher": "alltoall",
    "transformer_impl": "transformer_engine",
    "high_priority_a2a_comm_stream": False,
    "recompute": False,
    "overlap_grad_reduce": True,
    "grad_reduce_in_fp32": True,  # MCore DistributedDataParallelConfig's default
}

# Fields whose None is Megatron-Core's own setting (no VPP, no shared expert, no MTP, MHA,
# hidden / heads, 4 x hidden): present as None in a summary or config, they are not a default.
NONE_IS_A_VALUE = frozenset({
    "virtual_pipeline_model_parallel_size", "moe_shared_expert_intermediate_size", "mtp_num_layers",
    "num_query_groups", "kv_channels", "ffn_hidden_size",
})


def _parse_layer_pattern(text: str) -> list[int] | int | None:
    """``"([0]*3+[1]*58)"`` -> [0, 0, 0, 1, ...]; ``"1"`` -> 1; anything else -> None (no eval).
    A pattern of more than ``MAX_LAYER_PATTERN`` layers is ``ValueError`` (never expanded)."""
    t = text.strip().strip("()").replace(" ", "")
    if t.isdigit():
        return int(t)
    terms: list[tuple[list[int], int]] = []
    for term in t.split("+"):
        m = re.fullmatch(r"\[([\d,]+)\](?:\*(\d+))?", term)
        if not m or not all(m.group(1).split(",")):
            return None
        terms.append(([int(x) for x in m.group(1).split(",")], int(m.group(2) or 1)))
    total = sum(len(kinds) * times for kinds, times in terms)
    if total > MAX_LAYER_PATTERN:
        raise ValueError(f"moe_layer_freq pattern of {total} layers: more than {MAX_LAYER_PATTERN}")
    return [kind for kinds, times in terms for kind in kinds * times]


def _int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an int in [minimum, INT64_MAX]: an int, an integral finite float (``4096.0``,
    as a JSON file may hold it) or a numeric string; ``ValueError`` naming ``name`` otherwise -
    never a truncated ``2.5``, never ``inf``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        value = int(value)
    elif isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {value[:40]!r}") from None
    elif not isinstance(value, int):
        try:
            value = operator.index(value)  # numpy integers
        except TypeError:
            raise ValueError(f"{name} must be an integer, got {type(value).__name__}") from None
    _check_range(name, value, minimum)
    return value


def _check_range(name: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {shown(value)}")
    if value > INT64_MAX:
        raise ValueError(f"{name} exceeds 2**63 - 1 ({shown(value)}): no run has that many")


def _opt_int(name: str, value: Any, minimum: int = 0) -> int | None:
    return None if value is None else _int(name, value, minimum)


def _batch_layout(s: Mapping[str, Any], num_gpus: int | None, tp: int, pp: int, cp: int, mbs: int,
                  used: list[str]) -> tuple[int, int]:
    """(DP, microbatches per step): the summary's own values, else derived with ``base.sizes`` (the one
    owner of derived sizes: DP = world / (TP x PP x CP), microbatches = GBS / (MBS x DP)). An exact
    derivation is not a default; a guess (no world size) is recorded in ``used``."""
    dp, nmb, gbs = (_opt_int(k, s.get(k), 1) for k in ("data_parallel_size", "num_microbatches", "global_batch_size"))
    if dp is None and num_gpus is not None:
        dp = sizes.data_parallel_size(num_gpus, tp, pp, cp)
        if dp is None:
            raise ValueError(f"world size {num_gpus} is not divisible by TP x PP x CP = {tp * pp * cp}")
    elif dp is None:
        dp = max(1, gbs // (nmb * mbs)) if nmb is not None and gbs is not None else 1
        used.append("data_parallel_size")
    if nmb is None:
        if gbs is None:
            raise KeyError("summary lacks both num_microbatches and global_batch_size")
        nmb = sizes.num_microbatches(gbs, mbs, dp)
        if nmb is None:
            raise ValueError(f"global_batch_size {shown(gbs)} is not divisible by micro_batch_size x DP = {mbs * dp}")
    return dp, nmb


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """One link class as the all-to-all sees it: per-GPU, per-direction bandwidth (GB/s, 1e9 B),
    a fixed latency per all-to-all call (s), the fraction by which compute kernels slow down
    while a transfer on this link runs beside them (``contention``) and the fraction by which
    the transfer slows down while compute runs beside it (``comm_slowdown``); 0 = none."""

    name: str
    bandwidth_GBps: float  # noqa: N815 - the unit is part of the name (GB/s)
    latency_s: float
    contention: float = 0.0
    comm_slowdown: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Target machine. ``None`` fields take the GPU kind's defaults from ``hardware.json``."""

    gpu: str = "h100"
    num_gpus: int
    gpus_per_node: int | None = None
    nvlink_domain_size: int | None = None
    intra_link: LinkSpec | None = None  # inside the NVLink domain (default: NVLink of the GPU kind)
    inter_link: LinkSpec | None = None  # across domains (default: the GPU kind's NIC, IB/RoCE)


# (fields, minimum, None allowed): what ``StepInputs`` accepts; every value is at most ``INT64_MAX``.
_VALUE_RANGES: tuple[tuple[tuple[str, ...], int, bool], ...] = (
    (("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "seq_length",
      "micro_batch_size", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "vocab_size", "tp", "pp",
      "cp", "ep", "etp", "dp", "num_microbatches", "bytes_per_element", "router_probs_bytes"), 1, False),
    (("num_dense_layers", "mtp_num_layers"), 0, False),
    (("vpp",), 1, True),
    (("moe_shared_expert_intermediate_size", "ffn_hidden_size", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
      "qk_pos_emb_head_dim", "v_head_dim", "attention_window"), 0, True),  # None or 0: the model's own default
    (("windowed_layers",), 0, False),
)


@dataclass(frozen=True, kw_only=True)
class StepInputs:
    """One finalized training configuration (per model replica), as the model needs it."""

    # model shape
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    seq_length: int
    micro_batch_size: int
    num_moe_experts: int
    moe_router_topk: int
    moe_ffn_hidden_size: int
    moe_shared_expert_intermediate_size: int | None = None
    ffn_hidden_size: int | None = None
    num_dense_layers: int = 0
    vocab_size: int = 32768
    mtp_num_layers: int = 0
    # multi-latent attention (DeepSeek); None = standard attention
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None
    qk_pos_emb_head_dim: int | None = None
    v_head_dim: int | None = None
    # sliding-window attention (GPT-OSS): keys before each query (MCore window_size[0]) on
    # ``windowed_layers`` of the layers (MCore is_layer_window_attention); None / 0 = full attention
    attention_window: int | None = None
    windowed_layers: int = 0
    # parallel sizes
    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    cp: int = 1
    ep: int = 1
    etp: int = 1
    dp: int = 1
    num_microbatches: int = 1
    # numerics and implementation
    bytes_per_element: int = 2
    gemm_precision: str = "bf16"  # precision.PRECISIONS: what the linear layers' GEMMs run in
    dispatcher: str = "alltoall"
    transformer_impl: str = "transformer_engine"
    attention_mask_in_batch: bool = False  # a dense [s, s] mask travels with every microbatch
    high_priority_a2a: bool = False
    recompute: bool = False  # full activation recompute
    delay_wgrad: bool = False  # MCore delay_wgrad_compute (acts with overlap on only)
    recompute_modules: tuple[str, ...] = ()  # selective recompute (MCore recompute_modules); () = none
    overlap_grad_reduce: bool = True
    # DDP grad_reduce_in_fp32: the gradients are reduce-scattered in FP32 (4 bytes) or in the
    # parameters' BF16 (2 bytes; NVIDIA's perf recipes, perf_recipes/_common.py)
    grad_reduce_in_fp32: bool = True
    # the unfused grouped expert MLP (MCore TEGroupedMLP without the TE op fuser, experts.py:290):
    # eager passes over the routed tokens that the fused FC1 + GLU + FC2 op does not run
    glu_clamp: bool = False  # activation_func_clamp_value: two clamps + a cat before the fused GLU kernel
    expert_fc2_bias: bool = False  # add_bias_linear: the FC2 bias added per local expert, t + b * p and a cat
    router_probs_bytes: int = 2  # bytes per routing probability (moe_router_dtype; None: the activations')
    # MCore fp8_dot_product_attention under an FP8-class GEMM precision: TE runs core attention in FP8
    # (TE 2.18 DotProductAttention: delayed-scaling FP8 on Hopper, MXFP8 on Blackwell under an MXFP8 recipe)
    fp8_attention: bool = False
    defaults_used: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        """Every size an int in its range (``_VALUE_RANGES``), the tokens per step <= ``INT64_MAX``;
        ``ValueError`` naming the field otherwise."""
        if self.dispatcher not in DISPATCHERS:
            raise ValueError(f"dispatcher {self.dispatcher!r}: one of {DISPATCHERS}")
        if self.gemm_precision not in _precision_of.PRECISIONS:
            raise ValueError(f"gemm_precision {self.gemm_precision!r}: one of {_precision_of.PRECISIONS}")
        if self.transformer_impl not in TRANSFORMER_IMPLS:
            raise ValueError(f"transformer_impl {self.transformer_impl!r}: one of {TRANSFORMER_IMPLS}")
        for names, minimum, optional in _VALUE_RANGES:
            for name in names:
                value = getattr(self, name)
                if value is None and optional:
                    continue
                if not isinstance(value, int) or isinstance(value, bool):
                    got = value[:40] if isinstance(value, str) else value if isinstance(value, (float, type(None))) \
                        else type(value).__name__
                    raise ValueError(f"{name} must be an integer{' or None' if optional else ''}, got {got!r}")
                _check_range(name, value, minimum)
        tokens = self.micro_batch_size * self.seq_length * self.num_microbatches * self.dp
        if tokens > INT64_MAX:
            raise ValueError(f"tokens per step (micro_batch_size x seq_length x num_microbatches x DP) exceed "
                             f"2**63 - 1 ({shown(tokens)}): no run has that many")
        if self.num_dense_layers > self.num_layers:
            raise ValueError("num_dense_layers > num_layers")
        if self.windowed_layers > self.num_layers:
            raise ValueError("windowed_layers > num_layers")
        if self.num_moe_experts % self.ep:
            raise ValueError(f"num_moe_experts {self.num_moe_experts} not divisible by ep {self.ep}")

    # -- derived ---------------------------------------------------------------------------
    @property
    def multi_latent_attention(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers

    @property
    def tokens_per_gpu(self) -> float:
        """Tokens of one microbatch that one GPU carries through norms, router and dispatch."""
        return self.micro_batch_size * self.seq_length / (self.cp * self.tp)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def with_(self, **changes: Any) -> "StepInputs":
        """A copy with some fields changed (``dataclasses.replace``)."""
        return replace(self, **changes)

    # -- construction from a finalized-config summary --------------------------------------
    @classmethod
    def from_summary(cls, summary: Mapping[str, Any], *, num_gpus: int | None = None) -> "StepInputs":
        """Build from a flat dict of finalized field names (see the module docstring).

        ``num_gpus`` (the world size) gives DP when the summary lacks ``data_parallel_size``.
        Every field that fell back to a default (or a guess) is listed in ``defaults_used``.
        """
        s = dict(summary)
        used: list[str] = []

        def get(key: str, *aliases: str, required: bool = False, default: Any = "__table__") -> Any:
            for k in (key, *aliases):
                if s.get(k) is not None:
                    return s[k]
            if required:
                raise KeyError(f"summary lacks {key!r} (no default: it decides the model's shape)")
            if not (key in NONE_IS_A_VALUE and any(k in s for k in (key, *aliases))):
                used.append(key)  # absent (a None of NONE_IS_A_VALUE is the config's own choice)
            return FIELD_DEFAULTS.get(key) if default == "__table__" else default

        hidden = _int("hidden_size", get("hidden_size", required=True))
        heads = _int("num_attention_heads", get("num_attention_heads", required=True))
        num_layers = _int("num_layers", get("num_layers"))
        groups = get("num_query_groups", "num_key_value_heads")
        groups = heads if groups is None else _int("num_query_groups", groups)
        kv = get("kv_channels", "head_dim")
        kv = hidden // heads if kv is None else _int("kv_channels", kv)
        ffn = _opt_int("ffn_hidden_size", get("ffn_hidden_size"))

        dense = s.get("num_dense_layers")
        if dense is None:
            freq = s.get("moe_layer_freq")
            if isinstance(freq, str):  # Megatron-LM's pattern string, e.g. "([0]*3+[1]*58)"
                freq = _parse_layer_pattern(freq)
            if isinstance(freq, (list, tuple)):
                dense = sum(1 for x in freq if not x)
            elif isinstance(freq, int) and not isinstance(freq, bool) and freq > 1:
                dense = num_layers + (-num_layers // freq)  # minus ceil(layers / freq) MoE layers, exact
            else:
                dense = 0
                if freq is None:
                    used.append("num_dense_layers")

        tp = _int("tensor_model_parallel_size", get("tensor_model_parallel_size"))
        pp = _int("pipeline_model_parallel_size", get("pipeline_model_parallel_size"))
        vpp = _opt_int("virtual_pipeline_model_parallel_size", get("virtual_pipeline_model_parallel_size"), 1)
        vpp = None if vpp == 1 else vpp
        cp = _int("context_parallel_size", get("context_parallel_size"))
        ep = _int("expert_model_parallel_size", get("expert_model_parallel_size", required=True))
        etp = _int("expert_tensor_parallel_size", get("expert_tensor_parallel_size"))
        mbs = _int("micro_batch_size", get("micro_batch_size", required=True))
        dp, nmb = _batch_layout(s, num_gpus, tp, pp, cp, mbs, used)

        dispatcher = s.get("dispatcher")
        if dispatcher is None:
            kind = s.get("moe_token_dispatcher_type")
            if kind == "flex":
                dispatcher = s.get("moe_flex_dispatcher_backend") or "deepep"
            elif kind in (None, "alltoall"):
                dispatcher = "alltoall"
                if kind is None:
                    used.append("dispatcher")
            else:  # allgather: no all-to-all to hide; modelled as alltoall volume (documented)
                dispatcher = "alltoall"
                used.append("dispatcher")
        if s.get("bf16") is False and s.get("fp16") is not True:
            nbytes = 4
        else:
            nbytes = _int("bytes_per_element", s.get("bytes_per_element") or 2)
            if s.get("bf16") is None and s.get("fp16") is None and s.get("bytes_per_element") is None:
                used.append("bytes_per_element")
        gemm = s.get("gemm_precision")
        if gemm is None:
            fields_ = type("MixedPrecisionFields", (), {k: s.get(k) for k in ("bf16", "fp16", "fp8", "fp8_recipe", "fp4",
                                                                           "fp4_recipe")})
            gemm = _precision_of.of_fields(fields_) if (s.get("fp8") or s.get("fp4")) else \
                ("fp32" if nbytes == 4 else "bf16")
        impl = get("transformer_impl")
        mask = s.get("attention_mask_in_batch")
        if mask is None:
            mask = impl == "local"  # the local (unfused) attention path consumes a dense mask
            used.append("attention_mask_in_batch")
        window, windowed = _window(s, num_layers)
        recompute = s.get("recompute")
        selective: tuple[str, ...] = ()
        if s.get("recompute_granularity") == "selective":
            listed = s.get("recompute_modules")  # None: MCore's default, core_attn (transformer_config.py:1763)
            selective = tuple(str(x) for x in listed) if isinstance(listed, (list, tuple)) else ("core_attn",)
        if recompute is None:
            recompute = s.get("recompute_granularity") == "full"
        # MCore 0.19.2 TEGroupedMLP: the op fuser (use_transformer_engine_op_fuser) runs FC1, the clamped
        # GLU and FC2 with its bias in one op (experts.py:290, 753); otherwise the clamps run before the
        # fused GLU when bias_activation_fusion takes it (fused_bias_geglu.py:424-432, experts.py:827-843)
        # and the FC2 bias (skip_bias_add=True, experts.py:246) is added eagerly (experts.py:313-330)
        unfused = not s.get("use_transformer_engine_op_fuser")
        glu_clamp = bool(unfused and s.get("gated_linear_unit") and s.get("bias_activation_fusion")
                         and s.get("activation_func_clamp_value") is not None
                         and s.get("moe_mlp_glu_interleave_size") is None and not s.get("use_te_activation_func"))
        router_bytes = {"fp32": 4, "fp64": 8}.get(str(s.get("moe_router_dtype")), nbytes)

        return cls(
            num_layers=num_layers, hidden_size=hidden, num_attention_heads=heads, num_query_groups=groups,
            kv_channels=kv, seq_length=_int("seq_length", get("seq_length", required=True)), micro_batch_size=mbs,
            num_moe_experts=_int("num_moe_experts", get("num_moe_experts", required=True)),
            moe_router_topk=_int("moe_router_topk", get("moe_router_topk", required=True)),
            moe_ffn_hidden_size=_int("moe_ffn_hidden_size", get("moe_ffn_hidden_size", required=True)),
            moe_shared_expert_intermediate_size=_opt_int("moe_shared_expert_intermediate_size",
                                                         get("moe_shared_expert_intermediate_size")),
            ffn_hidden_size=ffn, num_dense_layers=_int("num_dense_layers", dense, 0),
            vocab_size=_int("vocab_size", get("vocab_size", "padded_vocab_size")),
            mtp_num_layers=_int("mtp_num_layers", get("mtp_num_layers") or 0, 0),
            **{k: _opt_int(k, s.get(k)) for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim",
                                                   "qk_pos_emb_head_dim", "v_head_dim")},
            attention_window=window, windowed_layers=windowed,
            tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, dp=dp, num_microbatches=nmb,
            bytes_per_element=nbytes, gemm_precision=str(gemm), dispatcher=str(dispatcher), transformer_impl=str(impl),
            attention_mask_in_batch=bool(mask),
            high_priority_a2a=bool(get("high_priority_a2a_comm_stream")),
            recompute=bool(recompute), overlap_grad_reduce=bool(get("overlap_grad_reduce")),
            grad_reduce_in_fp32=bool(get("grad_reduce_in_fp32")),
            delay_wgrad=bool(s.get("delay_wgrad_compute")),  # absent: MCore's default, off
            recompute_modules=selective,
            glu_clamp=glu_clamp, expert_fc2_bias=bool(unfused and s.get("add_bias_linear")),
            router_probs_bytes=router_bytes,
            fp8_attention=bool(s.get("fp8_dot_product_attention")) and gemm is not None
            and str(gemm) not in ("bf16", "fp16", "fp32"),
            defaults_used=tuple(dict.fromkeys(used)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _window(s: Mapping[str, Any], num_layers: int) -> tuple[int | None, int]:
    """(keys before each query, windowed layers) from MCore's ``window_size`` ((left, right) or
    left) and ``window_attn_skip_freq`` as ``transformer/utils.py:is_layer_window_attention`` reads
    them (1-based layer numbers: an int N makes every N-th layer full attention, a list marks the
    windowed layers, None windows every layer); (None, 0) without a window."""
    if s.get("attention_window") is not None:
        return _opt_int("attention_window", s["attention_window"]), _int("windowed_layers", s.get("windowed_layers", 0), 0)
    w = s.get("window_size")
    if not w:
        return None, 0
    left = _int("window_size", w[0] if isinstance(w, (list, tuple)) else w, 0)
    freq = s.get("window_attn_skip_freq")
    if freq is None:
        return left, num_layers
    if isinstance(freq, (list, tuple)):
        return left, sum(1 for x in freq[:num_layers] if x)
    freq = _int("window_attn_skip_freq", freq)
    return left, num_layers - num_layers // freq
