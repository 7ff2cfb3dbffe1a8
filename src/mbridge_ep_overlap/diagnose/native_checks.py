"""Native (C++/CUDA) checks named from the text their macros print: Transformer Engine, DeepEP, NCCL.

Contract
--------
``NativeChecks.feed(text, where)`` is fed every line of a log and keeps each distinct failed check
(library, file:line) whose line has one of the macro formats in ``FORMATS``:

- Transformer Engine ``NVTE_CHECK`` / ``NVTE_ERROR`` (``transformer_engine/common/util/logging.h``):
  ``FILE:LINE in function FN: Assertion failed: COND. MESSAGE`` / ``FILE:LINE in function FN: MESSAGE``;
- DeepEP ``EP_HOST_ASSERT`` / ``CUDA_CHECK`` (``csrc/kernels/exception.cuh``, class ``EPException``):
  ``Failed: Assertion error FILE:LINE 'COND'`` / ``Failed: CUDA error FILE:LINE 'ERROR'``, and
  ``EP_DEVICE_ASSERT``'s ``Assertion failed: FILE:LINE, condition: COND``; DeepEP V2's ``EPException``
  (``deep_ep/include/deep_ep/common/exception.cuh``): ``NAME exception (FILE:LINE): ERROR`` for
  ``EP_HOST_ASSERT`` (NAME ``Assertion``, ERROR the condition), ``CUDA_RUNTIME_CHECK`` / ``CUDA_DRIVER_CHECK``
  (``CUDA runtime`` / ``CUDA driver``: ``N (NAME, TEXT)``), ``NCCL_CHECK`` (``NCCL``: ``N (ncclGetLastError)``,
  N read as its ``ncclResult_t`` name) and any other NAME (``EPExceptionWithLineInfo``); an assert condition
  of the form ``COND and "MESSAGE"`` is read as its condition and its message;
- HybridEP's ``CUDA_CHECK`` / ``CU_CHECK`` (``csrc/hybrid_ep/utils.cuh``): ``... file=FILE, line=LINE,
  call='CALL', Reason=NAME:TEXT`` / ``... file=FILE line=LINE, call='CALL' Reason=TEXT.``, and the line
  with only ``call='CALL' Reason=TEXT`` (the call then names the check);
- NVSHMEM's error macros (``src/include/non_abi/nvshmemx_error.h``), on a path that is NVSHMEM's:
  ``NVSHMEMI_ERROR_PRINT`` ``FILE:FUNCTION:LINE: MESSAGE`` and the ``*_ERROR_JMP`` family ``FILE:LINE:
  non-zero status: N MESSAGE`` / ``error status: N MESSAGE`` / ``NULL value MESSAGE``; NVSHMEM prints one
  such line per function the error passes through, so the first is where it began and the later ones are
  named at ``FOLLOW_CONFIDENCE`` (also when a signature names the first);
- torch's ``C10D_NCCL_CHECK`` (``torch/csrc/distributed/c10d/NCCLUtils.hpp``) around an NCCL call:
  ``NCCL error in: FILE:LINE, NCCL_ERROR_STRING, NCCL version X``;
- a C ``assert`` in any native code (glibc's ``__assert_fail``): ``PROGRAM: FILE:LINE: FUNCTION: Assertion
  `COND' failed.`` (the ``FILE:LINE:`` may be wrapped onto the line before), its library read from the
  file's path (HybridEP's ``csrc/hybrid_ep/...`` is DeepEP's), else "native code".

A DeepEP ``Failed: ... error FILE:LINE`` line whose quoted part a paste wrapped onto the next line is read
joined. A CUDA check's error that names a ``cudaError_t`` (by name, or by its ``cudaGetErrorString`` text) adds
that error's meaning and fix from its runtime-error row (``signatures.runtime``).

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
from .signatures.runtime import CUDA_ERRORS
from .signatures.runtime import SIGNATURES as RUNTIME_SIGNATURES
from .sources import join

MAX_CHECKS = 8
BY_PATH = ""
"""The library of a format any C/C++ code prints (a failed C ``assert``): read from the file's path."""
_SOURCE = r"(?<![^\s'\"(=])(?P<file>[^\s'\":]+\.(?:cu|cuh|cpp|cc|c|h|hpp))"
"""A source path from the start of its token, without a colon: one search per start, never backtracking across
a long line (a path never holds ':' in these formats, the line number follows the first one)."""
_NVSHMEM_FILE = r"(?<![^\s'\"(=])(?P<file>[^\s'\":]*nvshmem[^\s'\":]*\.(?:cpp|cu|cuh|c|h))"
FORMATS: tuple[tuple[str, str, re.Pattern], ...] = (
    ("transformer-engine", "NVTE_CHECK", re.compile(
        _SOURCE + r":(?P<line>\d{1,9}) in function (?P<function>[\w:~<>()]+): Assertion failed: (?P<condition>.+?)\."
                  r"(?: (?P<message>.*?))?\s*$")),
    ("transformer-engine", "NVTE_ERROR", re.compile(  # an exception's text: NVTE_WARN prints the same format
        r"(?:Error|what\(\)):\s+" + _SOURCE + r":(?P<line>\d{1,9}) in function (?P<function>[\w:~<>()]+): (?P<message>.+?)\s*$")),
    ("deep-ep", "EP_HOST_ASSERT", re.compile(r"Failed: Assertion error " + _SOURCE + r":(?P<line>\d{1,9}) '(?P<condition>.*)'")),
    ("deep-ep", "CUDA_CHECK", re.compile(r"Failed: CUDA error " + _SOURCE + r":(?P<line>\d{1,9}) '(?P<message>.*)'")),
    ("deep-ep", "EP_DEVICE_ASSERT", re.compile(
        r"Assertion failed: " + _SOURCE + r":(?P<line>\d{1,9}), condition: (?P<condition>.+?)\s*$")),
    ("nccl", "C10D_NCCL_CHECK", re.compile(
        r"NCCL error in: " + _SOURCE + r":(?P<line>\d{1,9}), (?P<message>.+?)(?:, NCCL version (?P<version>[\w.+-]+))?\s*$")),
    ("deep-ep", "EPException", re.compile(  # V2: name << " exception (" << file << ":" << line << "): " << error
        r"(?P<name>Assertion|CUDA runtime|CUDA driver|NCCL|Dispatch CPU wait|Combine CPU wait) exception \(" + _SOURCE
        + r":(?P<line>\d{1,9})\): (?P<message>.+?)\s*$")),
    ("deep-ep", "HybridEP CU_CHECK", re.compile(  # "CU error encountered at: file=%s line=%d, call='%s' Reason=%s."
        r"(?:(?:CUDA|CU) error encountered at: file=" + _SOURCE + r",? line=(?P<line>\d{1,9}), )?"
        r"call='(?P<call>[^']+)',? Reason=(?P<message>.+?)\.?\s*$")),
    ("nvshmem", "NVSHMEMI_ERROR_JMP", re.compile(
        _NVSHMEM_FILE + r":(?P<line>\d{1,9}): (?P<status>(?:non-zero|error) status: -?\d+"
        r"(?:: [^,]*?, exiting\.\.\.)?|NULL value) ?(?P<message>.*?)\s*$")),
    ("nvshmem", "NVSHMEMI_ERROR_PRINT", re.compile(
        _NVSHMEM_FILE + r":(?P<function>[A-Za-z_]\w*):(?P<line>\d{1,9}): (?!(?:warning|note|error|fatal error):)"
        r"(?P<message>.+?)\s*$")),
    (BY_PATH, "assert", re.compile(  # glibc's __assert_fail: "%s%s%s:%u: %s%sAssertion `%s' failed."
        _SOURCE + r":(?P<line>\d{1,9}):\s*(?:(?P<function>[^`]+?):\s+)?Assertion `(?P<condition>.+)' failed\.")),
)
"""(library, macro, the expression that reads its format), most specific first."""

