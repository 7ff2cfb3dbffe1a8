"""Derived parallel and batch sizes: computed here and nowhere else.

Contract: pure integer arithmetic on the sizes Megatron reads (like torchtitan's
``parallel_dims``). Every function returns ``None`` instead of raising when an input is unknown,
not a positive integer, or does not divide evenly, so callers report "not checked" or a typed
violation rather than a ``ZeroDivisionError``.
"""

from __future__ import annotations

from typing import Any


INT64_MAX = 2**63 - 1
"""The bound on every size and on the tokens per step: torch and numpy hold sizes, shapes, positions
and token counts as int64, so no run can have more (``rules.values``, ``predict.inputs``)."""


def shown(value: int) -> str:
    """An int for a message: its digits up to 64 bits, else its size (a 10**5000 cannot even be
    printed: Python refuses to convert ints of more than 4300 digits to text)."""
    return str(value) if abs(value).bit_length() <= 64 else f"a {abs(value).bit_length()}-bit integer"


def positive_int(value: Any) -> int | None:
    """``value`` when it is an int >= 1 (bools excluded), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def model_parallel_size(tp: Any, pp: Any, cp: Any) -> int | None:
    """TP x PP x CP: GPUs of one data-parallel replica (CP None counts as 1)."""
    sizes = [positive_int(tp), positive_int(pp), positive_int(1 if cp is None else cp)]
    return None if None in sizes else sizes[0] * sizes[1] * sizes[2]


def expert_group_size(ep: Any, etp: Any, pp: Any) -> int | None:
    """EP x ETP x PP: GPUs the expert layout needs (EP/ETP None count as 1)."""
    sizes = [positive_int(1 if ep is None else ep), positive_int(1 if etp is None else etp), positive_int(pp)]
    return None if None in sizes else sizes[0] * sizes[1] * sizes[2]


def data_parallel_size(world: Any, tp: Any, pp: Any, cp: Any) -> int | None:
    world, mp = positive_int(world), model_parallel_size(tp, pp, cp)
    if world is None or mp is None or world % mp:
        return None
    return world // mp


def num_microbatches(global_batch: Any, micro_batch: Any, dp: Any) -> int | None:
    gbs, mbs, dp = positive_int(global_batch), positive_int(micro_batch), positive_int(dp)
    if gbs is None or mbs is None or dp is None or gbs % (mbs * dp):
        return None
    return gbs // (mbs * dp)
