"""The smoke check's verdicts and their cache on this machine: what the probe reads.

Contract: ``Verdict`` is one backend's outcome (``STATUSES``; ``text`` the words the cache, the
probe and ``dispatcher="auto"`` use). The cache is a JSON file keyed by host name, GPU UUIDs,
driver and the deep_ep build line (``host_key``; ``cache_path()``: ``$EP_OVERLAP_SMOKE_CACHE``,
else ``$XDG_CACHE_HOME`` or ``~/.cache`` ``/mbridge_ep_overlap/smoke.json``); ``save`` merges
verdicts into it atomically, ``load`` reads them back, ``cached_verdicts(target)`` returns
``{backend: verdict text}`` for this machine or None and never launches anything.
``lab.smoke`` runs the checks and writes here; ``target.probe`` reads here, so the probe
needs nothing above ``target``. torch is imported only when a cache key is computed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .deep_ep import deep_ep_info

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