ROOTS = {"transformer-engine": ("transformer_engine/",), "deep-ep": ("csrc/", "deep_ep/include/"),
         "nccl": ("torch/csrc/",), "nvshmem": (), "native code": ()}
"""Where a library's file path starts, so that two builds' absolute paths name the same check."""
_NVSHMEM_ROOT = re.compile(r".*nvshmem[^/]*/(?:.*?/)??(src/.+)$")
"""NVSHMEM's ``src/...`` after its source folder (``.../main_nvshmem/src/host/...``, ``/repo/nvshmem_src/src/...``)."""
_PATH_LIBRARIES = (("transformer-engine", "transformer_engine"), ("deep-ep", "deep_ep"), ("deep-ep", "deepep"),
                   ("deep-ep", "hybrid_ep"), ("nccl", "/nccl"))
"""(library, a part of a source path that only its sources have), first match wins; else "native code"."""
_QUOTE_HEAD = re.compile(r"Failed: (?:Assertion|CUDA) error " + _SOURCE + r":\d{1,9}\s*$")
"""DeepEP's ``EPException`` line whose quoted part a paste wrapped onto the next line."""
_QUOTE_TAIL = re.compile(r"^\s*'.*'\s*$")
_WRAPPED_ASSERT = re.compile(r"^\s*(?:[^`]+?:\s+)?Assertion `.+' failed\.")
"""A C ``assert`` message whose ``FILE:LINE:`` a log wrapped onto the line before it."""
_UNREACHABLE = re.compile(r'^false\s*(?:and|&&)\s*"?(.*?)"?$')
"""``EP_HOST_ASSERT(false and "Unsupported RDMA ranks")``: a branch the code does not support."""
_FAILED_CALL = re.compile(r"^(CUDA|cuBLAS|cuDNN|NVRTC|cuBLASMp|MPI) [Ee]rror: ")
_COND_AND_MESSAGE = re.compile(r'^(?P<cond>.+?)\s+(?:and|&&)\s*"(?P<message>.*)"$', re.S)
"""DeepEP V2's ``EP_HOST_ASSERT(x != NONE and "NCCL GIN is unavailable ...")``: a condition with its message."""
NCCL_RESULTS = ("ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
                "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress")
