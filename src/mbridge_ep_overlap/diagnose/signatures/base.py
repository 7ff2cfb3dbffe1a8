"""The ``Signature`` row and the symptom classes (see the package docstring)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from re import _constants as _sre  # the parser's opcodes (Python 3.12)
from re import _parser as _sre_parse
from typing import Callable

# The symptom classes, in the order the report and the troubleshooting page list them.
SYMPTOMS = {
    "config-error": "upstream assertion or config error",
    "hang": "hang",
    "crash": "crash signal",
    "numerics": "wrong numerics",
    "fallback": "silent fallback",
    "no-speedup": "no speed-up",
    "hardware": "unsupported hardware",
    "install": "install or build",
    "oom": "out of memory",
}


DEEPEP_AT = "deepseek-ai/DeepEP@9af0e0d0e74f3577af1979c9b9e1ac2cad0104ee"
"""DeepEP v1.2.1, where the DeepEP source lines the signatures quote are (``Signature.quoted_at``)."""
HYBRID_EP_AT = "deepseek-ai/DeepEP@94a9f8f6b146c07d97ec58f67cd6d303296d6098"
"""DeepEP's hybrid-ep branch (HybridEP)."""
DEEPEP_V2_AT = "deepseek-ai/DeepEP@dd758caf451848bd150e1046af3d0a73e5fff38d"
"""DeepEP main with the V2 (elastic / NCCL GIN) buffers and V2's ``EPException`` format."""



TE_AT = "NVIDIA/TransformerEngine@27486e03cfc1fa41f6932dcecdc47c71c47eac3e"
"""Transformer Engine v2.18, where the newest wording of the TE messages the signatures match is."""


def github_blob(at: str, path: str) -> str:
    """The URL of ``path`` at ``owner/repo@commit``."""
    repo, commit = at.split("@")
    return f"https://github.com/{repo}/blob/{commit}/{path}"


FOUND_BY = ("patterns", "numerics", "flight-recorder", "watchdog", "facts", "crash", "runs", "upstream-source",
            "native-check", "traceback", "attention-backend",
            "attribute-error", "py-spy", "launcher", "import-error", "runtime-error", "static-assert", "type-error",
            "passed-keyword", "extension-call", "error-directive", "device-link",
            "none-section", "divisibility", "name-error", "kernel-limit", "value-check", "header-api", "ptxas",
            "conversion", "rank-norms", "mismatch", "unpacking", "capability-gate",
            "state-dict-shape")


