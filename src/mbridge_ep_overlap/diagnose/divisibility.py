"""A size that must divide another, as any framework's check words it: the numbers read from the message, and the
values that would divide.

Contract
--------
``Divisibility.feed(text, where)`` keeps each line (at most ``MAX_LINES``) that says one size must divide another, in
the forms of ``FORMS``: ``A=a must be divisible by B=b`` / ``A (a) is not divisible by B (b)`` / ``a is not divisible
by b`` / ``A must be a multiple of B`` with numbers, and a product of named sizes against a GPU count (``the world size
must be divisible by ETP * EP * PP (1 * 64 * 4 = 256)`` with ``N GPUs`` or ``world size (N)`` in the same line).
``findings(lines)`` gives one ``divisibility:NAME`` finding per line from the ``SIZE_NOT_DIVISIBLE`` row
(``signatures.config_error``), NAME the divisor's name (``ep-size``, ``etp-ep-pp``; ``size`` without one): the
numbers, whether they really do not divide, and the fix in values: for a single divisor the values near it that divide
(``divisors_near``: the divisors of the dividend closest to it, at most ``SHOWN``), for a product each factor's
values that make the product divide the GPU count (``factor_choices``), else the GPU counts that fit the product.
``details(lines)``: those fix lines, for a finding another reader made of the same line (an upstream check).
A line whose numbers do divide is kept as evidence only (the message's arithmetic is not this check's). Never raises.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from .report import Finding
from .sources import Held, join
from .signatures.config_error import SIZE_NOT_DIVISIBLE

MAX_LINES = 6
SHOWN = 4
_NUM = r"(\d{1,12})"
_NAME = r"(?<![\w.'])([A-Za-z_][\w.]*(?: [a-z_]+)?)"
_PHRASE = r"((?:[A-Za-z_][\w.']*\s+){0,3}[A-Za-z_][\w.']*)"
"""A divisor's name of up to four words (``weight quantization block_n``)."""
FORMS = (
    ("named", re.compile(_NAME + r"\s*=\s*" + _NUM + r"\s+(?:must be|is not|should be)\s+(?:evenly\s+)?divisible by\s+"
                         + _PHRASE + r"\s*=\s*" + _NUM)),
    ("named", re.compile(_NAME + r"\s*\(" + _NUM + r"\)\s+(?:must be|is not|should be)\s+divisible by\s+" + _NAME
                         + r"\s*\(" + _NUM + r"\)")),
    ("named", re.compile(_NAME + r"\s*\(" + _NUM + r"\)\s+(?:must be|should be) a multiple of\s+" + _NAME
                         + r"\s*\(" + _NUM + r"\)")),
    ("bare", re.compile(r"(?<![\w.])" + _NUM + r" is not divisible by " + _NUM + r"(?![\w.])")),
)
PRODUCT = re.compile(r"divisible by\s+(?P<names>[A-Za-z]+(?:\s*[*x×]\s*[A-Za-z]+)+)\s*\((?P<values>\d+(?:\s*[*x×]\s*\d+)+)"
                     r"\s*=\s*(?P<product>\d+)\)")
_CUT = re.compile(r"(?:divisible|divisible by|a multiple of)\s*$")
"""A line that ends where the divisor should follow: the message was wrapped there."""
_CONTINUED = re.compile(r"\s*(?:by\s|of\s|[a-z_])")
WORLD = re.compile(r"(?:(?P<a>\d{1,7})\s+GPUs|world[ _]size\s*\(?\s*(?:of\s+)?(?P<b>\d{1,7})\)?)")


@dataclass
class SizeLine:
    where: str
    text: str
    dividend: int
    divisor: int
    dividend_name: str = ""
    divisor_name: str = ""
    factors: tuple[tuple[str, int], ...] = ()
    """(name, value) of a product divisor (``ETP * EP * PP``)."""

    @property
    def divides(self) -> bool:
        return self.divisor > 0 and self.dividend % self.divisor == 0

    @property
    def slug(self) -> str:
        if self.factors:
            return "-".join(n.lower() for n, _ in self.factors)
        return re.sub(r"[^a-z0-9]+", "-", self.divisor_name.lower()).strip("-") or "size"


