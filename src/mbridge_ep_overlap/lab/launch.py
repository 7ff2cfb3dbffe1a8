"""torchrun launcher shared by the functional suite, the benchmark and the dispatcher smoke check:
hard timeout, per-rank logs, crash reports.

Contract: ``launch(name, nproc, args, log_root=...)`` runs ``scripts/run_script.py`` (or ``script``)
under ``torch.distributed.run --nproc_per_node nproc`` in its own process group on a free port, tees
every rank's output to a log under ``log_root/name``, on timeout ends every process it started (a
hang fails loudly instead of blocking; ``_kill_group``: SIGTERM to the group, ``TERM_GRACE_S`` for
torchrun to stop its workers, then SIGKILL to the group and to every descendant found under /proc -
torchrun's workers run in sessions of their own, so the group alone would orphan them), and returns
a ``Run`` with the return code, the rank logs and the evidence summary (``None`` when none was
written). ``run_process_group`` is the part any torchrun command can use (the smoke check launches a
module with it). The child environment is ``launch_environment``'s: the NVLink-multicast-off
variables (``MULTICAST_OFF``, the one copy, also exported by Slurm jobs) win over anything else, and
``PYTHONFAULTHANDLER=1`` makes a native crash print each rank's Python stack. ``rank_crashes(logs)``
(owned by ``diagnose.crashes``, imported here) reads that back from a run's log tree - faulthandler's "Fatal Python error: Segmentation fault" and
"Current thread ..." frames in a rank's ``stderr.log``, torchrun's "exitcode : -11" summary - and
``Run.describe_failure()`` reports a rank killed by a signal as "crashed (SIGSEGV) in rank N" with
those frames. ``kill_launched()`` ends the process trees this process started and has not reaped
(test-session teardown), the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..diagnose.crashes import (FATAL_ERRORS, SELF_INFLICTED, RankCrash, crash_report, faulthandler_stack,  # noqa: F401 - the launcher's readers, owned by diagnose
                                 rank_crashes, rank_texts)

def _repo_root() -> Path:
    """The checkout holding scripts/run_script.py (the cwd of a GPU run, or this source tree)."""
    for candidate in (Path.cwd(), *Path(__file__).resolve().parents):
        if (candidate / "scripts" / "run_script.py").exists():
            return candidate
    raise FileNotFoundError("scripts/run_script.py not found: run from the mbridge_ep_overlap checkout")


LOG_ROOT = Path(os.environ.get("EP_OVERLAP_LOG_DIR", "out/functional"))
# NVLink multicast off: on shared hosts a program that uses it can take the GPUs out of service.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

_live: dict[int, subprocess.Popen] = {}  # process-group id -> launcher process, while it runs
_live_lock = threading.Lock()


def launch_environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the multicast-off variables winning (every launch and Slurm job uses this)."""
    return {**env, **MULTICAST_OFF}


def free_port() -> int:
    """A TCP port free on this host now (concurrent launches must not share a rendezvous port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- running a torchrun process group -----------------------------------------------------------
def run_process_group(cmd: list[str], folder: Path, env: dict[str, str], timeout_s: float,
                      cwd: Path | None = None) -> tuple[int | None, bool, float]:
    """Run ``cmd`` in its own session (process group) with its output in ``folder/launcher.log``;
    on timeout - or an interrupt or error while waiting - end it and every process below it
    (``_kill_group``). Returns (return code, timed out, seconds)."""
    start = time.monotonic()
    with open(folder / "launcher.log", "w") as launcher_log:
        launcher_log.write(" ".join(cmd) + "\n")
        launcher_log.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=launcher_log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        with _live_lock:
            _live[proc.pid] = proc
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except BaseException:  # Ctrl-C or any error here: its own session never gets the terminal's SIGINT
            _kill_group(proc, grace_s=1.0)
            raise
        finally:
            with _live_lock:
                _live.pop(proc.pid, None)
    return proc.returncode, timed_out, time.monotonic() - start


# ---- ending a launched process tree ------------------------------------------------------------
# torchrun (torch.distributed.elastic) starts each worker in a session of its own, so killing the
# launcher's process group alone orphans the workers (re-parented to init, running on forever).
TERM_GRACE_S = 5.0
"""Seconds torchrun gets after SIGTERM to stop its workers itself before everything is SIGKILLed."""


def _stat(pid: int) -> tuple[int, int, str, int] | None:
    """(parent pid, process group, state, start time) from /proc/PID/stat; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and ')'
    try:
        return int(fields[1]), int(fields[2]), fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _process_table() -> dict[int, tuple[int, int, str, int]]:
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: only the process group can be reached
        return {}
    table = {}
    for name in names:
        if name.isdigit() and (st := _stat(int(name))) is not None:
            table[int(name)] = st
    return table


