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

from mbridge_ep_overlap.recipe import with_ep_overlap

PROXY_MODEL = "mbridge-ep-overlap/qwen3-moe-proxy"
PROXY_VOCAB = 32768


def proxy_base(seq_length: int = 1024, global_batch_size: int = 16, micro_batch_size: int = 2):
    cfg = _pretrain_common()
    cfg.model = AutoBridge.from_hf_pretrained(PROXY_MODEL).to_megatron_provider(load_weights=False)
    m = cfg.model
    m.transformer_layer_spec = local_layer_spec
    m.transformer_impl = "local"
    for name in (
        "apply_rope_fusion",
        "gradient_accumulation_fusion",
        "persist_layer_norm",
        "cross_entropy_loss_fusion",
        "moe_permute_fusion",
        "moe_router_fusion",
        "masked_softmax_fusion",
    ):
        setattr(m, name, False)
    m.moe_grouped_gemm = True
    m.moe_token_dispatcher_type = "alltoall"
    m.moe_flex_dispatcher_backend = None
    m.moe_router_load_balancing_type = "aux_loss"
    m.moe_aux_loss_coeff = 1e-3
    m.tensor_model_parallel_size = 1
    m.pipeline_model_parallel_size = 1
    m.context_parallel_size = 1
    m.expert_model_parallel_size = 2
    m.expert_tensor_parallel_size = 1
    m.sequence_parallel = False
    m.seq_length = seq_length
    m.vocab_size = PROXY_VOCAB
    cfg.tokenizer.tokenizer_type = "NullTokenizer"
    cfg.tokenizer.tokenizer_model = None
    cfg.tokenizer.vocab_size = PROXY_VOCAB
    cfg.dataset.seq_length = seq_length
    cfg.dataset.num_workers = 1
    cfg.train.train_iters = 20
    cfg.train.global_batch_size = global_batch_size
    cfg.train.micro_batch_size = micro_batch_size
    cfg.train.manual_gc = False
    cfg.validation.eval_interval = None
    cfg.validation.eval_iters = 0
    cfg.scheduler.lr_warmup_iters = 2
    cfg.optimizer.use_precision_aware_optimizer = False
    cfg.checkpoint.save = None
    cfg.checkpoint.load = None
    cfg.checkpoint.save_interval = None
    cfg.logger.log_interval = 1
    cfg.logger.tensorboard_dir = None
    return cfg


@with_ep_overlap(name="qwen3_moe_proxy", gpu="h200", num_gpus=2, dispatcher="alltoall")
def qwen3_moe_proxy():
    """Small Qwen3-MoE proxy, 2x H200, EP=2, alltoall (default recipe; runs without TE)."""
    return proxy_base()
