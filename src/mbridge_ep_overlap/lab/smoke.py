"""Dispatcher smoke check: does each token dispatcher really work on this node?

Contract
--------
``run(backends, nproc=2)`` launches, per backend, ``python -m torch.distributed.run --nproc_per_node 2
-m mbridge_ep_overlap.lab.smoke_worker --backend X`` (``launch.run_process_group``: own process
group, hard timeout that kills the group, multicast-off variables, ``PYTHONFAULTHANDLER=1``, per-rank
logs under ``log_dir/X``). The worker builds the backend's buffer as Megatron-Core 0.19.2 does and
checks one dispatch/combine round trip of a known token set; ``classify`` turns the outcome into a
``Verdict``: ``usable``, ``crashed (SIGSEGV) in HybridEPBuffer init``, ``hung (timeout after N s) in
<stage>``, ``wrong result in <stage>: ...``, ``failed in <stage>: <exception>``, ``not installed: ...``
or ``cannot run: no CUDA GPU``. When HybridEP's default path fails and its allocator tried CUDA
fabric handles, it runs again with ``USE_MNNVL=0`` (cudaMalloc + CUDA IPC, classic DeepEP's path)
and the verdict names the cause. Verdicts are cached in a JSON file keyed by host name, GPU UUIDs,
driver and the deep_ep build line (``cache_path()``: ``$EP_OVERLAP_SMOKE_CACHE``, else
``$XDG_CACHE_HOME`` or ``~/.cache`` ``/mbridge_ep_overlap/smoke.json``; ``target.smoke_verdicts``); ``cached_verdicts(target)``
returns ``{backend: verdict text}`` for this machine (``"usable"`` exactly when usable) or None, and
never launches anything - ``dispatcher="auto"`` consults it. Nothing here imports Megatron; torch
only when a check runs or a cache key is computed.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from ..base.choices import MEASURED_DISPATCHERS
from ..target.smoke_verdicts import (STATUSES, Verdict, _deep_ep_line, _gpu_ids, cache_path, cached_results,  # noqa: F401
                                     cached_verdicts, cannot_run_reason, driver_version, host_key, load, save)
from ..core.dispatcher import IPC_HEALTH_KEY
from .launch import child_environment, clear_folder, free_port, rank_crashes, rank_texts, read_logs, run_process_group

BACKENDS = MEASURED_DISPATCHERS
_TIMEOUTS_S = {"alltoall": 90, "deepep": 150, "hybridep": 180}
"""Per-backend hard timeouts (``EP_OVERLAP_SMOKE_TIMEOUT`` overrides them all): start-up takes ~15 s;
HybridEP JIT-compiles its kernels with nvcc on first use."""
_WORKER = "mbridge_ep_overlap.lab.smoke_worker"
# ---- classification ------------------------------------------------------------------------------
_LINE = re.compile(r"^(stage|result|wrong|error|missing|info): ?(.*)$", re.M)


def _lines(text: str, kind: str) -> list[str]:
    return [m.group(2).strip() for m in _LINE.finditer(text) if m.group(1) == kind]


def _stage_of(detail: str) -> tuple[str, str]:
    """'check dispatch: 3 rows differ' -> ('check dispatch', '3 rows differ')."""
    stage, sep, rest = detail.partition(": ")
    return (stage, rest) if sep else ("", detail)


def classify(backend: str, returncode: int | None, timed_out: bool, logs: dict[str, str], *,
             seconds: float = 0.0, timeout_s: float = 0.0, env: dict[str, str] | None = None,
             log_dir: str = "") -> Verdict:
    """The verdict of one worker launch from its exit, its timeout and its log tree (``read_logs``)."""
    ranks = rank_texts(logs)
    base = dict(backend=backend, seconds=round(seconds, 1), timeout_s=timeout_s, env=dict(env or {}),
                log_dir=log_dir, checked_at=time.time())
    first_rank = next(iter(ranks.values()), "")
    base["info"] = _lines(first_rank, "info")[1:]  # the first info line is the worker's own banner
    stages = {rank: (_lines(text, "stage") or [""])[-1] for rank, text in ranks.items()}
    missing = [d for text in ranks.values() for d in _lines(text, "missing")]
    if missing:
        return Verdict(status="missing", detail=missing[0], **base)
    crashes = [c for c in rank_crashes(logs) if c.signal not in ("SIGTERM", "SIGKILL", "SIGINT")]
    if crashes:
        c = crashes[0]
        return Verdict(status="crashed", signal=c.signal, stage=stages.get(c.rank, ""), stack=c.stack, rank=c.rank,
                       detail="; ".join(f"rank {x.rank}: {x.signal}" for x in crashes), **base)
    for kind, status in (("wrong", "wrong"), ("error", "failed")):
        found = [(rank, d) for rank, text in ranks.items() for d in _lines(text, kind)]
        if found:
            rank, detail = found[0]
            stage, rest = _stage_of(detail)
            return Verdict(status=status, stage=stage, detail=rest, rank=rank, **base)
    if timed_out:
        distinct = sorted(set(stages.values()))
        stage = distinct[0] if len(distinct) == 1 else ", ".join(f"{s or 'start-up'} (rank {r})" for r, s in stages.items())
        return Verdict(status="hung", stage=stage, **base)
    ok = [rank for rank, text in ranks.items() if "ok" in _lines(text, "result")]
    if returncode == 0 and ranks and len(ok) == len(ranks):
        return Verdict(status="usable", **base)
    unfinished = [rank for rank in ranks if rank not in ok] or list(ranks)
    stage = next((stages[r] for r in unfinished if stages[r]), "")
    last = ranks[unfinished[0]].strip() if unfinished else ""
    tail = last.splitlines()[-1][:200] if last else "no rank output"
    return Verdict(status="failed", stage=stage, detail=f"exit code {returncode} ({tail})", **base)


# ---- where it can run ------------------------------------------------------------------------------
# ---- running it ------------------------------------------------------------------------------------
def _default_log_dir() -> Path:
    if os.environ.get("EP_OVERLAP_LOG_DIR"):
        return Path(os.environ["EP_OVERLAP_LOG_DIR"]) / "smoke"
    return cache_path().parent / "smoke-logs"


def _worker_command(backend: str, nproc: int, folder: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_port", str(free_port()), "--log-dir", str(folder / "torchrun"),
            "--redirects", "3", "--tee", "3", "-m", _WORKER, "--backend", backend, "--run-dir", str(folder)]


def check_one(backend: str, nproc: int = 2, timeout_s: float | None = None, log_dir: Path | None = None,
              env: dict[str, str] | None = None, name: str | None = None) -> Verdict:
    """Launch one worker and classify it (``backend`` may be a ``selftest-*`` worker backend)."""
    timeout_s = timeout_s or float(os.environ.get("EP_OVERLAP_SMOKE_TIMEOUT") or 0) or _TIMEOUTS_S.get(backend, 120)
    folder = Path(log_dir or _default_log_dir()) / (name or backend).replace(":", "_").replace("=", "_")
    clear_folder(folder)
    cmd = _worker_command(backend, nproc, folder)
    returncode, timed_out, seconds = run_process_group(cmd, folder, child_environment(env), timeout_s, cwd=folder)
    verdict = classify(name or backend, returncode, timed_out, read_logs(folder), seconds=seconds,
                       timeout_s=timeout_s, env=env, log_dir=str(folder))
    return verdict


def _installed_problem(backend: str) -> str | None:
    if backend == "alltoall":
        return None
    from ..target.deep_ep import deep_ep_info

    info = deep_ep_info()
    if not info.version:
        return "deep_ep does not import (install DeepEP's hybrid-ep branch; README, section DeepEP)"
    if backend == "hybridep" and not info.hybrid_ep:
        return f"deep_ep {info.version} has no HybridEPBuffer (build DeepEP's hybrid-ep branch)"
    return None


def _fabric_tried(verdict: Verdict) -> bool:
    """Whether HybridEP's allocator went (or may have gone) for fabric handles in this run."""
    said = " ".join(verdict.info)
    return "CUDA IPC handles" not in said