"""``ncclResult_t`` in NCCL's ``nccl.h`` (0..7), the number DeepEP V2's ``NCCL_CHECK`` prints."""
_HINT = re.compile(r"(?i:\b(?:try|please|consider)\s+)?\b(?i:set(?:ting)?|increas(?:e|ing)|export(?:ing)?|rais(?:e|ing))\s+(?i:the\s+)?"
                   r"[A-Z][A-Z0-9]*_[A-Z0-9_]+\b[^.;]*")
"""A message that itself names the setting to change ("try setting NVSHMEM_MAX_TEAMS environment variable")."""
_CALLED = re.compile(r"^(?P<name>[A-Za-z_][\w:]*)\s*\(")


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
        return f"{self.file}:{self.line}" if self.file else f"the call {self.function}"

    @property
    def requires(self) -> str:
        if m := _UNREACHABLE.match(self.condition):
            return f"a case it supports (it reached one it does not: {m.group(1)})"
        if self.condition:
            return self.condition
        if self.macro in ("CUDA_CHECK", "CUDA_RUNTIME_CHECK"):
            return f"the CUDA call to return cudaSuccess (it returned: {self.message})"
        if self.macro == "CUDA_DRIVER_CHECK":
            return f"the CUDA driver call to return CUDA_SUCCESS (it returned: {self.message})"
        if self.macro in ("C10D_NCCL_CHECK", "NCCL_CHECK"):
            return f"the NCCL call to return ncclSuccess (it returned: {self.message})"
        if self.macro == "HybridEP CU_CHECK":
            return f"{self.function} to succeed ({self.message})"
        if self.macro.startswith("NVSHMEMI_"):
            return f"what NVSHMEM's message says ({self.message})"
        if m := _FAILED_CALL.match(self.message):
            return f"the {m.group(1)} call to succeed (it returned: {self.message[m.end():]})"
        return f"what its message says ({self.macro} raises without a condition)"


