"""One rank of the dispatcher smoke check (``lab.smoke``), run under torchrun:

    python -m torch.distributed.run --nproc_per_node 2 -m mbridge_ep_overlap.lab.smoke_worker --backend hybridep

Contract
--------
Each backend builds what Megatron-Core 0.19.2 builds for it and moves a small, known token set
once: ``alltoall`` a NCCL ``all_to_all_single`` with uneven splits (what MCore's alltoall
dispatcher issues); ``deepep`` the classic ``deep_ep.Buffer`` sized as MCore's ``fused_a2a.get_buffer``
sizes it, ``get_dispatch_layout`` + ``dispatch`` + ``combine``; ``hybridep`` a
``deep_ep.HybridEPBuffer`` constructed as MCore's ``init_hybrid_ep_buffer`` does, then
``dispatch_with_permute`` + ``combine_with_unpermute`` (MCore's HybridEP calls). Every received row
and count is checked against what the routing implies; the combine must give back each token times
its number of copies, exactly (small integers are exact in bf16).

Output, one line each, flushed, on every rank: ``stage: <name>`` before each step (so the last one
names the step a native crash or hang happened in), ``info: <text>``, and at the end exactly one
of ``result: ok`` (exit 0), ``wrong: <stage>: <detail>`` (exit 3), ``error: <stage>: <Type>: <message>``
(exit 4, traceback on stderr) or ``missing: <what>`` (exit 5). faulthandler is enabled, so a
SIGSEGV prints this rank's Python stack on stderr. The ``selftest-*`` backends exercise the harness
without a GPU (gloo): ``ok``, ``segv``, ``hang``, ``wrong``, ``error``.

With ``--run-dir DIR`` (``lab.smoke`` passes the backend's log folder) and the evidence on
(``run_evidence.enabled``), each rank also leaves ``DIR/evidence/`` as a training rank does
(``base.run_files``): the flight-recorder variables set before its process group exists,
faulthandler into ``faulthandler-rank<R>.log`` as well as stderr, and ``facts-rank<R>.json`` (the
backend as dispatcher type and flex backend). No progress watchdog: the check has no iterations,
and its launcher's per-backend timeout ends a hang.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import traceback
import types
from pathlib import Path

from ..base import run_files
from ..base.choices import DEEP_EP_BACKENDS, MEASURED_DISPATCHERS
from ..runtime import run_evidence

BACKENDS = MEASURED_DISPATCHERS
_SELFTESTS = ("selftest-ok", "selftest-segv", "selftest-hang", "selftest-wrong", "selftest-error")
EXIT_WRONG, EXIT_ERROR, EXIT_MISSING = 3, 4, 5

# The token set: every rank routes TOKENS tokens of HIDDEN to TOPK of EXPERTS experts. Shapes as the
# proxy recipe's MoE layer (hidden 1024, 16 experts, top-4); 512 tokens keep the values exact.
HIDDEN, TOKENS, EXPERTS, TOPK = 1024, 512, 16, 4
# cuda.h: CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED (HybridEP's allocator reads it).
_FABRIC_SUPPORTED_ATTRIBUTE = 128


class Wrong(Exception):
    """A result that differs from what the routing implies."""


class _Missing(Exception):
    """The backend's package (or a part of it) is not installed."""


class Ranks:
    def __init__(self) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.stage = "start"

    def step(self, name: str) -> None:
        self.stage = name
        print(f"stage: {name}", flush=True)


def say(kind: str, text: str) -> None:
    print(f"{kind}: {text}", flush=True)


# ---- the known token set ---------------------------------------------------------------------------
def experts_of(rank: int, token: int, num_experts: int = EXPERTS, topk: int = TOPK) -> list[int]:
    """The TOPK distinct experts token ``token`` of rank ``rank`` is routed to (deterministic, so every
    rank knows every rank's routing without communicating)."""
    base = (token * 3 + rank * 5) % num_experts
    return [(base + k) % num_experts for k in range(topk)]


def _token_row(rank: int, token: int) -> tuple[int, int, int]:
    """The first three values of a token's row: who sent it and which token it is (all <= 64)."""
    return rank + 1, token // 64 + 1, token % 64 + 1


