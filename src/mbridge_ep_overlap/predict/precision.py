"""The GEMM precision of a config and what it costs on a GPU: the one owner of "which precision".

Contract
--------
* ``PRECISIONS``: the GEMM precisions the model knows - ``bf16``, ``fp16``, ``fp32`` and the
  low-precision recipes of Megatron-Bridge's ``MixedPrecisionConfig`` (``fp8`` + ``fp8_recipe`` =
  delayed / tensorwise / blockwise / mxfp8, ``fp4`` + ``fp4_recipe`` = nvfp4).
* ``of_fields(source)``: the precision an object with MB's mixed-precision fields (a
  ``MixedPrecisionConfig`` or a model config after MB applied it) asks for; ``of_name(name)``: the
  same for one of MB's registered recipe names (``"bf16_with_mxfp8_mixed"``); a whole config's
  (``cfg.mixed_precision`` first, else the model's own fields) is ``core.prediction_inputs.gemm_precision``.
  Reading a name needs no Megatron import (the unit tests check ``of_name`` against MB's own table).
* ``gemm_rate(gpu_spec, precision)`` -> ``Rate``: the dense peak the precision's GEMMs run at on the
  GPU (``hardware.json``), their efficiency relative to the calibrated BF16 efficiency, the extra
  memory-bound passes per GEMM input element (quantization) and whether the number is provisional.
  ``ValueError`` naming the GPU and the precision when the GPU's Tensor Cores do not run it (MXFP8 /
  NVFP4 on Hopper).
* What is sent: Megatron-Core 0.19.2's alltoall, DeepEP and HybridEP dispatchers send BF16 tokens
  whatever the GEMM precision (TE quantizes inside the expert GEMMs; ``fused_a2a.py``: HybridEP
  "does not support fp8 dispatch now", DeepEP's buffer is sized for >= 2-byte elements), and combine
  in BF16: ``A2A_BYTES`` is the one statement of that.

Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

PRECISIONS = ("bf16", "fp16", "fp32", "fp8_delayed", "fp8_tensorwise", "fp8_blockwise", "mxfp8", "nvfp4")
LOW = ("fp8_delayed", "fp8_tensorwise", "fp8_blockwise", "mxfp8", "nvfp4")
FP8_RECIPES = {"delayed": "fp8_delayed", "tensorwise": "fp8_tensorwise", "blockwise": "fp8_blockwise",
               "mxfp8": "mxfp8"}
A2A_BYTES = 2
"""Bytes per element the modelled dispatchers send (dispatch and combine) in MCore 0.19.2: BF16."""


def _base(source: Any) -> str:
    return "bf16" if getattr(source, "bf16", False) else "fp16" if getattr(source, "fp16", False) else "fp32"


def of_fields(source: Any) -> str:
    """The GEMM precision ``source``'s mixed-precision fields ask for (module docstring)."""
    if getattr(source, "fp4", None):
        recipe = getattr(source, "fp4_recipe", "nvfp4") or "nvfp4"
        if recipe != "nvfp4":
            raise ValueError(f"fp4_recipe {recipe!r}: the model knows nvfp4 only")
        return "nvfp4"
    if getattr(source, "fp8", None):
        recipe = getattr(source, "fp8_recipe", "tensorwise") or "tensorwise"
        if recipe not in FP8_RECIPES:
            raise ValueError(f"fp8_recipe {recipe!r}: one of {sorted(FP8_RECIPES)}")
        return FP8_RECIPES[recipe]
    return _base(source)


def of_name(name: str) -> str | None:
    """The precision of one of MB's registered mixed-precision recipe names (hyphens or
    underscores); None for a name this table does not read."""
    n = name.replace("-", "_")
    base = "fp16" if n.startswith("fp16") else "bf16" if n.startswith("bf16") or n.startswith("nemotron") \
        or n.startswith("nanov2") else None
    if base is None or not n.endswith("_mixed"):
        return None
    if n.startswith("nanov2_") and "fp8" in n:  # MB names it "current scaling" but sets fp8_recipe="blockwise"
        return "fp8_blockwise"
    for needle, precision in (("mxfp8", "mxfp8"), ("nvfp4", "nvfp4"), ("fp8_delayed", "fp8_delayed"),
                              ("fp8_current", "fp8_tensorwise"), ("fp8_subchannel", "fp8_blockwise")):
        if needle in n:
            return precision
    return base


@dataclass(frozen=True)
class Rate:
    peak_flops: float  # dense Tensor Core FLOP/s of the precision on the GPU
    relative_efficiency: float  # x the calibrated BF16 GEMM efficiency
    quantize_passes: float  # memory-bound passes per GEMM input element (amax + cast)
    provisional: bool


def gemm_rate(spec: Mapping[str, Any], precision: str, table: Mapping[str, Any]) -> Rate:
    """The rate of ``precision``'s GEMMs on the GPU ``spec`` (a ``hardware.json`` entry); ``table``:
    ``hardware.json``'s ``precisions``. fp16 and fp32 GEMMs are taken at the BF16 rate (fp32:
    TF32 is not modelled - the caller notes it)."""
    if precision in ("fp16", "fp32"):
        precision = "bf16"
    if precision not in table or precision == "about":
        raise ValueError(f"precision {precision!r}: one of {PRECISIONS}")
    row = table[precision]
    if row.get("needs") and not spec.get(row["needs"]):
        raise ValueError(f"{spec.get('name', 'this GPU')} has no {precision} Tensor Cores ({row['needs']} is false): "
                         f"{precision} runs on {row['gpus']} GPUs")
    peak = spec.get(row["peak"])
    if not peak:
        raise ValueError(f"{spec.get('name', 'this GPU')} has no {precision} Tensor Cores ({row['peak']} is null): "
                         f"{precision} runs on {row['gpus']} GPUs")
    return Rate(peak_flops=float(peak) * 1e12, relative_efficiency=float(row["relative_efficiency"]),
                quantize_passes=float(row["quantize_passes"]), provisional=bool(row.get("provisional", False)))