def parse(text: str) -> NativeCheck | None:
    """The native check a line reports, or None."""
    for library, macro, pattern in FORMATS:
        if m := pattern.search(text):
            g = m.groupdict()
            path = (g.get("file") or "").rsplit(":", 1)[-1]
            if library == BY_PATH:
                lowered = path.lower()
                library = next((lib for lib, part in _PATH_LIBRARIES if part in lowered), "native code")
            file = _from_root(library, path)
            condition, message = (g.get("condition") or "").strip(), (g.get("message") or "").strip()
            macro, function = _macro(macro, g), g.get("function") or ""
            if macro == "EP_HOST_ASSERT" and g.get("name"):  # V2: the error text is the stringified condition
                condition, message = message, ""
            if macro == "NCCL_CHECK" and (n := re.match(r"(\d{1,9}) \((.*)\)$", message)):
                code = int(n.group(1))
                name = NCCL_RESULTS[code] if code < len(NCCL_RESULTS) else f"ncclResult_t {code}"
                message = f"{code} = {name}: {n.group(2)}"
            if g.get("status"):
                message = f"{g['status']} {message}" if message else g["status"]
            if g.get("call"):
                function = (_CALLED.match(g["call"]) or re.match(r"(.*)", g["call"])).group(1)
                message = f"{g['call']} returned {message}"
            if (m2 := _COND_AND_MESSAGE.match(condition)) and not _UNREACHABLE.match(condition):
                condition, message = m2.group("cond").strip(), m2.group("message")
            if not g.get("file"):  # HybridEP's line without its file: the call names the check
                return NativeCheck(library, macro, "", 0, function, condition, message)
            return NativeCheck(library, macro, file, int(g["line"]), function, condition, message,
                               g.get("version") or "")
    return None


def _from_root(library: str, path: str) -> str:
    """The path from the library's source root (the same check in two builds has one name)."""
    if library == "nvshmem" and (m := _NVSHMEM_ROOT.match(path)):
        return m.group(1)
    return next((root + path.split(root, 1)[1] for root in ROOTS[library] if root in path), path.rsplit("/", 1)[-1])


def _macro(macro: str, g: dict) -> str:
    """The macro a V2 ``EPException`` line came from, by the name it prints."""
    if macro != "EPException":
        return macro
    return {"Assertion": "EP_HOST_ASSERT", "CUDA runtime": "CUDA_RUNTIME_CHECK", "CUDA driver": "CUDA_DRIVER_CHECK",
            "NCCL": "NCCL_CHECK"}.get(g["name"], f"EPException ({g['name']})")


class NativeChecks:
    def __init__(self) -> None:
        self.checks: list[tuple[NativeCheck, str, str]] = []
        """(check, where, the line), first seen first."""
        self._previous = ""

    def feed(self, text: str, where: str) -> None:
        previous, self._previous = self._previous, text
        if _QUOTE_TAIL.match(text) and "Failed: " in previous and _QUOTE_HEAD.search(previous):
            text = join(previous, text)
        if " in function " not in text and "Failed: " not in text and "Assertion failed: " not in text \
                and "NCCL error in: " not in text and "' failed." not in text and " exception (" not in text \
                and "Reason=" not in text and "nvshmem" not in text:
            return
        c = parse(text)
        if c is None and _WRAPPED_ASSERT.match(text):
            text = join(previous, text)
            c = parse(text)
        if c and len(self.checks) < MAX_CHECKS and all((c.library, c.where) != (o.library, o.where)
                                                       for o, _, _ in self.checks):
            self.checks.append((c, where, text.strip()))


