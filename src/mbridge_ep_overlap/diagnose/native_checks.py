"""Native (C++/CUDA) checks named from the text their macros print: Transformer Engine, DeepEP, NCCL.

Contract
--------
``NativeChecks.feed(text, where)`` is fed every line of a log and keeps each distinct failed check
(library, file:line) whose line has one of the macro formats in ``FORMATS``:

- Transformer Engine ``NVTE_CHECK`` / ``NVTE_ERROR`` (``transformer_engine/common/util/logging.h``):
  ``FILE:LINE in function FN: Assertion failed: COND. MESSAGE`` / ``FILE:LINE in function FN: MESSAGE``;
- DeepEP ``EP_HOST_ASSERT`` / ``CUDA_CHECK`` (``csrc/kernels/exception.cuh``, class ``EPException``):
  ``Failed: Assertion error FILE:LINE 'COND'`` / ``Failed: CUDA error FILE:LINE 'ERROR'``, and
  ``EP_DEVICE_ASSERT``'s ``Assertion failed: FILE:LINE, condition: COND``;
- torch's ``C10D_NCCL_CHECK`` (``torch/csrc/distributed/c10d/NCCLUtils.hpp``) around an NCCL call:
  ``NCCL error in: FILE:LINE, NCCL_ERROR_STRING, NCCL version X``;
- a C ``assert`` in any native code (glibc's ``__assert_fail``): ``PROGRAM: FILE:LINE: FUNCTION: Assertion
  `COND' failed.`` (the ``FILE:LINE:`` may be wrapped onto the line before), its library read from the
  file's path (HybridEP's ``csrc/hybrid_ep/...`` is DeepEP's), else "native code".

``findings(checks, facts)`` gives one ``Finding`` per check, from the ``native-check`` row
(``signatures.config_error.NATIVE_CHECK``): id ``native-check:LIBRARY:FILE:LINE`` (FILE from the
library's source root, ``transformer_engine/common/...``, ``csrc/...``, ``torch/csrc/...``), cause "LIBRARY's
check at FILE:LINE in function FN failed: it requires COND (MESSAGE)", fix "the check in LIBRARY FILE:LINE
requires COND", and, for a library that changes such checks between releases, the version the run's
facts record (or that the facts do not say). Reads nothing but the lines; never raises for their text.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .report import Finding
from .signatures.config_error import NATIVE_CHECK

MAX_CHECKS = 8
BY_PATH = ""
"""The library of a format any C/C++ code prints (a failed C ``assert``): read from the file's path."""
_SOURCE = r"(?P<file>[^\s'\"]+?\.(?:cu|cuh|cpp|cc|c|h|hpp))"
FORMATS: tuple[tuple[str, str, re.Pattern], ...] = (
    ("transformer-engine", "NVTE_CHECK", re.compile(
        _SOURCE + r":(?P<line>\d+) in function (?P<function>[\w:~<>]+): Assertion failed: (?P<condition>.+?)\."
                  r"(?: (?P<message>.*?))?\s*$")),
    ("transformer-engine", "NVTE_ERROR", re.compile(  # an exception's text: NVTE_WARN prints the same format
        r"(?:Error|what\(\)):\s+" + _SOURCE + r":(?P<line>\d+) in function (?P<function>[\w:~<>]+): (?P<message>.+?)\s*$")),
    ("deep-ep", "EP_HOST_ASSERT", re.compile(r"Failed: Assertion error " + _SOURCE + r":(?P<line>\d+) '(?P<condition>.*)'")),
    ("deep-ep", "CUDA_CHECK", re.compile(r"Failed: CUDA error " + _SOURCE + r":(?P<line>\d+) '(?P<message>.*)'")),
    ("deep-ep", "EP_DEVICE_ASSERT", re.compile(
        r"Assertion failed: " + _SOURCE + r":(?P<line>\d+), condition: (?P<condition>.+?)\s*$")),
    ("nccl", "C10D_NCCL_CHECK", re.compile(
        r"NCCL error in: " + _SOURCE + r":(?P<line>\d+), (?P<message>.+?)(?:, NCCL version (?P<version>[\w.+-]+))?\s*$")),
    (BY_PATH, "assert", re.compile(  # glibc's __assert_fail: "%s%s%s:%u: %s%sAssertion `%s' failed."
        _SOURCE + r":(?P<line>\d+):\s*(?:(?P<function>[^`]+?):\s+)?Assertion `(?P<condition>.+)' failed\.")),
)
"""(library, macro, the expression that reads its format), most specific first."""

ROOTS = {"transformer-engine": ("transformer_engine/",), "deep-ep": ("csrc/",), "nccl": ("torch/csrc/",),
         "native code": ()}
"""Where a library's file path starts, so that two builds' absolute paths name the same check."""
_PATH_LIBRARIES = (("transformer-engine", "transformer_engine"), ("deep-ep", "deep_ep"), ("deep-ep", "deepep"),
                   ("deep-ep", "hybrid_ep"), ("nccl", "/nccl"))
