"""A value outside what a kernel or library was built for, as its check words it, named with the config field that
sets it.

Contract
--------
``KernelLimits.feed(text, where)`` keeps each distinct line (at most ``MAX_LINES``) in one of three forms:

- ``Unsupported WHAT`` / ``Unsupported WHAT: VALUE`` (DeepEP's ``EP_HOST_ASSERT(false and "Unsupported hidden")``,
  its Python ``AssertionError: Unsupported number of EP ranks: 12``, a kernel's type switch ``Unsupported type``);
- an assertion (a line with ``ASSERT`` / ``Assertion`` / ``CHECK`` / ``assert``) whose condition holds a quantity
  against a compile-time maximum: ``NAME <= kNumMaxTopK`` / ``NAME < NUM_MAX_PEERS`` (a ``k``-prefixed or upper-case
  constant);
- an equality check printed with both values, ``A == B (a vs. b)`` (``TORCH_CHECK_EQ`` and the checks written like
  it);
- an assertion that a pointer is not null, ``NAME_ptr != 0`` / ``NAME != nullptr`` (DeepEP's
  ``EP_HOST_ASSERT(topk_idx_ptr != 0)``): a tensor without storage reached the kernel - an empty tensor (a rank
  with zero tokens has a ``[0, k]`` tensor whose data pointer is 0) or one never allocated.

``findings(lines)`` gives one finding per line from the ``KERNEL_LIMIT`` / ``VALUE_MISMATCH`` / ``NULL_TENSOR`` rows
(``signatures.config_error``): ``kernel-limit:WHAT`` / ``value-mismatch:NAME`` / ``null-tensor:NAME``, the quantity, the value found when
the line prints it, the limit or the value required, and the config field that sets the quantity when its words name
one (``QUANTITIES``: EP ranks -> ``expert_model_parallel_size``, top-k -> ``moe_router_topk``, hidden ->
``hidden_size``, ...). ``details(lines)``: the same as one line each, for a finding another reader made of the same
line (a native check with its file:line). Reads nothing but the lines; never raises for their text.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .report import Finding
from .signatures.config_error import KERNEL_LIMIT, NULL_TENSOR, VALUE_MISMATCH

MAX_LINES = 6
UNSUPPORTED = re.compile(r"(?<![\w])Unsupported (?P<what>(?:number of )?[A-Za-z][\w-]*(?: [A-Za-z][\w-]*){0,3}?)"
                         r"(?:\s*[:=]\s*(?P<value>[\w.\-]+))?\s*(?:['\"\)\].,;]|$)")
ASSERTING = re.compile(r"(?<![A-Za-z])(?:[A-Z0-9]+_)*(?:ASSERT|CHECK)(?:_[A-Z0-9]+)*\b|\bAssert\w*|\bassert\b")
"""An assertion's words (``EP_HOST_ASSERT``, ``TORCH_CHECK``, ``AssertionError``, ``assert``), not ``CHECKPOINT``."""
FAILING = re.compile(r"(?<![A-Za-z])(?:[A-Z0-9]+_)*(?:ASSERT|CHECK)|\bAssert|\bassert\b|[Ee]rror\b|Error:|[Ff]ailed|"
                     r"[Ee]xception|\bmust\b|Check failed")
"""A line that reports a failure; an ``Unsupported`` / ``a == b (x vs. y)`` line elsewhere must stand alone."""
WARNING = re.compile(r"\bW\d{4}\b|\bWARN(?:ING)?\b|[Ww]arning|falling back|[Ff]allback|\bpassed\b|\bsucceeded\b|\bnoted\b")
"""A line that reports no failure (a warning, a check that passed)."""
COMPARED = re.compile(r"Check failed|\bmust\b|[Ee]rror|Assert|\bassert\b|[Ff]ailed|[Ee]xception|\w*CHECK\w*\(|\w+_CHECK\w*\b")
"""The failure words an equality check's line carries (TORCH_CHECK_EQ's 'Check failed: a == b (x vs. y)')."""
LIMIT = re.compile(r"(?P<name>[A-Za-z_][\w.]*(?:->\w+)?(?:\(\d*\))?)\s*(?P<op><=|<)\s*"
                   r"(?P<limit>k[A-Z]\w*|[A-Z][A-Z0-9]*_[A-Z0-9_]+)\b")
MISMATCH = re.compile(r"(?P<a>[A-Za-z_][\w.\[\]]*(?:->\w+)?(?:\(\d*\))?)\s*==\s*(?P<b>[A-Za-z_][\w.\[\]]*(?:->\w+)?"
                      r"(?:\(\d*\))?)\s*\((?P<x>[^()\s]{1,40}) vs\.? (?P<y>[^()\s]{1,40})\)")
NULL = re.compile(r"(?P<name>[A-Za-z_][\w.]*(?:\(\))?)\s*!=\s*(?:nullptr|NULL)(?![\w.])"
                  r"|(?P<pname>[A-Za-z_][\w.]*ptr(?:\(\))?)\s*!=\s*0(?![\w.])")
"""A pointer compared with nullptr / NULL, or a name ending in ``ptr`` with 0 (``returncode != 0`` is no pointer)."""
QUANTITIES = (
    (re.compile(r"rdma[ _]ranks|\bnodes?\b"), "RDMA ranks (nodes)",
     "the number of nodes the EP group spans (expert_model_parallel_size / GPUs per node)"),
    (re.compile(r"\bep[ _]ranks|\branks\b|num_ranks|ep_size"), "EP ranks", "expert_model_parallel_size (the EP group size)"),
    (re.compile(r"top[ _-]?k|topk"), "top-k", "moe_router_topk"),
    (re.compile(r"hidden"), "hidden size", "hidden_size (what dispatch / combine move per token)"),
    (re.compile(r"experts?\b"), "experts", "num_moe_experts (and its share per EP rank)"),
    (re.compile(r"\bd?type\b|dtype|scalar"), "data type",
     "the dtype of the tensor passed (the recipe's precision: FP8 where the kernel takes BF16, or the reverse)"),
    (re.compile(r"tokens?\b"), "tokens",
     "tokens per rank (micro_batch_size x seq_length / (TP x CP)) and the dispatcher's token capacity"),
    (re.compile(r"heads?\b|head_dim"), "attention heads", "num_attention_heads / kv_channels"),
)


