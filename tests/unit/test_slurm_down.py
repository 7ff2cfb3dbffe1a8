"""scripts/ci/slurm_down.sh stops only what slurm_up.sh started and is safe to call twice: a second call
(the exit trap after the explicit stop) must not wait on a controller that is gone. Real Slurm clients
are replaced by ones that hang, as a client does when no controller answers; no daemon is started."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "ci" / "slurm_down.sh"


def _hanging_clients(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("squeue", "scancel"):
        tool = bin_dir / name
        tool.write_text("#!/bin/sh\nsleep 600\n")
        tool.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _state(tmp_path: Path, pids: str) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    (state / "slurm.conf").write_text("ClusterName=ci\n")
    (state / "pids").write_text(pids)
    return state


def test_a_second_stop_does_not_wait_on_a_controller_that_is_gone(tmp_path):
    state = _state(tmp_path, "")  # the first stop emptied the pid list
    r = subprocess.run(["bash", str(SCRIPT), str(state)], env=_hanging_clients(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "stopped 0 daemons" in r.stdout


def test_a_pid_that_names_another_program_is_not_signalled_or_drained_for(tmp_path):
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        state = _state(tmp_path, f"{sleeper.pid}\n")
        r = subprocess.run(["bash", str(SCRIPT), str(state)], env=_hanging_clients(tmp_path),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert sleeper.poll() is None  # "sleep" is not munged / slurmctld / slurmd: left alone
    finally:
        sleeper.kill()
        sleeper.wait()
