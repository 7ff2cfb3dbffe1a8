#!/usr/bin/env python3
"""What the run evidence costs a training step, measured piece by piece on the CPU.

    python scripts/bench_evidence_cost.py [--step-s S] [--moe-calls-per-step N] [--collectives-per-step N]

A step-time A/B of the same run with the evidence on and off (``tests/functional/record_failures.py
--only overhead``) on ranks that share one GPU cannot resolve a cost below its run-to-run noise. This
times each piece the evidence adds, where it runs, and prints the bound it gives on a step:

* the MoE position tracking (``runtime.rank_evidence.MoEPosition``): a wrapper around every forward
  ``MoELayer.dispatch`` / ``combine`` - timed on a stand-in layer class, wrapped and unwrapped;
* the watchdog's per-iteration call (``ProgressWatchdog.progress``, its native backup re-armed);
* the flight recorder's record of one collective: the same ``all_reduce`` on a one-rank gloo group
  with ``TORCH_FR_BUFFER_SIZE`` set and unset, each in a fresh process (torch's recorder records
  gloo's collectives too - the entries recorded are printed as the proof it was on; the NCCL path
  records on the host the same way and adds no work on the GPU);
* ``faulthandler`` and the facts cost nothing per step (installed once, written at start).

Prints JSON on stdout: per-piece microseconds per call and the step share for the given step time
and call counts (defaults: the ``qwen3_moe_proxy`` recording of 2026-12-02 on 1x H200: 0.78 s
median step; 4 MoE layers x 4 microbatches x a dispatch and a combine; the expert group's all-to-all
sequence number reached 193 at the start of step 3 in that run's flight-recorder dump, so about 100
collectives per step per rank).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def _per_call_us(fn, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t)
    return 1e6 * best / n


def position_cost(n: int = 200_000) -> float:
    from mbridge_ep_overlap.runtime.rank_evidence import MoEPosition

    class Layer:
        layer_number = 1

        def dispatch(self, hidden_states, probs):
            return hidden_states

        def combine(self, output):
            return output

    layer = Layer()
    bare = _per_call_us(lambda: layer.dispatch(1, 2), n)
    position = MoEPosition().install(Layer)
    wrapped = _per_call_us(lambda: layer.dispatch(1, 2), n)
    position.uninstall()
    return max(0.0, wrapped - bare)


def watchdog_cost(n: int = 2_000) -> float:
    from mbridge_ep_overlap.runtime.watchdog import ProgressWatchdog

    with tempfile.TemporaryDirectory() as tmp:
        dog = ProgressWatchdog(0, Path(tmp) / "fh.log", Path(tmp) / "events.jsonl", native_backup=True)
        counter = iter(range(10 ** 9))
        return _per_call_us(lambda: dog.progress(next(counter)), n)


_GLOO = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % int(sys.argv[1]), rank=0, world_size=1)
x = torch.ones(8)
for _ in range(500):
    dist.all_reduce(x)
best = 1e9
for _ in range(5):
    t = time.perf_counter()
    for _ in range(4000):
        dist.all_reduce(x)
    best = min(best, time.perf_counter() - t)
import pickle
from torch._C import _distributed_c10d as c10d
dump = getattr(c10d, "_dump_fr_trace", None)
entries = len(pickle.loads(dump()).get("entries", [])) if dump and os.environ.get("TORCH_FR_BUFFER_SIZE") else 0
print(1e6 * best / 4000, entries)
dist.destroy_process_group()
"""


def flight_recorder_cost(port: int = 29731) -> tuple[float, float, int]:
    """(added microseconds per collective, microseconds of the bare collective, entries recorded)."""

    def run(fr: bool, p: int) -> tuple[float, int]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_TRACE"))}
        if fr:
            env["TORCH_FR_BUFFER_SIZE"] = "2000"
        out = subprocess.run([sys.executable, "-c", _GLOO, str(p)], env=env, capture_output=True, text=True,
                             timeout=300, check=True)
        us, entries = out.stdout.strip().splitlines()[-1].split()
        return float(us), int(entries)

    ons, offs = [], []
    for i in range(3):  # alternating, the fastest of each: a loaded machine only adds time
        ons.append(run(True, port + 2 * i))
        offs.append(run(False, port + 2 * i + 1))
    on, entries = min(ons)
    off = min(offs)[0]
    return max(0.0, on - off), off, entries


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_evidence_cost.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--step-s", type=float, default=0.78)
    p.add_argument("--moe-calls-per-step", type=int, default=32)
    p.add_argument("--collectives-per-step", type=int, default=100)
    a = p.parse_args(argv)
    with contextlib.redirect_stdout(sys.stderr):  # Megatron's import-time INFO lines: diagnostics
        from mbridge_ep_overlap.target import shims  # MB's imports without TE, as every entry point

        shims.install()
        fr_added, fr_bare, fr_entries = flight_recorder_cost()
        pieces = {"moe_position_us_per_call": position_cost(), "watchdog_us_per_step": watchdog_cost(),
                  "flight_recorder_us_per_collective": fr_added}
    per_step_us = (pieces["moe_position_us_per_call"] * a.moe_calls_per_step + pieces["watchdog_us_per_step"]
                   + pieces["flight_recorder_us_per_collective"] * a.collectives_per_step)
    out = {**{k: round(v, 3) for k, v in pieces.items()}, "step_s": a.step_s,
           "moe_calls_per_step": a.moe_calls_per_step, "collectives_per_step": a.collectives_per_step,
           "gloo_all_reduce_us": round(fr_bare, 3), "flight_recorder_entries_recorded": fr_entries,
           "per_step_us": round(per_step_us, 1), "share_of_step_percent": round(1e-4 * per_step_us / a.step_s, 4)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
