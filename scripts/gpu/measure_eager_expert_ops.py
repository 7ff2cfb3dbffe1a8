"""Time the eager expert-MLP operations GPT-OSS's unfused path runs, on one GPU:
    python3 scripts/gpu/measure_eager_expert_ops.py OUT.json

Contract: runs the exact expressions of megatron-core 0.19.2 (copied, torch only, no TE needed):
the clamped GeGLU's clamps and cat before the fused kernel (``fusions/fused_bias_geglu.py:424-432``)
and ``TEGroupedMLP._apply_bias`` (``transformer/moe/experts.py:313-330``: a per-expert ``t + b * p``
and a ``cat``), at GPT-OSS-120B shapes (hidden 2880, expert FFN 2880, top-4, 4096 tokens per GPU
and microbatch -> 16384 routed rows) with the local experts of EP 64 / 16 / 8 (2 / 8 / 16) and the
probabilities in FP32 (flex dispatchers) and BF16 (alltoall). Per case: the forward and the
forward + backward, CUDA events around one call issued on an idle GPU (median of 20 after 5
warm-ups: what runs after a host sync), and the mean per call of 20 calls issued back to back (the
queue never drains unless the host is slower); plus the HBM copy rate of a 1 GiB clone. Writes JSON;
refuses to run without CUDA.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

ROWS, HIDDEN, FFN, CLAMP = 16384, 2880, 2880, 7.0


def clamp_chain(x: torch.Tensor) -> torch.Tensor:
    x_glu, x_linear = x.chunk(2, -1)  # fused_bias_geglu.py:424-432, verbatim
    return torch.cat((x_glu.clamp(min=None, max=CLAMP), x_linear.clamp(min=-CLAMP, max=CLAMP)), -1)


def apply_bias(out: torch.Tensor, biases: list[torch.Tensor], tokens: list[int], probs: torch.Tensor) -> torch.Tensor:
    shape = out.shape  # experts.py:318-330, verbatim
    return torch.cat([t + b * p for t, b, p in zip(torch.split(out.view(-1, shape[-1]), tokens), biases,
                                                   torch.split(probs, tokens))]).view(shape).to(out.dtype)


def timed(fn, reps: int = 20, warm: int = 5) -> dict[str, float]:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    idle = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        idle.append(a.elapsed_time(b) / 1e3)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - t0) / reps
    torch.cuda.synchronize()
    queued = (time.perf_counter() - t0) / reps
    return {"idle_gpu_s": statistics.median(idle), "queued_s": queued, "host_issue_s": host}


def copy_row(dev: torch.device) -> dict:
    big = torch.empty(1 << 29, dtype=torch.bfloat16, device=dev)  # 1 GiB, read and written by a clone
    return {"case": "clone 1 GiB", "bytes": 2 * big.numel() * 2, **timed(lambda: big.clone())}


def clamp_rows(dev: torch.device) -> list[dict]:
    x = torch.randn(ROWS, 2 * FFN, dtype=torch.bfloat16, device=dev, requires_grad=True)
    g = torch.randn(ROWS, 2 * FFN, dtype=torch.bfloat16, device=dev)
    return [{"case": "clamp chain forward", "elements": ROWS * FFN, **timed(lambda: clamp_chain(x))},
            {"case": "clamp chain forward+backward", "elements": ROWS * FFN,
             **timed(lambda: torch.autograd.grad(clamp_chain(x), (x,), g))}]


def bias_rows(dev: torch.device, experts: int, pdt: torch.dtype) -> list[dict]:
    tokens = [ROWS // experts] * experts
    out = torch.randn(ROWS, HIDDEN, dtype=torch.bfloat16, device=dev, requires_grad=True)
    biases = [torch.randn(HIDDEN, dtype=torch.bfloat16, device=dev, requires_grad=True) for _ in range(experts)]
    probs = torch.rand(ROWS, 1, dtype=pdt, device=dev, requires_grad=True)
    g = torch.randn(ROWS, HIDDEN, dtype=torch.bfloat16, device=dev)
    name = f"fc2 bias, {experts} experts, probs {str(pdt).split('.')[-1]}"
    return [{"case": name + " forward", "elements": ROWS * HIDDEN, **timed(lambda: apply_bias(out, biases, tokens, probs))},
            {"case": name + " forward+backward", "elements": ROWS * HIDDEN,
             **timed(lambda: torch.autograd.grad(apply_bias(out, biases, tokens, probs), (out, *biases, probs), g))}]


def main(path: str) -> int:
    if not torch.cuda.is_available():
        print("measure_eager_expert_ops.py: no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    rows = [copy_row(dev), *clamp_rows(dev)]
    for experts in (2, 8, 16):
        for pdt in (torch.float32, torch.bfloat16):
            rows += bias_rows(dev, experts, pdt)
    result = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "rows": rows}
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    for r in rows:
        print(f"{r['case']:52s} idle {r['idle_gpu_s'] * 1e3:8.3f} ms  queued {r['queued_s'] * 1e3:8.3f} ms  "
              f"host {r['host_issue_s'] * 1e3:8.3f} ms")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python3 scripts/gpu/measure_eager_expert_ops.py OUT.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
