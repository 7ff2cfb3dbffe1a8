#!/usr/bin/env python3
"""Is the ``CUDA_DEVICE_MAX_CONNECTIONS`` a job runs with the one the plan judged? Checked on a GPU node.

    source scripts/gpu/env.sh && python3 scripts/gpu/env_in_force.py OUT_DIR

Contract
--------
Three training runs of ``qwen3_moe_proxy`` (local layer stack, no Transformer Engine needed), EP = 2
with both ranks on GPU 0 (``lab.shared_gpu``), overlap on with the alltoall dispatcher, two steps,
launched at the same time, each through ``scripts/gpu/env_in_force_rank.py`` (``run_script.py``
training plus a record of the environment when MB applies ``cfg.env_vars`` and at CUDA's first
initialisation):

* ``recipe``: the launcher does not export the variable; the job must run with ``cfg.env_vars``'s
  value (32, put there by ``enable_ep_overlap``), applied before CUDA is initialised;
* ``launcher``: the launcher exports 8; MB's ``os.environ.setdefault`` keeps it, so the job must run
  with 8 (the value the plan must judge and print);
* ``launcher-1``: the launcher exports 1; the job runs with 1 and the plan must say so (its warning
  ``cuda-device-max-connections`` judges the launcher's value, not cfg.env_vars's 32).

Writes under OUT_DIR: one folder per case (torchrun logs, ``launcher.log``,
``env_in_force-rank<R>.json``) and ``verdict.json`` (per case: ok, reasons, what was seen); prints
one line per case. Exit 0 when every case holds, 1 when one does not, 2 for bad usage. Each run has a
hard timeout (``--timeout``, default 150 s; the three run at once, about 1-2 minutes in all).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
WARNING_RULE = "cuda-device-max-connections"


@dataclass(frozen=True)
class Case:
    name: str
    launcher: str | None
    """What the launcher exports (None: the variable is removed from the job's environment)."""


CASES = (Case("recipe", None), Case("launcher", "8"), Case("launcher-1", "1"))


def judge(case: Case, returncode: int | None, timed_out: bool, records: dict[int, dict], log: str) -> list[str]:
    """Why ``case`` does not hold (empty: it holds), from what its ranks recorded and logged."""
    if timed_out:
        return [f"timed out (return code {returncode})"]
    if not records:
        return ["no rank wrote env_in_force-rank<R>.json"]
    why: list[str] = []
    if returncode != 0:
        why.append(f"torchrun exit {returncode}")
    if case.launcher == "1" and WARNING_RULE not in log:
        why.append(f"the plan did not warn (rule {WARNING_RULE}) about the launcher's {VARIABLE}=1")
    for rank, r in sorted(records.items()):
        expected = case.launcher if case.launcher is not None else r.get("cfg_env_vars")
        if r.get("launcher") != case.launcher:
            why.append(f"rank {rank}: launcher value {r.get('launcher')!r}, the case exports {case.launcher!r}")
        if r.get("cfg_env_vars") != "32":
            why.append(f"rank {rank}: cfg.env_vars[{VARIABLE}] = {r.get('cfg_env_vars')!r}, enable_ep_overlap sets '32'")
        # in force from the process's start: exported by the launcher, or by the rank's re-execution
        from_start = r.get("reexecuted_with") == expected or (case.launcher is not None and r.get("launcher") == expected)
        at_apply = r.get("at_apply")
        if at_apply is None:
            why.append(f"rank {rank}: MB never applied cfg.env_vars")
        else:
            if at_apply.get("after") != expected:
                why.append(f"rank {rank}: {VARIABLE}={at_apply.get('after')!r} after MB applied cfg.env_vars, "
                           f"expected {expected!r}")
            if at_apply.get("cuda_initialized") and not from_start:
                why.append(f"rank {rank}: CUDA was already initialised when MB applied cfg.env_vars")
        at_init = r.get("at_cuda_init")
        if at_init is not None and not from_start:
            if not at_init.get("after_apply"):
                why.append(f"rank {rank}: CUDA was initialised before MB applied cfg.env_vars")
            if at_init.get("value") != expected:
                why.append(f"rank {rank}: {VARIABLE}={at_init.get('value')!r} at CUDA's first initialisation, "
                           f"expected {expected!r}")
        if r.get("exit") != "trained":
            why.append(f"rank {rank}: exit {r.get('exit')!r}")
    return why


def read_records(folder: Path) -> dict[int, dict]:
    out = {}
    for p in sorted(folder.glob("env_in_force-rank*.json")):
        try:
            r = json.loads(p.read_text())
            out[int(r["rank"])] = r
        except (ValueError, KeyError, TypeError, OSError):
            continue
    return out


def run_case(case: Case, root: Path, timeout_s: float, steps: int) -> dict:
    from mbridge_ep_overlap.lab import launch

    folder = root / case.name
    launch.clear_folder(folder)
    env = launch.child_environment()
    env.pop(VARIABLE, None)
    if case.launcher is not None:
        env[VARIABLE] = case.launcher
    args = launch.proxy_args(2, steps=steps, micro_batch=1, microbatches=2) + ["--ep-overlap", "on", "--dispatcher", "alltoall"]
    cmd = launch.launch_command(case.name, 2, args, folder, Path.cwd(), script="scripts/gpu/env_in_force_rank.py",
                                master_port=launch.free_port(), share_gpu=True)
    returncode, timed_out, seconds = launch.run_process_group(cmd, folder, env, timeout_s, cwd=Path.cwd())
    log = (folder / "launcher.log").read_text(errors="replace") if (folder / "launcher.log").exists() else ""
    log += "".join(launch.read_logs(folder).values())
    records = read_records(folder)
    why = judge(case, returncode, timed_out, records, log)
    return {"case": case.name, "launcher": case.launcher, "ok": not why, "why": why, "returncode": returncode,
            "timed_out": timed_out, "seconds": round(seconds, 1), "records": records}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="env_in_force.py", description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--timeout", type=float, default=150.0, help="hard limit of each run, seconds")
    p.add_argument("--steps", type=int, default=2)
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if args.timeout <= 0 or args.steps < 1:
        print("env_in_force.py: error: --timeout must be > 0 and --steps >= 1", file=sys.stderr)
        return 2
    root = Path(args.out_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.chdir(Path(__file__).resolve().parents[2])  # the checkout: torchrun runs its scripts/ from here
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(CASES)) as pool:
        results = list(pool.map(lambda c: run_case(c, root, args.timeout, args.steps), CASES))
    (root / "verdict.json").write_text(json.dumps({"variable": VARIABLE, "cases": results}, indent=1) + "\n")
    for r in results:
        print(f"{r['case']:<11} launcher={r['launcher']!s:<5} {'OK' if r['ok'] else 'FAILED'} "
              f"({r['seconds']} s){'' if r['ok'] else ': ' + '; '.join(r['why'])}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
