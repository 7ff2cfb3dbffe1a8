"""What the step-time model predicted for a run that shows no speed-up, from the config beside its logs.

Contract
--------
``beside(paths)`` looks in each PATH (a folder, or the folder of a file) and its ``evidence/`` folder for
``*plan.json`` (written by ``slurm``: spec, plan, finalized fields and the step-time model's prediction
``core.prediction.ConfigPrediction.to_dict``) and ``*config.yaml`` (the finalized config). ``lines(paths)``
gives the words a no-speed-up finding adds: the prediction plan.json records (overlap off / on, the
speed-up, dispatcher, GPUs, the model's confidence), or, when only a config YAML is there, that it is
there but holds neither the GPU nor the world size the model needs (``plan --predict`` on it gives the
prediction), or that no config is beside the logs. A file that cannot be read is named, never raised.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..base import run_files

PLAN_GLOB = "*plan.json"
CONFIG_GLOB = "*config.yaml"


def _folders(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p == "-":
            continue
        path = Path(p)
        folder = path if path.is_dir() else path.parent
        for f in (folder, folder / run_files.EVIDENCE_DIR):
            if f.is_dir() and f not in out:
                out.append(f)
    return out


def beside(paths: list[str]) -> tuple[list[Path], list[Path]]:
    """(plan.json files, config YAML files) beside the logs."""
    folders = _folders(paths)
    plans = [f for d in folders for f in sorted(d.glob(PLAN_GLOB))]
    configs = [f for d in folders for f in sorted(d.glob(CONFIG_GLOB))]
    return plans, configs


def lines(paths: list[str]) -> list[str]:
    plans, configs = beside(paths)
    out = []
    for plan in plans:
        out.append(_plan_words(plan))
    if out:
        return out
    if configs:
        return [f"step-time model: {configs[0]} is the run's config, but the evidence names neither the GPU nor "
                f"the world size the model needs: `mbridge-ep-overlap plan --predict` with this config and the "
                f"target gives the predicted gain"]
    return ["step-time model: no config beside the logs (no *plan.json or *config.yaml), so no prediction is "
            "made for this run: `mbridge-ep-overlap plan --predict` on its config gives the predicted gain"]


def _plan_words(plan: Path) -> str:
    try:
        data = json.loads(plan.read_text())
    except (OSError, ValueError) as e:
        return f"step-time model: {plan} could not be read ({type(e).__name__})"
    p = data.get("prediction") if isinstance(data, dict) else None
    if not isinstance(p, dict):
        return f"step-time model: {plan} holds no prediction"
    if "error" in p:
        return f"step-time model: no prediction for this config ({p['error']}), as {plan} records"
    try:
        words = (f"step-time model predicted, for this config ({plan}): {p['dispatcher']} on {p['num_gpus']}x "
                 f"{p['gpu']}, step {float(p['off_step_s']):.3f} s with overlap off, {float(p['on_step_s']):.3f} s "
                 f"on, speed-up {float(p['speedup']):.3f}x")
    except (KeyError, TypeError, ValueError):
        return f"step-time model: {plan} holds a prediction without its step times"
    if p.get("confidence"):
        words += f" (confidence {p['confidence']})"
    if isinstance(p.get("speedup"), (int, float)) and p["speedup"] < 1.02:
        words += "; the model expected no gain either"
    return words
