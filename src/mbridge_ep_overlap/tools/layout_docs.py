"""``docs/layout.md``: the package's modules, each with the first line of its docstring.

Contract: ``layout_page(root)`` lists every ``.py`` file under ``root/src/mbridge_ep_overlap`` as a tree
(folders first in name order, then files), each with its module docstring's first line, read with
``ast`` (nothing is imported). ``tools.gen_docs`` writes and checks the page.
"""

from __future__ import annotations

import ast
from pathlib import Path

NAME_WIDTH = 25


def _first_line(path: Path) -> str:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text()))
    except (SyntaxError, UnicodeDecodeError):
        return "(not parseable)"
    return doc.strip().splitlines()[0] if doc else ""


def _tree(folder: Path, depth: int) -> list[str]:
    indent = "  " * depth
    lines = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and any(p.rglob("*.py"))):
        if sub.name == "__pycache__":
            continue
        lines.append(f"{indent}{sub.name}/")
        lines += _tree(sub, depth + 1)
    for file in sorted(folder.glob("*.py")):
        lines.append(f"{indent}{file.name:{NAME_WIDTH}s}{_first_line(file)}".rstrip())
    return lines


def layout_page(root: Path) -> str:
    package = root / "src" / "mbridge_ep_overlap"
    return "\n".join(["# Layout of `src/mbridge_ep_overlap/`", "",
                      "Each line is the first line of the module's docstring; where to start reading, and the",
                      "direction imports go: `docs/architecture.md`.", "", "```", "mbridge_ep_overlap/",
                      *_tree(package, 1), "```", ""])
