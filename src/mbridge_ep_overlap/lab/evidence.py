"""Run-time evidence that EP overlap really ran: a Megatron-Bridge callback and a step wrapper.

Contract
--------
* ``ScheduleCounter`` wraps the forward-step function given to MB's ``pretrain()`` and counts calls
  made with ``return_schedule_plan=True`` - only MCore's combined-1F1B (overlapped) schedule makes
  them - and wraps MCore's combined-1F1B schedule entry points to count their executions. Flags in
  a config are not proof; these counters are.
* ``WgradCounter`` (``ScheduleCounter.wgrad``) is the same for delayed weight gradients: it counts
  MCore's ``TransformerLayerNode.backward_dw`` calls (what the combined-1F1B schedule calls per layer
  slot, ``models/common/model_chunk_schedule_plan.py``) and those made with ``delay_wgrad_compute``
  on, and Transformer Engine's deferred weight-gradient GEMMs (``WeightGradStore.put`` / ``pop``:
  queued in the backward, executed by ``backward_dw``). With ``probe_wgrad`` (or
  ``EP_OVERLAP_WGRAD_PROBE=1``) it also checks, around each delayed ``backward_dw``, whether the
  weight gradients of the slot's modules changed (device-synchronised; timing runs leave it off):
  that is what tells real deferred work from a no-op (local layers compute their weight gradients
  in the normal backward and their ``backward_dw`` does nothing).
* ``RunRecorder`` is an MB ``Callback``: per training step it records loss, grad norm, skipped
  flag and wall time (device-synchronised), and at the end writes one JSON summary (rank 0) with
  the finalized EP-overlap fields, the counters and the peak GPU memory of every rank. With
  ``profile_steps=(a, b)`` it runs the torch profiler (CUDA kernels) from step a to step b and
  adds rank 0's kernel list and its ``trace.analyze`` overlap efficiency to the summary. It also
  records which flex buffers (DeepEP / HybridEP) Megatron-Core allocated (``flex_buffers``), the
  delayed-wgrad counters (``wgrad``) and the layer stack the model was really built from
  (``layer_stack``: transformer_impl, the fusion flags, the Linear/attention/MLP classes, TE versions),
  and the EP-relevant variables the run really had once MB applied ``cfg.env_vars`` (``environment``:
  e.g. HybridEP's ``USE_MNNVL``).
It changes nothing in the training computation. Importing this module imports Megatron-Bridge:
install the import shims first (``target.shims.install``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from megatron.bridge.training.callbacks import Callback

from ..target.cluster import RELEVANT_ENV_VARS
from ..target.probe import te_version_here
from ..target.shims import real_te_available
from .shared_gpu import active
from .trace import analyze

from ..target.simulated_finalize import summarize


class ScheduleCounter:
    def __init__(self, probe_wgrad: bool | None = None) -> None:
        self.schedule_plan_calls = 0
        self.combined_schedule_calls: dict[str, int] = {}
        self.wgrad = WgradCounter(probe_wgrad)
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
        self._patched += self.wgrad.install()
        return self

    def uninstall(self) -> None:
        for module, name, original in reversed(self._patched):
            setattr(module, name, original)
        self._patched.clear()


class WgradCounter:
    """Evidence that delayed weight gradients really were deferred (see the module contract)."""

    def __init__(self, probe: bool | None = None) -> None:
        self.probe = os.environ.get("EP_OVERLAP_WGRAD_PROBE") == "1" if probe is None else bool(probe)
        self.node_backward_dw_calls = 0
        self.node_backward_dw_delayed = 0
        self.te_wgrad_deferred = 0
        self.te_wgrad_executed = 0
        self.te_counted = False
        self.probe_changed = 0
        self.probe_unchanged = 0
        self.probe_grads_present = 0

    def install(self) -> list[tuple[Any, str, Any]]:
        """Wrap MCore's ``TransformerLayerNode.backward_dw`` and TE's ``WeightGradStore``; returns
        what was patched as (owner, name, original)."""
        patched = []
        try:
            from megatron.core.models.common.utils import TransformerLayerNode
        except ImportError:
            TransformerLayerNode = None
        if TransformerLayerNode is not None and hasattr(TransformerLayerNode, "backward_dw"):
            original = TransformerLayerNode.backward_dw
            TransformerLayerNode.backward_dw = self.wrap_node_backward_dw(original)
            patched.append((TransformerLayerNode, "backward_dw", original))
        store = _te_weight_grad_store()
        if store is not None:
            self.te_counted = True
            for name, attr in (("put", "te_wgrad_deferred"), ("pop", "te_wgrad_executed")):
                original = getattr(store, name)

                def counted(obj, *args, __original=original, __attr=attr, **kwargs):
                    setattr(self, __attr, getattr(self, __attr) + 1)
                    return __original(obj, *args, **kwargs)

                setattr(store, name, counted)
                patched.append((store, name, original))
        return patched

    def wrap_node_backward_dw(self, original: Callable) -> Callable:
        @functools.wraps(original)
        def backward_dw_counted(node, *args, **kwargs):
            self.node_backward_dw_calls += 1
            delayed = bool(getattr(node, "delay_wgrad_compute", False))
            if not delayed:
                return original(node, *args, **kwargs)
            self.node_backward_dw_delayed += 1
            if not self.probe:
                return original(node, *args, **kwargs)
            grads = _slot_grads(node)
            before = _fingerprint(grads)
            result = original(node, *args, **kwargs)
            after = _fingerprint(grads)  # the same parameters (backward_dw clears bwd_dw_callables)
            if any(b != 0.0 for b in before):
                self.probe_grads_present += 1
            if before != after:
                self.probe_changed += 1
            else:
                self.probe_unchanged += 1
            return result

        return backward_dw_counted

    def to_dict(self) -> dict:
        out = {
            "node_backward_dw_calls": self.node_backward_dw_calls,
            "node_backward_dw_delayed": self.node_backward_dw_delayed,
            "te_wgrad_deferred": self.te_wgrad_deferred if self.te_counted else None,
            "te_wgrad_executed": self.te_wgrad_executed if self.te_counted else None,
        }
        if self.probe:
            out["probe"] = {"changed": self.probe_changed, "unchanged": self.probe_unchanged,
                            "grads_present_before": self.probe_grads_present}
        return out


def _te_weight_grad_store():
    """Transformer Engine's ``WeightGradStore`` class, None where the real TE does not import."""
    if not real_te_available():
        return None
    try:
        from transformer_engine.pytorch.module._common import WeightGradStore
    except Exception:  # noqa: BLE001 - another TE layout: the TE counters stay None
        return None
    return WeightGradStore