def _name_cause(default: Verdict, ipc: Verdict) -> str:
    if ipc.usable:
        return ("with USE_MNNVL=0 (cudaMalloc + CUDA IPC handles, classic DeepEP's path): usable -> the cause is "
                "HybridEP's CUDA fabric-handle path (cuMemCreate with CU_MEM_HANDLE_TYPE_FABRIC) on this node; "
                "run HybridEP with USE_MNNVL=0 (mbridge_ep_overlap's plan sets it for NVLink domains of <= 8 GPUs)")
    return (f"with USE_MNNVL=0 (CUDA IPC handles) too: {ipc.text} -> not (only) the fabric-handle path; "
            f"driver {driver_version()}")


def run(backends=BACKENDS, nproc: int = 2, timeout_s: float | None = None, log_dir: Path | None = None,
        env: dict[str, str] | None = None, cache: bool = True, retry_ipc: bool = True) -> dict[str, Verdict]:
    """Check each backend on this node (one after the other); HybridEP again with USE_MNNVL=0 when
    its default path fails after trying fabric handles. Caches the verdicts (``cache``)."""
    reason = cannot_run_reason(nproc)
    if reason is not None:
        return {b: Verdict(b, "cannot_run", detail=reason) for b in backends}
    log_dir = Path(log_dir or _default_log_dir())
    env = dict(env or {})
    results: dict[str, Verdict] = {}
    for backend in backends:
        problem = _installed_problem(backend)
        if problem:
            results[backend] = Verdict(backend, "missing", detail=problem, checked_at=time.time())
            continue
        verdict = check_one(backend, nproc, timeout_s, log_dir, env)
        results[backend] = verdict
        use_mnnvl = (os.environ.get("USE_MNNVL") if "USE_MNNVL" not in env else env["USE_MNNVL"]) or ""
        if (backend == "hybridep" and retry_ipc and verdict.status in FAILED
                and use_mnnvl.strip().lower() not in ("0", "false")):
            if _fabric_tried(verdict):
                ipc = check_one(backend, nproc, timeout_s, log_dir, {**env, "USE_MNNVL": "0"}, name=IPC_HEALTH_KEY)
                results[IPC_HEALTH_KEY] = ipc
                verdict.cause = _name_cause(verdict, ipc)
            else:
                verdict.cause = "HybridEP's allocator already used CUDA IPC handles here: not the fabric-handle path"
    if cache:
        try:
            save(results)
        except OSError as e:  # a read-only home must not turn a health check into a traceback
            print(f"smoke: verdicts not cached ({e})", file=sys.stderr)
    return results


