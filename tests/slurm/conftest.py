"""Slurm tests: the generated job submitted to a real Slurm controller (``scripts/ci/slurm_up.sh``).

They run where a controller answers (``SLURM_CONF`` pointing at it, as ``.ci/run`` sets), and skip
with the reason anywhere else - they never pass without running. No GPU is needed: the cluster's GPUs
are GRES backed by character devices, so ``--gpus-per-node`` schedules; where training would need a
real GPU, a stand-in worker does the distributed part (named in each test and in docs/slurm.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[2]
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED"}


def _controller() -> str | None:
    """Why no Slurm test can run here, or None when a controller answers."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "no Slurm client on PATH (scripts/ci/slurm_up.sh installs and starts a one-node cluster)"
    result = subprocess.run(["sinfo", "-h", "-o", "%P %t"], capture_output=True, text=True, timeout=60)
    if result.returncode != 0 or not result.stdout.strip():
        return f"no Slurm controller answers ({(result.stderr.strip() or 'no partition').splitlines()[-1]})"
    return None


@pytest.fixture(scope="session")
def slurm() -> "Slurm":
    why = _controller()
    if why:
        pytest.skip(why)
    return Slurm()


class Slurm:
    """The cluster under test: its partition, and jobs submitted and waited for."""

    def __init__(self) -> None:
        first = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True).stdout.split()[0]
        self.partition = first.rstrip("*")
        bindir = str(Path(sys.executable).parent)  # sbatch passes this environment on: torchrun must be on PATH
        self.env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}"}

    def sbatch(self, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["sbatch", *argv], capture_output=True, text=True, timeout=120, cwd=cwd, env=self.env)

    def submit(self, *argv: str, cwd: Path) -> str:
        result = self.sbatch("--parsable", *argv, cwd=cwd)
        assert result.returncode == 0 and "error" not in result.stderr.lower(), result.stderr
        assert "warning" not in result.stderr.lower(), result.stderr  # every #SBATCH line accepted as written
        return result.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
        fields = {}
        for token in out.split():
            key, _, value = token.partition("=")
            fields.setdefault(key, value)
        return fields

    def wait(self, job_id: str, timeout_s: float = 180) -> dict[str, str]:
        """The job's fields once it has ended (scontrol keeps them for MinJobAge); fails on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") in TERMINAL:
                return fields
            time.sleep(0.5)
        subprocess.run(["scancel", job_id])
        pytest.fail(f"job {job_id} did not end in {timeout_s} s: {self.job(job_id)}")
