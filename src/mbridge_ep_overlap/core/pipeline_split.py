"""A virtual pipeline for the overlapped schedule: the ``resolve="auto"`` fix of rule ``pp-needs-vpp``.

Contract
--------
``choose(model) -> Split``: with ``pipeline_model_parallel_size`` > 1 and no virtual pipeline size,
the smallest VPP from 2 to ``MAX_VPP`` that the model's own pipeline split accepts, as Megatron-Core
0.19's ``TransformerConfig.__post_init__`` checks it:

* a ``pipeline_model_parallel_layout`` (MCore's string or list form): a new layout of PP x VPP stages
  holding the same layers in the same order (VPP is implied by the layout's stage count / PP, and set
  to it); embedding first, loss and MTP in the last stage, every stage balanced with the embedding
  and the loss counted as one layer each (as ``account_for_*_in_pipeline_split`` counts them);
* ``num_layers_in_first/last_pipeline_stage``: VPP dividing the first, the last and each middle rank's layers;
* ``account_for_embedding/loss_in_pipeline_split``: VPP dividing (layers + the accounted ones) / PP;
* otherwise: VPP with num_layers divisible by PP x VPP;

and when the split the recipe chose has no such VPP, a layout as above replacing it (the conflicting
split settings cleared). Every layout is checked by MCore's own ``PipelineParallelLayerLayout``.
``Split.edits`` are the ``(path, value)`` edits (empty: none exists), ``Split.words`` says what was
chosen or every candidate tried and why it failed. Reads only the model; imports MCore when called.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_VPP = 8
"""The largest virtual pipeline size tried (more chunks per rank only add pipeline bubbles' cost)."""


@dataclass(frozen=True)
class Split:
    edits: list[tuple[str, Any]] = field(default_factory=list)
    words: str = ""


def _get(model: Any, name: str, default: Any = None) -> Any:
    return getattr(model, name, default)


def _layers(layout: Any) -> list[str] | None:
    """The layout's layers in order as MCore's letters (E, t, m, L), or None when unreadable."""
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    letters = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
    try:
        if isinstance(layout, PipelineParallelLayerLayout):
            flat = layout.flatten_layout
        else:
            stages = PipelineParallelLayerLayout.parse_str_to_list(layout) if isinstance(layout, str) else layout
            flat = [layer for stage in stages for layer in stage]
        return [letters[getattr(x, "name", str(x)).strip().lower()] for x in flat]
    except (AssertionError, KeyError, TypeError, AttributeError):
        return None


def _compress(stages: list[str]) -> str:
    """MCore's layout string: ``|`` between stages, ``(s|)*n`` for n equal stages, ``t*k`` for k decoders."""
    out, i = [], 0
    while i < len(stages):
        n = next((j for j in range(i, len(stages)) if stages[j] != stages[i]), len(stages)) - i
        out.append(f"({stages[i]}|)*{n}" if n > 1 else f"{stages[i]}|")
        i += n
    return "".join(out).rstrip("|")


def _stage(prefix: str, decoders: int, suffix: str) -> str:
    return prefix + ("t" * decoders if decoders < 3 else f"t*{decoders}") + suffix


def layout_for(num_layers: int, mtp: int, pp: int, vpp: int) -> tuple[str | None, str]:
    """A balanced layout of ``pp * vpp`` stages, checked by MCore: (layout, '') or (None, why not)."""
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    stages = pp * vpp
    units = num_layers + mtp + 2  # embedding and loss count one layer each
    if units < stages:
        return None, "fewer layers than stages (embedding and loss counted as one each)"
    base, extra = divmod(units, stages)
    quota = [base + (1 if 0 < i <= extra else 0) for i in range(stages)]
    if extra == stages - 1 or extra >= stages:  # the remainder reaches the last stage: keep it light
        quota = [base + (1 if i < extra else 0) for i in range(stages)]
    decoders = [quota[0] - 1, *quota[1:-1], quota[-1] - 1 - mtp]
    if min(decoders) < 0 or sum(decoders) != num_layers:
        return None, f"the end stages cannot hold the embedding, {mtp} MTP layer(s) and the loss"
    text = _compress([_stage("E", decoders[0], ""), *(_stage("", d, "") for d in decoders[1:-1]),
                      _stage("", decoders[-1], "m" * mtp + "L")])
    try:
        parsed = PipelineParallelLayerLayout(text, pp)
        parsed.validate_layer_layout(num_layers=num_layers, mtp_num_layers=mtp or None)
    except (AssertionError, ValueError) as e:
        return None, f"MCore refuses layout {text}: {e}"
    return (text, "") if parsed.virtual_pipeline_model_parallel_size == vpp else (None, f"{text} is not VPP {vpp}")


def _divides(model: Any, pp: int, vpp: int) -> str:
    """Why VPP ``vpp`` does not fit the model's own (non-layout) split; '' when it does."""
    layers = _get(model, "num_layers")
    first, last = _get(model, "num_layers_in_first_pipeline_stage"), _get(model, "num_layers_in_last_pipeline_stage")
    if first is not None or last is not None:
        ends = [n for n in (first, last) if n is not None]
        middle_ranks = pp - len(ends)
        middle = layers - sum(ends)
        if any(n % vpp for n in ends):
            return f"first/last stage layers {ends} not divisible by VPP"
        if middle_ranks and (middle % middle_ranks or (middle // middle_ranks) % vpp):
            return f"{middle} middle layers over {middle_ranks} ranks not divisible by VPP per rank"
        return ""
    accounted = int(bool(_get(model, "account_for_embedding_in_pipeline_split"))) + \
        int(bool(_get(model, "account_for_loss_in_pipeline_split")))
    total = layers + accounted
    if total % (pp * vpp):
        return f"{total} layers{' (embedding/loss counted)' if accounted else ''} not divisible by PP {pp} x VPP"
    return ""


_SPLIT_SETTINGS = (("num_layers_in_first_pipeline_stage", None), ("num_layers_in_last_pipeline_stage", None),
                   ("account_for_embedding_in_pipeline_split", False), ("account_for_loss_in_pipeline_split", False))


def choose(model: Any) -> Split:
    """The virtual pipeline (and layout) edits for ``model``; see the module docstring."""
    pp, layers = _get(model, "pipeline_model_parallel_size") or 1, _get(model, "num_layers")
    if pp <= 1 or not isinstance(layers, int):
        return Split(words="no pipeline to interleave" if pp <= 1 else "num_layers unknown")
    mtp = _get(model, "mtp_num_layers") or 0
    layout = _get(model, "pipeline_model_parallel_layout")
    tried: list[tuple[str, int, str]] = []
    if layout is not None:
        letters = _layers(layout)
        if letters is None:
            return Split(words=f"the recipe's layout {layout!r} is not one MCore can read")
        layers, mtp = letters.count("t"), letters.count("m")
    else:
        for vpp in range(2, MAX_VPP + 1):
            why = _divides(model, pp, vpp)
            if not why:
                return Split([("model.virtual_pipeline_model_parallel_size", vpp)],
                             f"VPP {vpp}: the recipe's pipeline split divides evenly")
            tried.append(("VPP", vpp, why))
    for vpp in range(2, MAX_VPP + 1):
        text, why = layout_for(layers, mtp, pp, vpp)
        if text is not None:
            cleared = [(f"model.{name}", value) for name, value in _SPLIT_SETTINGS if _get(model, name) != value]
            return Split([*cleared, ("model.pipeline_model_parallel_layout", text),
                          ("model.virtual_pipeline_model_parallel_size", vpp)],
                         f"VPP {vpp} with layout {text}" + (f" (the recipe's split has none: {_tried(tried)})"
                                                           if tried else ""))
        tried.append(("a layout of VPP", vpp, why))
    return Split(words=f"no virtual pipeline for PP {pp} and {layers} layers: {_tried(tried)}; "
                 "lower pipeline_model_parallel_size or turn overlap off")


def _tried(tried: list[tuple[str, int, str]]) -> str:
    """``VPP 2-8: why; a layout of VPP 2-8: why``: the candidates tried, equal reasons grouped."""
    groups: dict[tuple[str, str], list[int]] = {}
    for kind, vpp, why in tried:
        groups.setdefault((kind, why), []).append(vpp)
    return "; ".join(f"{kind} {v[0] if len(v) == 1 else f'{v[0]}-{v[-1]}'}: {why}" for (kind, why), v in groups.items())


def implied_vpp(model: Any) -> int | None:
    """The VPP a layout implies (its stages / PP), None without a readable layout."""
    layout, pp = _get(model, "pipeline_model_parallel_layout"), _get(model, "pipeline_model_parallel_size") or 1
    if layout is None:
        return None
    vpp = getattr(layout, "virtual_pipeline_model_parallel_size", None)
    if vpp is not None:
        return vpp
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    try:
        stages = len(PipelineParallelLayerLayout.parse_str_to_list(layout)) if isinstance(layout, str) else len(layout)
    except (AssertionError, TypeError):
        return None
    return stages // pp if stages % pp == 0 else None