FAILED = ("crashed", "hung", "wrong", "failed")


def exit_code(results: dict[str, Verdict]) -> int:
    """``doctor --smoke``'s exit code: 2 when nothing could run here (no GPUs), 1 when an installed
    backend crashed, hung, failed or gave a wrong result on the path training takes here (HybridEP:
    its CUDA-IPC run, which the plan uses on nodes of <= 8 GPUs, when that one was made), else 0.
    A backend that is not installed is a fact doctor prints, not a failure."""
    values = [v for name, v in results.items() if name in BACKENDS]
    if values and all(v.status == "cannot_run" for v in values):
        return 2
    failing = []
    for v in values:
        taken = results.get(IPC_HEALTH_KEY, v) if v.backend == "hybridep" else v
        if taken.status in FAILED:
            failing.append(v.backend)
    return 1 if failing else 0


def report_lines(results: dict[str, Verdict], detailed: bool = True) -> list[str]:
    """Doctor's lines: one per backend (a crash with its stage, stack and logs when ``detailed``);
    a machine where nothing can run gives one line."""
    values = list(results.values())
    if values and all(v.status == "cannot_run" for v in values):
        return [f"dispatcher smoke check: cannot run: {values[0].detail}"]
    out = ["dispatcher smoke check (2 ranks, one dispatch/combine round trip of known tokens per backend):"]
    for v in values:
        text = v.report() if detailed and not v.usable else v.line()
        out += [f"  {row}" for row in text.splitlines()]
    return out
