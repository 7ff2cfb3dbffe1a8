"""Python frames in the vocabulary of EP overlap: dispatch or combine, forward or backward, backend,
and whether MCore's combined 1F1B schedule (overlap on) was driving it.

Contract
--------
``place(frames)`` takes (function, file, line) frames, innermost first, from faulthandler, a watchdog
dump or the flight-recorder analyzer, and returns a ``Place``. It knows MCore's files by name:
``pipeline_parallel/combined_1f1b.py`` and ``models/common/model_chunk_schedule_plan.py`` (the
schedule), ``transformer/moe/token_dispatcher.py`` (dispatch/combine per dispatcher: the class that holds
a line is read from the installed file's syntax tree, so it follows the installed megatron-core),
``transformer/moe/fused_a2a.py``, ``MoELayer.dispatch`` / ``combine`` (``moe_layer.py``), the combined schedule's
``submodule_dispatch_*`` / ``submodule_combine_*`` (``models/gpt/fine_grained_callables.py``) and
``deep_ep`` (the DeepEP / HybridEP / NCCL EP kernels). A frame
the words do not fit leaves the field None ("not in the stack"); nothing is guessed. The layer and
the microbatch are not in Python frames: they are said only when the evidence carries them (the
flight recorder's sequence number counts collectives, not microbatches).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

_FAULT_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
_CLASS_BACKEND = {
    "MoEAlltoAllTokenDispatcher": "alltoall", "MoEAllGatherTokenDispatcher": "allgather",
    "_HybridEPManager": "hybridep", "_DeepepManager": "deepep", "_NCCLEPManager": "ncclep",
    "MoEFlexTokenDispatcher": "flex", "HybridEPDispatch": "hybridep", "HybridEPCombine": "hybridep",
    "FusedDispatch": "deepep", "FusedCombine": "deepep",
}
_FUNC_BACKEND = (("hybrid_ep", "hybridep"), ("nccl_ep", "ncclep"), ("fused_dispatch", "deepep"),
                 ("fused_combine", "deepep"), ("internode_", "deepep"), ("intranode_", "deepep"))


# A frame of the backward pass: MCore's ScheduleNode.backward / _backward (pipeline_parallel/utils.py),
# the schedules' backward helpers. combined_forward_backward_step runs both and says neither.
_BACKWARD_FUNCS = {"backward", "_backward", "backward_step", "backward_step_helper", "default_backward_func",
                   "run_backward", "backward_dw"}


@dataclass(frozen=True)
class Place:
    phase: str | None = None       # "dispatch" | "combine"
    direction: str | None = None   # "forward" | "backward"
    backend: str | None = None     # "alltoall" | "deepep" | "hybridep" | "ncclep" | "flex" | "allgather"
    schedule: str | None = None    # "combined 1F1B (EP overlap)" | None
    frame: str | None = None       # the innermost frame that placed it, "file:line in function"

    def words(self) -> str:
        if not (self.phase or self.schedule or self.backend):
            return "outside MCore's dispatch/combine and schedule"
        parts = [f"{self.phase or 'not in a dispatch or combine'}"]
        if self.direction:
            parts.append(f"{self.direction} pass")
        if self.backend:
            parts.append(f"backend {self.backend}")
        if self.schedule:
            parts.append(self.schedule)
        parts.append("layer and microbatch: not in the stack")
        return ", ".join(parts) + (f" (at {self.frame})" if self.frame else "")


def faulthandler_frames(lines: list[str]) -> list[tuple[str, str, int]]:
    """'File "x.py", line 3 in f' lines -> (function, file, line)."""
    return [(m.group(3), m.group(1), int(m.group(2))) for line in lines if (m := _FAULT_FRAME.search(line))]


def place(frames: list[tuple[str, str, int]]) -> Place:
    phase = backend = frame = None
    direction = "forward"
    schedule = None
    saw_ep = False
    for func, file, line in frames:
        name = file.replace("\\", "/")
        ep_file = (name.endswith(("moe/token_dispatcher.py", "moe/fused_a2a.py")) or "/deep_ep/" in name
                   or name.endswith("moe/moe_layer.py") and func in ("dispatch", "combine")
                   or name.endswith("gpt/fine_grained_callables.py") and ("dispatch" in func or "combine" in func))
        if ep_file:
            saw_ep = True
            cls = _class_at(name.rsplit("/", 1)[-1], line) if name.endswith(".py") and "/deep_ep/" not in name else None
            backend = backend or _CLASS_BACKEND.get(cls or "") or next(
                (b for key, b in _FUNC_BACKEND if key in func), None) or ("deepep" if "/deep_ep/" in name else None)
            if phase is None and ("dispatch" in func or "combine" in func):
                phase = "dispatch" if "dispatch" in func else "combine"
                frame = f"{Path(name).name}:{line} in {func}"
            if func == "backward":
                direction = "backward"
        if name.endswith(("combined_1f1b.py", "model_chunk_schedule_plan.py")):
            schedule = "combined 1F1B (EP overlap)"
        if func in _BACKWARD_FUNCS and not ep_file:
            direction = "backward"
        if name.endswith("torch/autograd/__init__.py") or name.endswith("torch/autograd/graph.py"):
            direction = "backward"
    if not saw_ep and schedule is None:
        return Place()
    return Place(phase, direction if saw_ep else None, backend, schedule, frame)


@functools.lru_cache(maxsize=None)
def _class_spans(basename: str) -> tuple[tuple[int, int, str], ...]:
    spec = importlib.util.find_spec("megatron.core")  # the installed copy, never imported here
    if spec is None or not spec.submodule_search_locations:
        return ()
    path = Path(next(iter(spec.submodule_search_locations))) / "transformer" / "moe" / basename
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return ()
    return tuple((n.lineno, n.end_lineno or n.lineno, n.name) for n in ast.walk(tree) if isinstance(n, ast.ClassDef))


def _class_at(basename: str, line: int) -> str | None:
    spans = [s for s in _class_spans(basename) if s[0] <= line <= s[1]]
    return min(spans, key=lambda s: s[1] - s[0])[2] if spans else None