@dataclass(frozen=True)
class LimitLine:
    where: str
    text: str
    form: str
    """``unsupported``, ``limit``, ``mismatch`` or ``null``."""
    what: str
    value: str = ""
    """The value found, where the line prints it."""
    required: str = ""
    """The limit (``kNumMaxTopK``) or the other side's value."""
    other: str = ""
    """A mismatch's other side (``args->top_k``)."""

    @property
    def slug(self) -> str:
        base = re.sub(r"^number of ", "", self.what.lower())
        return re.sub(r"[^a-z0-9]+", "-", base).strip("-") or "value"

    @property
    def quantity(self) -> tuple[str, str] | None:
        words = f"{self.what} {self.other}".lower()
        for pattern, label, field in QUANTITIES:
            if pattern.search(words):
                return label, field
        return None


class KernelLimits:
    def __init__(self) -> None:
        self.lines: list[LimitLine] = []

    def feed(self, text: str, where: str) -> None:
        if len(self.lines) >= MAX_LINES or ("Unsupported" not in text and "=" not in text and "<" not in text):
            return
        line = read(text.strip()[:400], where)
        if line is not None and all((o.form, o.what, o.value) != (line.form, line.what, line.value) for o in self.lines):
            self.lines.append(line)

    def finish(self) -> None:
        """Nothing is held across sources."""


def read(text: str, where: str = "") -> LimitLine | None:
    """The limit a line states, or None (a warning never states one)."""
    if WARNING.search(text):
        return None
    failing = FAILING.search(text) is not None
    if (m := UNSUPPORTED.search(text)) is not None and (failing or text.lstrip("'\" ").startswith("Unsupported")):
        return LimitLine(where, text, "unsupported", m["what"].strip(), m["value"] or "")
    if COMPARED.search(text) and (m := MISMATCH.search(text)) is not None and m["x"] != m["y"]:
        return LimitLine(where, text, "mismatch", m["a"], m["x"], m["y"], m["b"])
    if ASSERTING.search(text) and (m := LIMIT.search(text)) is not None:
        return LimitLine(where, text, "limit", m["name"], "", f"{m['op']} {m['limit']}")
    if ASSERTING.search(text):
        names = [m["name"] or m["pname"] for m in NULL.finditer(text)]
        if names:
            return LimitLine(where, text, "null", names[-1], "", "", " and ".join(names[:-1]))
    return None


def _field(s: LimitLine) -> str:
    q = s.quantity if s.form != "null" else None
    return f"; {q[0]} is set by {q[1]}" if q else ""


def details(lines: list[LimitLine]) -> list[str]:
    return [f"limit: {_say(s)}{_field(s)}" for s in lines]


def _say(s: LimitLine) -> str:
    if s.form == "unsupported":
        return (f"the code has no variant for this {s.what}" + (f" ({s.value})" if s.value else "")
                + ": it is built or tuned for a fixed set of values and the run's is not one of them")
    if s.form == "limit":
        return f"{s.what} must be {s.required}, a maximum fixed when the kernel was compiled"
    if s.form == "null":
        both = f"{s.other} and {s.what}" if s.other else s.what
        return (f"{both} must not be null: a tensor without storage reached the kernel - an empty tensor (a rank with "
                "zero tokens passes a [0, k] tensor whose data pointer is 0) or one never allocated")
    return f"{s.what} is {s.value} where {s.other} is {s.required}: the two must be equal"


def _fix(s: LimitLine) -> str:
    q = s.quantity
    field = q[1] if q else f"what sets {s.what}"
    if s.form == "unsupported":
        return (f"set {field} to a value the library supports (its source lists them beside the check), or use a "
                f"release that adds {s.value or 'this ' + s.what}")
    if s.form == "null":
        return ("skip the call (or pass a one-row placeholder) on a rank that has no tokens, or use a release of the "
                "caller / kernel that handles zero tokens; with uneven routing or data-parallel attention some ranks "
                "get none in a batch")
    if s.form == "limit":
        return (f"keep {field} within the kernel's {s.required.split()[-1]}, or use a build of the library whose "
                f"{s.required.split()[-1]} is larger (it is a compile-time constant)")
    return (f"make {s.what} equal {s.other}: the caller and the kernel disagree on a tensor's layout or size (often "
            "a caller and a kernel from releases that do not match); the side that passes "
            f"{s.what} = {s.value} is the one to change")


def findings(lines: list[LimitLine]) -> list[Finding]:
    out = []
    for s in lines:
        row = {"mismatch": VALUE_MISMATCH, "null": NULL_TENSOR}.get(s.form, KERNEL_LIMIT)
        cause = {"unsupported": "A value outside what the library was built for", "limit": "A compile-time limit of a "
                 "kernel exceeded", "mismatch": "A check of two values that must match failed",
                 "null": "A null-pointer check of a kernel failed"}[s.form]
        sig = dataclasses.replace(row, id=f"{row.id}:{s.slug}", cause=f"{cause}: {_say(s)}{_field(s)}.", fix=_fix(s))
        f = Finding(sig)
        f.add(f"{s.where}: {s.text}")
        out.append(f)
    return out
