"""The launcher's timeout ends the whole process tree it started (no GPU, no torch: a pure-Python
tree shaped like torchrun's - workers in sessions of their own - timed out by ``run_process_group``)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from mbridge_ep_overlap.lab import launch

# top -> child (top's group) -> grandchild (a session of its own, as torchrun starts its workers)
# -> leaf (the grandchild's session). The grandchild and the leaf ignore SIGTERM: only SIGKILL ends
# them. top either exits on SIGTERM at once (a launcher that leaves its workers behind, orphaned) or
# ignores it (a launcher that never stops: the grace period runs out).
TREE = r'''
import os, signal, subprocess, sys, time
role, folder, top_on_term = sys.argv[1], sys.argv[2], sys.argv[3]
if role in ("grandchild", "leaf") or (role == "top" and top_on_term == "ignore"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
following = {"top": "child", "child": "grandchild", "grandchild": "leaf"}.get(role)
if following:
    subprocess.Popen([sys.executable, __file__, following, folder, top_on_term],
                     start_new_session=following == "grandchild")
with open(os.path.join(folder, role + ".tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(folder, role + ".tmp"), os.path.join(folder, role + ".pid"))
while True:
    time.sleep(1)
'''
ROLES = ("top", "child", "grandchild", "leaf")


def alive(pid: int, marker: str) -> bool:
    """``pid`` runs (not a zombie) and is still one of this test's processes (its command line
    holds the test's own folder: a reused pid is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and marker.encode() in cmdline