def descendants(root: int | None, known: dict[int, int] | None = None) -> dict[int, int]:
    """pid -> start time of every live process below ``root`` (None: a root already reaped, whose pid
    may name another process now) and below the ``known`` ones (found earlier; an orphan has init as
    its parent by now). A known pid that now names another process (other start time) or a zombie
    is dropped."""
    table = _process_table()
    found = {pid: start for pid, start in (known or {}).items()
             if pid in table and table[pid][3] == start and table[pid][2] != "Z"}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, state, _) in table.items():
        if state != "Z":
            children.setdefault(ppid, []).append(pid)
    stack = [*([] if root is None else [root]), *found]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found and child != root:
                found[child] = table[child][3]
                stack.append(child)
    return found


def _signal(pid: int, start: int, sig: signal.Signals) -> None:
    """``sig`` to ``pid`` if it is still the process that started at ``start`` (pids are reused)."""
    st = _stat(pid)
    if st is not None and st[3] == start:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _kill_group(proc: subprocess.Popen, grace_s: float | None = None) -> None:
    """End ``proc`` (started with ``start_new_session``) and every process below it: SIGTERM to its
    group and ``grace_s`` for torchrun to stop its workers; then whatever is left - in the group or
    below it in sessions of their own, orphans included - is stopped (SIGSTOP: a stopped process
    cannot start another), found again until nothing new appears, and SIGKILLed with its group."""
    grace_s = TERM_GRACE_S if grace_s is None else grace_s
    tree = descendants(proc.pid)  # before any signal: once torchrun is gone its workers are orphans
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
        tree = descendants(proc.pid, tree)  # what starts or is orphaned meanwhile
    exited = proc.poll() is not None
    stopped: set[int] = set()
    for _ in range(100):
        tree = descendants(None if exited else proc.pid, tree)
        new = [pid for pid in tree if pid not in stopped]
        if not new:
            break
        for pid in new:
            _signal(pid, tree[pid], signal.SIGSTOP)
            stopped.add(pid)
    table = _process_table()
    # groups still in use cannot have been handed to another process; the launcher's own group only
    # while it is not reaped or a member is left
    groups = {table[pid][1] for pid in tree if pid in table and table[pid][3] == tree[pid]}
    if not exited:
        groups.add(proc.pid)
    for group in groups:
        if group > 1 and (group == proc.pid or group in tree):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
    if not exited:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    for pid, start in tree.items():
        _signal(pid, start, signal.SIGKILL)
    proc.wait()


def kill_launched() -> int:
    """Kill the process trees started here that are still running; returns how many."""
    with _live_lock:
        procs = list(_live.values())
    for proc in procs:
        _kill_group(proc)
    return len(procs)


