"""Imports go one way, and a function-level import is there for start-up speed only.

* The layers (``pyproject.toml`` ``[tool.importlinter]``: tools > lab > runtime > diagnose > pipeline >
  spec > core > predict | target > base) hold for module-level AND function-level imports: this test walks the
  AST of ``src/`` (the same contract ``lint-imports`` checks in CI, without needing it installed).
* A function-level import is allowed when what it imports loads torch, Megatron, Transformer Engine,
  DeepEP or matplotlib at import time (directly, or through this package's module-level imports:
  computed here, not asserted), or when it is listed in ``DEFERRED`` with its reason.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = "mbridge_ep_overlap"
HEAVY = {"torch", "megatron", "transformer_engine", "deep_ep", "matplotlib", "transformers", "omegaconf", "apex"}

_CLI_START = "start-up: the command line parses --help and light commands without loading the rule table"
_MODEL = "start-up: the step-time model loads its calibration tables only when a prediction is asked for"
_GPU_NODE = "only on a GPU node: probing this machine (CUDA, TE, DeepEP) is deferred until a run needs it"
_RARE = "only on the path that needs it (a failure, a plot, an optional check): the common path skips it"

# (module, imported module) -> why it is imported inside a function
DEFERRED: dict[tuple[str, str], str] = {
    ("mbridge_ep_overlap", "mbridge_ep_overlap.target.shims"):
        "the package's lazy public API (PEP 562 __getattr__): importing the package loads nothing",
    ("mbridge_ep_overlap.core.dispatcher", "types"): _RARE,
    ("mbridge_ep_overlap.core.dispatcher", "mbridge_ep_overlap.core.prediction"): _MODEL,
    ("mbridge_ep_overlap.core.facts", "mbridge_ep_overlap.core.prediction"): _MODEL,
    ("mbridge_ep_overlap.core.enforcement", "inspect"): _RARE,
    ("mbridge_ep_overlap.core.rules.base", "inspect"): _RARE,
    ("mbridge_ep_overlap.core.enable", "mbridge_ep_overlap.target.simulate"): _GPU_NODE,
    ("mbridge_ep_overlap.core.engine", "mbridge_ep_overlap.target.simulate"): _GPU_NODE,
    ("mbridge_ep_overlap.core.dispatcher", "mbridge_ep_overlap.target.simulate"): _GPU_NODE,
    ("mbridge_ep_overlap.core.export", "yaml"): _RARE,
    ("mbridge_ep_overlap.target.simulate", "mbridge_ep_overlap.target.probe"): _GPU_NODE,
    ("mbridge_ep_overlap.target.simulate", "packaging.version"): _RARE,
    ("mbridge_ep_overlap.target.stack", "packaging.version"): _RARE,
    ("mbridge_ep_overlap.target.probe", "mbridge_ep_overlap.target.shims"): _GPU_NODE,
    ("mbridge_ep_overlap.target.probe", "ctypes"): _GPU_NODE,
    ("mbridge_ep_overlap.target.offline", "json"): _RARE,
    ("mbridge_ep_overlap.tools.cli", "mbridge_ep_overlap.spec"): _CLI_START,
    ("mbridge_ep_overlap.tools.cli", "mbridge_ep_overlap.lab.bench_command"): _CLI_START,
    ("mbridge_ep_overlap.tools.cli", "mbridge_ep_overlap.tools.calibrate"): _CLI_START,
    ("mbridge_ep_overlap.tools.cli", "mbridge_ep_overlap.tools.diagnose"): _CLI_START,
    ("mbridge_ep_overlap.tools.cli", "mbridge_ep_overlap.tools.doctor"): _CLI_START,
    ("mbridge_ep_overlap.tools.cli", "mbridge_ep_overlap.tools.verify_log"): _CLI_START,
    ("mbridge_ep_overlap.tools.cli", "mbridge_ep_overlap.tools.plan"): _CLI_START,
    ("mbridge_ep_overlap.tools.cli", "mbridge_ep_overlap.tools.rule"): _CLI_START,
    ("mbridge_ep_overlap.lab.bench", "mbridge_ep_overlap.core.dispatcher"): _CLI_START,
    ("mbridge_ep_overlap.lab.bench", "mbridge_ep_overlap.pipeline"): _CLI_START,
    ("mbridge_ep_overlap.lab.bench", "mbridge_ep_overlap.spec"): _CLI_START,
    ("mbridge_ep_overlap.lab.bench", "mbridge_ep_overlap.target.probe"): _GPU_NODE,
    ("mbridge_ep_overlap.lab.bench", "mbridge_ep_overlap.runtime.exits"): _CLI_START,
    ("mbridge_ep_overlap.lab.bench", "mbridge_ep_overlap.runtime.flags"): _CLI_START,
    ("mbridge_ep_overlap.tools.calibrate", "mbridge_ep_overlap.predict.cluster_calibration"): _MODEL,
    ("mbridge_ep_overlap.tools.calibrate", "mbridge_ep_overlap.predict.costs"): _MODEL,
    ("mbridge_ep_overlap.tools.calibrate", "mbridge_ep_overlap.predict.inputs"): _MODEL,
    ("mbridge_ep_overlap.lab.bench", "mbridge_ep_overlap.runtime.spec_file"): _CLI_START,
    ("mbridge_ep_overlap.tools.doctor", "importlib.util"): _RARE,
    ("mbridge_ep_overlap.tools.doctor", "mbridge_ep_overlap.core.dispatcher"): _CLI_START,
    ("mbridge_ep_overlap.tools.doctor", "mbridge_ep_overlap.target.cluster"): _GPU_NODE,
    ("mbridge_ep_overlap.tools.doctor", "mbridge_ep_overlap.target.probe"): _GPU_NODE,
    ("mbridge_ep_overlap.tools.doctor", "mbridge_ep_overlap.target.shims"): _GPU_NODE,
    ("mbridge_ep_overlap.tools.doctor", "mbridge_ep_overlap.runtime.exits"): _CLI_START,
    ("mbridge_ep_overlap.tools.doctor", "mbridge_ep_overlap.lab.smoke"): _GPU_NODE,
    ("mbridge_ep_overlap.tools.plan_report", "mbridge_ep_overlap.pipeline"): _CLI_START,
    ("mbridge_ep_overlap.tools.plan_report", "mbridge_ep_overlap.core.prediction"): _MODEL,
    ("mbridge_ep_overlap.tools.plan_report", "mbridge_ep_overlap.spec"): _CLI_START,
    ("mbridge_ep_overlap.tools.rule", "mbridge_ep_overlap.core.rules"): _CLI_START,
    ("mbridge_ep_overlap.tools.rule", "mbridge_ep_overlap.tools.rule_docs"): _CLI_START,
    ("mbridge_ep_overlap.tools.run", "faulthandler"): _RARE,
    ("mbridge_ep_overlap.tools.run", "mbridge_ep_overlap.base.values"): _RARE,
    ("mbridge_ep_overlap.tools.run", "mbridge_ep_overlap.core.export"): _CLI_START,
    ("mbridge_ep_overlap.tools.run", "mbridge_ep_overlap.pipeline"): _CLI_START,
    ("mbridge_ep_overlap.tools.run", "mbridge_ep_overlap.target.shims"): _GPU_NODE,
    ("mbridge_ep_overlap.runtime.run_evidence", "pickle"): _RARE,
    ("mbridge_ep_overlap.lab.results", "mbridge_ep_overlap.predict.cluster_calibration"): _MODEL,
    ("mbridge_ep_overlap.lab.results", "mbridge_ep_overlap.predict.inputs"): _MODEL,
    ("mbridge_ep_overlap.diagnose.upstream_checks", "mbridge_ep_overlap.core.rules"): _CLI_START,
    ("mbridge_ep_overlap.tools.slurm", "mbridge_ep_overlap.base.gpus"): _CLI_START,
    ("mbridge_ep_overlap.tools.slurm", "mbridge_ep_overlap.core.export"): _CLI_START,
    ("mbridge_ep_overlap.tools.slurm", "mbridge_ep_overlap.pipeline"): _CLI_START,
    ("mbridge_ep_overlap.tools.slurm_script", "mbridge_ep_overlap.core.prediction"): _MODEL,
    ("mbridge_ep_overlap.tools.slurm", "mbridge_ep_overlap.spec"): _CLI_START,
    ("mbridge_ep_overlap.tools.slurm", "mbridge_ep_overlap.tools.plan"): _CLI_START,
    ("mbridge_ep_overlap.lab.smoke", "mbridge_ep_overlap.target.deep_ep"): _GPU_NODE,
    ("mbridge_ep_overlap.lab.smoke_worker", "ctypes"): _GPU_NODE,
    ("mbridge_ep_overlap.lab.smoke_worker", "time"): _RARE,
    ("mbridge_ep_overlap.lab.tune", "mbridge_ep_overlap.core.enable"): _CLI_START,
    ("mbridge_ep_overlap.lab.tune", "mbridge_ep_overlap.pipeline"): _CLI_START,
    ("mbridge_ep_overlap.lab.tune", "mbridge_ep_overlap.target.probe"): _GPU_NODE,
    ("mbridge_ep_overlap.lab.tune", "yaml"): _RARE,
}
HEAVY_AT_IMPORT = {
    # defines its ConfigContainer subclass (Megatron-Bridge's class) when imported: no import statement shows it
    "mbridge_ep_overlap.core.enforcement",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path) for path in SRC.rglob("*.py")}


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """What an import statement imports: ``from .core import enforcement`` is ``...core.enforcement``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        source = ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
    else:
        source = node.module
    return [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names]


