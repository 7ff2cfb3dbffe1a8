#!/usr/bin/env python3
"""Test-only fault injector: ``scripts/run_script.py`` with one real failure planted in one rank.

    EP_OVERLAP_FAULT="hang:rank=1,layer=1,step=2,microbatch=1" \\
      torchrun --nproc_per_node 2 tests/functional/fault_injector.py --recipe qwen3_moe_proxy --ep 2 ...

Same flags as ``scripts/run_script.py``; the library never imports this file. ``EP_OVERLAP_FAULT`` is
``KIND:rank=R,layer=K,step=S,microbatch=M[,seconds=T]`` (``parse_fault``): in rank R, at the forward
dispatch or combine of MoE layer K (MCore's ``MoELayer.layer_number``, 1-based) in training
iteration S (1-based, as MB logs it) and microbatch M (0-based), it does

* ``hang``: skips that combine's all-to-all (returns a tensor of the combined shape) - the other
  ranks wait in the collective, the schedules diverge;
* ``stall``: sleeps T seconds (default 600) inside that dispatch - a kernel that never returns;
* ``crash``: reads address 0 inside that dispatch (a real SIGSEGV, as in a kernel library);
* ``timeout``: calls one extra all-reduce on the EP group inside that dispatch, which no other rank
  matches - NCCL's watchdog times it out (give a short ``dist.distributed_timeout_minutes``);
* ``nan``: makes that combine's output NaN (an expert output gone bad);
* ``none``: nothing (the "no gain" case is a configuration: one microbatch per rank).

The hooks wrap ``MoELayer.dispatch`` / ``MoELayer.combine`` - the entry points through which both
MCore's combined-1F1B schedule (``models/gpt/fine_grained_callables.py``) and the plain forward reach
the token dispatcher's ``token_dispatch`` / ``token_combine`` - in this process only. When the fault
fires it writes ``<output-dir>/injected-fault.json`` (what was done, where, in which rank): the truth a
diagnosis of the recorded run is checked against, never read by the library.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ENV = "EP_OVERLAP_FAULT"
KINDS = ("hang", "stall", "crash", "timeout", "nan", "none")
AT_DISPATCH = ("stall", "crash", "timeout")
AT_COMBINE = ("hang", "nan")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int = 1
    layer: int = 1
    step: int = 2
    microbatch: int = 0
    seconds: float = 600.0

    @property
    def where(self) -> str:
        return "dispatch" if self.kind in AT_DISPATCH else "combine"


def parse_fault(text: str) -> Fault:
    """``KIND[:key=value,...]`` -> ``Fault``; ValueError naming what is wrong."""
    kind, _, rest = text.strip().partition(":")
    if kind not in KINDS:
        raise ValueError(f"{ENV}: unknown fault {kind!r}; allowed: {', '.join(KINDS)}")
    values: dict = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in ("rank", "layer", "step", "microbatch", "seconds"):
            raise ValueError(f"{ENV}: bad item {item!r}; allowed: rank=R, layer=K, step=S, microbatch=M, seconds=T")
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", value) or (key != "seconds" and "." in value):
            raise ValueError(f"{ENV}: {key} must be a number >= 0, got {value!r}")
        values[key] = float(value) if key == "seconds" else int(value)
    fault = Fault(kind, **values)
    if fault.layer < 1 or fault.step < 1:
        raise ValueError(f"{ENV}: layer and step are 1-based, got layer={fault.layer}, step={fault.step}")
    return fault


class Injector:
    """Counts each MoE layer's forward dispatch / combine calls in this rank and fires the fault once."""

    def __init__(self, fault: Fault, rank: int, record: Path | None, microbatches) -> None:
        self.fault, self.rank, self.record = fault, rank, record
        self.microbatches = microbatches  # () -> microbatches per step (MCore's calculator)
        self.calls: dict[tuple[int, str], int] = {}
        self.fired = False

    def due(self, layer: int, op: str) -> tuple[int, int] | None:
        """(step, microbatch) of this call; counted, and returned only when the fault fires here."""
        n = self.calls.get((layer, op), 0)
        self.calls[(layer, op)] = n + 1
        if self.fired or self.rank != self.fault.rank or layer != self.fault.layer or op != self.fault.where:
            return None
        m = self.microbatches()
        step, microbatch = n // m + 1, n % m
        if (step, microbatch) != (self.fault.step, self.fault.microbatch):
            return None
        self.fired = True
        return step, microbatch

    def note(self, step: int, microbatch: int, detail: str) -> None:
        what = {**asdict(self.fault), "where": self.fault.where, "phase": "forward", "fired_rank": self.rank,
                "fired_step": step, "fired_microbatch": microbatch, "detail": detail, "time": time.time()}
        print(f"[fault-injector] rank {self.rank}: {self.fault.kind} at the forward {self.fault.where} of MoE layer "
              f"{self.fault.layer}, step {step}, microbatch {microbatch}: {detail}", file=sys.stderr, flush=True)
        if self.record is not None:
            self.record.parent.mkdir(parents=True, exist_ok=True)
            self.record.write_text(json.dumps(what, indent=1) + "\n")


