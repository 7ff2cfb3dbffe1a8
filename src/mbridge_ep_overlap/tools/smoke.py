"""Dispatcher smoke check: does each token dispatcher really work on this node?

Contract
--------
``run(backends, nproc=2)`` launches, per backend, ``python -m torch.distributed.run --nproc_per_node 2
-m mbridge_ep_overlap.tools.smoke_worker --backend X`` (``launch.run_process_group``: own process
group, hard timeout that kills the group, multicast-off variables, ``PYTHONFAULTHANDLER=1``, per-rank
logs under ``log_dir/X``). The worker builds the backend's buffer as Megatron-Core 0.19.2 does and
checks one dispatch/combine round trip of a known token set; ``classify`` turns the outcome into a
``Verdict``: ``usable``, ``crashed (SIGSEGV) in HybridEPBuffer init``, ``hung (timeout after N s) in
<stage>``, ``wrong result in <stage>: ...``, ``failed in <stage>: <exception>``, ``not installed: ...``
or ``cannot run: no CUDA GPU``. When HybridEP's default path fails and its allocator tried CUDA
fabric handles, it runs again with ``USE_MNNVL=0`` (cudaMalloc + CUDA IPC, classic DeepEP's path)
and the verdict names the cause. Verdicts are cached in a JSON file keyed by host name, GPU UUIDs,
driver and the deep_ep build line (``cache_path()``: ``$EP_OVERLAP_SMOKE_CACHE``, else
``$XDG_CACHE_HOME`` or ``~/.cache`` ``/mbridge_ep_overlap/smoke.json``); ``cached_verdicts(target)``
returns ``{backend: verdict text}`` for this machine (``"usable"`` exactly when usable) or None, and
never launches anything - ``dispatcher="auto"`` consults it. Nothing here imports Megatron; torch
only when a check runs or a cache key is computed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..base.choices import MEASURED_DISPATCHERS
from ..core.dispatcher import IPC_HEALTH_KEY
from .launch import child_environment, clear_folder, free_port, rank_crashes, rank_texts, read_logs, run_process_group

BACKENDS = MEASURED_DISPATCHERS
TIMEOUTS_S = {"alltoall": 90, "deepep": 150, "hybridep": 180}
"""Per-backend hard timeouts (``EP_OVERLAP_SMOKE_TIMEOUT`` overrides them all): start-up takes ~15 s;
HybridEP JIT-compiles its kernels with nvcc on first use."""
WORKER = "mbridge_ep_overlap.tools.smoke_worker"
STATUSES = ("usable", "crashed", "hung", "wrong", "failed", "missing", "cannot_run")


@dataclass
class Verdict:
    backend: str
    status: str
    """One of STATUSES."""
    stage: str = ""
    detail: str = ""
    signal: str = ""
    stack: list[str] = field(default_factory=list)
    """The crashed rank's Python frames (faulthandler), innermost first."""
    rank: str = ""
    seconds: float = 0.0
    timeout_s: float = 0.0
    env: dict[str, str] = field(default_factory=dict)
    """Variables the check ran with on top of this environment (USE_MNNVL for the IPC run)."""
    info: list[str] = field(default_factory=list)
    """The worker's ``info:`` lines (rank 0), e.g. which memory handles HybridEP's allocator took."""
    cause: str = ""
    """HybridEP: what the USE_MNNVL=0 run says about the cause of a failure."""
    log_dir: str = ""
    checked_at: float = 0.0

    @property
    def usable(self) -> bool:
        return self.status == "usable"

    @property
    def text(self) -> str:
        """The verdict: 'usable', 'crashed (SIGSEGV) in HybridEPBuffer init', 'wrong result in check
        combine: ...', 'not installed: ...' (no host words: the cache and ``auto`` use it)."""
        head, detail = self._parts()
        return f"{head}: {detail}" if detail else head

    def _parts(self) -> tuple[str, str]:
        stage = self.stage or "start-up"
        if self.status == "crashed":
            return f"crashed ({self.signal})" + (f" in {self.stage}" if self.stage else ""), ""
        if self.status == "hung":
            return f"hung (timeout after {self.timeout_s:.0f} s) in {stage}", ""
        if self.status == "wrong":
            return f"wrong result in {stage}", self.detail
        if self.status == "failed":
            return f"failed in {stage}", self.detail
        if self.status == "missing":
            return "not installed", self.detail
        if self.status == "cannot_run":
            return "cannot run", self.detail
        return "usable", ""

    def line(self) -> str:
        """'hybridep: crashed (SIGSEGV) in HybridEPBuffer init on this node' (+ the cause, when known)."""
        head, detail = self._parts()
        on_node = " on this node" if self.status in ("crashed", "hung", "wrong", "failed") else ""
        took = f" ({self.seconds:.0f} s)" if self.usable and self.seconds else ""
        cause = f"; {self.cause}" if self.cause else ""
        return f"{self.backend}: {head}{on_node}{took}" + (f": {detail}" if detail else "") + cause

    def report(self, frames: int = 12) -> str:
        """The verdict line, the stage, the crashed rank's stack and where the logs are."""
        lines = [self.line()]
        if self.info:
            lines += [f"  {i}" for i in self.info]
        if self.stack:
            lines.append(f"  Python stack of rank {self.rank or '?'} (faulthandler, most recent call first):")
            lines += [f"    {f}" for f in self.stack[:frames]]
        if self.log_dir:
            lines.append(f"  logs: {self.log_dir}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


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
def cannot_run_reason(nproc: int = 2) -> str | None:
    """Why the check cannot run here (one phrase), or None."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure is a reason, never a traceback
        return f"torch does not import ({type(e).__name__}: {e})"
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    found = torch.cuda.device_count()
    if found < nproc:
        return f"needs {nproc} CUDA GPUs on one node, found {found}"
    return None


def _deep_ep_line(version: str | None = None, build: str | None = None) -> str:
    if version is None:
        from ..target.probe import deep_ep_info

        info = deep_ep_info()
        version, build = info.version, info.build
    return f"deep_ep {version} ({build or 'no build line'})" if version else "deep_ep missing"


def driver_version() -> str:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        m = re.search(r"Kernel Module\s+(\S+)", text)
        if m:
            return m.group(1)
    except OSError:
        pass
    try:
        import torch

        v = torch._C._cuda_getDriverVersion()  # the CUDA API version of libcuda, e.g. 13000
        return f"CUDA API {v // 1000}.{(v % 1000) // 10}"
    except Exception:  # noqa: BLE001
        return "unknown"


def _gpu_ids() -> str:
    try:
        import torch

        uuids = [str(getattr(torch.cuda.get_device_properties(i), "uuid", "")) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001
        return "?"
    return hashlib.sha1(",".join(uuids).encode()).hexdigest()[:10] if any(uuids) else "?"


def host_key(deep_ep_line: str | None = None) -> str:
    """What the verdicts depend on: this host, its GPUs, its driver and the DeepEP build."""
    return (f"{socket.gethostname()} | GPUs {_gpu_ids()} | driver {driver_version()} | "
            f"{deep_ep_line or _deep_ep_line()}")


# ---- cache -----------------------------------------------------------------------------------------
def cache_path() -> Path:
    if os.environ.get("EP_OVERLAP_SMOKE_CACHE"):
        return Path(os.environ["EP_OVERLAP_SMOKE_CACHE"])
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "mbridge_ep_overlap" / "smoke.json"


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save(results: dict[str, Verdict], key: str | None = None, path: Path | None = None) -> Path:
    """Merge ``results`` into the cache entry of ``key`` (default: this machine). Atomic replace."""
    path = path or cache_path()
    key = key or host_key()
    data = _read_cache(path)
    entry = data.get(key) if isinstance(data.get(key), dict) else {}
    verdicts = dict(entry.get("verdicts") or {})
    verdicts.update({name: v.to_dict() for name, v in results.items() if v.status != "cannot_run"})
    data[key] = {"saved_at": time.time(), "verdicts": verdicts}
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(data, f, indent=2)
    os.replace(f.name, path)
    return path


def load(key: str | None = None, path: Path | None = None, max_age_s: float | None = None) -> dict[str, Verdict] | None:
    """The cached verdicts of ``key`` (default: this machine), None when there are none (or older than
    ``max_age_s``)."""
    entry = _read_cache(path or cache_path()).get(key or host_key())
    if not isinstance(entry, dict) or not isinstance(entry.get("verdicts"), dict):
        return None
    if max_age_s is not None and time.time() - float(entry.get("saved_at", 0)) > max_age_s:
        return None
    try:
        return {name: Verdict.from_dict(v) for name, v in entry["verdicts"].items()}
    except TypeError:
        return None


def cached_results(target=None, path: Path | None = None) -> dict[str, Verdict] | None:
    """This machine's cached ``Verdict`` objects; None for a described (dry-run) target, a machine
    without GPUs, or when no check ran here with this driver and DeepEP build."""
    if target is not None and (getattr(target, "source", "probed") != "probed" or not getattr(target, "has_gpu", True)):
        return None
    if cannot_run_reason(1) is not None:
        return None
    line = None
    if target is not None and getattr(target, "deep_ep_version", None) is not None:
        line = _deep_ep_line(target.deep_ep_version, getattr(target, "deep_ep_build", None))
    return load(host_key(line), path)


def cached_verdicts(target=None, path: Path | None = None) -> dict[str, str] | None:
    """``{backend: verdict text}`` from the cache for this machine (``"usable"`` exactly when the
    round trip passed; the key ``"hybridep:USE_MNNVL=0"`` when HybridEP was also tried with CUDA IPC
    handles), or None when there is none. Launches nothing: what ``dispatcher="auto"`` consults."""
    results = cached_results(target, path)
    return None if results is None else {name: v.text for name, v in results.items()}


# ---- running it ------------------------------------------------------------------------------------
def default_log_dir() -> Path:
    if os.environ.get("EP_OVERLAP_LOG_DIR"):
        return Path(os.environ["EP_OVERLAP_LOG_DIR"]) / "smoke"
    return cache_path().parent / "smoke-logs"


def worker_command(backend: str, nproc: int, folder: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_port", str(free_port()), "--log-dir", str(folder / "torchrun"),
            "--redirects", "3", "--tee", "3", "-m", WORKER, "--backend", backend, "--run-dir", str(folder)]


def check_one(backend: str, nproc: int = 2, timeout_s: float | None = None, log_dir: Path | None = None,
              env: dict[str, str] | None = None, name: str | None = None) -> Verdict:
    """Launch one worker and classify it (``backend`` may be a ``selftest-*`` worker backend)."""
    timeout_s = timeout_s or float(os.environ.get("EP_OVERLAP_SMOKE_TIMEOUT") or 0) or TIMEOUTS_S.get(backend, 120)
    folder = Path(log_dir or default_log_dir()) / (name or backend).replace(":", "_").replace("=", "_")
    clear_folder(folder)
    cmd = worker_command(backend, nproc, folder)
    returncode, timed_out, seconds = run_process_group(cmd, folder, child_environment(env), timeout_s, cwd=folder)
    verdict = classify(name or backend, returncode, timed_out, read_logs(folder), seconds=seconds,
                       timeout_s=timeout_s, env=env, log_dir=str(folder))
    return verdict


def _installed_problem(backend: str) -> str | None:
    if backend == "alltoall":
        return None
    from ..target.probe import deep_ep_info

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
    log_dir = Path(log_dir or default_log_dir())
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
