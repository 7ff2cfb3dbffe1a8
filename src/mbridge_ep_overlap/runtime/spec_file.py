"""The run description as a file: what a launched job is given instead of flags to re-parse.

Contract
--------
``write_spec(spec, path)`` writes a ``RunSpec`` as JSON - its fields as ``dataclasses.asdict`` gives
them (``target`` a nested object; tuples as lists) and ``"schema": SPEC_SCHEMA`` - and returns
``["--spec", path]``, the ``run_script.py`` arguments that run it (``launch_slurm.py`` writes
``<job>.spec.json`` beside ``<job>.plan.json``, one per task of a job array; ``bench`` writes
``<out>/runs/<link>__<variant>.spec.json`` beside each job's folder, which ``launch`` clears).
``read_spec(path)`` is the inverse, checked as the flags are (``RunSpec.validated`` and a registered
recipe name resolved, before Megatron is imported): a file that cannot be read, is not a JSON object,
has another or no ``schema``, an unknown or missing field, or a value the spec refuses is one
``UsageError`` naming the file, the field, the value found and the value required. The target in the
file is the one the job was judged for; a training run probes its own node instead
(``flags.spec_from_args``). No torch or Megatron import.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..base.errors import UsageError
from ..spec import RunSpec, TargetSpec, resolve_recipe

SPEC_SCHEMA = "mbridge-ep-overlap run spec 1"
"""The ``schema`` value of a spec file; a file of another version is refused, never guessed at."""
_TUPLES = ("overrides", "env")  # fields JSON holds as lists


def spec_json(spec: RunSpec) -> dict[str, Any]:
    """The file's content: ``schema`` and every field of ``spec``."""
    return {"schema": SPEC_SCHEMA, **dataclasses.asdict(spec)}


def write_spec(spec: RunSpec, path: Path) -> list[str]:
    """Write ``spec`` to ``path`` (its folder made) and return the ``run_script.py`` arguments that run it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec_json(spec), indent=2) + "\n")
    return ["--spec", str(path)]


def _fields(cls: type, data: Any, where: str, path: Path) -> dict[str, Any]:
    """``data``'s fields for dataclass ``cls``; an object that is none, or an unknown field, refused."""
    if not isinstance(data, dict):
        raise UsageError(f"{where} in spec file {path}", data, f"a JSON object of {cls.__name__} fields", "invalid")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise UsageError(f"field of {where} in spec file {path}", unknown[0], names)
    return {k: tuple(v) if k in _TUPLES and isinstance(v, list) else v for k, v in data.items()}


def read_spec(path: str | Path) -> RunSpec:
    """The validated spec in the file at ``path`` (module docstring); bad usage in one ``UsageError``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError("spec file", str(path), f"a readable file ({getattr(e, 'strerror', None) or e})",
                         "unreadable") from None
    except json.JSONDecodeError as e:
        raise UsageError("spec file", str(path), f"JSON (line {e.lineno}: {e.msg})", "malformed") from None
    if not isinstance(data, dict):
        raise UsageError("spec file", str(path), "a JSON object with the RunSpec fields", "invalid")
    if data.get("schema") != SPEC_SCHEMA:
        raise UsageError(f"schema of spec file {path}", data.get("schema"),
                         f"{SPEC_SCHEMA!r} (written by launch_slurm.py or bench of this version)", "unknown")
    fields = _fields(RunSpec, {k: v for k, v in data.items() if k != "schema"}, "the run", path)
    if "recipe" not in fields:
        raise UsageError(f"field recipe in spec file {path}", None, "a registered recipe name or MODULE:FUNCTION",
                         "missing")
    if "target" in fields:
        fields["target"] = TargetSpec(**_fields(TargetSpec, fields["target"], "target", path))
    try:
        spec = RunSpec(**fields).validated()
        if ":" not in spec.recipe:
            resolve_recipe(spec.recipe)
    except UsageError as e:
        raise UsageError(f"{e.what} (in spec file {path})", e.value, e.allowed, e.problem) from None
    return spec
