"""torchrun launcher shared by the functional suite and the benchmark: hard timeout, per-rank logs.

Contract: ``launch(name, nproc, args, log_root=...)`` runs ``scripts/run_script.py`` under
``torch.distributed.run --nproc_per_node nproc`` in its own process group, tees every rank's
output to a log under ``log_root/name``, kills the whole group on timeout (a hang fails loudly
instead of blocking), and returns a ``Run`` with the return code, the rank logs and the evidence
summary (``None`` when none was written). The child environment is ``launch_environment``'s: the
NVLink-multicast-off variables (``MULTICAST_OFF``, the one copy, also exported by Slurm jobs) win
over anything else, and ``PYTHONFAULTHANDLER=1`` makes a native crash print each rank's Python
stack, which ``Run.crash()`` reports.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

def _repo_root() -> Path:
    """The checkout holding scripts/run_script.py (the cwd of a GPU run, or this source tree)."""
    for candidate in (Path.cwd(), *Path(__file__).resolve().parents):
        if (candidate / "scripts" / "run_script.py").exists():
            return candidate
    raise FileNotFoundError("scripts/run_script.py not found: run from the mbridge_ep_overlap checkout")


LOG_ROOT = Path(os.environ.get("EP_OVERLAP_LOG_DIR", "out/functional"))
# NVLink multicast off: on shared hosts a program that uses it can take the GPUs out of service.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
_SIGNALS = {int(s): s.name for s in signal.Signals}


def launch_environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the multicast-off variables winning (every launch and Slurm job uses this)."""
    return {**env, **MULTICAST_OFF}


@dataclass
class Run:
    name: str
    returncode: int | None
    timed_out: bool
    seconds: float
    folder: Path
    summary: dict | None

    def rank_logs(self) -> dict[str, str]:
        logs = {}
        for path in sorted(self.folder.rglob("*.log")):
            logs[str(path.relative_to(self.folder))] = path.read_text(errors="replace")
        return logs

    def tail(self, lines: int = 40) -> str:
        out = []
        for name, text in self.rank_logs().items():
            out.append(f"----- {name} (last {lines} lines) -----")
            out += text.splitlines()[-lines:]
        return "\n".join(out)

    def crash(self) -> str | None:
        """'SIGSEGV in rank 0 (...)' when a rank died of a signal, with faulthandler's first frame."""
        for name, text in self.rank_logs().items():
            m = re.search(r"Fatal Python error: (\w+)", text) or re.search(r"exitcode\s*:\s*-(\d+)", text)
            if m:
                sig = m.group(1)
                sig = _SIGNALS.get(int(sig), f"signal {sig}") if sig.isdigit() else sig
                frame = re.search(r'File "([^"]+)", line (\d+) in (\w+)', text[m.start():])
                where = f" at {Path(frame.group(1)).name}:{frame.group(2)} in {frame.group(3)}" if frame else ""
                return f"{sig} ({name}){where}"
        return None

    def describe_failure(self) -> str:
        crash = self.crash()
        why = ("timed out (possible hang)" if self.timed_out else f"crashed: {crash}" if crash
               else f"exit code {self.returncode}")
        return f"run {self.name!r} {why} after {self.seconds:.0f}s\n{self.tail()}"


def launch_command(name: str, nproc: int, args: list[str], folder: Path, repo: Path | None = None,
                   script: str = "scripts/run_script.py") -> list[str]:
    """The exact torchrun command ``launch`` runs (the wide-EP unit test dry-runs it for N = 2, 4, 8).
    ``script`` (relative to the checkout) must accept ``--output-dir`` and ``--summary-json``."""
    repo = repo or _repo_root()
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc_per_node", str(nproc), "--master_port", str(29500 + (abs(hash(name)) % 1000)),
        "--log-dir", str(folder / "torchrun"), "--redirects", "3", "--tee", "3",
        str(repo / script),
        *args,
        "--output-dir", str(folder), "--summary-json", str(folder / "summary.json"),
    ]


def launch(
    name: str,
    nproc: int,
    args: list[str],
    timeout_s: float = 420,
    env: dict | None = None,
    log_root: Path | None = None,
    script: str = "scripts/run_script.py",
) -> Run:
    repo = _repo_root()
    folder = Path(log_root or LOG_ROOT) / name
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.rglob("*"):
        if old.is_file():
            old.unlink()
    summary_path = folder / "summary.json"
    cmd = launch_command(name, nproc, args, folder, repo, script)
    full_env = launch_environment({**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"})
    start = time.monotonic()
    with open(folder / "launcher.log", "w") as launcher_log:
        launcher_log.write(" ".join(cmd) + "\n")
        launcher_log.flush()
        proc = subprocess.Popen(cmd, cwd=repo, env=full_env, stdout=launcher_log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    seconds = time.monotonic() - start
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return Run(name, proc.returncode, timed_out, seconds, folder, summary)


def proxy_args(nproc: int, steps: int = 6, micro_batch: int = 2, microbatches: int = 4) -> list[str]:
    """run_script arguments of the functional suite: the proxy at EP = nproc (nproc must divide 16)."""
    return [
        "--recipe", "qwen3_moe_proxy", "--ep", str(nproc), "--max-steps", str(steps),
        "--micro-batch-size", str(micro_batch), "--global-batch-size", str(micro_batch * microbatches * nproc),
    ]