FOLLOW_CONFIDENCE = 0.45
"""An NVSHMEM error line after the first one: NVSHMEM prints one per function the error passes through, so it
follows from the first (named above it, by this reader or by a signature)."""


def findings(checks: list[tuple[NativeCheck, str, str]], facts: dict[str, dict],
             chain_named: tuple[str, ...] = ()) -> list[Finding]:
    """One finding per check (module docstring); ``chain_named``: the libraries whose first error line of a
    chain a signature already names, so that their lines here follow from it."""
    out = []
    seen_first = set(chain_named)
    for c, where, line in checks:
        version = _version(c, facts)
        in_fn = f" in function {c.function}" if c.function else ""
        said = f": {c.message.rstrip('.')}" if c.message and c.condition else ""
        hint = _HINT.search(c.message)
        told = f"its message says what to change: {hint.group(0).rstrip('.')}; " if hint else ""
        sig = dataclasses.replace(
            NATIVE_CHECK, id=f"{NATIVE_CHECK.id}:{c.library}:{c.where}",
            cause=f"{c.library}'s check at {c.where}{in_fn} failed ({c.macro}): it requires {c.requires}{said}.",
            fix=f"{told}the check in {c.library} {c.where} requires {c.requires}: change what the run passes it, or use "
                f"a {c.library} release whose check accepts it; the run's version: {version}",
            source=f"{c.library}:{c.where}", emitted=(line,), versions=version)
        if c.library == "nvshmem":
            if c.library in seen_first:
                sig = dataclasses.replace(sig, confidence=FOLLOW_CONFIDENCE,
                                          cause=sig.cause + " It follows from the first NVSHMEM error of the log.")
            seen_first.add(c.library)
        meaning = _cuda_meaning(c)
        if meaning:
            said_more = _LIBRARY_WORDS.get((c.library, meaning.id), "")
            sig = dataclasses.replace(sig, cause=f"{sig.cause} {meaning.cause}{said_more}", fix=f"{meaning.fix}; {sig.fix}",
                                      confidence=max(sig.confidence, meaning.confidence))
        f = Finding(sig)
        f.add(f"{where}: {line[:300]}")
        f.detail.append(f"native check: {c.library} {c.where}{in_fn}: {c.macro}, requires {c.requires}"
                        + (f"; message: {c.message}" if c.message and c.condition else ""))
        if meaning:
            f.detail.append(f"the CUDA error: {meaning.id} ({_cuda_name(c)})")
        out.append(f)
    return out


_LIBRARY_WORDS = {
    ("deep-ep", "cuda-peer-access"):
        " DeepEP's intranode buffers open every local peer's buffer with cudaIpcOpenMemHandle "
        "(cudaIpcMemLazyEnablePeerAccess; csrc/deep_ep.cpp, Buffer::sync through SharedMemoryAllocator::open_mem_handle), "
        "so every pair of GPUs of a node needs peer access: on a host where only some pairs have it (PCIe GPUs "
        "behind different switches) DeepEP's normal kernels cannot run there; use the alltoall dispatcher on such hosts.",
}
"""What a CUDA error means for one library's check, said after the error's general meaning."""


def _cuda_name(c: NativeCheck) -> str:
    """The ``cudaError_t`` a CUDA check's message names: its enum name when printed, else the one whose
    ``cudaGetErrorString`` text it is (``signatures.runtime.CUDA_ERRORS``); '' for other checks."""
    if c.macro not in ("CUDA_CHECK", "CUDA_RUNTIME_CHECK") or not c.message:
        return ""
    for name, (code, text, _) in CUDA_ERRORS.items():
        if name in c.message or c.message.strip().strip("'").rstrip(".") == text:
            return name
    return ""


def _cuda_meaning(c: NativeCheck):
    """The runtime-error row for the CUDA error a check reports (cause and fix in the user's terms), or None."""
    name = _cuda_name(c)
    row = CUDA_ERRORS[name][2] if name else None
    return next((s for s in RUNTIME_SIGNATURES if s.id == row), None) if row else None


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