def survivors(pids: dict[str, int], marker: str, wait_s: float = 3.0) -> list[str]:
    """The roles still alive after up to ``wait_s`` (SIGKILL is delivered asynchronously)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = [role for role, pid in pids.items() if alive(pid, marker)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.mark.parametrize("top_on_term", ["exit", "ignore"])
def test_timeout_kills_every_descendant_in_sessions_of_their_own(top_on_term, tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "TERM_GRACE_S", 1.0)
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    folder = tmp_path / "run"
    folder.mkdir()
    pids: dict[str, int] = {}
    try:
        code, timed_out, seconds = launch.run_process_group(
            [sys.executable, str(script), "top", str(folder), top_on_term], folder, dict(os.environ), timeout_s=6)
        pids = {role: int((folder / f"{role}.pid").read_text()) for role in ROLES if (folder / f"{role}.pid").exists()}
        assert timed_out and code is not None
        assert sorted(pids) == sorted(ROLES), f"the tree was not built before the timeout: {sorted(pids)}"
        assert survivors(pids, str(tmp_path)) == []
        assert seconds < 6 + 1.0 + 5  # the grace period, not torchrun's own 30 s
        assert not launch._live
    finally:  # a failed test leaves nothing running
        for pid in pids.values():
            if alive(pid, str(tmp_path)):
                os.kill(pid, signal.SIGKILL)


def test_descendants_follow_orphans_and_ignore_reused_pids(tmp_path):
    import subprocess

    script = tmp_path / "tree.py"
    script.write_text(TREE)
    folder = tmp_path / "run"
    folder.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), "top", str(folder), "exit"], start_new_session=True)
    pids: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 10
        while not (folder / "leaf.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = {role: int((folder / f"{role}.pid").read_text()) for role in ROLES}
        tree = launch.descendants(proc.pid)
        assert set(tree) == {pids["child"], pids["grandchild"], pids["leaf"]}
        proc.kill()
        proc.wait()  # top gone and reaped: its pid may name another process now
        os.kill(pids["child"], signal.SIGKILL)  # the grandchild is an orphan now
        assert survivors({"child": pids["child"]}, str(tmp_path)) == []
        found = launch.descendants(None, {**tree, pids["child"]: tree[pids["child"]]})
        assert set(found) == {pids["grandchild"], pids["leaf"]}
        assert launch.descendants(None, {pids["leaf"]: tree[pids["leaf"]] + 1}) == {}  # another start time
    finally:
        for pid in pids.values():
            if alive(pid, str(tmp_path)):
                os.kill(pid, signal.SIGKILL)


def test_an_interrupt_while_waiting_ends_the_tree_too(tmp_path, monkeypatch):
    """Ctrl-C reaches only the launcher's own process (the tree runs in a session of its own): the
    interrupt propagates and nothing it started is left running."""
    monkeypatch.setattr(launch, "TERM_GRACE_S", 1.0)
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    folder = tmp_path / "run"
    folder.mkdir()

    def interrupt(signum, frame):
        if len(list(folder.glob("*.pid"))) == len(ROLES):
            signal.setitimer(signal.ITIMER_REAL, 0)  # one Ctrl-C
            raise KeyboardInterrupt
    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5, 0.2)
    pids: dict[str, int] = {}
    try:
        with pytest.raises(KeyboardInterrupt):
            launch.run_process_group([sys.executable, str(script), "top", str(folder), "ignore"], folder,
                                     dict(os.environ), timeout_s=60)
        signal.setitimer(signal.ITIMER_REAL, 0)
        pids = {role: int((folder / f"{role}.pid").read_text()) for role in ROLES}
        assert survivors(pids, str(tmp_path)) == []
        assert not launch._live
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        for pid in pids.values():
            if alive(pid, str(tmp_path)):
                os.kill(pid, signal.SIGKILL)


# ---- ranks sharing one GPU (lab.shared_gpu) ----------------------------------------------------
def test_shared_gpu_command_wraps_the_script_and_the_default_does_not(tmp_path):
    from mbridge_ep_overlap.lab.shared_gpu import ENV, enabled

    plain = launch.launch_command("x", 2, ["--a"], tmp_path, script="scripts/run_script.py", master_port=1)
    shared = launch.launch_command("x", 2, ["--a"], tmp_path, script="scripts/run_script.py", master_port=1,
                                   share_gpu=True)
    assert "--module" not in plain and "mbridge_ep_overlap.lab.shared_gpu" not in plain
    i = shared.index("--module")
    assert shared[i + 1] == "mbridge_ep_overlap.lab.shared_gpu"
    assert shared[i + 2].endswith("scripts/run_script.py") and shared[i + 3] == "--a"
    assert [a for a in shared if a not in ("--module", "mbridge_ep_overlap.lab.shared_gpu")] == plain
    assert enabled({ENV: "1"}) and not enabled({ENV: "0"}) and not enabled({})


@pytest.mark.parametrize("caller, expect_ifname", [({}, "lo"), ({"NCCL_SOCKET_IFNAME": "eth0"}, None)])
def test_shared_gpu_rank_environment(caller, expect_ifname):
    from mbridge_ep_overlap.lab.shared_gpu import HOSTID_PREFIX, active, rank_environment

    env0 = rank_environment({"RANK": "0", "LOCAL_RANK": "0", **caller})
    env1 = rank_environment({"RANK": "1", "LOCAL_RANK": "1", **caller})
    assert env1["LOCAL_RANK"] == "0" and env1["LOCAL_WORLD_SIZE"] == "1"
    assert env0["NCCL_HOSTID"] != env1["NCCL_HOSTID"] and env1["NCCL_HOSTID"] == f"{HOSTID_PREFIX}1"
    assert env1.get("NCCL_SOCKET_IFNAME") == expect_ifname  # the caller's choice is kept (not overwritten)
    assert active(env1) and not active({"NCCL_HOSTID": "somehost"})
    with pytest.raises(RuntimeError, match="torchrun"):
        rank_environment({})


def test_shared_gpu_runs_the_script_as_main_with_the_rank_environment(tmp_path):
    import json
    import subprocess

    script = tmp_path / "probe_script.py"
    script.write_text("import json, os, sys\n"
                      "print(json.dumps({'argv': sys.argv[1:], 'name': __name__, 'local': os.environ['LOCAL_RANK'],"
                      " 'host': os.environ['NCCL_HOSTID'], 'path0': sys.path[0]}))\n"
                      "sys.exit(3)\n")
    env = {**os.environ, "RANK": "1", "LOCAL_RANK": "1"}
    env.pop("NCCL_HOSTID", None)
    proc = subprocess.run([sys.executable, "-m", "mbridge_ep_overlap.lab.shared_gpu", str(script), "--x", "1"],
                          env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr  # the script's own exit code
    out = json.loads(proc.stdout)
    assert out == {"argv": ["--x", "1"], "name": "__main__", "local": "0",
                   "host": "ep-overlap-shared-gpu-rank1", "path0": str(tmp_path)}
