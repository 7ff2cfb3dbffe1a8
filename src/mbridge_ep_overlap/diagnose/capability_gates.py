"""A feature a library refuses on the run's platform, in any library's words: '... is not supported on ROCm',
'... not supported on 12.0+ architectures', '... requires Hopper', '... is only supported on sm_90a'.

Contract
--------
``CapabilityGates.feed(text, where)`` keeps (at most ``MAX_LINES``) each error line (not a warning, and not one that says
it goes on without the feature: falling back, using, disabling, skipping, instead) that says a feature is
not supported on, or needs, a platform of ``PLATFORMS`` (a GPU architecture by name, compute capability, ``sm_NN``
target, or the ROCm / HIP stack), with the feature (the words before, from the line's message) and what was said
(``refused``: not supported on it; ``needed``: only on it / requires it). ``findings(lines)`` gives one
``capability-gate:PLATFORM`` finding per platform (``CAPABILITY_GATE``, ``signatures.hardware``): the feature, the
platform and the GPUs of it (``GPUS_OF``), that the run's hardware or software stack is outside what the feature
supports there - not a configuration value to tune - and the fix: turn the feature off on this platform (the
setting that enables it) or run it where it is supported. A line another finding already names is left to it
(``engine``). Never raises for what is in the lines.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .report import Finding
from .signatures.hardware import BLACKWELL_GPUS, CAPABILITY_GATE, RTX_BLACKWELL_GPUS

MAX_LINES = 4
_ARCH = (r"(?P<arch>ROCm|ROCM|HIP|AMD GPUs?|MI\d{3}\w*|Hopper|Blackwell|Ampere|Ada(?: Lovelace)?|Volta|Turing|"
         r"sm_?\d{2,3}[af]?|SM\s?\d{2,3}[af]?|(?:compute capability|CC) ?(?:>=?\s*)?\d{1,2}\.\d\+?|"
         r"\d{1,2}\.\d\+? architectures?|this (?:GPU|device|platform|architecture|hardware))")
FORMS = (
    ("refused", re.compile(r"(?P<feature>[\w.()/+ -]{3,90}?)\s+(?:is|are)\s+(?:not|not yet|currently not)\s+supported\s+"
                           r"(?:on|for|with)\s+(?:the\s+)?" + _ARCH, re.IGNORECASE)),
    ("needed", re.compile(r"(?P<feature>[\w.()/+ -]{3,90}?)\s+(?:is|are)\s+only\s+supported\s+(?:on|for|with)\s+(?:the\s+)?"
                          + _ARCH, re.IGNORECASE)),
    ("needed", re.compile(r"(?P<feature>[\w.()/+ -]{3,90}?)\s+(?:requires?|needs?)\s+(?:a\s+)?" + _ARCH
                          + r"(?:\s+(?:GPUs?|or\s+(?:newer|later|higher)))?", re.IGNORECASE)),
)
_MESSAGE_START = re.compile(r"^.*?(?:\w(?:Error|Exception)|ERROR|error)\s*:\s*")
"""Errors only: a warning that says a feature is not supported here goes on without it (a fallback, not a cause)."""
_GOES_ON = re.compile(r"(?i)\b(?:fall(?:ing)? ?back|using|disabling|disabled|skipping|ignor(?:ed|ing)|instead)\b")
GPUS_OF = (
    (re.compile(r"^(?:rocm|hip|amd gpus?|mi\d{3}\w*)$", re.I),
     "rocm", "AMD GPUs under ROCm / HIP (MI250, MI300X, MI355X): the CUDA-only path has no ROCm build there"),
    (re.compile(r"^hopper$|^sm_?90a?$|^(?:compute capability|cc) ?(?:>=?\s*)?9\.0\+?$", re.I),
     "hopper", "Hopper, compute capability 9.0 (H100, H200, GH200; sm_90a for its arch-specific instructions)"),
    (re.compile(r"^blackwell$|^sm_?10[03][af]?$|^(?:compute capability|cc) ?(?:>=?\s*)?10\.\d\+?$", re.I),
     "blackwell", f"data-centre Blackwell, compute capability 10.x ({BLACKWELL_GPUS})"),
    (re.compile(r"^sm_?12\d[af]?$|^12\.\d\+? architectures?$|^(?:compute capability|cc) ?(?:>=?\s*)?12\.\d\+?$", re.I),
     "cc12", f"RTX-class Blackwell, compute capability 12.x ({RTX_BLACKWELL_GPUS})"),
    (re.compile(r"^ampere$|^sm_?8[06]$", re.I), "ampere", "Ampere, compute capability 8.x (A100 8.0, A10 / RTX 30 8.6)"),
    (re.compile(r"^ada(?: lovelace)?$|^sm_?89$", re.I), "ada", "Ada, compute capability 8.9 (L4, L40S, RTX 40 series)"),
    (re.compile(r"^volta$|^sm_?70$", re.I), "volta", "Volta, compute capability 7.0 (V100)"),
    (re.compile(r"^turing$|^sm_?75$", re.I), "turing", "Turing, compute capability 7.5 (T4, RTX 20 series)"),
)


@dataclass
class GateLine:
    where: str
    text: str
    said: str
    """``refused`` (not supported on the platform) or ``needed`` (only on it / requires it)."""
    feature: str
    platform: str

    @property
    def key(self) -> str:
        return next((k for p, k, _ in GPUS_OF if p.match(self.platform)), re.sub(r"[^a-z0-9]+", "-",
                                                                                  self.platform.lower()).strip("-"))

    @property
    def gpus(self) -> str:
        return next((g for p, _, g in GPUS_OF if p.match(self.platform)), self.platform)


class CapabilityGates:
    def __init__(self) -> None:
        self.lines: list[GateLine] = []

    def feed(self, text: str, where: str) -> None:
        if "support" not in text and "requir" not in text and "need" not in text:
            return
        if len(self.lines) >= MAX_LINES or (start := _MESSAGE_START.match(text)) is None:
            return
        message = text[start.end():].strip()[:300]
        if _GOES_ON.search(message):
            return
        for said, form in FORMS:
            if (m := form.search(message)) is not None:
                feature = m["feature"].strip(" .,:;-")
                if feature and all(o.text != text.strip() for o in self.lines):
                    self.lines.append(GateLine(where, text.strip(), said, feature, m["arch"].strip()))
                return

    def finish(self) -> None:
        """Nothing is held across sources."""


def findings(lines: list[GateLine]) -> list[Finding]:
    out: dict[str, Finding] = {}
    for g in lines:
        if g.key in out:
            out[g.key].add(f"{g.where}: {g.text}")
            continue
        if g.said == "refused":
            cause = (f"{g.feature}: refused on {g.platform} ({g.gpus}). The run's GPU or software stack is one the "
                     "feature does not support; no value of the configuration makes it run there.")
            fix = (f"turn {g.feature} off on this platform (the setting or recipe that enables it) or use its "
                   f"alternative there, or run it on a platform it supports")
        else:
            cause = (f"{g.feature}: needs {g.platform} ({g.gpus}), and the run is not on it (its GPU, its CUDA / "
                     "torch build, or both): the feature is not available on this platform.")
            fix = f"run {g.feature} on {g.platform}, or turn it off (the setting or recipe that enables it) on this one"
        sig = dataclasses.replace(CAPABILITY_GATE, id=f"{CAPABILITY_GATE.id}:{g.key}", cause=cause, fix=fix)
        f = Finding(sig)
        f.add(f"{g.where}: {g.text}")
        out[g.key] = f
    return list(out.values())