def make_tokens(rank: int, tokens: int = TOKENS, hidden: int = HIDDEN):
    import torch

    x = torch.full((tokens, hidden), float(rank + 1), dtype=torch.bfloat16)
    ids = torch.tensor([_token_row(rank, t) for t in range(tokens)], dtype=torch.bfloat16)
    x[:, :3] = ids
    return x


def expected_rows(world: int, experts: range, tokens: int = TOKENS) -> list[tuple[int, int, int]]:
    """Rows (as identity triples) a rank holding ``experts`` receives once per (source token)."""
    rows = []
    for src in range(world):
        for t in range(tokens):
            if any(e in experts for e in experts_of(src, t)):
                rows.append(_token_row(src, t))
    return sorted(rows)


def identities(rows) -> list[tuple[int, int, int]]:
    return sorted(tuple(int(v) for v in row) for row in rows[:, :3].float().cpu().tolist())


def check(condition: bool, detail: str) -> None:
    if not condition:
        raise Wrong(detail)


# ---- backends ----------------------------------------------------------------------------------------
def _init_nccl(r: Ranks):
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA GPU (torch.cuda.is_available() is False)")
    torch.cuda.set_device(r.local_rank)
    r.step("init process group (nccl)")
    dist.init_process_group("nccl", device_id=torch.device("cuda", r.local_rank))
    return dist.group.WORLD


def _run_alltoall(r: Ranks) -> None:
    import torch
    import torch.distributed as dist

    _init_nccl(r)
    # Uneven splits, as MCore's alltoall dispatcher sends: rank r sends (j + r + 1) * 8 values to rank j.
    send_counts = [(j + r.rank + 1) * 8 for j in range(r.world)]
    recv_counts = [(r.rank + i + 1) * 8 for i in range(r.world)]
    send = torch.cat([torch.arange(n, dtype=torch.float32) + 1000 * r.rank + 100 * j
                      for j, n in enumerate(send_counts)]).cuda()
    recv = torch.empty(sum(recv_counts), dtype=torch.float32, device="cuda")
    r.step("all_to_all_single")
    dist.all_to_all_single(recv, send, output_split_sizes=recv_counts, input_split_sizes=send_counts)
    torch.cuda.synchronize()
    r.step("check all_to_all_single")
    expected = torch.cat([torch.arange(n, dtype=torch.float32) + 1000 * i + 100 * r.rank
                          for i, n in enumerate(recv_counts)])
    got = recv.cpu()
    bad = (got != expected).nonzero()
    check(bad.numel() == 0, f"{bad.numel()} of {got.numel()} values differ (first at {bad[0].item() if bad.numel() else -1})")


