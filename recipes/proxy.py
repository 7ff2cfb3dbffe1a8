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
"""

from __future__ import annotations

from megatron.bridge import AutoBridge
from megatron.bridge.models.gpt_provider import local_layer_spec
from megatron.bridge.recipes.common import _pretrain_common

from ._fields import set_fields

PROXY_MODEL = "mbridge-ep-overlap/qwen3-moe-proxy"
PROXY_VOCAB = 32768


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


def qwen3_moe_proxy():
    """Small Qwen3-MoE proxy, 2x H200, EP=2, alltoall (default recipe; runs without TE)."""
    return proxy_base()