def _slot_grads(node) -> list[tuple[Any, str]]:
    """(parameter, attribute) of every trainable parameter the slot's delayed-wgrad callables own:
    ``main_grad`` (MCore's DDP buffer, where fused accumulation writes) when there is one, else ``grad``."""
    out = []
    for module in list(getattr(node, "bwd_dw_callables", None) or []):
        params = getattr(module, "parameters", None)
        for p in (params() if callable(params) else []):
            if getattr(p, "requires_grad", False):
                out.append((p, "main_grad" if getattr(p, "main_grad", None) is not None else "grad"))
    return out


def _fingerprint(grads: list[tuple[Any, str]]) -> list[float]:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()  # backward_dw runs on its own stream; compare finished values
    values = []
    for p, attr in grads:
        g = getattr(p, attr, None)
        values.append(0.0 if g is None else float(torch.linalg.vector_norm(g.detach().float())))
    return values


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
        import torch.distributed as dist

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
            "wgrad": self.counter.wgrad.to_dict(),
            "layer_stack": layer_stack(context),
            "environment": _run_environment(),
            "hardware": hardware(),
            "peak_memory_gib_per_rank": [round(float(p.item()), 3) for p in peaks],
            "profile": self.profile,
            "steps": self.steps,
        }
        self.summary_path.parent.mkdir(parents=True, exist_ok=True)
        self.summary_path.write_text(json.dumps(summary, indent=2))


def hardware() -> dict:
    """The GPUs this rank saw, and whether the ranks shared one GPU (``lab.shared_gpu``: the
    emulation whose runs are correctness evidence only, never timings)."""
    import torch

    return {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "visible_gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
            "ranks_share_one_gpu": active()}


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


_LAYER_FIELDS = ("transformer_impl", "moe_grouped_gemm", "apply_rope_fusion", "gradient_accumulation_fusion",
                "moe_permute_fusion", "moe_router_fusion", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl",
                "bias_activation_fusion", "masked_softmax_fusion", "persist_layer_norm")


_TE_MODULE_PREFIXES = ("transformer_engine", "megatron.core.extensions.transformer_engine")


def layer_stack(context) -> dict:
    """What the model was really built from: its layer fields, the classes of its linear, attention,
    MLP and norm modules and which of them are Transformer Engine's (defined in ``transformer_engine``
    or MCore's TE extension; note MCore builds the final norm with TE whenever TE imports, even on
    the local spec), and the TE version as this process and Megatron-Core see it."""
    model_cfg = context.state.cfg.model
    fields = {name: getattr(model_cfg, name, None) for name in _LAYER_FIELDS}
    classes, te_classes = set(), set()
    for chunk in context.model or []:
        for module in chunk.modules():
            cls = type(module)
            if any(k in cls.__name__ for k in ("Linear", "Attention", "MLP", "Norm")):
                classes.add(cls.__name__)
                if cls.__module__.startswith(_TE_MODULE_PREFIXES):
                    te_classes.add(cls.__name__)
    mcore_te = None
    te = te_version_here()
    if te:
        try:
            from megatron.core.utils import get_te_version

            mcore_te = str(get_te_version())
        except Exception:  # noqa: BLE001
            mcore_te = None
    return {**{k: (v if isinstance(v, (bool, int, float, str)) or v is None else str(v)) for k, v in fields.items()},
            "module_classes": sorted(classes), "te_module_classes": sorted(te_classes), "te_version": te or None,
            "mcore_te_version": mcore_te}


def _run_environment() -> dict[str, str]:
    """The EP-relevant environment variables of this process now (after MB applied ``cfg.env_vars``)."""
    return {k: os.environ[k] for k in RELEVANT_ENV_VARS if k in os.environ}
