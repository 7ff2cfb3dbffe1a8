"""Silent fallbacks in general: a warning of the installed Megatron-Core / Megatron-Bridge that says the run
goes on with something other than what was asked, named from its place in the source.

Contract
--------
``warnings_in_source()`` scans the installed ``megatron/core`` and ``megatron/bridge`` source that decides
what an MoE / EP-overlap run computes (``SCOPE``; the files ``upstream_source.sources()`` reads, once per
process, when a log line first carries a fallback word) for the warnings whose literal text says a fallback
(``FALLBACK_WORDS``: "falling back", "fall back", "disabling", "non-fused path", ...) issued through
``warnings.warn``, ``logger.warning`` / ``logging.warning``, ``log_single_rank(..., logging.WARNING, ...)``
or ``warning_rank_0``: file, line, the function, the ``if`` it is issued under (what made the code fall
back), the literal text and a pattern (placeholders match anything). ``FallbackLines.feed(text, where)``
keeps the log lines that carry one of those words; ``findings(fallbacks, named)`` gives one
``upstream-fallback:FILE:LINE`` finding (``signatures.fallback.UPSTREAM_FALLBACK``) per warning found in
them that no hand-written signature already names (``named``: their evidence lines). Never raises for
what is in the lines; a file that cannot be parsed is skipped.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from dataclasses import dataclass

from . import upstream_source
from .report import Finding
from .signatures.fallback import UPSTREAM_FALLBACK

FALLBACK_WORDS = re.compile(r"[Ff]all(?:ing|s)? ?back|[Dd]isabling |will be disabled|non-fused path|"
                            r"[Uu]sing the unfused|[Rr]everting to")
SCOPE = re.compile(r"megatron/core/transformer/(?:moe/|transformer_layer\.py)|megatron/core/extensions/transformer_engine"
                   r"\.py|megatron/bridge/training/(?:flex_dispatcher_backend|comm_overlap)\.py|megatron/bridge/utils/fusions\.py")
"""The files whose fallbacks change what an MoE / EP-overlap run computes or overlaps (MoE layers, token
dispatchers, the transformer layer, TE's wrappers, MB's dispatcher choice, overlap and fusion settings); a
fallback elsewhere (an optimizer or a norm without Apex) is not an EP-overlap finding."""
_WARN_CALLS = {"warn", "warning", "warn_once", "warning_once", "warning_rank_0", "log_single_rank"}
MAX_LINES = 32


@dataclass(frozen=True)
class Fallback:
    file: str
    line: int
    function: str
    condition: str
    """The ``if`` the warning is issued under, as Python source ('(unconditional)' at the top of a function)."""
    literal: str
    pattern: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@functools.lru_cache(maxsize=1)
def warnings_in_source() -> tuple[Fallback, ...]:
    found: list[Fallback] = []
    for rel, text in upstream_source.sources():
        if SCOPE.search(rel) and FALLBACK_WORDS.search(text):
            tree = upstream_source.parsed(rel)
            if tree is not None:
                found += _file_fallbacks(tree, rel)
    return tuple(found)


def _file_fallbacks(tree: ast.AST, rel: str) -> list[Fallback]:
    out: list[Fallback] = []

    def visit(node: ast.AST, guard: str, function: str) -> None:
        if isinstance(node, ast.Call) and _is_warning(node):
            for arg in node.args:
                parts = upstream_source._parts(arg)
                literal = "".join("..." if p is None else p for p in parts or [])
                if parts and FALLBACK_WORDS.search(literal):
                    pattern = "".join(".*?" if p is None else re.escape(p.strip() if i in (0, len(parts) - 1) else p)
                                      for i, p in enumerate(parts))
                    out.append(Fallback(rel, node.lineno, function, guard or "(unconditional)", literal.strip(), pattern))
                    break
        if isinstance(node, ast.If):
            visit(node.test, guard, function)
            for child in node.body:
                visit(child, ast.unparse(node.test), function)
            for child in node.orelse:
                visit(child, guard if upstream_source._is_elif(node) else upstream_source._negated(node.test), function)
            return
        named = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for child in ast.iter_child_nodes(node):
            visit(child, "" if named else guard, node.name if named else function)

    visit(tree, "", "")
    return out


def _is_warning(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name == "log_single_rank":  # log_single_rank(logger, logging.WARNING, msg)
        return len(call.args) >= 3 and "WARNING" in ast.unparse(call.args[1])
    return name in _WARN_CALLS


@functools.lru_cache(maxsize=None)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern, re.DOTALL)


def find(line: str) -> Fallback | None:
    """The installed warning a log line carries (the one with the most literal text first), else None."""
    hits = [f for f in warnings_in_source() if _compiled(f.pattern).search(line)]
    return max(hits, key=lambda f: len(f.literal), default=None)


class FallbackLines:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        """(where, the line) of each line with a fallback word, first seen first."""

    def feed(self, text: str, where: str) -> None:
        if len(self.lines) < MAX_LINES and FALLBACK_WORDS.search(text):
            self.lines.append((where, text.strip()))


def findings(fallbacks: FallbackLines, named: list[str]) -> list[Finding]:
    out: dict[str, Finding] = {}
    for where, line in fallbacks.lines:
        if any(line[:120] in e for e in named):
            continue
        if (f := find(line)) is None:
            continue
        sig = dataclasses.replace(
            UPSTREAM_FALLBACK, id=f"{UPSTREAM_FALLBACK.id}:{f.where}",
            cause=f"{upstream_source.installed_version(f.file)} warned at {f.where}"
                  + (f" in {f.function}" if f.function else "") + f" and went on with a fallback: {f.literal}",
            fix=f"make the condition it falls back on false ({f.condition}), or accept the fallback knowingly; "
                "`mbridge-ep-overlap plan` shows what the run will really use",
            source=f"installed:{f.file}", emitted=(f.literal,), versions=upstream_source.installed_version(f.file))
        finding = out.setdefault(sig.id, Finding(sig))
        finding.add(f"{where}: {line[:300]}")
        if len(finding.detail) == 0:
            finding.detail.append(f"upstream warning: {f.where}: issued when {f.condition}")
    return list(out.values())
