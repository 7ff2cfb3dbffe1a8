"""The command-line reference, read from the argument parsers and the environment-variable registry.

Contract: ``cli_page(root)`` is ``docs/cli.md``: the ``--help`` of ``mbridge-ep-overlap`` and of each
of its subcommands and theirs (``bench run|report|tune``; from ``tools.cli.build_parser``), of each script in ``scripts/*.py`` that runs a
``main`` of this package (found by reading the script: the module it imports ``main`` from, and the
subcommand it passes, as ``benchmark_ep_overlap.py`` does with ``bench run``), then every ``EP_OVERLAP_*``
variable of ``base.env_vars``. Help is formatted at a fixed width so the page does not depend on the
terminal. Nothing is listed by hand here; building the parsers imports neither torch nor Megatron.
"""

from __future__ import annotations

import argparse
import ast
import importlib
from pathlib import Path

from ..base.env_vars import GPU_SCRIPTS, GPU_TESTS, LIBRARY, UNIT_TESTS, VARIABLES
from . import cli

WIDTH = 100
PROGRAM = "mbridge-ep-overlap"


def cli_page(root: Path) -> str:
    out = ["# Command-line reference", "",
           f"`{PROGRAM}` (also `python -m mbridge_ep_overlap`) and the scripts, as their `--help` prints them;",
           "then the environment variables. Exit codes everywhere: 0 ok, 1 refused (every violation listed),",
           "2 bad usage (one line on stderr).", ""]
    parser = cli.build_parser()
    out += _section(f"## {PROGRAM}", parser)
    for name, sub in _subcommands(parser).items():
        out += _section(f"### {PROGRAM} {name}", sub)
        for inner, leaf in _subcommands(sub).items():
            out += _section(f"#### {PROGRAM} {name} {inner}", leaf)
    for script, module, argv in scripts(root):
        if module == cli.__name__:
            out += [f"## {script}", "", f"Runs `{PROGRAM} {' '.join(argv)}`: the same flags "
                    f"([{PROGRAM} {' '.join(argv)}](#{'-'.join([PROGRAM, *argv])})).", ""]
            continue
        out += _section(f"## {script}", importlib.import_module(module).build_parser())
    out += _environment()
    return "\n".join(out).rstrip("\n") + "\n"


def scripts(root: Path) -> list[tuple[str, str, list[str]]]:
    """(path, module, leading arguments) of each ``scripts/*.py`` whose ``main`` is one of ours and
    whose module builds a parser (or is the command line itself)."""
    found = []
    for path in sorted((root / "scripts").glob("*.py")):
        tree = ast.parse(path.read_text())
        module = next((n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                       and n.module.startswith("mbridge_ep_overlap.") and any(a.name == "main" for a in n.names)), None)
        if module is None:
            continue
        argv = next(([e.value for e in c.args[0].elts if isinstance(e, ast.Constant)]
                     for c in ast.walk(tree) if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "main"
                     and c.args and isinstance(c.args[0], ast.List)), [])
        if module == cli.__name__ or hasattr(importlib.import_module(module), "build_parser"):
            found.append((path.relative_to(root).as_posix(), module, argv))
    return found


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of ``parser`` by name (none for a command without subcommands)."""
    action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return dict(action.choices) if action is not None else {}


def _section(heading: str, parser: argparse.ArgumentParser) -> list[str]:
    return [heading, "", "```text", help_text(parser).rstrip("\n"), "```", ""]


def help_text(parser: argparse.ArgumentParser) -> str:
    """``parser.format_help()`` at ``WIDTH`` columns, whatever the terminal."""
    original = parser.formatter_class
    parser.formatter_class = lambda prog: original(prog, width=WIDTH, max_help_position=32)
    try:
        return parser.format_help()
    finally:
        parser.formatter_class = original


def _environment() -> list[str]:
    out = ["## Environment variables", "",
           "Every `EP_OVERLAP_*` variable the package, the scripts and the tests read "
           "(`mbridge_ep_overlap.base.env_vars`).", ""]
    for where in (LIBRARY, GPU_SCRIPTS, GPU_TESTS, UNIT_TESTS):
        rows = [v for v in VARIABLES if v.where == where]
        if not rows:
            continue
        out += [f"### Read by {where}", "", "| variable | default | meaning |", "|---|---|---|"]
        out += [f"| `{v.name}` | {v.default} | {v.meaning} |" for v in rows]
        out.append("")
    return out
