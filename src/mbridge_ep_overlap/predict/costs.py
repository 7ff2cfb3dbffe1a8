"""Cost of each schedule node: FLOPs and bytes per layer and microbatch -> seconds on one GPU.

Contract
--------
``layer_costs(inputs, cluster, calibration)`` returns ``Costs``: the duration of every node that
Megatron-Core's combined-1F1B schedule runs for one layer and one microbatch (attention block
forward/backward, expert MLP forward/backward, each of the four all-to-alls), plus the
per-microbatch ends (embedding, output layer and loss), the per-step parts (optimizer, DP
gradient sync) and what each all-to-all moves (bytes in and out of the NVLink domain).

Compute time = GEMM FLOPs / (peak x GEMM efficiency; linear layers at the peak and relative
efficiency of the recipe's GEMM precision, ``precision.gemm_rate``, plus its quantization passes) + memory-bound bytes / (HBM bandwidth x
``memory_efficiency``) [+ fused attention FLOPs / (peak x ``te_attention_efficiency(FLOPs of one
call)``) on the Transformer-Engine path: the measured TE fused-attention efficiency at that size].
The GEMM efficiency is ``gemm_efficiency`` on the local layer stack and, on the Transformer-Engine stack,
``te_gemm_efficiency(flops of one GEMM call)``: the measured TE GEMM efficiency at that size
(``hardware.json``; a grouped GEMM is sized per local expert; a
calibration of another cluster scales it by its ``gemm_efficiency`` over the shipped one), since
one constant cannot hold both Qwen3-30B-A3B's small GEMMs and DeepSeek-V3's large ones. The two
calibrated efficiencies are fitted on the GPU the calibration was measured on
(``calibration.json``); pass counts of the memory-bound kernels are fixed constants
(``_PASSES``), not fitted. Sliding-window layers shorten fused attention; selectively recomputed
modules (``REPLAYED_MODULES``) add their forward to their backward node; the unfused grouped
expert MLP adds its eager clamp and FC2-bias passes (``eager_expert_bytes``). All-to-all time = latency + max(bytes inside the NVLink domain /
its bandwidth, bytes leaving it / the NIC bandwidth) for the dispatcher's traffic pattern; HybridEP's bandwidth
inside the domain is its published figure where one is published for the GPU kind (``hybridep_published``).

Stdlib only; loads ``hardware.json`` and ``calibration.json`` from this package's folder.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .inputs import Cluster, LinkSpec, StepInputs
from .precision import Rate, gemm_rate

_HERE = Path(__file__).resolve().parent

# Memory-bound passes, in units of (tokens x hidden) elements unless noted. Counted from the
# Megatron-Core 0.19.2 layer code (norms read+write, residual adds read 2 write 1, RoPE on q/k,
# permutation copies topk x hidden, SwiGLU reads 2 x ffn writes 1 x ffn, probs multiply). They
# are assumptions that the fitted memory efficiency scales; they are not fitted one by one.
_PASSES = {
    "attn_block": 7.0,  # input norm 2 + attention residual 3 + pre-MLP norm 2
    "permute_per_topk": 2.0,  # dispatch preprocess gather (read + write per routed copy)
    "expert_per_topk_h": 4.0,  # post-dispatch sort + pre-combine unsort (2 + 2 per routed copy)
    "expert_per_topk_ffn": 4.0,  # SwiGLU (read 2 ffn, write 1 ffn) + probs multiply (1 ffn)
    "combine_post_per_topk": 1.0,  # unpermute reads every routed copy ...
    "combine_post": 4.0,  # ... writes one + MLP residual add (3)
    "dense_mlp_per_ffn": 4.0,
    "score_bytes_local": 16.0,  # bytes per attention-score element, unfused (baddbmm, mask, fp32 softmax, bmm)
    "loss_bytes_local": 16.0,  # bytes per logit element, unfused cross-entropy (fp32)
    "loss_bytes_te": 6.0,  # fused cross-entropy
    "optimizer_bytes_per_param": 30.0,  # Adam, fp32 master + m + v read/write, bf16 param write
    "grad_accum_bytes_per_param_local": 10.0,  # unfused main_grad accumulation per microbatch
}
# selectively recomputed modules whose replay layer_costs adds to their backward node
REPLAYED_MODULES = frozenset({"core_attn", "layernorm", "mla_up_proj", "shared_experts", "moe_act", "mlp"})
_ATTN_KEY_TILE = 128  # keys per tile of the fused attention kernels (FlashAttention / cuDNN block size; assumed)
_BWD_GEMM = 2.0  # dgrad + wgrad
_BWD_MEM = 2.0
_BWD_ATTN_LOCAL = 2.0  # unfused backward: dgrad + wgrad-like products of the two score GEMMs


# Copy-equivalent bytes per element of the eager expert passes of MCore 0.19.2's unfused grouped
# expert MLP (``eager_expert_bytes``): the exact expressions timed on 1x H200 (torch 2.11) at GPT-OSS-120B
# shapes, seconds x the same GPU's measured copy rate / elements, BF16 activations
# (docs/evidence/2026-12-02-h200x1-eager-expert/eager_expert_ops.json, 2 local experts: the GPU-bound
# case; tests/unit/test_predict.py re-derives them). Counted from the code they are 16 / 20 (clamps,
# per ffn element) and 28 / 36 (FP32 probabilities) or 12 / 12 (BF16), per hidden element: strided
# views, broadcasts and mixed dtypes keep PyTorch's elementwise kernels below the copy rate.
EAGER_EXPERT_EVIDENCE = "docs/evidence/2026-12-02-h200x1-eager-expert/eager_expert_ops.json"
_EAGER_EXPERT_BYTES = {  # (forward, backward) per routed-copy element
    "clamp": (32.8, 69.0),  # per ffn element: two clamps + cat, their backwards + the chunk-gradient cat
    "fc2_bias_fp32": (51.0, 65.6),  # per hidden element, FP32 probabilities (flex dispatchers)
    "fc2_bias_bf16": (23.3, 35.1),  # per hidden element, probabilities in the activations' dtype
}


def eager_expert_bytes(inputs: StepInputs, dispatcher: str | None = None) -> tuple[float, float, float]:
    """(forward, backward, ``moe_act`` replay) copy-equivalent HBM bytes per layer and microbatch of the
    eager passes of Megatron-Core 0.19.2's unfused grouped expert MLP (``TEGroupedMLP`` without the TE
    op fuser; ``StepInputs.glu_clamp`` / ``expert_fc2_bias``) on the Transformer-Engine stack; 0 elsewhere.

    * Clamped GLU (``fusions/fused_bias_geglu.py:424-432``) over the FC1 output of every routed copy:
      two clamps and a ``cat`` before the fused GLU kernel; backward the two clamp backwards and the
      chunk's gradient ``cat``. A recomputed ``moe_act`` (the checkpointed ``bias_act_func``) replays
      the forward.
    * FC2 bias (``experts.py:246`` ``skip_bias_add=True``, added at ``313-330``): per local expert
      ``t + b * p``, a ``cat`` and a ``.to``; backward the casts and the multiply's two gradients. In
      FP32 where the probabilities are: the flex dispatchers hand FP32 probabilities to the experts
      (``token_dispatcher.py:1127-1133``, ``1303-1309``), ``alltoall`` those of the router's dtype.

    Bytes per element: ``_EAGER_EXPERT_BYTES`` (measured with BF16 activations, scaled by the
    activation width otherwise). The per-expert kernels' launches (about 2 per local expert forward, 5
    backward) are not costed: on the H200 host they made 8 and 16 local experts host-bound (the
    evidence file), and no host time per kernel is known for the target machines.
    """
    i = inputs
    if i.transformer_impl != "transformer_engine":
        return 0.0, 0.0, 0.0
    width = i.bytes_per_element / 2
    routed = i.moe_router_topk * i.tokens_per_gpu
    fwd = bwd = replay = 0.0
    if i.glu_clamp:
        f, b = _EAGER_EXPERT_BYTES["clamp"]
        fwd, bwd = f * routed * i.moe_ffn_hidden_size * width, b * routed * i.moe_ffn_hidden_size * width
        replay = fwd if "moe_act" in i.recompute_modules else 0.0
    if i.expert_fc2_bias:
        fp32 = (dispatcher or i.dispatcher) in ("deepep", "hybridep") or i.router_probs_bytes > i.bytes_per_element
        f, b = _EAGER_EXPERT_BYTES["fc2_bias_fp32" if fp32 else "fc2_bias_bf16"]
        fwd += f * routed * i.hidden_size * width
        bwd += b * routed * i.hidden_size * width
    return fwd, bwd, replay


@lru_cache(maxsize=4)
def _load_json(name: str) -> dict[str, Any]:
    return json.loads((_HERE / name).read_text())


def hardware() -> dict[str, Any]:
    """The parsed ``hardware.json``."""
    return _load_json("hardware.json")


def fp8_attention() -> dict[str, Any]:
    """``hardware.json`` ``fp8_attention``: the GPU kinds whose FP8 fused attention was measured and its time
    relative to BF16 fused attention there (``time_factor``)."""
    return hardware()["fp8_attention"]


def fp8_attention_measured(inputs: StepInputs, gpu: str) -> bool:
    """Whether the config runs FP8 attention in a recipe on a GPU kind whose FP8 attention was measured."""
    m = fp8_attention()
    return inputs.fp8_attention and gpu in m["gpus"] and inputs.gemm_precision in m["recipes"]


def linear_rate(inputs: StepInputs, cluster: Cluster) -> Rate:
    """The rate of the config's linear-layer GEMMs on the cluster's GPU (``precision.gemm_rate``)."""
    return gemm_rate(gpu_spec(cluster.gpu), inputs.gemm_precision, hardware()["precisions"])


def te_gemm_efficiency(flops_per_call: float) -> float:
    """Fraction of the dense peak one Transformer Engine GEMM call of ``flops_per_call`` reaches:
    ``e_max x (1 - exp(-d / d0))`` with d = (M x N x K)^(1/3) = (flops / 2)^(1/3), fitted on the
    BF16 TE GEMM rows measured on 1x H200 (``hardware.json`` ``te_gemm_efficiency``)."""
    c = hardware()["te_gemm_efficiency"]
    d = (max(flops_per_call, 0.0) / 2) ** (1 / 3)
    return max(c["floor"], c["e_max"] * (1 - math.exp(-d / c["d0"])))


def te_attention_efficiency(flops_per_call: float) -> float:
    """Fraction of the dense peak one Transformer Engine fused-attention forward call of
    ``flops_per_call`` (causal pairs) reaches: ``e_max x (1 - exp(-d / d0))`` with d = (flops / 2)^(1/3),
    e_max the TE GEMM ceiling, d0 fitted on the BF16 attention rows measured on 1x H200
    (``hardware.json`` ``te_attention_efficiency``)."""
    hw = hardware()
    c = hw["te_attention_efficiency"]
    d = (max(flops_per_call, 0.0) / 2) ** (1 / 3)
    return max(c["floor"], hw["te_gemm_efficiency"]["e_max"] * (1 - math.exp(-d / c["d0"])))


def gpu_spec(key: str) -> dict[str, Any]:
    gpus = hardware()["gpus"]
    if key not in gpus:
        raise KeyError(f"unknown GPU {key!r}: one of {sorted(gpus)}")
    return gpus[key]


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """The fitted constants (see ``calibration.json`` for how they were measured)."""

    gpu: str
    gemm_efficiency: float
    memory_efficiency: float
    nvlink_alltoall_efficiency: float
    nvlink_contention: float
    nvlink_comm_slowdown: float = 0.0
    links: dict[str, LinkSpec] = field(default_factory=dict)  # named measured links (e.g. 'throttled')
    host_s_per_microbatch: float = 0.0
    host_s_per_mask_byte: float = 0.0
    ib_contention: float = 0.0
    ib_comm_slowdown: float = 0.0
    deepep_dispatch_sync_s: float = 0.0  # DeepEP normal-mode dispatch: CPU wait + re-issue, per dispatch
    stream_priority_delay: float = 0.0  # default-priority all-to-all start delay, fraction of the running compute node
    source: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Calibration":
        f = d["fitted"]
        links = {name: LinkSpec(name=name, bandwidth_GBps=v["bandwidth_GBps"], latency_s=v["latency_s"],
                                contention=v["contention"], comm_slowdown=v.get("comm_slowdown", 0.0))
                 for name, v in f.get("links", {}).items()}
        a = d["assumed"]
        return cls(gpu=d["gpu"], gemm_efficiency=f["gemm_efficiency"], memory_efficiency=f["memory_efficiency"],
                   nvlink_alltoall_efficiency=f["nvlink_alltoall_efficiency"],
                   nvlink_contention=f["nvlink_contention"], nvlink_comm_slowdown=f.get("nvlink_comm_slowdown", 0.0),
                   links=links,
                   host_s_per_microbatch=f["host_s_per_microbatch"], host_s_per_mask_byte=f["host_s_per_mask_byte"],
                   ib_contention=_assumed(a, "ib_contention", links),
                   ib_comm_slowdown=_assumed(a, "ib_comm_slowdown", links),
                   stream_priority_delay=f.get("stream_priority_delay", 0.0),
                   deepep_dispatch_sync_s=f.get("deepep_dispatch_sync_s", 0.0),
                   source=d.get("file", "calibration.json"))


def _assumed(a: dict[str, Any], key: str, links: dict[str, LinkSpec]) -> float:
    """An assumed constant: a number, or 'same as <link>.<field>' of a fitted link."""
    v = a[key]
    if isinstance(v, str) and v.startswith("same as "):
        link, fld = v[len("same as "):].split(".")
        return float(getattr(links[link], fld))
    return float(v)


def default_calibration() -> Calibration:
    """The calibration shipped in ``calibration.json``."""
    d = dict(_load_json("calibration.json"))
    d["file"] = str(_HERE / "calibration.json")
    return Calibration.from_dict(d)


# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class A2A:
    """One all-to-all call of one GPU."""

    seconds: float
    bytes_total: float  # bytes this GPU sends (= receives, balanced routing), self included
    bytes_intra: float  # to other GPUs of its NVLink domain
    bytes_inter: float  # to GPUs outside its NVLink domain
    contention: float  # compute slowdown while it runs
    comm_slowdown: float  # its own slowdown while compute runs beside it


@dataclass(frozen=True)
class Costs:
    """Seconds per node for one layer and one microbatch on one GPU (compute nodes include the
    contention-free time only; the schedule applies contention)."""

    attn_f: float  # attention block (norms, QKV, core attention, projection, residual)
    attn_b: float
    moe_pre_f: float  # router, shared expert, permutation: same node as attention in MoE layers
    moe_pre_b: float
    expert_f: float
    expert_b: float
    dense_mlp_f: float
    dense_mlp_b: float
    combine_post_f: float  # combine postprocess + residual, runs on the comm stream with overlap
    combine_post_b: float
    a2a: A2A  # each of dispatch, combine and their backwards (same volume)
    embed_f: float
    embed_b: float
    head_f: float  # final norm + output layer + loss
    head_b: float
    mtp_extra_f: float  # MTP layer's projection + its own output layer (per MTP layer)
    mtp_extra_b: float
    tp_comm_f: float  # TP all-gather/reduce-scatter per layer (serial, on the compute stream)
    tp_comm_b: float
    pp_p2p: float  # activation send/recv per model chunk boundary and direction
    optimizer: float  # per step
    dp_sync: float  # per step, gradient reduce-scatter + parameter all-gather
    host_per_microbatch: float  # host stall at each microbatch start (compute stream idle)
    sync_per_dispatch: bool  # the dispatcher makes the CPU wait for the GPU in dispatch forward
    dispatch_sync_s: float  # host time after that wait before the GPU gets new work (DeepEP)
    # with delay_wgrad_compute (overlap on only): the weight-gradient GEMM part of expert_b and of
    # attn_b + moe_pre_b that MCore runs as a separate step (``backward_dw``); 0 without it
    expert_wgrad: float = 0.0
    attn_wgrad: float = 0.0


def _links(inputs: StepInputs, cluster: Cluster, cal: Calibration) -> tuple[LinkSpec, LinkSpec]:
    spec = gpu_spec(cluster.gpu)
    hw = hardware()["links"]
    intra = cluster.intra_link or LinkSpec(
        name="nvlink", bandwidth_GBps=spec["nvlink_GBps_bidir"] / 2 * cal.nvlink_alltoall_efficiency,
        latency_s=hw["nvlink"]["latency_s"], contention=cal.nvlink_contention, comm_slowdown=cal.nvlink_comm_slowdown)
    inter = cluster.inter_link or LinkSpec(
        name="infiniband", bandwidth_GBps=spec["nic_gbit_s"] / 8 * hw["infiniband"]["nccl_alltoall_efficiency"],
        latency_s=hw["infiniband"]["latency_s"], contention=cal.ib_contention, comm_slowdown=cal.ib_comm_slowdown)
    return intra, inter


def domain_size(cluster: Cluster) -> int:
    """GPUs per NVLink domain: the explicit value, else the GPU kind's; on systems whose domain is
    one node (H100/H200/B200) a ``gpus_per_node`` override sets it too. Never more than the job."""
    spec = gpu_spec(cluster.gpu)
    d = cluster.nvlink_domain_size
    if d is None:
        d = spec["nvlink_domain"]
        if cluster.gpus_per_node is not None and spec["nvlink_domain"] == spec["gpus_per_node"]:
            d = cluster.gpus_per_node
    return max(1, min(d, cluster.num_gpus))


def ep_layout(inputs: StepInputs, cluster: Cluster) -> tuple[int, int]:
    """(EP peers inside one NVLink domain incl. self, NVLink domains the EP group spans).

    Megatron-Core orders expert ranks ETP fastest, then EP: EP neighbours are ``etp`` GPUs
    apart, so a domain of D GPUs holds min(ep, D // etp) members of one EP group."""
    local = max(1, min(inputs.ep, domain_size(cluster) // max(1, inputs.etp)))
    return local, math.ceil(inputs.ep / local)


def hybridep_published(gpu: str, local: int) -> tuple[float, str] | None:
    """HybridEP's bandwidth inside the NVLink domain from its published table for this GPU kind
    (``hardware.json`` ``flex_dispatchers.hybridep.published_algbw_GBps``, or the kind ``published_for`` names),
    as (GB/s to the other ``local - 1`` peers, how it was read), or None where none is published.

    The table's algorithm bandwidth counts every dispatched byte, the rank's own included: the time for one
    rank's ``total`` bytes is ``total / algbw``, so the bandwidth to the other peers is ``algbw x (local-1)/local``.
    Dispatch and combine are averaged (the model gives both the same volume); between two published rank counts
    linear, outside them the end value (said in the returned text)."""
    h = hardware()["flex_dispatchers"]["hybridep"]
    kind = gpu if gpu in h.get("published_algbw_GBps", {}) else h.get("published_for", {}).get(gpu)
    table = h.get("published_algbw_GBps", {}).get(kind) if kind else None
    if not table or local < 2:
        return None
    ranks = table["ranks"]
    mean = [(a + b) / 2 for a, b in zip(table["dispatch_bf16"], table["combine"])]
    if local <= ranks[0] or local >= ranks[-1] or local in ranks:
        at = ranks.index(local) if local in ranks else 0 if local <= ranks[0] else -1
        algbw = mean[at]
        how = (f"published HybridEP {kind} bandwidth at {ranks[at]} ranks ({algbw:.0f} GB/s)"
               + ("" if local == ranks[at] else f", used for {local} EP peers in the NVLink domain (none published for "
                                                 f"{local})"))
    else:
        i = next(j for j in range(1, len(ranks)) if ranks[j] >= local)
        t = (local - ranks[i - 1]) / (ranks[i] - ranks[i - 1])
        algbw = mean[i - 1] + t * (mean[i] - mean[i - 1])
        how = f"published HybridEP {kind} bandwidth between {ranks[i - 1]} and {ranks[i]} ranks ({algbw:.0f} GB/s)"
    if kind != gpu:
        how += f"; {gpu} has none published: {kind}'s used"
    return algbw * (local - 1) / local, how


def a2a_cost(inputs: StepInputs, cluster: Cluster, cal: Calibration, dispatcher: str | None = None) -> A2A:
    """One dispatch (or combine) all-to-all of one microbatch on one GPU."""
    d = dispatcher or inputs.dispatcher
    if inputs.ep == 1:  # no expert-parallel exchange at all
        return A2A(seconds=0.0, bytes_total=0.0, bytes_intra=0.0, bytes_inter=0.0, contention=0.0, comm_slowdown=0.0)
    intra, inter = _links(inputs, cluster, cal)
    local, domains = ep_layout(inputs, cluster)
    tok = inputs.tokens_per_gpu
    h, k, b, ep = inputs.hidden_size, inputs.moe_router_topk, inputs.bytes_per_element, inputs.ep
    total = tok * k * h * b  # every routed copy, balanced over the EP group
    frac_intra = (local - 1) / ep
    frac_inter = (ep - local) / ep
    spec = gpu_spec(cluster.gpu)
    flex = hardware()["flex_dispatchers"]
    if d == "alltoall":
        bi, be = total * frac_intra, total * frac_inter
        bw_i, bw_e = intra.bandwidth_GBps, inter.bandwidth_GBps
        lat = inter.latency_s if domains > 1 else intra.latency_s
        cont = max(intra.contention if bi else 0.0, inter.contention if be else 0.0)
        slow = max(intra.comm_slowdown if bi else 0.0, inter.comm_slowdown if be else 0.0)
    elif d in ("deepep", "hybridep"):
        f = flex[d]
        # cross-domain traffic de-duplicated: a token goes once to every other domain holding one
        # of its experts (expected count for k experts spread uniformly over `domains` domains)
        other = domains - 1
        per_dom = local / ep
        p_hit = 1.0 - (1.0 - per_dom) ** k if domains > 1 else 0.0
        bi = total * frac_intra
        be = tok * h * b * other * p_hit
        # the flex kernels move tokens over NVLink themselves: an NCCL link override inside the
        # domain (e.g. the bench's throttled link) does not apply to them
        raw_nvl = spec["nvlink_GBps_bidir"] / 2
        if d == "deepep":
            bw_i = min(f["intranode_GBps_cap"], raw_nvl)
        elif (published := hybridep_published(cluster.gpu, local)) is not None:
            bw_i = published[0]
        else:
            bw_i = raw_nvl * f["intranode_link_efficiency"]
        bw_e = spec["nic_gbit_s"] / 8 * f["internode_nic_efficiency"]
        if cluster.inter_link is not None:
            bw_e = cluster.inter_link.bandwidth_GBps
        lat = inter.latency_s if domains > 1 else intra.latency_s
        cont = f["sms"] / spec["sms"]
        slow = 0.0  # own SMs, not an NCCL kernel waiting for SMs
    else:
        raise ValueError(f"dispatcher {d!r} has no bandwidth model")
    t_i = bi / (bw_i * 1e9) if bi else 0.0
    t_e = be / (bw_e * 1e9) if be else 0.0
    secs = lat + max(t_i, t_e)
    if d == "alltoall" and max(t_i, t_e) > 0:
        # each part slows by its own link's factor; the call takes as long as the slower part
        slow = max(t_i * (1 + intra.comm_slowdown), t_e * (1 + inter.comm_slowdown)) / max(t_i, t_e) - 1
    return A2A(seconds=secs, bytes_total=total, bytes_intra=bi, bytes_inter=be, contention=cont, comm_slowdown=slow)


def layer_costs(inputs: StepInputs, cluster: Cluster, cal: Calibration, dispatcher: str | None = None) -> Costs:
    """Node durations for ``inputs`` on ``cluster`` (see the module docstring)."""
    spec = gpu_spec(cluster.gpu)
    peak = spec["bf16_dense_tflops"] * 1e12
    hbm = spec["hbm_TBps"] * 1e12
    eg, em = cal.gemm_efficiency, cal.memory_efficiency
    i = inputs
    T = i.tokens_per_gpu
    h, b, k, E = i.hidden_size, i.bytes_per_element, i.moe_router_topk, i.num_moe_experts
    S = i.seq_length
    impl = i.transformer_impl
    causal = 0.5 if impl == "transformer_engine" else 1.0  # unfused local attention computes the full square

    # a calibration other than the shipped one (another cluster's) scales the TE curve by its own
    # gemm_efficiency relative to the shipped one: the curve's shape is TE's, its level the cluster's
    te_scale = eg / _load_json("calibration.json")["fitted"]["gemm_efficiency"]

    def eff(flops: float, calls: float) -> float:
        """GEMM efficiency: the calibrated constant on the local stack; on the TE stack the measured
        TE GEMM efficiency at the size of one call (``te_gemm_efficiency``, module docstring)."""
        return te_gemm_efficiency(flops / calls) * te_scale if impl == "transformer_engine" else eg

    def gemm(flops: float, calls: float = 1) -> float:  # BF16 GEMMs: router, output layer, unfused attention
        return flops / (peak * eff(flops, calls)) if flops else 0.0

    # linear layers in the recipe's GEMM precision (FP8 / MXFP8 / NVFP4 at their own peak), plus the
    # quantization passes over each GEMM input (forward) and output gradient (backward)
    rate = linear_rate(inputs, cluster)
    quant = rate.quantize_passes * 2  # bytes read + written per quantized element, BF16 source

    def lin(flops: float, calls: float = 1) -> float:
        return flops / (rate.peak_flops * eff(flops, calls) * rate.relative_efficiency) if flops else 0.0

    def lin_mem(elements: float) -> float:
        return elements * quant / (hbm * em) if quant else 0.0

    def mem(nbytes: float) -> float:
        return nbytes / (hbm * em)

    # attention block: QKV + output projection (+ MLA down/up projections), core attention
    nh = i.num_attention_heads
    if i.multi_latent_attention:
        dqk = (i.qk_head_dim or 128) + (i.qk_pos_emb_head_dim or 64)
        dv = i.v_head_dim or 128
        q_in = (i.q_lora_rank or 0)
        q_proj = (2 * T * h * q_in + 2 * T * q_in * nh * dqk) if q_in else 2 * T * h * nh * dqk
        kv_proj = 2 * T * h * (i.kv_lora_rank + (i.qk_pos_emb_head_dim or 64)) \
            + 2 * T * i.kv_lora_rank * nh * ((i.qk_head_dim or 128) + dv)
        attn_lin_t = lambda: lin(q_proj, 2 if q_in else 1) + lin(kv_proj, 2) + lin(2 * T * nh * dv * h)  # noqa: E731
        core = 2 * T * S * nh * (dqk + dv) * causal
        full_core = core
        rope_elems = T * nh * (i.qk_pos_emb_head_dim or 64) * 2
        attn_params = h * (q_in + i.kv_lora_rank + (i.qk_pos_emb_head_dim or 64)) \
            + q_in * nh * dqk + i.kv_lora_rank * nh * ((i.qk_head_dim or 128) + dv) + nh * dv * h
        score_heads = nh
    else:
        kv = i.kv_channels
        ng = i.num_query_groups
        attn_lin_t = lambda: lin(2 * T * h * (nh * kv + 2 * ng * kv)) + lin(2 * T * nh * kv * h)  # noqa: E731
        core = full_core = 4 * T * S * nh * kv * causal
        if i.attention_window and impl == "transformer_engine" and i.windowed_layers:
            # sliding window (fused attention skips key tiles outside it): each query computes its
            # window plus the partly masked key tile at the window's edge, never more than causal;
            # averaged over the layers (the replay runs one layer cost). The local path computes
            # the whole masked square, so it saves nothing there.
            keys = min(S * causal, i.attention_window + 1 + _ATTN_KEY_TILE)
            frac = i.windowed_layers / i.num_layers
            core = core * (1 - frac) + 4 * T * keys * nh * kv * frac
        rope_elems = T * (nh + ng) * kv * 2
        attn_params = h * (nh * kv + 2 * ng * kv) + nh * kv * h
        score_heads = nh
    attn_params /= i.tp
    attn_mem = (_PASSES["attn_block"] * T * h + rope_elems) * b
    if impl == "local":
        scores = T * S * score_heads  # per GPU: local queries x all keys x local heads
        attn_core_f = gemm(core) + mem(scores * _PASSES["score_bytes_local"])
        attn_core_b = _BWD_ATTN_LOCAL * attn_core_f
    else:
        # at the measured efficiency of this layer's full-attention call (a windowed layer too: its
        # own call is outside the measured sizes; hardware.json te_attention_efficiency)
        attn = hardware()["te_attention_efficiency"]
        attn_core_f = core / (peak * te_attention_efficiency(full_core) * spec.get("attention_speedup", 1.0))
        attn_core_b = attn["backward_factor"] * attn_core_f
        if fp8_attention_measured(i, cluster.gpu):
            # FP8 fused attention measured against BF16 on the GPU kind that runs it (fp8_attention(), the
            # quantization of Q, K, V, O and dO included); elsewhere taken at the BF16 rate and said so
            attn_core_f *= fp8_attention()["time_factor"]
            attn_core_b *= fp8_attention()["time_factor"]
    grad_acc = _PASSES["grad_accum_bytes_per_param_local"] if impl == "local" else 0.0

    # router + shared expert + permutation live in the attention node (pre_dispatch_computation)
    shared = i.moe_shared_expert_intermediate_size or 0
    moe_pre_mem = (_PASSES["permute_per_topk"] * k * T * h + (3 * T * shared if shared else 0)) * b
    shared_params = 3 * h * shared / i.tp + h * E

    attn_q = T * (h + nh * (i.v_head_dim or i.kv_channels))  # QKV and projection inputs
    shared_q = T * (h + shared) if shared else 0.0
    t_attn_lin = attn_lin_t()
    attn_f_common = t_attn_lin + lin_mem(attn_q) + attn_core_f + mem(attn_mem)
    attn_b_common = (_BWD_GEMM * t_attn_lin + _BWD_MEM * lin_mem(attn_q) + attn_core_b + _BWD_MEM * mem(attn_mem)
                     + mem(attn_params * grad_acc))
    router, shared_gemm = 2 * T * h * E, 6 * T * h * shared
    t_shared = lin(shared_gemm * 2 / 3) + lin(shared_gemm / 3)  # fc1 (gate + up), fc2
    moe_pre_f = gemm(router) + t_shared + lin_mem(shared_q) + mem(moe_pre_mem)
    moe_pre_b = (_BWD_GEMM * (gemm(router) + t_shared + lin_mem(shared_q)) + _BWD_MEM * mem(moe_pre_mem)
                 + mem(shared_params * grad_acc))

    # routed experts (grouped GEMM, SwiGLU: fc1 2 x ffn, fc2 ffn)
    F = i.moe_ffn_hidden_size
    expert_flops = 6 * T * k * h * F
    expert_mem = (_PASSES["expert_per_topk_h"] * k * T * h + _PASSES["expert_per_topk_ffn"] * k * T * F) * b
    expert_params = (E // i.ep) * 3 * h * F / i.etp
    expert_q = k * T * (h + F)  # FC1 and FC2 inputs
    groups = max(1, E // i.ep)  # one grouped GEMM call runs every local expert
    t_expert = lin(expert_flops * 2 / 3, groups) + lin(expert_flops / 3, groups)  # fc1, fc2
    eager_f, eager_b, eager_replay = eager_expert_bytes(i, dispatcher)  # GPT-OSS's unfused path
    expert_f = t_expert + lin_mem(expert_q) + mem(expert_mem) + mem(eager_f)
    expert_b = (_BWD_GEMM * t_expert + _BWD_MEM * lin_mem(expert_q) + _BWD_MEM * mem(expert_mem)
                + mem(expert_params * grad_acc) + mem(eager_b))
    cpost = mem((_PASSES["combine_post_per_topk"] * k + _PASSES["combine_post"]) * T * h * b)

    # dense layers
    Fd = i.ffn_hidden_size or 4 * h
    dense_flops = 6 * T * h * Fd
    dense_mem = (_PASSES["dense_mlp_per_ffn"] * T * Fd + 2 * T * h) * b
    dense_params = 3 * h * Fd / i.tp
    dense_q = T * (h + Fd)
    t_dense = lin(dense_flops * 2 / 3) + lin(dense_flops / 3)
    dense_mlp_f = t_dense + lin_mem(dense_q) + mem(dense_mem)
    dense_mlp_b = (_BWD_GEMM * t_dense + _BWD_MEM * lin_mem(dense_q) + _BWD_MEM * mem(dense_mem)
                   + mem(dense_params * grad_acc))

    # selective recompute (MCore recompute_modules): each listed module's forward runs again inside
    # the backward node it belongs to. "moe" (the whole MoE forward, all-to-alls included) and
    # "gdn_norm_out" are not modelled (config.unmodelled lists them).
    sel = set(i.recompute_modules)
    replay_attn = (attn_core_f if "core_attn" in sel else 0.0) \
        + (mem(4 * T * h * b) if "layernorm" in sel else 0.0)  # input and pre-MLP norms: read + write
    if "mla_up_proj" in sel and i.multi_latent_attention:
        up = (2 * T * q_in * nh * dqk if q_in else 0.0) + 2 * T * i.kv_lora_rank * nh * ((i.qk_head_dim or 128) + dv)
        replay_attn += lin(up, 2 if q_in else 1) + mem(rope_elems * b)
    replay_pre = t_shared + mem(3 * T * shared * b) if "shared_experts" in sel and shared else 0.0
    replay_expert = mem(3 * k * T * F * b) if "moe_act" in sel else 0.0  # fused GLU: reads 2 x ffn, writes 1
    replay_expert += mem(eager_replay)  # the clamps before it
    replay_dense = dense_mlp_f if "mlp" in sel else 0.0

    # output layer + loss, embedding
    V = i.vocab_size
    head_flops = 2 * T * h * V
    loss_bytes = _PASSES["loss_bytes_local"] if impl == "local" else _PASSES["loss_bytes_te"]
    head_mem = T * V * loss_bytes + 2 * T * h * b
    head_f = gemm(head_flops) + mem(head_mem)
    head_b = _BWD_GEMM * gemm(head_flops) + mem(head_mem) + mem(h * V / i.tp * grad_acc)
    embed_f = mem(2 * T * h * b)
    embed_b = mem(2 * T * h * b + h * V / i.tp * grad_acc)
    mtp_extra_f = lin(2 * T * 2 * h * h) + head_f
    mtp_extra_b = _BWD_GEMM * lin(2 * T * 2 * h * h) + head_b

    intra, inter = _links(inputs, cluster, cal)
    # TP: all-gather before and reduce-scatter after attention and dense MLP (sequence parallel)
    if i.tp > 1:
        vol = T * i.tp * h * b * (i.tp - 1) / i.tp
        tp_comm = 2 * (intra.latency_s + vol / (intra.bandwidth_GBps * 1e9))
    else:
        tp_comm = 0.0
    # PP: one activation tensor per chunk boundary; stages are assumed to sit on different domains
    # when PP > 1 and the model does not fit one domain (the usual layout)
    if i.pp > 1:
        link = inter if cluster.num_gpus > domain_size(cluster) else intra
        pp_p2p = link.latency_s + T * h * b / (link.bandwidth_GBps * 1e9)
    else:
        pp_p2p = 0.0

    # parameters per GPU -> optimizer step and DP gradient sync (distributed optimizer)
    layers_local = i.num_layers / i.pp
    moe_local = i.num_moe_layers / i.pp
    dense_local = i.num_dense_layers / i.pp
    nonexpert = layers_local * (attn_params + 4 * h / i.tp) + moe_local * shared_params + dense_local * dense_params
    nonexpert += 2 * h * V / i.tp / i.pp  # input embedding + output layer (untied), spread over stages
    expert = moe_local * expert_params
    dp_dense = i.dp * i.cp
    dp_expert = max(1, i.world_size // (i.ep * i.etp * i.pp))
    opt_params = nonexpert / dp_dense + expert / dp_expert
    optimizer = mem(opt_params * _PASSES["optimizer_bytes_per_param"])

    def group_time(params: float, size: int, stride: int) -> float:
        if size <= 1:
            return 0.0
        link = inter if size * stride > domain_size(cluster) else intra
        # gradient reduce-scatter (FP32 or BF16: grad_reduce_in_fp32) + BF16 parameter all-gather
        vol = params * ((4 if i.grad_reduce_in_fp32 else 2) + 2) * (size - 1) / size
        return 2 * link.latency_s + vol / (link.bandwidth_GBps * 1e9)

    dp_sync = group_time(nonexpert, dp_dense, i.tp) + group_time(expert, dp_expert, i.ep * i.etp)

    host = cal.host_s_per_microbatch
    if i.attention_mask_in_batch:
        host += cal.host_s_per_mask_byte * i.micro_batch_size * S * S  # one bool per (query, key)
    d = dispatcher or i.dispatcher
    sync = True
    if d in ("deepep", "hybridep"):
        sync = bool(hardware()["flex_dispatchers"][d]["cpu_sync_per_dispatch"])
    return Costs(
        attn_f=attn_f_common, attn_b=attn_b_common + replay_attn, moe_pre_f=moe_pre_f, moe_pre_b=moe_pre_b + replay_pre,
        expert_f=expert_f, expert_b=expert_b + replay_expert,
        dense_mlp_f=dense_mlp_f, dense_mlp_b=dense_mlp_b + replay_dense,
        combine_post_f=cpost, combine_post_b=_BWD_MEM * cpost,
        a2a=a2a_cost(inputs, cluster, cal, d),
        embed_f=embed_f, embed_b=embed_b, head_f=head_f, head_b=head_b,
        mtp_extra_f=mtp_extra_f, mtp_extra_b=mtp_extra_b,
        tp_comm_f=tp_comm, tp_comm_b=tp_comm, pp_p2p=pp_p2p,
        optimizer=optimizer, dp_sync=dp_sync, host_per_microbatch=host, sync_per_dispatch=sync,
        # measured on 2x H200 with DeepEP's intranode kernels only (V1: up to 8 NVLink peers):
        # applied where those kernels run; internode DeepEP (other kernels, RDMA notify) gets the
        # published model only
        dispatch_sync_s=(cal.deepep_dispatch_sync_s
                         if d == "deepep" and ep_layout(inputs, cluster)[1] == 1 and i.ep <= 8 else 0.0),
        # the wgrad GEMMs take as long as the forward GEMMs (dgrad and wgrad: _BWD_GEMM = 2); only TE
        # linears defer them - the local layers' backward_dw() is a no-op (core/rules/delay_wgrad.py)
        expert_wgrad=t_expert if i.delay_wgrad and impl == "transformer_engine" else 0.0,
        attn_wgrad=t_attn_lin + t_shared if i.delay_wgrad and impl == "transformer_engine" else 0.0,
    )

