"""Memory (family "topology and batch"): the config must fit the target GPU's memory.

Both rules read the memory prediction (``Facts.memory``, ``predict.memory``; method and check rows in
docs/prediction.md): peak memory per GPU on the most loaded pipeline stage - parameters, gradients,
optimizer state as configured, activations of the microbatches in flight (with what EP overlap
adds when it is on), dispatcher buffers, CUDA-graph buffers, a fixed per-GPU overhead and the
allocator's reserve. ``fits-in-gpu-memory`` refuses a config predicted over the GPU's memory (MB and
MCore accept it and the job dies of CUDA out-of-memory at its first step, or cannot even allocate
its parameters) by more than the model's error bound (``MODEL_ERROR``); ``gpu-memory-headroom``
advises above ``NEAR`` of it, and over it within that bound. Where no prediction can be
made they are "not checked".
"""

from __future__ import annotations

from ...predict.memory import MODEL_ERROR, NEAR
from ...base.errors import Severity
from ..facts import Facts
from .base import Family, When, rule

family = rule.family(Family.TOPOLOGY)


def _total(f: Facts) -> float:
    return f.memory.total(f.overlap)


def _current(f: Facts) -> str:
    m = f.memory
    parts = m.parts_on if f.overlap else m.parts_off
    big = sorted(parts.items(), key=lambda kv: -kv[1])[:4]
    split = ", ".join(f"{k} {v:.1f} GiB" for k, v in big)
    return (f"predicted {_total(f):.1f} GiB per GPU with overlap {'on' if f.overlap else 'off'}, {m.stage} "
            f"pipeline stage ({split}); {m.gpu} has {m.capacity_gib:.0f} GiB")


@family("fits-in-gpu-memory", When.ALWAYS, "train.micro_batch_size",
        required=f"predicted peak memory per GPU <= the GPU's memory + {MODEL_ERROR:.0%} (the model's error bound)",
        needs=lambda f: f.memory is not None, current=_current)
def fits_in_gpu_memory(f: Facts) -> bool:
    """the config is predicted not to fit in GPU memory: the job would fail with CUDA out of memory.

    Fix: spread the model over more GPUs (larger EP / TP / PP, the distributed optimizer), hold fewer
    activations (smaller micro batch or sequence, recompute), or use a GPU with more memory; the
    prediction's parts (plan --predict) say which one dominates.
    """
    return _total(f) <= (1 + MODEL_ERROR) * f.memory.capacity_gib


@family("gpu-memory-headroom", When.ALWAYS, "train.micro_batch_size", severity=Severity.ADVICE,
        required=f"predicted peak memory per GPU <= {NEAR:.0%} of the GPU's memory",
        needs=lambda f: f.memory is not None, current=_current)
def gpu_memory_headroom(f: Facts) -> bool:
    """the config is predicted close to, or within the model's error over, the GPU's memory: little headroom.

    Fix: keep the predicted peak below 90% of the GPU's memory (smaller micro batch, recompute, more
    parallelism), or check the real peak with mbridge-ep-overlap bench run before a long run.
    """
    total = _total(f)
    return total > (1 + MODEL_ERROR) * f.memory.capacity_gib or total <= NEAR * f.memory.capacity_gib


RULES = family.rules
