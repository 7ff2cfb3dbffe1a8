"""Peak GPU memory per GPU of a config, with EP overlap off and on: what the ``fits-in-gpu-memory``
rule and ``plan --predict`` read.

Contract
--------
``predict_memory(inputs, cluster, options) -> MemoryPrediction``: bytes on the most loaded pipeline
stage, every stage computed from its own layers (``model.pipeline_model_parallel_layout`` as MCore
reads it, else an even split with the dense layers first), its own warm-up microbatches per model
chunk (``_in_flight``), the embedding on the first stage and the output layer, logits and MTP layers
on the last; split into parts:

* ``parameters`` - BF16 weights of the stage's layers (attention and dense parts / TP, experts /
  (EP x ETP), router replicated), ``gradients`` - the DDP main-grad buffer (FP32 when
  ``StepInputs.grad_reduce_in_fp32``, else BF16), ``optimizer`` - Adam's master weights and two moments (FP32, or
  the precision-aware optimizer's dtypes),
  divided by the data-parallel group (dense: DP x CP, experts: the expert-data-parallel group) with
  the distributed optimizer, not without it; ``optimizer_offload_fraction`` of it on the host.
* ``activations`` - per layer and microbatch, the tensors Megatron-Core 0.19.2 saves for backward
  with TE layers (flash attention: no [s, s] scores; local attention adds its softmax output and
  GQA-expanded k / v; unfused SwiGLU and qk-layernorm inputs where configured), GEMM inputs in one
  byte under FP8-class recipes; times the layers in flight: overlap off one
  microbatch without PP, PP microbatches on the first stage with PP, the interleaved warm-up's
  ``2(pp-1) + (vpp-1)pp + 1`` model chunks with VPP; overlap on pairs each forward layer with a
  backward layer (combined 1F1B: one more layer in flight, its attention part released early with
  ``ep_overlap_early_attn_memory_release``; on the loss stage without VPP only what exceeds the
  logits, which a combined step frees before its layer pairs) and with VPP warms up one chunk more
  (``schedules.py:939``); delayed wgrad keeps one layer's expert GEMM inputs longer. Full recompute
  keeps each recomputed layer's input only, selective recompute drops the modules it replays.
* ``logits`` (last stage: the BF16 output + an FP32 tensor of the same shape: the unfused loss's
  softmax, MCore's fused loss's ``exp_logits``, TE's fused loss's FP32 gradient), ``dispatcher_buffers`` (DeepEP: its NVLink
  and RDMA buffers, ``num_sms / 2`` channels x peers x chunked tokens x hidden bytes, the shape of
  DeepEP's ``get_nvl_buffer_size_hint`` that MCore's ``fused_a2a.get_buffer`` asks for; HybridEP:
  dispatch and combine buffers of ``max_num_of_tokens_per_rank`` tokens for every rank of the NVLink
  domain, ``fused_a2a.init_hybrid_ep_buffer``), ``cuda_graphs`` (static input/output buffers of the
  graphed scopes per layer for one microbatch, the graphs sharing one pool: an estimate, no
  measurement yet),
  ``workspace`` (one layer's activations of backward transients), ``cublas_workspaces`` (Transformer
  Engine's persistent cuBLAS workspaces, ``te_cublas_workspaces``) and ``fixed`` (CUDA context, NCCL
  buffers: ``FIXED_GIB``, assumed).

``MemoryPrediction.allocated_off/on`` is what ``torch.cuda.max_memory_allocated`` measures (no
``fixed``, no fragmentation); ``total_off/on`` adds both and is what the rule compares with the
GPU's memory (``base.gpus``). ``lines()`` is what ``plan`` prints. Every number finite or
``ValueError``. Stdlib only.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ..base.gpus import GPU_CATALOG
from .costs import domain_size, ep_layout
from .inputs import Cluster, StepInputs

GIB = 2 ** 30
FIXED_GIB = 2.0  # assumed: CUDA context + NCCL buffers per GPU, outside the caching allocator
FRAGMENTATION = 0.05  # assumed: caching-allocator reserve above the allocated peak
NEAR = 0.90  # the advice threshold: predicted above this share of the GPU's memory
MODEL_ERROR = 0.25
"""How far above the GPU's memory a prediction must be before it refuses: the model's error bound. Checked
against measured peaks (docs/prediction.md, 2026-12-01, 1x H200) it is within 3% on both stacks, each row
predicted from the recipe it ran, and the CUDA-graph buffers of large recipes are an unmeasured estimate; a
prediction within this margin over the memory is advice, not a refusal (NVIDIA's own recipes run there)."""
SELECTIVE_MODULES = ("core_attn", "layernorm", "moe_act", "mlp", "moe", "shared_experts", "mla_up_proj")


@dataclass(frozen=True, kw_only=True)
class MemoryOptions:
    """What memory depends on beyond ``StepInputs`` (read from a config by ``core.prediction_inputs.memory_options``)."""

    distributed_optimizer: bool = True
    megatron_fsdp: bool = False
    """Megatron-FSDP (``ddp.use_megatron_fsdp``): parameters and gradients sharded like the optimizer state."""
    optimizer_offload_fraction: float = 0.0
    optimizer_state_bytes: float = 12.0
    """Bytes of Adam state per parameter: FP32 master weight and two FP32 moments; with
    ``use_precision_aware_optimizer`` the sizes of ``main_params_dtype``, ``exp_avg_dtype`` and
    ``exp_avg_sq_dtype`` (MCore's precision-aware optimizer stores each in its own dtype)."""
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    recompute_modules: tuple[str, ...] = ()
    cuda_graph_impl: str = "none"
    cuda_graph_scope: tuple[str, ...] = ()
    overlap: bool = False
    early_attn_release: bool = False
    delay_wgrad: bool = False
    tied_embeddings: bool = False
    deepep_num_sms: int = 20
    grouped_gemm: bool = False
    """``moe_grouped_gemm``: with Transformer Engine the experts are ``te.GroupedLinear``, whose grouped GEMM
    allocates one cuBLAS workspace per compute stream (``te_cublas_workspaces``)."""
    tp_comm_overlap: bool = False
    """``model.tp_comm_overlap`` (MB's comm-overlap setup sets it only with TP >= 2, sequence parallelism and TE):
    TE's userbuffers GEMMs allocate their own cuBLAS workspace."""
    fused_activation: bool = True
    """``bias_activation_fusion`` or ``use_te_activation_func``: the fused (weighted) SwiGLU saves its input;
    unfused, MCore's ``glu`` also keeps ``x_linear + glu_linear_offset``, ``silu(x_glu)`` and their product."""
    qk_layernorm: bool = False
    """``qk_layernorm``: the q / k norms save their inputs: a copy of q, and k (local: a view keeping the whole
    QKV projection output alive; TE: a contiguous copy)."""
    softmax_in_fp32: bool = False
    """``attention_softmax_in_fp32`` with the unfused masked softmax (local attention): an FP32 copy of the
    probabilities is saved beside the BF16 ones."""
    pipeline_layout: str | None = None  # model.pipeline_model_parallel_layout (MCore's string form)


@dataclass(frozen=True)
class MemoryPrediction:
    gpu: str
    capacity_gib: float  # the GPU's memory (base.gpus)
    parts_off: dict[str, float] = field(default_factory=dict)  # GiB per part, overlap off
    parts_on: dict[str, float] = field(default_factory=dict)  # GiB per part, overlap on
    stage: str = "first"  # the pipeline stage the peak is on

    @property
    def allocated_off(self) -> float:
        return sum(v for k, v in self.parts_off.items() if k != "fixed")

    @property
    def allocated_on(self) -> float:
        return sum(v for k, v in self.parts_on.items() if k != "fixed")

    @property
    def total_off(self) -> float:
        return self.allocated_off * (1 + FRAGMENTATION) + self.parts_off.get("fixed", 0.0)

    @property
    def total_on(self) -> float:
        return self.allocated_on * (1 + FRAGMENTATION) + self.parts_on.get("fixed", 0.0)

    def total(self, overlap: bool) -> float:
        return self.total_on if overlap else self.total_off

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "allocated_off_gib": self.allocated_off, "allocated_on_gib": self.allocated_on,
                "total_off_gib": self.total_off, "total_on_gib": self.total_on}

    def lines(self) -> list[str]:
        on = self.parts_on
        keys = [k for k in on if on[k] >= 0.05 or self.parts_off.get(k, 0) >= 0.05]
        split = ", ".join(f"{k} {on[k]:.1f}" for k in keys)
        return [f"  memory per GPU      : {self.total_off:.1f} GiB off / {self.total_on:.1f} GiB on of "
                f"{self.capacity_gib:.0f} GiB ({self.gpu}, {self.stage} pipeline stage)",
                f"  memory, overlap on  : {split} GiB (+{FRAGMENTATION:.0%} allocator reserve)"]


