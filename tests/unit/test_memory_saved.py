"""What Megatron-Core 0.19.2 really saves for backward in one local-stack MoE layer, against the memory
model (``predict.memory``): the proxy recipe's layer (local spec, GQA, qk-layernorm, unfused SwiGLU,
top-4 of 16 experts) built from the real MCore modules on CPU, one forward under
``torch.autograd.graph.saved_tensors_hooks``, every saved storage counted once.

CPU stand-ins, each where the CPU path differs from the GPU one: ``torch.nn.functional.rms_norm``
saves what ``aten::_fused_rms_norm`` saves on CUDA (input, weight, rstd: derivatives.yaml; on CPU the
op is decomposed and saves FP32 intermediates), the CUDA RNG tracker's fork is a no-op (dropout 0),
``torch.cuda.current_device`` is the CPU, and the all-gather dispatcher stands in for all-to-all (whose
constructor makes a CUDA stream): with EP 1 both hand the experts the same k x T permuted tokens.
"""

from __future__ import annotations

import contextlib
import copy

import pytest

torch = pytest.importorskip("torch")


class _CudaRmsNorm(torch.autograd.Function):
    """RMSNorm saving what the CUDA kernel saves: input, weight, rstd."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.eps = eps
        return (x.float() * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, _ = ctx.saved_tensors
        with torch.enable_grad():
            xx, ww = x.detach().requires_grad_(), weight.detach().requires_grad_()
            y = (xx.float() * torch.rsqrt(xx.float().pow(2).mean(-1, keepdim=True) + ctx.eps)).to(x.dtype) * ww
            gx, gw = torch.autograd.grad(y, (xx, ww), grad)
        return gx, gw, None


@pytest.fixture
def local_layer_saved(proxy_cfg, tmp_path, monkeypatch):
    """(config, {module name: bytes saved}) of one forward of the proxy's one-layer local model."""
    import torch.distributed as dist
    import torch.nn.functional as functional
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as tp_random

    cfg = copy.deepcopy(proxy_cfg)
    p = cfg.model
    p.num_layers, p.use_cpu_initialization, p.moe_token_dispatcher_type = 1, True, "allgather"
    p.params_dtype, p.bf16 = torch.bfloat16, True
    p.finalize()  # what MB does before provide(): init methods, derived sizes
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(tp_random.CudaRNGStatesTracker, "fork", lambda self, *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(functional, "rms_norm", lambda x, shape, weight=None, eps=None: _CudaRmsNorm.apply(x, weight, eps or 1e-6))
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(1, 1)
        torch.manual_seed(0)
        model = p.provide(pre_process=True, post_process=True).bfloat16().train()
        params = {w.untyped_storage().data_ptr() for w in model.parameters()}
        names: list[str] = []
        for name, module in model.named_modules():
            module.register_forward_pre_hook(lambda m, a, n=name: names.append(n) and None)
            module.register_forward_hook(lambda m, a, o: names.pop() and None)
        saved: dict[int, tuple[str, int]] = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in params and storage.data_ptr() not in saved:
                saved[storage.data_ptr()] = (names[-1] if names else "", storage.nbytes())
            return t

        b, s = cfg.train.micro_batch_size, p.seq_length
        tokens = torch.randint(0, p.vocab_size, (b, s))
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)[None, None]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(tokens, torch.arange(s).expand(b, -1), mask, labels=torch.randint(0, p.vocab_size, (b, s)))
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
    by_module: dict[str, int] = {}
    for name, nbytes in saved.values():
        by_module[name] = by_module.get(name, 0) + nbytes
    return cfg, by_module


def test_local_attention_keeps_one_score_tensor_and_the_expanded_kv(local_layer_saved):
    cfg, saved = local_layer_saved
    p = cfg.model
    b, s, nh, kv = cfg.train.micro_batch_size, p.seq_length, p.num_attention_heads, p.kv_channels
    softmax = saved["decoder.layers.0.self_attention.core_attention.scale_mask_softmax"]
    # the BF16 softmax output plus masked_fill's boolean [s, s] mask: no raw scores
    assert softmax == b * nh * s * s * 2 + s * s
    # q and k (baddbmm) and v (bmm), k and v repeat-interleaved to every query head
    assert saved["decoder.layers.0.self_attention.core_attention"] == 3 * b * s * nh * kv * 2


def test_one_local_layer_saves_what_the_memory_model_counts(local_layer_saved):
    from mbridge_ep_overlap.predict import Cluster
    from mbridge_ep_overlap.core.prediction_inputs import from_config, memory_options
    from mbridge_ep_overlap.predict.memory import GIB, predict_memory

    cfg, saved = local_layer_saved
    cfg.model.expert_model_parallel_size = 1
    layer = sum(v for k, v in saved.items() if k.startswith("decoder.layers.0."))
    options = memory_options(cfg)
    assert (options.fused_activation, options.qk_layernorm, options.grouped_gemm) == (False, True, True)
    m = predict_memory(from_config(cfg, 1), Cluster(gpu="h200", num_gpus=1), options)
    predicted = m.parts_off["activations"] * GIB  # PP 1: one microbatch of the one layer
    assert predicted == pytest.approx(layer, rel=0.03), (predicted / 2**20, layer / 2**20, saved)