def _imports() -> list[tuple[str, str, bool, int]]:
    """(module, imported, inside a function, line) for every import in src/, TYPE_CHECKING blocks left out."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        module, tree = _module_name(path), ast.parse(path.read_text())

        def visit(node, in_function):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for name in _targets(child, module, path.name == "__init__.py"):
                        out.append((module, name, in_function, child.lineno))
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

        visit(tree, False)
    return out


IMPORTS = _imports()


def _own(name: str) -> str | None:
    """The module of this package ``name`` refers to (``from . import x`` names a module or a name in one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name if name.startswith(PACKAGE) else None


def _heavy_modules() -> set[str]:
    """This package's modules that load a heavy package at import time (closure over module-level imports)."""
    edges: dict[str, set[str]] = {}
    heavy = set(HEAVY_AT_IMPORT)
    for module, name, in_function, _ in IMPORTS:
        if in_function:
            continue
        if name.split(".")[0] in HEAVY:
            heavy.add(module)
        elif _own(name):
            edges.setdefault(module, set()).add(_own(name))
    changed = True
    while changed:
        changed = False
        for module, targets in edges.items():
            if module not in heavy and targets & heavy:
                heavy.add(module)
                changed = True
    return heavy


def _layer(module: str, layers: list[list[str]]) -> int | None:
    sub = module.split(".")[1] if "." in module else None
    for rank, names in enumerate(layers):
        if sub in names:
            return rank
    return None


def test_every_import_goes_down_the_layers():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    layers = [[part.strip() for part in layer.split("|")] for layer in contract["layers"]]
    wrong = []
    for module, name, in_function, line in IMPORTS:
        target = _own(name)
        if target is None:
            continue
        low, high = _layer(target, layers), _layer(module, layers)
        same_layer = low is not None and low == high and target.split(".")[1] != module.split(".")[1]
        if low is not None and high is not None and (low < high or same_layer):
            wrong.append(f"{module}:{line} imports {target} ({'in a function' if in_function else 'module level'})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_function_level_imports_are_deferred_for_a_reason():
    heavy = _heavy_modules()
    unexplained = []
    for module, name, in_function, line in IMPORTS:
        if not in_function or name.split(".")[0] in HEAVY or (name.startswith("__future__")):
            continue
        target = _own(name) or name
        if target in heavy or (module, target) in DEFERRED:
            continue
        unexplained.append(f"{module}:{line} imports {target} inside a function")
    assert not unexplained, ("a function-level import that defers nothing heavy: import it at module level, or "
                             "list it in DEFERRED with the reason:\n" + "\n".join(sorted(set(unexplained))))


def test_every_listed_reason_is_still_needed():
    present = {(module, _own(name) or name) for module, name, in_function, _ in IMPORTS if in_function}
    assert not set(DEFERRED) - present, f"listed but no longer imported in a function: {set(DEFERRED) - present}"


def test_the_heavy_modules_are_the_ones_that_load_megatron():
    heavy = _heavy_modules()
    assert {"mbridge_ep_overlap.core.forward_step", "mbridge_ep_overlap.runtime.rank_evidence"} <= heavy
    assert not {m for m in heavy if m.startswith(("mbridge_ep_overlap.base", "mbridge_ep_overlap.predict",
                                                    "mbridge_ep_overlap.spec"))}