def _layer(i: StepInputs) -> dict[str, float]:
    """Parameters of one layer on one GPU, by part."""
    h, nh = i.hidden_size, i.num_attention_heads
    if i.multi_latent_attention:
        dqk = (i.qk_head_dim or 128) + (i.qk_pos_emb_head_dim or 64)
        dv, q_in, rope = i.v_head_dim or 128, i.q_lora_rank or 0, i.qk_pos_emb_head_dim or 64
        attn = h * (q_in + i.kv_lora_rank + rope) + (q_in or h) * nh * dqk \
            + i.kv_lora_rank * nh * ((i.qk_head_dim or 128) + dv) + nh * dv * h
    else:
        kv, ng = i.kv_channels, i.num_query_groups
        attn = h * (nh * kv + 2 * ng * kv) + nh * kv * h
    shared = i.moe_shared_expert_intermediate_size or 0
    return {"attn": attn / i.tp + 4 * h, "router": h * i.num_moe_experts, "shared": 3 * h * shared / i.tp,
            "experts": (i.num_moe_experts // i.ep) * 3 * h * i.moe_ffn_hidden_size / i.etp,
            "dense_mlp": 3 * h * (i.ffn_hidden_size or 4 * h) / i.tp}


def _activations(i: StepInputs, o: MemoryOptions, recomputed: bool) -> dict[str, float]:
    """Bytes one layer keeps for backward per microbatch, by part (attention, MoE, dense MLP)."""
    T = i.tokens_per_gpu
    h, k, E, F = i.hidden_size, i.moe_router_topk, i.num_moe_experts, i.moe_ffn_hidden_size
    if recomputed:  # full recompute: the layer input only
        return {"attn": 2 * T * h, "moe": 0.0, "dense": 0.0, "expert_inputs": 0.0}
    low = i.gemm_precision in ("fp8_delayed", "fp8_tensorwise", "fp8_blockwise", "mxfp8", "nvfp4")
    gemm_in = 1.0 if low else 2.0  # TE saves the quantized GEMM input under FP8-class recipes
    nh, kv, ng = i.num_attention_heads, i.kv_channels, i.num_query_groups
    if i.multi_latent_attention:
        qk = (i.qk_head_dim or 128) + (i.qk_pos_emb_head_dim or 64)
        q_el, kv_el, out_el = nh * qk, nh * (qk + (i.v_head_dim or 128)), nh * (i.v_head_dim or 128)
        up = T * ((i.q_lora_rank or 0) + i.kv_lora_rank) * 2  # latent inputs of the up projections
    else:
        q_el, kv_el, out_el = nh * kv, 2 * ng * kv, nh * kv
        up = 0.0
    mods = set(o.recompute_modules) if o.recompute_granularity == "selective" else set()
    ln_out = 0.0 if "layernorm" in mods else T * h * gemm_in  # the norm's output, saved by the next GEMM
    # layer input (the residual) + norm output + flash attention's q, k, v and output (the output is the
    # projection's input too: one tensor, plus its quantized copy under FP8-class recipes)
    # MLA with mla_up_proj recompute: the up-projected q, k, v are released after attention's forward
    # (CheckpointWithoutOutput) and recomputed from the latents, which are kept
    local = i.transformer_impl == "local" and not i.multi_latent_attention
    if local:
        # MCore's local DotProductAttention repeat_interleaves k and v to every query head (GQA) and the
        # baddbmm / bmm save the expanded copies
        kv_el = 2 * nh * kv
    qkv = 0.0 if (i.multi_latent_attention and "mla_up_proj" in mods) else q_el + kv_el
    if o.qk_layernorm and not i.multi_latent_attention:
        # the q / k norms save their inputs (get_query_key_value_tensors): q is a reshaped copy of its
        # slice of the QKV projection's output; k is a view of that output, which the local (torch)
        # norm saves as it is, keeping the whole projection output alive, while TE's norm saves a
        # contiguous copy of k. The normed, rotated q and k are new tensors (counted above)
        qkv += nh * kv + (nh * kv + 2 * ng * kv if local else ng * kv)
    attn = 2 * T * h + ln_out + 2 * T * (qkv + out_el) + (T * out_el if low else 0.0) + up
    if i.transformer_impl == "local" and "core_attn" not in mods:
        # local attention keeps one [b, np, s, s] tensor: the softmax output, saved by softmax's backward
        # and by the bmm with v. The baddbmm's scores are not kept (its backward needs q and k only) and
        # masked_fill saves its boolean mask; FP32 softmax (unfused) adds the FP32 probabilities
        per_score = 2 + (4 if o.softmax_in_fp32 else 0)
        attn += i.micro_batch_size * (nh / i.tp) * (i.seq_length / i.cp) * i.seq_length * per_score
    else:
        # fused / flash attention saves its softmax statistics: one FP32 value per token and head
        # (TE 2.18 fused_attn_f16_arbitrary_seqlen.cu:1232-1242, Stats [b, h, s, 1]; the Max tensor only
        # with return_max_logit, off by default) and a 2-element RNG state
        attn += T * nh * 4
    if i.transformer_impl == "transformer_engine":
        # TE norms save their FP32 rstdev beside the input (layernorm_linear.py:503-512 mu, rsigma;
        # rmsnorm_fwd returns no mu, csrc/extensions/normalization.cpp:325, 448): the input norm (fused
        # into the QKV LayerNormLinear) and the q / k norms, per head; the pre-MLP norm's is counted with
        # the MoE / dense MLP part below
        attn += 4 * T + (4 * T * (nh + ng) if o.qk_layernorm and not i.multi_latent_attention else 0.0)
    # MoE: its input (residual) + norm output (router and shared-expert input) + router probabilities
    # (fp32) + the routed copies: FC1 input, FC1 output (SwiGLU input), FC2 input, their probabilities.
    # MCore 0.19.2 applies the probabilities in the experts' activation (experts.py permuted_probs), so
    # the unpermute keeps no FC2 output (an index scatter)
    expert_in = k * T * (h + F) * gemm_in
    # unfused SwiGLU: x_linear + glu_linear_offset, silu(x_glu) and their product (the probabilities'
    # multiply input) beside the FC1 output (MCore moe/experts.py bias_act_func, mlp.py glu)
    glu = 2 if o.fused_activation else 5
    rstd = 4 * T if i.transformer_impl == "transformer_engine" else 0.0  # the TE pre-MLP norm's rstdev
    moe = 2 * T * h + (0.0 if "layernorm" in mods else 2 * T * h + rstd) + 4 * T * E * 2 + 4 * k * T \
        + (0.0 if "moe_act" in mods else k * T * glu * F * 2) + expert_in
    shared = i.moe_shared_expert_intermediate_size or 0
    if shared and "shared_experts" not in mods:
        moe += T * (2 * shared * 2 + shared * gemm_in)
    if "moe" in mods:
        moe = 2 * T * h
    Fd = i.ffn_hidden_size or 4 * h
    # dense MLP unfused: x_linear + offset and silu(x_glu) (their product is FC2's input)
    dense = 2 * T * h if "mlp" in mods else 2 * T * h + ln_out + rstd + T * (2 if o.fused_activation else 4) * Fd * 2 \
        + T * Fd * gemm_in
    return {"attn": attn, "moe": moe, "dense": dense, "expert_inputs": expert_in}


CUBLAS_WORKSPACE_HOPPER = 32 * 2 ** 20 + 1024
"""TE 2.18 ``get_cublas_workspace_size_bytes`` (``pytorch/cpp_extensions/gemm.py:35-41``): 32 MiB for NVFP4
GEMMs plus 1 KiB for alignment and scales on compute capability 9.0 and later, 4 MiB before."""
TE_COMPUTE_STREAMS = 4  # TE 2.18 common/util/multi_stream.cpp:52-55 get_num_compute_streams
TE_UB_STREAMS = 3  # TE 2.18 pytorch/cpp_extensions/gemm.py:32 _NUM_MAX_UB_STREAMS


def te_cublas_workspaces(i: StepInputs, cluster: Cluster, o: MemoryOptions) -> float:
    """Bytes of Transformer Engine's cuBLAS workspaces on one GPU: ``get_cublas_workspace`` (TE 2.18
    ``pytorch/cpp_extensions/gemm.py:43-62``, ``lru_cache``d per device, so allocated once and held for
    the whole run through the caching allocator) gives ``general_gemm`` (``te.Linear``,
    ``te.LayerNormLinear``: gemm.py:134) one workspace, the grouped GEMM of ``te.GroupedLinear``
    (gemm.py:310; the grouped-tensor path is off unless ``NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM``)
    one per compute stream, and userbuffers GEMMs ``_NUM_MAX_UB_STREAMS`` in one tensor. 0 for the
    local stack."""
    if i.transformer_impl != "transformer_engine":
        return 0.0
    size = CUBLAS_WORKSPACE_HOPPER if GPU_CATALOG[cluster.gpu].major >= 9 else 4 * 2 ** 20
    count = 1 + (TE_COMPUTE_STREAMS if o.grouped_gemm and i.num_moe_experts else 0) \
        + (TE_UB_STREAMS if o.tp_comm_overlap and i.tp > 1 else 0)
    return size * count


def _flex_buffers(i: StepInputs, cluster: Cluster, o: MemoryOptions) -> float:
    if i.ep <= 1:
        return 0.0
    hidden_bytes = i.hidden_size * 2  # fused_a2a.get_hidden_bytes: max(element size, 2)
    local, domains = ep_layout(i, cluster)
    if i.dispatcher == "deepep":
        channels = max(1, o.deepep_num_sms // 2)
        nvl = channels * local * 256 * hidden_bytes * 1.1  # chunked receive tokens + scales/indices
        rdma = channels * domains * 128 * 2 * hidden_bytes * 1.1 if domains > 1 else 0.0
        return nvl + rdma
    if i.dispatcher == "hybridep":
        ranks = min(domain_size(cluster), i.ep)
        return 2 * ranks * i.tokens_per_gpu * hidden_bytes  # dispatch + combine buffers of every domain rank
    return 0.0


_UNROLL = (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)")  # MCore's PipelineParallelLayerLayout.parse_str_to_list


def layout_chunks(layout: str, pp: int) -> list[list[str]]:
    """``pipeline_model_parallel_layout`` as MCore 0.19.2 reads it: per pipeline rank, its model chunks
    in virtual-stage order, each a string of E (embedding), t (decoder layer), m (MTP), L (loss).
    ``ValueError`` when the stages do not divide by ``pp``."""
    text = layout.replace(",", "")
    for pattern in _UNROLL:
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    stages = text.split("|")
    if len(stages) % pp or any(set(c) - set("EtmL") for c in stages):
        raise ValueError(f"pipeline_model_parallel_layout {layout!r}: {len(stages)} stages for PP {pp}, "
                         "or a character other than E, t, m, L")
    v = len(stages) // pp
    return [[stages[k * pp + r] for k in range(v)] for r in range(pp)]


def _even_chunks(i: StepInputs) -> list[list[tuple[float, float, float]]]:
    """Without a layout: the decoder layers split evenly over the pp x vpp chunks (dense layers first),
    the embedding on the first chunk, MTP on the last: per rank, per chunk (dense, MoE, MTP) layers."""
    pp, v = i.pp, i.vpp or 1
    per = i.num_layers / (pp * v)
    out = [[(0.0, 0.0, 0.0)] * v for _ in range(pp)]
    for c in range(pp * v):
        lo, hi = c * per, (c + 1) * per
        dense = max(0.0, min(hi, i.num_dense_layers) - lo)
        mtp = float(i.mtp_num_layers) if c == pp * v - 1 else 0.0
        out[c % pp][c // pp] = (dense, per - dense, mtp)
    return out


def _chunks(i: StepInputs, layout: str | None) -> list[list[tuple[float, float, float]]]:
    if not layout:
        return _even_chunks(i)
    seen, out = 0, []
    grid = layout_chunks(layout, i.pp)
    order = sorted(((k, r) for r in range(i.pp) for k in range(len(grid[r]))))  # layer order: chunk by chunk
    counts: dict[tuple[int, int], tuple[float, float, float]] = {}
    for k, r in order:
        text = grid[r][k]
        n = text.count("t")
        dense = max(0, min(seen + n, i.num_dense_layers) - seen)
        counts[(r, k)] = (float(dense), float(n - dense), float(text.count("m")))
        seen += n
    for r in range(i.pp):
        out.append([counts[(r, k)] for k in range(len(grid[r]))])
    return out


def _in_flight(i: StepInputs, rank: int, v: int, overlap: bool) -> list[int]:
    """How many microbatches of each model chunk ``rank`` holds at its peak: the 1F1B warm-up's
    forwards plus the first steady-state one (MCore ``schedules.py``: ``(pp - rank - 1) * 2 +
    (vpp - 1) * pp`` warm-up forwards interleaved, ``pp - rank`` without VPP, microbatch groups of
    ``pp`` per chunk); combined 1F1B with VPP warms up one chunk more."""
    pp, m = i.pp, i.num_microbatches
    if pp == 1:
        return [1] * v
    if v == 1:
        return [min(m, pp - rank)]
    total = min(m * v, (pp - rank - 1) * 2 + (v - 1) * pp + 1 + (1 if overlap else 0))
    held = [0] * v
    for f in range(total):
        held[(f // pp) % v] += 1
    return held


def predict_memory(i: StepInputs, cluster: Cluster, o: MemoryOptions) -> MemoryPrediction:
    """The peak per GPU (module docstring); ``ValueError`` for a GPU kind the catalogue lacks."""
    if cluster.gpu not in GPU_CATALOG:
        raise ValueError(f"GPU {cluster.gpu!r}: not in the GPU catalogue (base.gpus)")
    per = _layer(i)
    pp = i.pp
    moe_params = per["attn"] + per["router"] + per["shared"] + per["experts"]
    dense_params = per["attn"] + per["dense_mlp"]
    emb = i.hidden_size * i.vocab_size / i.tp
    dp_dense = i.dp * i.cp
    dp_expert = max(1, i.world_size // (i.ep * i.etp * pp))
    chunks = _chunks(i, o.pipeline_layout)
    v = len(chunks[0])
    a_full, a_rec = _activations(i, o, False), _activations(i, o, True)
    moe_layer = a_full["attn"] + a_full["moe"]
    dense_layer = a_full["attn"] + a_full["dense"]

    def stage(rank: int) -> tuple[dict[str, float], dict[str, float]]:
        first, last = rank == 0, rank == pp - 1
        mine = chunks[rank]
        layers_dense = sum(c[0] for c in mine)
        layers_moe = sum(c[1] for c in mine)
        mtp = sum(c[2] for c in mine)
        params = layers_moe * moe_params + layers_dense * dense_params + mtp * (moe_params + 2 * i.hidden_size ** 2)
        if first:
            params += emb
        if last and not o.tied_embeddings:
            params += emb
        experts = (layers_moe + mtp) * per["experts"]
        dense_part = params - experts
        weights = 2 * params
        grads = (4 if i.grad_reduce_in_fp32 else 2) * params
        if o.megatron_fsdp:  # sharded over the data-parallel groups (dense over DP x CP, experts over expert DP)
            shard = dense_part / dp_dense + experts / dp_expert
            weights, grads = 2 * shard, (4 if i.grad_reduce_in_fp32 else 2) * shard
        b = o.optimizer_state_bytes
        state = b * (dense_part / dp_dense + experts / dp_expert) if o.distributed_optimizer else b * params
        state *= 1 - o.optimizer_offload_fraction
        n_layers = layers_moe + layers_dense + mtp
        rec = 0.0
        if o.recompute_granularity == "full":
            rec = n_layers if o.recompute_method != "block" else min(n_layers, (o.recompute_num_layers or 0) * v)
        rec_share = rec / n_layers if n_layers else 0.0

        def chunk_bytes(c: tuple[float, float, float]) -> float:
            full = c[0] * dense_layer + (c[1] + c[2]) * moe_layer
            return (1 - rec_share) * full + rec_share * sum(c) * a_rec["attn"]

        act_off = sum(n * chunk_bytes(c) for n, c in zip(_in_flight(i, rank, v, False), mine))
        act_on = sum(n * chunk_bytes(c) for n, c in zip(_in_flight(i, rank, v, True), mine))
        per_layer = (layers_dense * dense_layer + (layers_moe + mtp) * moe_layer) / n_layers if n_layers else 0.0
        extra = 0.0
        if i.ep > 1:  # parts_on: as if overlap were on (the caller picks by the config's setting)
            extra = per_layer if not o.early_attn_release else a_full["moe"]
            if o.delay_wgrad:
                extra += a_full["expert_inputs"]
        # the BF16 logits and an FP32 tensor of their shape, held together at the loss, whichever loss:
        # * unfused: MCore's VocabParallelCrossEntropy turns its FP32 copy into the softmax in place
        #   (-= max, exp(out=), div_) and saves it, its backward writing the gradient into it in place;
        # * cross_entropy_fusion_impl "te": TE 2.18 writes the gradient in the forward into an FP32
        #   tensor (triton/cross_entropy.py:58 empty_like(_input, dtype=float32)) and saves it
        #   (cross_entropy.py:62) while the BF16 logits are alive;
        # * "native": MCore 0.19.2's fused_cross_entropy.py saves the FP32 exp_logits of its FP32 copy
        # (read from the code; the CPU count in tests/unit/test_memory_saved.py covers the unfused loss)
        logits = i.tokens_per_gpu * i.vocab_size * (2 + 4) if last else 0.0
        if last and v == 1:
            # combined 1F1B on the stage with the loss: a step runs the backward microbatch's loss and
            # output layer first (model_chunk_schedule_plan.py run(): post_process.backward), which frees
            # its logits, then the layer pairs, then the forward microbatch's loss last
            # (post_process.forward): the extra layer in flight and the logits are never held together
            extra = max(0.0, extra - logits)
        graphs = 0.0
        # full_iteration graphs allocate the activations themselves in their pool (counted above);
        # scoped graphs keep static input / output buffers per graphed layer and microbatch in flight
        if o.cuda_graph_impl not in ("none", "full_iteration"):
            scopes = max(1, len(o.cuda_graph_scope))
            # one microbatch's worth: the graphs of all microbatches share one memory pool, captured in
            # execution order (MCore's TE CUDA-graph helper), so static buffers are reused
            graphs = 2 * i.tokens_per_gpu * i.hidden_size * 2 * scopes * n_layers
        base = {"parameters": weights, "gradients": grads, "optimizer": state, "logits": logits,
                "dispatcher_buffers": _flex_buffers(i, cluster, o), "cuda_graphs": graphs, "workspace": per_layer,
                "cublas_workspaces": te_cublas_workspaces(i, cluster, o)}
        off = {**base, "activations": act_off}
        on = {**base, "activations": act_on + extra}
        return ({k: val / GIB for k, val in off.items()} | {"fixed": FIXED_GIB},
                {k: val / GIB for k, val in on.items()} | {"fixed": FIXED_GIB})

    stages = [stage(r) for r in range(pp)]
    peak = max(range(pp), key=lambda r: sum(stages[r][1].values()))
    off, on = stages[peak]
    name = "first" if peak == 0 else "last" if peak == pp - 1 else f"{peak + 1} of {pp}"
    bad = [k for k, val in {**off, **on}.items() if not math.isfinite(val)]
    if bad:
        raise ValueError(f"memory arithmetic out of range ({', '.join(bad)})")
    capacity = float(GPU_CATALOG[cluster.gpu].memory_gib)
    return MemoryPrediction(gpu=cluster.gpu, capacity_gib=capacity, parts_off=off, parts_on=on, stage=name)
