"""A checkpoint whose tensors do not have the model's shapes, read from torch's ``load_state_dict`` words: which part
of the model differs, in which dimension and by what factor, and what sets that size.

Contract
--------
``StateDictShapes.feed(text, where)`` keeps (at most ``MAX_PARAMS``) each ``size mismatch for NAME: copying a param
with shape torch.Size([...]) from checkpoint, the shape in current model is torch.Size([...])`` line (torch's
``Module._load_from_state_dict``; a tab, torchrun's ``[rankN]:`` and a line holding several of them allowed), and
Megatron-Core's distributed checkpoint's ``Global shape mismatch for loaded (...) and expected (...) tensor for key
KEY`` (``GLOBAL``: whole-tensor shapes, so a factor there is a config size, not a split).
``findings(shapes)`` gives one ``state-dict-shape`` finding (``STATE_DICT_SHAPE``, ``signatures.config_error``) for the
load: how many tensors differ, and for each part of the model (``PARTS``: the word embedding and output layer, the
attention projections, the MLP / expert FC1 and FC2, the router, norms) the first mismatch's dimension, the two sizes
and their ratio, and what sets that size (``_reason``): a whole-number ratio on one dimension is a tensor split k ways
(TP / EP / ETP) against a whole one, or a size set k times apart; 2 on FC1's output is a gated (GLU) FC1 against an
ungated one; the vocabulary dimension is the padded vocabulary (tokenizer, ``make_vocab_size_divisible_by`` x TP). The
fix: build the model with the sizes the checkpoint was saved with (the config that wrote it, the same parallel sizes
for a non-distributed checkpoint), or convert the checkpoint. Never raises for what is in the lines.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from fractions import Fraction

from .report import Finding
from .signatures.config_error import STATE_DICT_SHAPE

MAX_PARAMS = 64
SHOWN = 4
LINE = re.compile(r"size mismatch for (?P<name>[\w.]{1,300}): copying a param with shape torch\.Size\(\[(?P<saved>[\d, ]{0,200})\]\) "
                  r"from checkpoint, the shape in current model is torch\.Size\(\[(?P<model>[\d, ]{0,200})\]\)")
GLOBAL = re.compile(r"Global shape mismatch for loaded \((?:torch\.Size\(\[)?(?P<saved>[\d, ]{0,200})(?:\]\))?\) and expected "
                    r"\(\((?P<model>[\d, ]{0,200})\)\) tensor for key (?P<name>[\w./-]{1,300})")
"""Megatron-Core's distributed checkpoint (``dist_checkpointing/strategies/torch.py`` ``_validate_global_shapes``): the
shapes are the whole tensors', the same under any parallel layout."""
PARTS = (
    ("word_embeddings", "the word embedding", "vocab"),
    ("output_layer", "the output layer", "vocab"),
    ("lm_head", "the output layer", "vocab"),
    ("embed_tokens", "the word embedding", "vocab"),
    ("router", "the MoE router", "experts"),
    ("shared_experts.linear_fc1", "the shared experts' FC1", "fc1"),
    ("shared_experts.linear_fc2", "the shared experts' FC2", "fc2"),
    ("shared_experts", "the shared experts", "mlp"),
    ("experts.linear_fc1", "the MoE experts' FC1", "fc1"),
    ("experts.linear_fc2", "the MoE experts' FC2", "fc2"),
    ("experts", "the MoE experts", "mlp"),
    ("linear_fc1", "the MLP's FC1", "fc1"),
    ("linear_fc2", "the MLP's FC2", "fc2"),
    ("linear_qkv", "the attention QKV projection", "attention"),
    ("linear_q", "the attention projections", "attention"),
    ("linear_kv", "the attention projections", "attention"),
    ("linear_proj", "the attention output projection", "attention"),
    ("layernorm", "a norm", "norm"),
    ("norm", "a norm", "norm"),
)


@dataclass(frozen=True)
class Mismatch:
    where: str
    name: str
    saved: tuple[int, ...]
    model: tuple[int, ...]
    whole: bool = False
    """Megatron-Core's distributed checkpoint: global shapes, independent of the parallel layout."""

    @property
    def part(self) -> tuple[str, str]:
        low = self.name.lower()
        return next(((what, kind) for key, what, kind in PARTS if key in low), ("another tensor", "other"))