def _run_deepep(r: Ranks) -> None:
    import torch
    import torch.distributed as dist

    r.step("import deep_ep")
    try:
        from deep_ep import Buffer
    except ImportError as e:
        raise _Missing(f"deep_ep does not import ({e})") from None
    group = _init_nccl(r)
    n = r.world
    local = EXPERTS // n
    x = make_tokens(r.rank).cuda()
    hidden_bytes = x.size(1) * max(x.element_size(), 2)
    r.step("buffer sizing")  # fused_a2a.get_buffer: a DeepEP without NVSHMEM fails here
    nvl_bytes = rdma_bytes = 0
    for config in (Buffer.get_dispatch_config(n), Buffer.get_combine_config(n)):
        nvl_bytes = max(config.get_nvl_buffer_size_hint(hidden_bytes, n), nvl_bytes)
        rdma_bytes = max(config.get_rdma_buffer_size_hint(hidden_bytes, n), rdma_bytes)
    say("info", f"Buffer(num_nvl_bytes={nvl_bytes}, num_rdma_bytes={rdma_bytes}) on {n} ranks")
    r.step("Buffer init")
    buffer = Buffer(group, nvl_bytes, rdma_bytes, explicitly_destroy=True)
    topk_idx = torch.tensor([experts_of(r.rank, t) for t in range(TOKENS)], dtype=torch.int64, device="cuda")
    topk_weights = torch.ones(TOKENS, TOPK, dtype=torch.float32, device="cuda")
    r.step("get_dispatch_layout")
    per_rank, per_rdma_rank, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, EXPERTS)
    want_per_expert = [sum(e in experts_of(r.rank, t) for t in range(TOKENS)) for e in range(EXPERTS)]
    check(per_expert.tolist() == want_per_expert, f"tokens per expert {per_expert.tolist()} != {want_per_expert}")
    r.step("dispatch")
    recv_x, _, _, recv_per_expert, handle, _ = buffer.dispatch(
        x, topk_idx=topk_idx, topk_weights=topk_weights, num_tokens_per_rank=per_rank,
        num_tokens_per_rdma_rank=per_rdma_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
    torch.cuda.synchronize()
    r.step("check dispatch")
    mine = range(r.rank * local, (r.rank + 1) * local)
    want_rows = expected_rows(n, mine)
    check(len(recv_x) == len(want_rows), f"received {len(recv_x)} tokens, expected {len(want_rows)}")
    check(identities(recv_x) == want_rows, "received token rows differ from the ones routed to this rank")
    want_recv = [sum(e in experts_of(s, t) for s in range(n) for t in range(TOKENS)) for e in mine]
    check(list(recv_per_expert) == want_recv, f"received tokens per local expert {list(recv_per_expert)} != {want_recv}")
    r.step("combine")
    combined, _, _ = buffer.combine(recv_x, handle)
    torch.cuda.synchronize()
    r.step("check combine")
    copies = torch.tensor([len({e // local for e in experts_of(r.rank, t)}) for t in range(TOKENS)],
                          dtype=torch.float32).unsqueeze(1)
    want = x.float().cpu() * copies
    got = combined.float().cpu()
    check(torch.equal(got, want), f"combine: max |diff| {(got - want).abs().max().item():g} "
          "(expected each token times the number of ranks it was sent to)")
    r.step("Buffer destroy")
    dist.barrier()
    buffer.destroy()


def _fabric_path(r: Ranks) -> str:
    """Which memory handles HybridEP's allocator will try here (allocator.cu ExtendedMemoryAllocator):
    fabric handles when every visible GPU advertises them and USE_MNNVL is not 0/false, else CUDA IPC.
    Reads device attributes only; allocates nothing."""
    import ctypes

    use_mnnvl = os.environ.get("USE_MNNVL")
    if use_mnnvl is not None and use_mnnvl.strip().lower() in ("0", "false"):
        return f"CUDA IPC handles (USE_MNNVL={use_mnnvl})"
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        count, value = ctypes.c_int(0), ctypes.c_int(0)
        cuda.cuDeviceGetCount(ctypes.byref(count))
        flags = []
        for d in range(count.value):
            rc = cuda.cuDeviceGetAttribute(ctypes.byref(value), _FABRIC_SUPPORTED_ATTRIBUTE, d)
            flags.append(value.value if rc == 0 else None)
    except OSError as e:
        return f"unknown ({e})"
    if flags and all(f == 1 for f in flags):
        return ("fabric handles (cuMemCreate FABRIC; every GPU advertises "
                f"CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED; USE_MNNVL={use_mnnvl or 'unset'})")
    return f"CUDA IPC handles (fabric handles not advertised by every GPU: {flags})"


def run_hybridep(r: Ranks) -> None:
    import torch
    import torch.distributed as dist

    r.step("import deep_ep")
    try:
        import deep_ep
    except ImportError as e:
        raise _Missing(f"deep_ep does not import ({e})") from None
    if not hasattr(deep_ep, "HybridEPBuffer"):
        raise _Missing(f"deep_ep {getattr(deep_ep, '__version__', '')} has no HybridEPBuffer (build its hybrid-ep branch)")
    group = _init_nccl(r)
    n = r.world
    local = EXPERTS // n
    r.step("allocator path")
    say("info", f"HybridEP allocator: {_fabric_path(r)}")
    r.step("HybridEPBuffer init")  # fused_a2a.init_hybrid_ep_buffer
    buffer = deep_ep.HybridEPBuffer(group=group, hidden_dim=HIDDEN, max_num_of_tokens_per_rank=TOKENS,
                                    num_local_experts=local, use_fp8=False)
    torch.cuda.synchronize()
    x = make_tokens(r.rank).cuda()
    routing = torch.zeros(TOKENS, EXPERTS, dtype=torch.bool)
    for t in range(TOKENS):
        routing[t, experts_of(r.rank, t)] = True
    routing = routing.cuda()
    probs = routing.float()
    r.step("dispatch_with_permute")  # fused_a2a.HybridEPDispatch.forward
    hidden, _, _, tokens_per_expert, handle = buffer.dispatch_with_permute(
        hidden=x, routing_map=routing, probs=probs, scaling_factor=None, num_of_experts_per_rank=local,
        pad_multiple=None, num_permuted_tokens=None, non_blocking=False)
    torch.cuda.synchronize()
    r.step("check dispatch")
    counts = [int(c) for c in torch.as_tensor(tokens_per_expert).cpu().tolist()]
    mine = range(r.rank * local, (r.rank + 1) * local)
    want_counts = [sum(e in experts_of(s, t) for s in range(n) for t in range(TOKENS)) for e in mine]
    check(counts == want_counts, f"tokens per local expert {counts} != {want_counts}")
    check(hidden.size(0) >= sum(want_counts), f"{hidden.size(0)} permuted rows < {sum(want_counts)} routed")
    start = 0
    for e, count in zip(mine, want_counts):
        segment = identities(hidden[start:start + count])
        want = sorted(_token_row(s, t) for s in range(n) for t in range(TOKENS) if e in experts_of(s, t))
        check(segment == want, f"rows permuted to expert {e} differ from the tokens routed to it")
        start += count
    r.step("combine_with_unpermute")  # fused_a2a.HybridEPCombine.forward
    combined, _ = buffer.combine_with_unpermute(hidden=hidden, handle=handle, pad_multiple=None)
    torch.cuda.synchronize()
    r.step("check combine")
    want = x.float().cpu() * TOPK
    got = combined.float().cpu()
    check(torch.equal(got, want), f"combine: max |diff| {(got - want).abs().max().item():g} "
          f"(expected each token times its {TOPK} expert copies)")
    r.step("HybridEPBuffer release")
    dist.barrier()
    del buffer


def run_selftest(r: Ranks, what: str) -> None:
    """The harness without a GPU: gloo, and one of the failure kinds on rank 0."""
    import time

    import torch.distributed as dist

    r.step("init process group (gloo)")
    dist.init_process_group("gloo")
    r.step("selftest step")
    if r.rank == 0 and what == "segv":
        import ctypes

        ctypes.string_at(0)  # SIGSEGV: faulthandler prints this rank's stack
    if r.rank == 0 and what == "hang":
        time.sleep(3600)
    if what == "wrong":
        check(False, "selftest: 1 of 4 values differ")
    if what == "error":
        raise RuntimeError("selftest: an exception")
    dist.barrier()


def _start_evidence(run_dir: Path, backend: str) -> None:
    """The evidence of a training rank, less the watchdog (see the module docstring)."""
    import torch  # here, as in every step of this worker: its --help and argument errors stay fast

    rank = int(os.environ.get("RANK", "0"))
    run_evidence.install_flight_recorder(run_dir, torch.__version__)
    run_evidence.enable_faulthandler(run_files.faulthandler_file(run_dir, rank), sys.stderr)
    flex = backend if backend in DEEP_EP_BACKENDS else None
    described = types.SimpleNamespace(model=types.SimpleNamespace(
        moe_token_dispatcher_type="flex" if flex else backend, moe_flex_dispatcher_backend=flex))
    run_evidence.write_facts(run_dir, rank, run_evidence.facts(described))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="smoke_worker", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", required=True, choices=BACKENDS + _SELFTESTS)
    ap.add_argument("--run-dir", default=None, help="leave the rank's evidence under RUN_DIR/evidence/")
    args = ap.parse_args(argv)
    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)
    if args.run_dir and run_evidence.enabled():
        _start_evidence(Path(args.run_dir), args.backend)
    r = Ranks()
    say("info", f"rank {r.rank} of {r.world}, backend {args.backend}, pid {os.getpid()}")
    try:
        if args.backend.startswith("selftest-"):
            run_selftest(r, args.backend.removeprefix("selftest-"))
        else:
            {"alltoall": _run_alltoall, "deepep": _run_deepep, "hybridep": run_hybridep}[args.backend](r)
    except _Missing as e:
        say("missing", str(e))
        return EXIT_MISSING
    except Wrong as e:
        say("wrong", f"{r.stage}: {e}")
        return EXIT_WRONG
    except Exception as e:  # noqa: BLE001 - every failure becomes one verdict line
        traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        say("error", f"{r.stage}: {type(e).__name__}: {first}")
        return EXIT_ERROR
    say("result", "ok")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a communication library's destructors must not turn a verdict into a hang.
    os._exit(code)