def install(fault: Fault, rank: int, record: Path | None) -> Injector:
    """Wrap ``MoELayer.dispatch`` / ``combine`` in this process (imports Megatron-Core)."""
    import ctypes

    import torch
    from megatron.core.num_microbatches_calculator import get_num_microbatches
    from megatron.core.transformer.moe.moe_layer import MoELayer

    injector = Injector(fault, rank, record, get_num_microbatches)
    dispatch, combine = MoELayer.dispatch, MoELayer.combine

    def injected_dispatch(self, hidden_states, probs):
        at = injector.due(int(self.layer_number), "dispatch")
        if at is not None:
            if fault.kind == "stall":
                injector.note(*at, f"sleeping {fault.seconds:.0f} s inside the dispatch")
                time.sleep(fault.seconds)
            elif fault.kind == "crash":
                injector.note(*at, "reading address 0 (SIGSEGV) inside the dispatch")
                ctypes.string_at(0)
            elif fault.kind == "timeout":
                injector.note(*at, "one all-reduce on the EP group that no other rank calls")
                torch.distributed.all_reduce(torch.ones(1, device=hidden_states.device),
                                             group=self.token_dispatcher.ep_group)
        return dispatch(self, hidden_states, probs)

    def injected_combine(self, output):
        at = injector.due(int(self.layer_number), "combine")
        if at is not None and fault.kind == "hang":
            splits = getattr(self.token_dispatcher, "input_splits", None)
            rows = int(torch.as_tensor(splits).sum().item()) if splits is not None else output.shape[0]
            injector.note(*at, f"skipping the combine all-to-all (returning {rows} rows without communicating)")
            return output.new_zeros((rows, *output.shape[1:]))
        result = combine(self, output)
        if at is not None and fault.kind == "nan":
            injector.note(*at, "the combined expert output set to NaN")
            result = result * float("nan")
        return result

    MoELayer.dispatch, MoELayer.combine = injected_dispatch, injected_combine
    return injector


def output_dir(argv: list[str]) -> Path | None:
    for i, arg in enumerate(argv):
        if arg == "--output-dir" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--output-dir="):
            return Path(arg.split("=", 1)[1])
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        fault = parse_fault(os.environ.get(ENV, "none"))
    except ValueError as e:
        print(f"fault_injector.py: {e}", file=sys.stderr)
        return 2
    from mbridge_ep_overlap.target import shims

    shims.install()
    out = output_dir(argv)
    if fault.kind != "none":
        install(fault, int(os.environ.get("RANK", "0")), out / "injected-fault.json" if out else None)
    from mbridge_ep_overlap.tools.run import main as run_main

    return run_main(argv)


if __name__ == "__main__":
    sys.exit(main())
