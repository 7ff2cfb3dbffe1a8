"""TE fused attention on THD (packed) input: the path the packed proof needs. Prints the backend."""
import os, sys, torch
import transformer_engine, transformer_engine.pytorch as te
print("TE", transformer_engine.__version__, "cudnn(torch)", torch.backends.cudnn.version())
h, d, s = 4, 64, 256
attn = te.DotProductAttention(h, d, qkv_format="thd", attn_mask_type="padding_causal").cuda()
cu = torch.tensor([0, 100, 256], dtype=torch.int32, device="cuda")
q, k, v = (torch.randn(s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
out = attn(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=156, max_seqlen_kv=156)
out.sum().backward()
print("thd attention ok", tuple(out.shape))