"""(library, a part of a source path that only its sources have), first match wins; else "native code"."""
_WRAPPED_ASSERT = re.compile(r"^\s*(?:[^`]+?:\s+)?Assertion `.+' failed\.")
"""A C ``assert`` message whose ``FILE:LINE:`` a log wrapped onto the line before it."""
_UNREACHABLE = re.compile(r'^false\s*(?:and|&&)\s*"(.*)"$')
"""``EP_HOST_ASSERT(false and "Unsupported RDMA ranks")``: a branch the code does not support."""
_FAILED_CALL = re.compile(r"^(CUDA|cuBLAS|cuDNN|NVRTC|cuBLASMp|MPI) [Ee]rror: ")


@dataclass(frozen=True)
class NativeCheck:
    library: str
    macro: str
    file: str
    """From the library's source root (``transformer_engine/common/...``)."""
    line: int
    function: str
    """'' where the macro does not print it."""
    condition: str
    message: str
    version: str = ""
    """The library version the line itself prints (NCCL's), else ''."""

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def requires(self) -> str:
        if m := _UNREACHABLE.match(self.condition):
            return f"a case it supports (it reached one it does not: {m.group(1)})"
        if self.condition:
            return self.condition
        if self.macro == "CUDA_CHECK":
            return f"the CUDA call to return cudaSuccess (it returned: {self.message})"
        if self.macro == "C10D_NCCL_CHECK":
            return f"the NCCL call to return ncclSuccess (it returned: {self.message})"
        if m := _FAILED_CALL.match(self.message):
            return f"the {m.group(1)} call to succeed (it returned: {self.message[m.end():]})"
        return f"what its message says ({self.macro} raises without a condition)"


def parse(text: str) -> NativeCheck | None:
    """The native check a line reports, or None."""
    for library, macro, pattern in FORMATS:
        if m := pattern.search(text):
            g = m.groupdict()
            path = g["file"].rsplit(":", 1)[-1]
            if library == BY_PATH:
                lowered = path.lower()
                library = next((lib for lib, part in _PATH_LIBRARIES if part in lowered), "native code")
            file = next((root + path.split(root, 1)[1] for root in ROOTS[library] if root in path),
                        path.rsplit("/", 1)[-1])
            return NativeCheck(library, macro, file, int(g["line"]), g.get("function") or "",
                               (g.get("condition") or "").strip(), (g.get("message") or "").strip(),
                               g.get("version") or "")
    return None


class NativeChecks:
    def __init__(self) -> None:
        self.checks: list[tuple[NativeCheck, str, str]] = []
        """(check, where, the line), first seen first."""
        self._previous = ""

    def feed(self, text: str, where: str) -> None:
        previous, self._previous = self._previous, text
        if " in function " not in text and "Failed: " not in text and "Assertion failed: " not in text \
                and "NCCL error in: " not in text and "' failed." not in text:
            return
        c = parse(text)
        if c is None and _WRAPPED_ASSERT.match(text):
            text = previous.rstrip() + " " + text.strip()
            c = parse(text)
        if c and len(self.checks) < MAX_CHECKS and all((c.library, c.where) != (o.library, o.where)
                                                       for o, _, _ in self.checks):
            self.checks.append((c, where, text.strip()))


def findings(checks: list[tuple[NativeCheck, str, str]], facts: dict[str, dict]) -> list[Finding]:
    out = []
    for c, where, line in checks:
        version = _version(c, facts)
        in_fn = f" in function {c.function}" if c.function else ""
        said = f": {c.message.rstrip('.')}" if c.message and c.condition else ""
        sig = dataclasses.replace(
            NATIVE_CHECK, id=f"{NATIVE_CHECK.id}:{c.library}:{c.where}",
            cause=f"{c.library}'s check at {c.where}{in_fn} failed ({c.macro}): it requires {c.requires}{said}.",
            fix=f"the check in {c.library} {c.where} requires {c.requires}: change what the run passes it, or use "
                f"a {c.library} release whose check accepts it; the run's version: {version}",
            source=f"{c.library}:{c.where}", emitted=(line,), versions=version)
        f = Finding(sig)
        f.add(f"{where}: {line[:300]}")
        f.detail.append(f"native check: {c.library} {c.where}{in_fn}: {c.macro}, requires {c.requires}"
                        + (f"; message: {c.message}" if c.message and c.condition else ""))
        out.append(f)
    return out


def _version(c: NativeCheck, facts: dict[str, dict]) -> str:
    """The run's version of the library: printed by the line itself, else from the facts, else not known."""
    if c.version:
        return f"{c.library} {c.version} (printed with the error)"
    key = c.library  # the library's name is its key in the facts' ``versions`` (runtime.run_evidence.DISTRIBUTIONS)
    seen = sorted({str((f.get("versions") or {}).get(key)) for f in facts.values()
                   if isinstance(f, dict) and (f.get("versions") or {}).get(key)})
    if seen:
        return f"{c.library} {' / '.join(seen)} (the run's facts)"
    return f"{c.library} version not in the evidence (no facts file records it); checks change between releases"
