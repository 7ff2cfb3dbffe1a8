"""The reference text of the rules, read from the rule objects themselves.

Contract: ``rule_text(rule)`` is one rule's section - what ``mbridge-ep-overlap rule ID`` prints and
``docs/rules.md`` holds, character for character; ``rules_page()`` is the whole page (an index table,
then one section per rule of ``RULES``, in the engine's order). Nothing here is kept by hand: the
family is the rule's module, the message and fix its docstring, the auto-fix its edit function's
docstring, the upstream check the rule's ``upstream`` and its location is found in the installed
package's own source (the function ``Upstream.source`` names, parsed with ``ast``, never imported;
the line where the rule's ``upstream_match`` pattern first matches inside it, when it does). A rule
that records no upstream check says "none recorded". Importing this module loads no Megatron package.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from ..core.rules import RULES, Rule, Upstream

PAGE_TITLE = "# Rules"


def rule_text(rule: Rule) -> str:
    """One rule's section, in Markdown that reads as plain text in a terminal."""
    auto = _auto_fix_text(rule)
    lines = [
        f"## {rule.id}",
        "",
        f"{rule.message}.",
        "",
        f"- **Family:** {rule.family.value} (`{rule.check.__module__}`)",
        f"- **Severity:** {rule.severity.value}",
        f"- **Applies when:** {rule.when.value}",
        f"- **Field:** `{rule.field}`",
        f"- **Required:** {rule.required}",
        f"- **Message:** {rule.message}",
        f"- **Fix:** {rule.fix}",
        f'- **Fixed by `resolve="auto"`:** {auto}',
    ]
    if rule.sanity:
        lines.append("- **Checked first:** yes (a value's type or range, before the other rules)")
    lines += [f"- **Upstream check mirrored:** {_upstream_text(rule)}",
              f"- **Upstream source:** {upstream_location(rule)}"]
    if rule.upstream_match:
        lines.append(f"- **Upstream message pattern (parity-tested):** `{rule.upstream_match}`")
    return "\n".join(lines) + "\n"


def rules_page() -> str:
    """``docs/rules.md``: how to read it, the index, then every rule's section."""
    head = [
        PAGE_TITLE, "",
        "Every constraint `enable_ep_overlap` and the finalize check enforce, one section per rule, in the",
        "order the engine evaluates them. `mbridge-ep-overlap rule ID` prints one section; a refusal line",
        "ends with where to read more. The upstream source is a location in the installed",
        "megatron-core / megatron-bridge (a path under site-packages): the function the rule's upstream",
        "check lives in and, where the rule's parity-tested message pattern matches a line of it, that line.",
        "", f"{len(RULES)} rules.", "",
        "| id | family | severity | applies when | field | upstream |",
        "|---|---|---|---|---|---|",
    ]
    head += [f"| [{r.id}](#{r.id}) | {r.family.value} | {r.severity.value} | {r.when.value} | `{r.field}` | "
             f"{_upstream_short(r)} |" for r in RULES]
    return "\n".join(head) + "\n\n" + "\n".join(rule_text(r) for r in RULES)


def upstream_location(rule: Rule) -> str:
    """``path:line (qualified name)`` of the upstream check in the installed package, or why there is none."""
    source = rule.upstream.source
    if source is None:
        return "none recorded"
    path, qualname = source
    found = _function_lines(path, qualname)
    if found is None:
        return f"`{path}` `{qualname}` (not found in the installed package)"
    start, end, lines = found
    where = f"`{path}:{start}` (`{qualname}`)"
    if rule.upstream_match:
        pattern = re.compile(rule.upstream_match)
        hits = [n for n, text in enumerate(lines, 1) if pattern.search(text)]
        inside = [n for n in hits if start <= n <= end]
        if inside:
            where += f"; the message pattern matches at line {inside[0]}"
        elif hits:  # the check calls a helper of the same module
            where += f"; the message pattern matches at `{path}:{hits[0]}`"
    return where


def _upstream_text(rule: Rule) -> str:
    if rule.upstream is Upstream.NONE:
        return "none: a failure upstream does not check (it would run wrong, hang or silently do less)"
    return rule.upstream.value


def _upstream_short(rule: Rule) -> str:
    return rule.upstream.name.lower().replace("_", " ") if rule.upstream is not Upstream.NONE else "none"


def _auto_fix_text(rule: Rule) -> str:
    if rule.auto_fix is None:
        return "no (only the user can fix it)"
    doc = " ".join((rule.auto_fix.__doc__ or "").split()).rstrip(".")
    return f"yes: {doc}" if doc else "yes (the edits are computed from the config)"


@lru_cache(maxsize=None)
def _function_lines(path: str, qualname: str) -> tuple[int, int, tuple[str, ...]] | None:
    """(first line, last line, the file's lines) of ``qualname`` in ``path`` under the installed
    ``megatron`` package."""
    spec = importlib.util.find_spec("megatron")  # a namespace package: finding it imports nothing
    roots = [Path(p).parent for p in (spec.submodule_search_locations or [])] if spec else []
    file = next((r / path for r in roots if (r / path).is_file()), None)
    if file is None:
        return None
    text = file.read_text()
    node: ast.AST | None = ast.parse(text)
    for name in qualname.split("."):
        node = next((n for n in getattr(node, "body", []) if isinstance(n, (ast.ClassDef, ast.FunctionDef))
                     and n.name == name), None)
        if node is None:
            return None
    return node.lineno, node.end_lineno or node.lineno, tuple(text.splitlines())