def child_environment(env: dict | None = None) -> dict[str, str]:
    """What every launched run gets: this environment, ``env``, unbuffered output, faulthandler on,
    and the multicast-off variables over all of it."""
    return launch_environment({**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"})


def clear_folder(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.rglob("*"):
        if old.is_file():
            old.unlink()


def read_logs(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text(errors="replace") for p in sorted(folder.rglob("*.log"))}


@dataclass
class Run:
    name: str
    returncode: int | None
    timed_out: bool
    seconds: float
    folder: Path
    summary: dict | None

    def rank_logs(self) -> dict[str, str]:
        return read_logs(self.folder)

    def tail(self, lines: int = 40) -> str:
        out = []
        for name, text in self.rank_logs().items():
            out.append(f"----- {name} (last {lines} lines) -----")
            out += text.splitlines()[-lines:]
        return "\n".join(out)

    def crashes(self) -> list[RankCrash]:
        """The ranks that died of a signal, if one of them crashed by itself (SIGSEGV, SIGABRT, ...):
        ranks torchrun terminated after another rank's Python exception are not a crash."""
        crashes = rank_crashes(self.rank_logs())
        return crashes if any(c.signal in SELF_INFLICTED or c.stack for c in crashes) else []

    def crash(self) -> str | None:
        """'SIGSEGV in rank 0 at hybrid_ep_buffer.py:62 in __init__' when a rank died of a signal."""
        crashes = self.crashes()
        if not crashes:
            return None
        c = crashes[0]
        return f"{c.signal} in rank {c.rank}{c.where()}"

    def describe_failure(self) -> str:
        crashes = self.crashes()
        if self.timed_out:
            head, detail = "timed out (possible hang)", ""
        elif crashes:
            report = crash_report(crashes)
            head, _, detail = report.partition("\n")
        else:
            head, detail = f"exit code {self.returncode}", ""
        return f"run {self.name!r} {head} after {self.seconds:.0f}s\n" + (detail + "\n" if detail else "") + self.tail()


def launch_command(name: str, nproc: int, args: list[str], folder: Path, repo: Path | None = None,
                   script: str = "scripts/run_script.py", master_port: int | None = None,
                   share_gpu: bool = False) -> list[str]:
    """The exact torchrun command ``launch`` runs (the wide-EP unit test dry-runs it for N = 2, 4, 8).
    ``script`` (relative to the checkout) must accept ``--output-dir`` and ``--summary-json``.
    ``share_gpu``: every rank on GPU 0, each as a node of its own (``lab.shared_gpu``)."""
    repo = repo or _repo_root()
    port = master_port if master_port is not None else 29500 + (abs(hash(name)) % 1000)
    wrapper = ["--module", "mbridge_ep_overlap.lab.shared_gpu"] if share_gpu else []
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc_per_node", str(nproc), "--master_port", str(port),
        "--log-dir", str(folder / "torchrun"), "--redirects", "3", "--tee", "3",
        *wrapper, str(repo / script),
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
    share_gpu: bool = False,
) -> Run:
    """Safe to call from several threads at once (each launch gets its own free rendezvous port).
    ``share_gpu``: run every rank on GPU 0 (``lab.shared_gpu``: correctness evidence only)."""
    repo = _repo_root()
    folder = Path(log_root or LOG_ROOT) / name
    clear_folder(folder)
    summary_path = folder / "summary.json"
    cmd = launch_command(name, nproc, args, folder, repo, script, master_port=free_port(), share_gpu=share_gpu)
    returncode, timed_out, seconds = run_process_group(cmd, folder, child_environment(env), timeout_s, cwd=repo)
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return Run(name, returncode, timed_out, seconds, folder, summary)


def proxy_args(nproc: int, steps: int = 6, micro_batch: int = 2, microbatches: int = 4,
               recipe: str = "qwen3_moe_proxy") -> list[str]:
    """run_script arguments of the functional suite: a proxy recipe at EP = nproc (nproc must divide 16)."""
    return [
        "--recipe", recipe, "--ep", str(nproc), "--max-steps", str(steps),
        "--micro-batch-size", str(micro_batch), "--global-batch-size", str(micro_batch * microbatches * nproc),
    ]