@dataclass(frozen=True, kw_only=True)
class Signature:
    id: str
    """Stable name, kebab-case, shown in reports and docs/troubleshooting.md."""
    symptom: str
    """A key of SYMPTOMS."""
    patterns: tuple[str, ...]
    """Regular expressions (case-sensitive); a line matching any one is evidence."""
    cause: str
    fix: str
    source: str
    """Upstream issue / PR URL, or ``installed:<package path>`` for text read from the installed package."""
    emitted: tuple[str, ...]
    """Text upstream really emits, one line each; every one must match a pattern (parity)."""
    confidence: float
    """How sure one match makes us that this is the cause, 0..1."""
    rule: str | None = None
    """Id of the rule in ``core.rules`` that refuses this configuration before the run."""
    versions: str = "all known"
    """Which upstream versions print it (as the source says)."""
    corpus_report: str | None = None
    """For text of packages not installed here (DeepEP, NVSHMEM, TE kernels): the id of the failure report
    (``tests/unit/fixtures/failure_reports``) whose verbatim log holds ``emitted``; its URL is ``source``."""
    quote: str = ""
    """For text of a package not installed here: the upstream source line that prints or raises it, verbatim
    (a ``printf`` / ``throw`` / ``EP_HOST_ASSERT`` line); the parity test checks that it renders ``emitted``."""
    quoted_at: str = ""
    """Where ``quote`` is: ``owner/repo@commit:file:line``."""
    excerpts: tuple[str, ...] = ()
    """For text of a package not installed here (Transformer Engine): the upstream lines that raise or print it,
    one ``owner/repo@commit:file:first-last`` per wording (an older release's wording beside the newest); a copy of
    those few lines is kept with the tests (``tests/unit/fixtures/upstream_text``) and the parity test checks that a
    pattern matches each."""
    generic: bool = False
    found_by: str = "patterns"
    """What recognises it: "patterns" (a line of text), or the reader of structured evidence that
    raises it: "numerics" (MB's iteration lines), "flight-recorder" (torch's analyzer), "watchdog",
    "facts" (the effective facts every rank writes), "crash" (faulthandler / torchrun exit codes),
    "runs" (two runs' step times compared), "upstream-source" (an error's message found in the installed
    Megatron-Core / Megatron-Bridge source, ``diagnose.upstream_checks``), "native-check" (the line a
    C++/CUDA check macro of Transformer Engine, DeepEP or torch's NCCL wrapper prints, ``diagnose.native_checks``),
    "traceback" (the ``assert`` line a traceback's innermost frame prints, ``diagnose.raise_frames``),
    "attention-backend" (Transformer Engine's attention-backend choice and its reasons, ``diagnose.attention_backends``),
    "attribute-error" (an ``AttributeError`` on a Megatron-Core / Megatron-Bridge class or module, read against the
    installed source: who sets the attribute, and what reads it first; or one across a package boundary: Megatron
    code reading another package's object, a name another package's module lacks, ``diagnose.attribute_errors``),
    "py-spy" (the stacks ``py-spy dump`` printed for each process of a stuck job:
    where each waits, and which is not where the others are, ``diagnose.pyspy``),
    "launcher" (torchrun's failure summary: the root-cause rank, its host and exit code, and the verdict on a Slurm
    time limit from the iteration lines before it, ``diagnose.launcher``),
    "import-error" (an ``ImportError`` / ``ModuleNotFoundError``: a name or submodule the run's copy of a package
    lacks, a circular import, a package not installed, read against what is installed here,
    ``diagnose.import_errors``),
    "runtime-error" (what the CUDA runtime, a kernel's device-side assert, cuBLAS or NCCL prints when a kernel or a
    library call fails, read with the enum, status or result it names and the frames and torchrun summary around
    it, ``diagnose.runtime_errors``),
    "static-assert" (a ``static_assert`` nvcc, gcc or clang reports failed when a kernel was compiled, in a build or a
    JIT compile at run time, looked up in the known static_asserts of DeepEP, HybridEP and Transformer Engine and in the
    headers installed here, ``diagnose.static_asserts``),
    "type-error" (a ``TypeError`` raised where one package's code meets another's: the innermost frame in one package,
    the caller or the function it names in another; an argument layout of another version, ``diagnose.type_errors``)."""
    facts_pass: Callable[[dict], bool | None] | None = field(default=None, compare=False)
    """From a rank's effective facts (``base.run_files.FACT_KEYS``): False when they show this failure's
    condition (which is then what ``rule`` refuses), True when they rule it out, None where they do not say.
    A ``found_by="facts"`` signature is raised by a False."""
    facts_keys: tuple[str, ...] = ()
    """The facts shown as evidence when ``facts_pass`` raises it."""

    def __post_init__(self) -> None:
        if self.found_by not in FOUND_BY:
            raise ValueError(f"signature {self.id}: unknown reader {self.found_by!r}")
        if self.symptom not in SYMPTOMS:
            raise ValueError(f"signature {self.id}: unknown symptom class {self.symptom!r}")
        if not 0 < self.confidence <= 1:
            raise ValueError(f"signature {self.id}: confidence {self.confidence} not in (0, 1]")

    def compiled(self) -> tuple[re.Pattern, ...]:
        return _compiled(self.patterns)

    def matchers(self) -> tuple[tuple[re.Pattern, str | None], ...]:
        """Each pattern with a literal text every match of it contains (``required_literal``), or None: a line
        without that text cannot match, so a reader may skip the search."""
        return tuple((p, required_literal(p)) for p in self.compiled())


_CACHE: dict[tuple[str, ...], tuple[re.Pattern, ...]] = {}


MIN_LITERAL = 3
_LITERALS: dict[str, str | None] = {}
_ZERO_WIDTH = (_sre.AT, _sre.ASSERT, _sre.ASSERT_NOT)
_REPEATS = (_sre.MAX_REPEAT, _sre.MIN_REPEAT, _sre.POSSESSIVE_REPEAT)


def required_literal(pattern: re.Pattern) -> str | None:
    """The longest run of literal characters that every match of the pattern contains (at least ``MIN_LITERAL``
    of them), read from the pattern's parse tree: literals in sequence at the top level, inside groups and in
    the first, required turn of a repeat; zero-width items (anchors, look-arounds) keep a run going, anything
    else ends it. None for a case-insensitive pattern, a top-level alternation with no such run, or a parse
    this does not read."""
    if pattern.pattern not in _LITERALS:
        try:
            runs = [] if pattern.flags & re.IGNORECASE else _runs(_sre_parse.parse(pattern.pattern, pattern.flags))
        except Exception:  # noqa: BLE001 - a parse this reader does not know: search every line
            runs = []
        best = max(runs, key=len, default="")
        _LITERALS[pattern.pattern] = best if len(best) >= MIN_LITERAL else None
    return _LITERALS[pattern.pattern]


def _runs(seq) -> list[str]:
    out, cur = [], []
    for op, av in seq:
        if op is _sre.LITERAL:
            cur.append(chr(av))
            continue
        if op in _ZERO_WIDTH:
            continue
        out.append("".join(cur))
        cur = []
        if op is _sre.SUBPATTERN and not (av[1] & re.IGNORECASE):
            out += _runs(av[3])
        elif op in _REPEATS and av[0] >= 1:
            out += _runs(av[2])
    out.append("".join(cur))
    return out


def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern, ...]:
    if patterns not in _CACHE:
        _CACHE[patterns] = tuple(re.compile(p) for p in patterns)
    return _CACHE[patterns]

