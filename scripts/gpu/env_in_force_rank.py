#!/usr/bin/env python3
"""One rank of ``scripts/gpu/env_in_force.py``: ``scripts/run_script.py`` training, with a record of the
process environment at the moment Megatron-Bridge applies ``cfg.env_vars``.

Contract: same flags as ``scripts/run_script.py`` (``--output-dir`` required). Before training it wraps
``megatron.bridge.training.config.apply_environment_variables`` (called first thing by MB's
``runtime_config_update`` inside ``pretrain()``) and ``torch.cuda._lazy_init`` (CUDA's first
initialisation in this process), and writes ``<output-dir>/env_in_force-rank<R>.json``::

    {"rank": R, "variable": "CUDA_DEVICE_MAX_CONNECTIONS",
     "launcher": value exported by the launcher (null: not exported),
     "cfg_env_vars": the value in cfg.env_vars when MB applied it,
     "at_apply": {"before": ..., "after": ..., "cuda_initialized": bool},
     "at_cuda_init": {"value": ..., "after_apply": bool} | null,
     "exit": "trained" | "refused" | "error: ..."}

The file is rewritten at each of these points, so a run that dies later still leaves what it saw.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"


def _output_dir(argv: list[str]) -> Path:
    for i, a in enumerate(argv):
        if a == "--output-dir" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if a.startswith("--output-dir="):
            return Path(a.split("=", 1)[1])
    raise SystemExit("env_in_force_rank.py: --output-dir is required")


def main(argv: list[str]) -> int:
    out = _output_dir(argv)
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    record: dict = {"rank": rank, "variable": VARIABLE, "launcher": os.environ.get(VARIABLE),
                    "cfg_env_vars": None, "at_apply": None, "at_cuda_init": None, "exit": None}
    path = out / f"env_in_force-rank{rank}.json"
    # A rank that re-executed itself with cfg.env_vars exported (tools.run.reexec_if_env_too_late) keeps
    # the first process's launcher value and records what the new process started with.
    if os.environ.get("EP_OVERLAP_ENV_REEXEC") and path.exists():
        record["launcher"] = json.loads(path.read_text()).get("launcher")
        record["reexecuted_with"] = os.environ.get(VARIABLE)

    def save() -> None:
        path.write_text(json.dumps(record, indent=1) + "\n")

    save()
    from mbridge_ep_overlap.target import shims

    shims.install()  # before any Megatron import, as run_script's training path does
    import torch
    from megatron.bridge.training import config as mb_config

    real_apply = mb_config.apply_environment_variables
    real_lazy_init = torch.cuda._lazy_init

    def apply_environment_variables(cfg):
        before = os.environ.get(VARIABLE)
        record["cfg_env_vars"] = None if cfg.env_vars.get(VARIABLE) is None else str(cfg.env_vars[VARIABLE])
        real_apply(cfg)
        record["at_apply"] = {"before": before, "after": os.environ.get(VARIABLE),
                              "cuda_initialized": bool(torch.cuda.is_initialized())}
        save()

    def lazy_init():
        if record["at_cuda_init"] is None and not torch.cuda.is_initialized():
            record["at_cuda_init"] = {"value": os.environ.get(VARIABLE), "after_apply": record["at_apply"] is not None}
            save()
        return real_lazy_init()

    mb_config.apply_environment_variables = apply_environment_variables
    torch.cuda._lazy_init = lazy_init
    from mbridge_ep_overlap.tools.run import main as run_main

    try:
        rc = run_main(argv)
    except BaseException as e:  # noqa: BLE001 - recorded, then re-raised
        record["exit"] = f"error: {type(e).__name__}: {e}"[:500]
        save()
        raise
    record["exit"] = "trained" if rc == 0 else ("refused" if rc == 1 else f"exit {rc}")
    save()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
