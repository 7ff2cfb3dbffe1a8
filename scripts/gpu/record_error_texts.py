"""Trigger, for real, the error texts CUDA, ATen, NCCL and torchrun print, and keep them verbatim.

Contract: ``python scripts/gpu/record_error_texts.py OUT_DIR`` on a GPU node (``source scripts/gpu/env.sh``
first) runs each case below in a child process of its own (a device-side assert poisons the CUDA context of
the process it happens in) and writes ``OUT_DIR/<case>.txt`` with the child's stdout and stderr as printed,
plus ``OUT_DIR/cases.json`` (case -> command, exit code). Nothing is reworded or trimmed; the unit tests keep
pruned copies as the text the diagnose readers are checked against (``tests/unit/fixtures/recorded_texts``).

Cases: ATen's device-side asserts (an embedding lookup past the table, a cross-entropy target past the
classes, a gather / scatter-add index past the dimension), an illegal memory access (a Triton kernel that
stores far past its buffer), and, with two ranks sharing the GPU over NCCL's socket transport
(``lab.shared_gpu``): a rank that exits in the middle of the run, NCCL creating its buffers on a full GPU,
and a rank killed by SIGKILL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

_CHILD = {
    "embedding_index_out_of_range": """
        import torch
        table = torch.nn.Embedding(1000, 64).cuda()
        ids = torch.tensor([[3, 999, 1000, 1500]], device="cuda")
        out = table(ids)
        torch.cuda.synchronize()
    """,
    "cross_entropy_target_out_of_range": """
        import torch
        logits = torch.randn(8, 1000, device="cuda")
        target = torch.tensor([0, 1, 2, 3, 4, 5, 6, 1024], device="cuda")
        loss = torch.nn.functional.cross_entropy(logits, target)
        print(loss.item())
    """,
    "gather_index_out_of_range": """
        import torch
        probs = torch.randn(16, 8, device="cuda")
        idx = torch.full((16, 2), 8, device="cuda")
        out = torch.gather(probs, 1, idx)
        torch.cuda.synchronize()
    """,
    "scatter_add_index_out_of_range": """
        import torch
        out = torch.zeros(16, 32, device="cuda")
        src = torch.ones(4, 32, device="cuda")
        idx = torch.full((4, 32), 16, device="cuda")
        out.scatter_add_(0, idx, src)
        torch.cuda.synchronize()
    """,
    "illegal_memory_access": """
        import torch, triton, triton.language as tl

        @triton.jit
        def far_store(ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(ptr + offs + (1 << 36), tl.zeros([BLOCK], dtype=tl.float32))

        buf = torch.empty(1024, device="cuda")
        far_store[(1,)](buf, 1024, BLOCK=128)
        torch.cuda.synchronize()
    """,
}

_RANKS = {
    # Two ranks, NCCL over sockets; rank 1 leaves after the first all-reduce, rank 0 waits in the second.
    "nccl_peer_exited": """
        import os, time, datetime, torch, torch.distributed as dist
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60))
        rank = dist.get_rank()
        torch.cuda.set_device(0)
        x = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        if rank == 1:
            os._exit(3)
        time.sleep(2)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        print("rank", rank, "finished")
    """,
    # Two ranks; rank 0 fills the GPU before the first collective creates NCCL's buffers.
    "nccl_out_of_memory": """
        import datetime, torch, torch.distributed as dist
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60))
        rank = dist.get_rank()
        torch.cuda.set_device(0)
        x = torch.ones(1 << 20, device="cuda")
        hold = []
        if rank == 0:
            free, _ = torch.cuda.mem_get_info()
            while free > (16 << 20):
                try:
                    hold.append(torch.empty(max(free - (8 << 20), 1 << 20) // 2, dtype=torch.uint8, device="cuda"))
                except torch.OutOfMemoryError:
                    break
                free, _ = torch.cuda.mem_get_info()
        dist.barrier()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        print("rank", rank, "finished")
    """,
    # Two ranks; rank 1 is killed by SIGKILL (what the kernel's OOM killer or a scheduler sends).
    "rank_sigkilled": """
        import os, signal, time, datetime, torch, torch.distributed as dist
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60))
        rank = dist.get_rank()
        torch.cuda.set_device(0)
        x = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(2)
        dist.all_reduce(x)
        torch.cuda.synchronize()
    """,
}


def _run(cmd: list[str], env: dict, timeout: int) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, text=True)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n[record_error_texts: killed after {timeout} s]\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: record_error_texts.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    cases: dict[str, dict] = {}
    for name, body in _CHILD.items():
        script = out / f"{name}.py"
        script.write_text(textwrap.dedent(body))
        cmd = [sys.executable, str(script)]
        rc, text = _run(cmd, env, 180)
        (out / f"{name}.txt").write_text(text)
        cases[name] = {"command": " ".join(cmd), "exit": rc}
        print(f"{name}: exit {rc}", flush=True)
    for name, body in _RANKS.items():
        script = out / f"{name}.py"
        script.write_text(textwrap.dedent(body))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531",
               "--module", "mbridge_ep_overlap.lab.shared_gpu", str(script)]
        rank_env = {**env, "NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
        rc, text = _run(cmd, rank_env, 240)
        (out / f"{name}.txt").write_text(text)
        cases[name] = {"command": " ".join(cmd), "exit": rc, "env": {"NCCL_DEBUG": "WARN"}}
        print(f"{name}: exit {rc}", flush=True)
    (out / "cases.json").write_text(json.dumps(cases, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
