"""Run-time evidence that EP overlap really ran: a Megatron-Bridge callback and a step wrapper.

Contract
--------
* ``ScheduleCounter`` wraps the forward-step function given to MB's ``pretrain()`` and counts calls
  made with ``return_schedule_plan=True`` - only MCore's combined-1F1B (overlapped) schedule makes
  them - and wraps MCore's combined-1F1B schedule entry points to count their executions. Flags in
  a config are not proof; these counters are.
* ``RunRecorder`` is an MB ``Callback``: per training step it records loss, grad norm, skipped
  flag and wall time (device-synchronised), and at the end writes one JSON summary (rank 0) with
  the finalized EP-overlap fields, the counters and the peak GPU memory of every rank. With
  ``profile_steps=(a, b)`` it runs the torch profiler (CUDA kernels) from step a to step b and
  adds rank 0's kernel list and its ``trace.analyze`` overlap efficiency to the summary. It also
  records which flex buffers (DeepEP / HybridEP) Megatron-Core allocated (``flex_buffers``).
It changes nothing in the training computation. Importing this module imports Megatron-Bridge:
install the import shims first (``target.shims.install``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

from megatron.bridge.training.callbacks import Callback

from ..target.simulated_finalize import summarize


class ScheduleCounter:
    def __init__(self) -> None:
        self.schedule_plan_calls = 0
        self.combined_schedule_calls: dict[str, int] = {}
        self._patched: list[tuple[Any, str, Any]] = []

    def wrap_forward_step(self, forward_step: Callable) -> Callable:
        @functools.wraps(forward_step)
        def forward_step_counted(state, data_iterator, model, return_schedule_plan: bool = False):
            if return_schedule_plan:
                self.schedule_plan_calls += 1
            return forward_step(state, data_iterator, model, return_schedule_plan=return_schedule_plan)

        return forward_step_counted

    def install(self) -> "ScheduleCounter":
        from megatron.core.pipeline_parallel import schedules

        for name in ("combined_1f1b_schedule_for_no_pipelining", "combined_1f1b_schedule_for_interleaved_pipelining"):
            original = getattr(schedules, name, None)
            if original is None:
                continue
            self.combined_schedule_calls[name] = 0

            def counted(*args, __name=name, __original=original, **kwargs):
                self.combined_schedule_calls[__name] += 1
                return __original(*args, **kwargs)

            setattr(schedules, name, counted)
            self._patched.append((schedules, name, original))
        return self

    def uninstall(self) -> None:
        for module, name, original in self._patched:
            setattr(module, name, original)
        self._patched.clear()


class RunRecorder(Callback):
    def __init__(
        self,
        summary_path: str | os.PathLike | None,
        counter: ScheduleCounter,
        meta: dict | None = None,
        profile_steps: tuple[int, int] | None = None,
    ):
        self.summary_path = Path(summary_path) if summary_path else None
        self.counter = counter
        self.meta = dict(meta or {})
        self.steps: list[dict] = []
        self.profile_steps = profile_steps
        self.profile: dict | None = None
        self._t0 = 0.0
        self._profiler = None
        self._window_t0 = 0.0

    def on_train_step_start(self, context) -> None:
        import torch

        torch.cuda.synchronize()
        if self.profile_steps and len(self.steps) == self.profile_steps[0]:
            self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            self._profiler.__enter__()
            self._window_t0 = time.perf_counter()
        self._t0 = time.perf_counter()

    def on_train_step_end(self, context) -> None:
        import torch

        torch.cuda.synchronize()
        elapsed = time.perf_counter() - self._t0
        loss = None
        if context.loss_dict:
            value = context.loss_dict.get("lm loss", next(iter(context.loss_dict.values())))
            loss = float(value.item() if hasattr(value, "item") else value)
        grad_norm = context.grad_norm
        self.steps.append(
            {
                "iteration": int(context.state.train_state.step),
                "loss": loss,
                "grad_norm": None if grad_norm is None else float(grad_norm),
                "skipped": bool(context.skipped_iter),
                "step_time_s": elapsed,
                "finite": loss is not None and math.isfinite(loss),
            }
        )
        if self._profiler is not None and len(self.steps) == self.profile_steps[1]:
            self._finish_profile(time.perf_counter() - self._window_t0)

    def _finish_profile(self, window_s: float) -> None:
        import tempfile

        import torch.distributed as dist

        from .trace import analyze

        self._profiler.__exit__(None, None, None)
        iterations = self.profile_steps[1] - self.profile_steps[0]
        if dist.get_rank() == 0:
            with tempfile.TemporaryDirectory() as tmp:
                raw = Path(tmp) / "trace.json"
                self._profiler.export_chrome_trace(str(raw))
                events = json.loads(raw.read_text()).get("traceEvents", [])
            kernels = [
                {"name": e["name"], "ts": e["ts"], "dur": e["dur"], "stream": e.get("args", {}).get("stream")}
                for e in events
                if e.get("cat") == "kernel" and "dur" in e
            ]
            self.profile = {
                "steps": list(self.profile_steps),
                "window_s": window_s,
                "overlap_efficiency": analyze(kernels, iterations, window_s).to_dict(),
                "kernel_count": len(kernels),
            }
        self._profiler = None

    def on_train_end(self, context) -> None:
        import torch
        import torch.distributed as dist

        peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30], device="cuda")
        peaks = [torch.zeros_like(peak) for _ in range(dist.get_world_size())]
        dist.all_gather(peaks, peak)
        if dist.get_rank() != 0 or self.summary_path is None:
            return
        summary = {
            **self.meta,
            "finalized": summarize(context.state.cfg),
            "schedule_plan_calls": self.counter.schedule_plan_calls,
            "combined_schedule_calls": dict(self.counter.combined_schedule_calls),
            "world_size": dist.get_world_size(),
            "flex_buffers": flex_buffers(),
            "peak_memory_gib_per_rank": [round(float(p.item()), 3) for p in peaks],
            "profile": self.profile,
            "steps": self.steps,
        }
        self.summary_path.parent.mkdir(parents=True, exist_ok=True)
        self.summary_path.write_text(json.dumps(summary, indent=2))


def flex_buffers() -> dict[str, bool]:
    """Which flex communication buffers Megatron-Core allocated in this process: proof that the
    DeepEP / HybridEP kernels, not NCCL all-to-all, moved the tokens."""
    try:
        from megatron.core.transformer.moe import fused_a2a
    except ImportError:
        return {}
    return {
        "deepep": getattr(fused_a2a, "_buffer", None) is not None,
        "hybridep": getattr(fused_a2a, "_hybrid_ep_buffer", None) is not None,
    }
