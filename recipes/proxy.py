"""A small Qwen3-MoE-shaped proxy that trains on 2 GPUs with EP=2 (functional tests, benchmarks).

Built through Megatron-Bridge's real ``AutoBridge`` conversion of a shipped Qwen3-MoE
``config.json`` (4 layers, hidden 1024, 16 experts, top-4), so the provider is exactly what MB
builds for Qwen3-MoE, only smaller. 16 experts leave room for EP = 2, 4, 8 and 16.

Changes relative to MB's ``_pretrain_common()`` and why:
* local (non-TE) layer spec and every TE-only fusion off: runs where Transformer Engine is absent;
* NullTokenizer + mock data, seq 1024: no tokenizer or dataset download;
* GBS 16 / MBS 2 on 2 GPUs (DP=2): 4 microbatches per step, enough for combined-1F1B to overlap;
* plain Adam path (no precision-aware optimizer): TE's FusedAdam is not required;
* no checkpoint writes, no evaluation, log every iteration: short functional runs.

``qwen3_moe_proxy_te`` is the same proxy (shape, data, optimizer, sizes, seed) on Transformer Engine
layers, set up the way Megatron-Bridge 0.6.2's own Qwen3-MoE recipes are (``recipes/qwen/h100/
qwen3_moe.py``: ``qwen3_30b_a3b_pretrain_*`` keep the provider's ``default_layer_spec``, i.e.
``transformer_engine_layer_spec`` -> MCore's ``get_gpt_layer_with_transformer_engine_spec``), so the
two stacks' losses compare and each stack's overlap variants compare with its own overlap-off run.
"""

from __future__ import annotations

from megatron.bridge import AutoBridge
from megatron.bridge.models.gpt_provider import local_layer_spec
from megatron.bridge.recipes.common import _pretrain_common

from mbridge_ep_overlap.target.offline import builds_offline

from ._fields import set_fields

PROXY_MODEL = "mbridge-ep-overlap/qwen3-moe-proxy"
PROXY_VOCAB = 32768


@builds_offline
def proxy_base(seq_length: int = 1024, global_batch_size: int = 16, micro_batch_size: int = 2):
    cfg = _pretrain_common()
    cfg.model = AutoBridge.from_hf_pretrained(PROXY_MODEL).to_megatron_provider(load_weights=False)
    set_fields(
        cfg.model,
        transformer_layer_spec=local_layer_spec, transformer_impl="local",
        # every TE-only fusion off: runs where Transformer Engine is absent
        apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
        cross_entropy_loss_fusion=False, moe_permute_fusion=False, moe_router_fusion=False,
        masked_softmax_fusion=False,
        moe_grouped_gemm=True, moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_backend=None,
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-3,
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
        expert_model_parallel_size=2, expert_tensor_parallel_size=1, sequence_parallel=False,
        seq_length=seq_length, vocab_size=PROXY_VOCAB,
    )
    set_fields(cfg.tokenizer, tokenizer_type="NullTokenizer", tokenizer_model=None, vocab_size=PROXY_VOCAB)
    set_fields(cfg.dataset, seq_length=seq_length, num_workers=1)
    set_fields(cfg.train, train_iters=20, global_batch_size=global_batch_size, micro_batch_size=micro_batch_size,
               manual_gc=False)
    set_fields(cfg.validation, eval_interval=None, eval_iters=0)
    cfg.scheduler.lr_warmup_iters = 2
    cfg.optimizer.use_precision_aware_optimizer = False
    set_fields(cfg.checkpoint, save=None, load=None, save_interval=None)
    set_fields(cfg.logger, log_interval=1, tensorboard_dir=None)
    return cfg


@builds_offline
def qwen3_moe_proxy():
    """Small Qwen3-MoE proxy, 2x H200, EP=2, alltoall (default recipe; runs without TE)."""
    return proxy_base()


@builds_offline
def qwen3_moe_proxy_te():
    """The proxy on Transformer Engine layers (TE attention, grouped-GEMM experts, fusions); needs TE.

    Changes relative to ``qwen3_moe_proxy``, each as MB 0.6.2's Qwen3-MoE H100 recipes set it:
    * ``transformer_impl="transformer_engine"`` and MB's ``default_layer_spec`` (TE linear layers
      with fused layer norm, TE attention, ``TEGroupedMLP`` experts: ``moe_grouped_gemm=True``);
    * the TE fusions Transformer Engine 2.18 has on H100/H200: ``apply_rope_fusion``,
      ``moe_permute_fusion``, ``moe_router_fusion`` (TE >= 2.7), ``cross_entropy_loss_fusion`` with
      ``cross_entropy_fusion_impl="te"``, and ``bias_activation_fusion`` (MCore's fused SwiGLU).
    ``gradient_accumulation_fusion`` is the one fusion MB's recipes set that stays off: MCore's
    non-TE linear layers need APEX's ``fused_weight_gradient_mlp_cuda`` for it (rule
    grad-accum-fusion-needs-apex), and the GPU node this proxy is proven on has no APEX.
    ``persist_layer_norm`` stays off: MB's Qwen3 bridge does not set it and it selects Apex's
    persistent LayerNorm kernel, which TE layers (their norms are TE's) never use. Everything else -
    shape, mock data, tokenizer, optimizer (plain Adam, no precision-aware optimizer), batch sizes,
    schedule, seed - is the local proxy's.
    """
    from megatron.bridge.models.gpt_provider import default_layer_spec

    cfg = proxy_base()
    set_fields(
        cfg.model,
        transformer_layer_spec=default_layer_spec, transformer_impl="transformer_engine", moe_grouped_gemm=True,
        apply_rope_fusion=True, moe_permute_fusion=True, moe_router_fusion=True, gradient_accumulation_fusion=False,
        cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te", bias_activation_fusion=True,
        masked_softmax_fusion=True,
    )
    return cfg