class Divisibility:
    def __init__(self) -> None:
        self.lines: list[SizeLine] = []
        self._cut = Held()
        """A line that ends where its divisor should follow."""

    def feed(self, text: str, where: str) -> None:
        text = text.rstrip().rstrip("\"'")  # a quote left at the end of a line cut from a string
        cut = self._cut.take()
        if cut is not None and _CONTINUED.match(text):  # a message wrapped before its divisor: read the two as one
            text, where = join(cut[1], text), cut[0]
        if ("divisible" not in text and "multiple of" not in text) or len(self.lines) >= MAX_LINES:
            return
        line = _read(text.strip()[:400], where)
        if line is None and _CUT.search(text):
            self._cut.hold(text.strip(), where)
        elif line is not None and all(o.text != line.text for o in self.lines):
            self.lines.append(line)

    def finish(self) -> None:
        """Nothing is held across sources."""
        self._cut.clear()


def _read(text: str, where: str) -> SizeLine | None:
    if (p := PRODUCT.search(text)) is not None and (w := WORLD.search(text)) is not None:
        names = re.split(r"\s*[*x×]\s*", p["names"])
        values = [int(v) for v in re.split(r"\s*[*x×]\s*", p["values"])]
        if len(names) == len(values) and math.prod(values) == int(p["product"]):
            return SizeLine(where, text, int(w["a"] or w["b"]), int(p["product"]), "GPUs", " x ".join(names),
                            tuple(zip(names, values, strict=True)))
    for kind, pattern in FORMS:
        if (m := pattern.search(text)) is not None:
            if kind == "bare":
                return SizeLine(where, text, int(m.group(1)), int(m.group(2)))
            return SizeLine(where, text, int(m.group(2)), int(m.group(4)), m.group(1).strip(), m.group(3).strip())
    return None


def divisors_near(n: int, near: int, keep: int = SHOWN) -> list[int]:
    """The divisors of ``n`` closest to ``near`` (smaller first on a tie)."""
    if n <= 0:
        return []
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    every = sorted(set(small + [n // d for d in small]))
    return sorted(sorted(every, key=lambda d: (abs(d - near), d))[:keep])


def factor_choices(world: int, factors: tuple[tuple[str, int], ...]) -> list[str]:
    """For each factor, the values (below its own) that make the product divide ``world``, the largest first."""
    out = []
    for i, (name, value) in enumerate(factors):
        rest = math.prod(v for j, (_, v) in enumerate(factors) if j != i)
        fits = [v for v in range(value - 1, 0, -1) if world % (rest * v) == 0][:2]
        if fits:
            out.append(f"{name}={' or '.join(str(v) for v in fits)} (with the others kept)")
    return out


def _fix(s: SizeLine) -> str:
    if s.factors:
        choices = factor_choices(s.dividend, s.factors)
        gpus = s.divisor * max(1, -(-s.dividend // s.divisor))
        return ("make the product divide the GPU count: " + ("; ".join(choices) if choices else "no single factor fits")
                + f"; or run on a multiple of {s.divisor} GPUs ({gpus})")
    near = [d for d in divisors_near(s.dividend, s.divisor) if d != s.divisor]
    name = s.divisor_name or "the divisor"
    return (f"set {name} to a value that divides {s.dividend}" + (f" ({', '.join(map(str, near))})" if near else "")
            + (f", or change {s.dividend_name} to a multiple of {s.divisor}" if s.dividend_name else ""))


def details(lines: list[SizeLine]) -> list[str]:
    return [f"sizes: {_fix(s)}" for s in lines if not s.divides]


def findings(lines: list[SizeLine]) -> list[Finding]:
    out = []
    for s in lines:
        if s.divides:
            continue
        of = (f"{s.dividend} GPUs" if s.factors else f"{s.dividend_name} {s.dividend}" if s.dividend_name
              else str(s.dividend))
        by = (f"{s.divisor_name} = {' x '.join(str(v) for _, v in s.factors)} = {s.divisor}" if s.factors else
              f"{s.divisor_name} {s.divisor}" if s.divisor_name else str(s.divisor))
        cause = (f"A size does not divide another: {of} is not a multiple of {by} ({s.dividend} % {s.divisor} = "
                 f"{s.dividend % s.divisor}); what it splits or tiles needs whole groups (ranks of a parallel layout) or "
                 "whole blocks (a quantization or kernel tile) of that size.")
        sig = dataclasses.replace(SIZE_NOT_DIVISIBLE, id=f"{SIZE_NOT_DIVISIBLE.id}:{s.slug}", cause=cause, fix=_fix(s))
        f = Finding(sig)
        f.add(f"{s.where}: {s.text}")
        out.append(f)
    return out