class StateDictShapes:
    def __init__(self) -> None:
        self.mismatches: list[Mismatch] = []

    def feed(self, text: str, where: str) -> None:
        if "size mismatch for" not in text and "Global shape mismatch" not in text:
            return
        for whole, form in ((False, LINE), (True, GLOBAL)):
            for m in form.finditer(text):
                if len(self.mismatches) >= MAX_PARAMS:
                    return
                saved, model = _shape(m["saved"]), _shape(m["model"])
                if saved is None or model is None:
                    continue
                if all(o.name != m["name"] for o in self.mismatches):
                    self.mismatches.append(Mismatch(where, m["name"], saved, model, whole))

    def finish(self) -> None:
        """Counted across every source: one load."""


def _shape(text: str) -> tuple[int, ...] | None:
    """``"151936, 2048"`` -> (151936, 2048); None for what is not a list of sizes (a paste that lost its commas)."""
    parts = [x for x in text.split(",") if x.strip()] if text.strip() else []
    if any(not re.fullmatch(r"\s*\d{1,12}\s*", x) for x in parts):
        return None
    return tuple(int(x) for x in parts)


def _reason(m: Mismatch) -> str:
    if len(m.saved) != len(m.model):
        return (f"{len(m.saved)} dimensions saved, {len(m.model)} in the model: another layout of the tensor (a fused "
                "or grouped tensor against per-part ones)")
    dims = [i for i, (a, b) in enumerate(zip(m.saved, m.model, strict=True)) if a != b]
    if not dims:
        return "the printed shapes are the same: the tensors differ in what the message does not show"
    if len(dims) != 1:
        return "more than one dimension differs: another model shape (hidden size, heads) than the one saved"
    i = dims[0]
    a, b = m.saved[i], m.model[i]
    ratio = Fraction(a, b) if b else None
    said = f"dimension {i}: {a} saved, {b} in the model"
    if ratio is None:
        return said
    kind = m.part[1]
    k = ratio if ratio.denominator == 1 else 1 / ratio if ratio.numerator == 1 else None
    bigger = "saved" if ratio > 1 else "model's"
    if kind == "fc1" and ratio in (2, Fraction(1, 2)) and i == 0:
        return (f"{said} (x{ratio if ratio > 1 else 1 / ratio}): a gated FC1 (SwiGLU / GLU: gated_linear_unit, two "
                "halves) against an ungated one, or ffn_hidden_size twice apart"
                + ("" if m.whole else ", or a 2-way split against a whole one"))
    if kind == "vocab" and i == 0:
        return (f"{said}: the padded vocabulary differs - another tokenizer or vocab_size, or the padding "
                "(make_vocab_size_divisible_by x tensor-parallel size) of another layout"
                + (f"; the {bigger} is {k}x the other: one side is a {k}-way tensor-parallel shard"
                   if k and not m.whole else ""))
    if k is not None and k > 1 and m.whole:
        return (f"{said} (the {bigger} is {k}x the other): the distributed checkpoint's shapes are the whole "
                f"tensors', the same under any parallel layout, so the model config sets that size {k}x apart (an "
                "expert count, ffn / hidden size, heads or groups)")
    if k is not None and k > 1:
        return (f"{said} (the {bigger} is {k}x the other): a tensor split {k} ways (tensor / expert parallel) "
                f"against a whole one, or the size that dimension holds set {k}x apart")
    return f"{said} (ratio {ratio}): a size of the model config differs from the one the checkpoint was saved with"


def findings(shapes: StateDictShapes) -> list[Finding]:
    if not shapes.mismatches:
        return []
    by_part: dict[str, list[Mismatch]] = {}
    for m in shapes.mismatches:
        by_part.setdefault(m.part[0], []).append(m)
    parts = [f"{len(ms)} in {what} (first: {ms[0].name}, {_reason(ms[0])})" for what, ms in by_part.items()]
    n = len(shapes.mismatches)
    cause = (f"The checkpoint's tensors do not have the model's shapes: {n} tensor(s) differ" +
             (f" (at least; {MAX_PARAMS} read)" if n >= MAX_PARAMS else "") + ": " + "; ".join(parts) + ".")
    sig = dataclasses.replace(STATE_DICT_SHAPE, cause=cause)
    f = Finding(sig)
    for ms in list(by_part.values())[:SHOWN]:
        f.add(f"{ms[0].where}: size mismatch for {ms[0].name}: saved {list(ms[0].saved)}, model {list(ms[0].model)}")
    return [f]
