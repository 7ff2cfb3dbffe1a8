"""A rank's evidence (runtime.run_evidence, runtime.rank_evidence): flight-recorder variables by torch
version, faulthandler to file and stderr, facts, watchdog settings, and a real stalled collective on
CPU (gloo) recorded by the watchdog with torch's own flight-recorder dump."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from mbridge_ep_overlap.base import run_files
from mbridge_ep_overlap.base.errors import UsageError
from mbridge_ep_overlap.runtime import run_evidence as ev

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version,names", [
    ("2.9.1+cu128", ev.OLD_FR_NAMES), ("2.10.0", ev.NEW_FR_NAMES), ("2.11.0+cu130", ev.NEW_FR_NAMES),
    ("2.13.0a0+git", ev.NEW_FR_NAMES), ("garbage", ev.OLD_FR_NAMES),
])
def test_flight_recorder_names_follow_the_torch_version(version, names):
    assert ev.flight_recorder_names(version) == names


def test_installed_torch_reads_the_names_chosen_for_it():
    """The installed torch's own Python reads the buffer-size name chosen for its version."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    buffer_name = ev.flight_recorder_names(torch.__version__)[0]
    assert f'"{buffer_name}"' in Path(c10d.__file__).read_text()


def test_flight_recorder_environment_never_overrides_the_user(tmp_path):
    env = ev.flight_recorder_environment(tmp_path, "2.11.0", {})
    assert env == {"TORCH_FR_BUFFER_SIZE": ev.FR_BUFFER_ENTRIES,
                   "TORCH_FR_DUMP_TEMP_FILE": str(run_files.flight_recorder_prefix(tmp_path)),
                   "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    user = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr_", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    assert ev.flight_recorder_environment(tmp_path, "2.11.0", user) == {}  # either name counts as set
    assert ev.flight_recorder_prefix(tmp_path, "2.11.0", user) == "/scratch/fr_"
    old = ev.flight_recorder_environment(tmp_path, "2.9.0", {"TORCH_FR_BUFFER_SIZE": "10"})
    assert old == {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(run_files.flight_recorder_prefix(tmp_path)),
                   "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}


def test_install_flight_recorder_makes_the_dump_folder(tmp_path):
    # torch writes <prefix><rank> on an NCCL timeout but never creates the folder: without it the dump
    # is lost ("Error opening file for writing Flight Recorder debug info", recorded 2026-12-01 on 1x H200)
    env: dict[str, str] = {}
    prefix = ev.install_flight_recorder(tmp_path / "run", "2.11.0", env)
    assert prefix == env["TORCH_FR_DUMP_TEMP_FILE"] == str(run_files.flight_recorder_prefix(tmp_path / "run"))
    assert Path(prefix).parent.is_dir()
    user = {"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "scratch" / "deep" / "fr_")}
    assert ev.install_flight_recorder(tmp_path / "run2", "2.11.0", user) == user["TORCH_FR_DUMP_TEMP_FILE"]
    assert (tmp_path / "scratch" / "deep").is_dir() and not (tmp_path / "run2").exists()


def test_dump_flight_recorder_writes_prefix_plus_rank(tmp_path):
    prefix = str(run_files.flight_recorder_prefix(tmp_path))
    empty, full = pickle.dumps({"entries": []}), pickle.dumps({"entries": [{"record_id": 0}]})
    path = ev.dump_flight_recorder(prefix, 3, dumps=[lambda: empty, lambda: full])
    assert path == prefix + "3" and Path(path).read_bytes() == full  # the recorder that holds entries
    assert ev.dump_flight_recorder(prefix, 3, dumps=[]).startswith("unavailable")


def test_enabled_reads_the_variable():
    assert ev.enabled({}) and ev.enabled({"EP_OVERLAP_EVIDENCE": "1"})
    assert not ev.enabled({"EP_OVERLAP_EVIDENCE": "0"}) and not ev.enabled({"EP_OVERLAP_EVIDENCE": "off"})


def test_watchdog_settings():
    assert ev.watchdog_settings(None, {}) == {"first_s": ev.FIRST_S, "floor_s": ev.FLOOR_S, "factor": ev.FACTOR,
                                              "fixed_s": None, "cap_s": None}
    assert ev.watchdog_settings(None, {ev.WATCHDOG_ENV: "25"})["fixed_s"] == 25
    assert ev.watchdog_settings("30", {ev.WATCHDOG_ENV: "25"})["fixed_s"] == 30  # the flag wins
    assert ev.watchdog_settings(None, {ev.WATCHDOG_ENV: "0"}) is None
    assert ev.watchdog_settings(None, {ev.WATCHDOG_FIRST_ENV: "900"})["first_s"] == 900
    with pytest.raises(UsageError, match="EP_OVERLAP_WATCHDOG_S 'soon'"):
        ev.watchdog_settings(None, {ev.WATCHDOG_ENV: "soon"})


def test_watchdog_default_is_capped_below_the_process_group_timeout(capsys):
    settings = ev.watchdog_settings(None, {}, pg_timeout_s=60)
    assert settings["cap_s"] == ev.PG_TIMEOUT_FRACTION * 60 < 60
    assert capsys.readouterr().err == ""
    kept = ev.watchdog_settings("150", {}, pg_timeout_s=60)  # the user's value is kept, and said
    assert kept["fixed_s"] == 150
    assert "--watchdog-s=150 s is at or past the process group's timeout (60 s)" in capsys.readouterr().err
    ev.watchdog_settings("20", {}, pg_timeout_s=60)
    assert capsys.readouterr().err == ""


def test_process_group_timeout_is_read_from_the_dist_config(proxy_cfg):
    proxy_cfg.dist.distributed_timeout_minutes = 1
    assert ev.process_group_timeout_s(proxy_cfg) == 60
    assert ev.process_group_timeout_s(object()) is None


def test_facts_have_the_layout_keys_and_read_the_config(proxy_cfg):
    environ = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "32"}
    found = ev.facts(proxy_cfg, environ, microbatches=4, versions_found={"torch": "x"})
    assert tuple(found) == run_files.FACT_KEYS
    assert found["rank"] == 1 and found["world_size"] == 2 and found["microbatches_per_step"] == 4
    assert found["moe_token_dispatcher_type"] == "alltoall" and found["cuda_device_max_connections"] == "32"
    assert found["overlap_moe_expert_parallel_comm"] == proxy_cfg.model.overlap_moe_expert_parallel_comm
    assert json.loads(json.dumps(found)) == found


def test_versions_name_every_package_and_never_fail():
    found = ev.versions()
    assert set(found) == {*ev.DISTRIBUTIONS, "nccl"}
    import torch

    assert found["torch"] == torch.__version__.split("+")[0] or found["torch"] == torch.__version__
    assert ev._distribution_version(("no-such-distribution-here",)) == ev.NOT_INSTALLED


def test_faulthandler_reaches_the_file_and_stderr_on_a_real_segfault(tmp_path):
    log = tmp_path / "evidence" / "faulthandler-rank0.log"
    code = textwrap.dedent(f"""
        import ctypes, sys
        from mbridge_ep_overlap.runtime.run_evidence import enable_faulthandler
        enable_faulthandler(__import__("pathlib").Path({str(log)!r}), sys.stderr)
        def dispatch_in_layer():
            ctypes.string_at(0)
        dispatch_in_layer()
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == -11
    deadline = time.monotonic() + 5  # the tee child copies what the dead rank wrote
    while "dispatch_in_layer" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    for text in (result.stderr, log.read_text()):
        assert "Fatal Python error: Segmentation fault" in text and "dispatch_in_layer" in text


def test_launch_reads_the_crash_from_stderr_as_before(tmp_path):
    """lab.launch's crash reader still finds the rank's faulthandler report on its stderr."""
    from mbridge_ep_overlap.lab.launch import rank_crashes

    log = tmp_path / "faulthandler-rank0.log"
    code = ("import ctypes, sys, pathlib\nfrom mbridge_ep_overlap.runtime.run_evidence import enable_faulthandler\n"
            f"enable_faulthandler(pathlib.Path({str(log)!r}), sys.stderr)\nctypes.string_at(0)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    crashes = rank_crashes({"attempt_0/0/stderr.log": result.stderr})
    assert [c.signal for c in crashes] == ["SIGSEGV"] and crashes[0].stack


STALL_SCRIPT = textwrap.dedent("""
    import os, sys, time, datetime, pathlib
    run_dir, rank = pathlib.Path(sys.argv[1]), int(sys.argv[2])
    from mbridge_ep_overlap.base import run_files
    from mbridge_ep_overlap.runtime import run_evidence as ev
    from mbridge_ep_overlap.runtime.watchdog import ProgressWatchdog
    import torch
    os.environ.update(ev.flight_recorder_environment(run_dir, torch.__version__))
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[3], rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    prefix = ev.flight_recorder_prefix(run_dir, torch.__version__)
    wd = ProgressWatchdog(rank, run_files.faulthandler_file(run_dir, rank), run_files.watchdog_file(run_dir, rank),
                          dump_flight_recorder=lambda: ev.dump_flight_recorder(prefix, rank), fixed_s=1.0, poll_s=0.1)
    wd.start()
    def combine_all_to_all():
        dist.all_reduce(torch.ones(4))
    combine_all_to_all(); wd.progress(1)
    if rank == 1:
        time.sleep(60)  # rank 1 never joins the second collective
    combine_all_to_all()
""")


def test_a_real_stalled_collective_is_recorded_by_the_watchdog(tmp_path):
    """Two gloo ranks; rank 1 skips the second collective. Rank 0's watchdog writes its stacks (the
    waiting frame named), a stall event, and torch's flight-recorder dump showing the collective."""
    from mbridge_ep_overlap.lab.launch import free_port

    script = tmp_path / "stall.py"
    script.write_text(STALL_SCRIPT)
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path), str(r), port], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in (0, 1)]
    try:
        events = run_files.watchdog_file(tmp_path, 0)
        deadline = time.monotonic() + 90
        while not events.exists() and time.monotonic() < deadline and procs[0].poll() is None:
            time.sleep(0.2)
        assert events.exists(), procs[0].communicate(timeout=5)[0].decode()[-3000:] if procs[0].poll() is not None else "no stall event"
        event = json.loads(events.read_text().splitlines()[0])
        assert event["event"] == "stall" and event["rank"] == 0 and event["iteration"] == 1
        stacks = run_files.faulthandler_file(tmp_path, 0).read_text()
        assert "combine_all_to_all" in stacks and "all_reduce" in stacks
        dump = Path(event["flight_recorder"])
        assert dump == Path(f"{run_files.flight_recorder_prefix(tmp_path)}0")
        entries = pickle.loads(dump.read_bytes())["entries"]
        assert [e["collective_seq_id"] for e in entries if "all_reduce" in e["profiling_name"]][-1] == 2
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_rank_evidence_position_and_callback_on_the_real_moe_layer(tmp_path):
    from megatron.core.transformer.moe.moe_layer import MoELayer

    from mbridge_ep_overlap.runtime.rank_evidence import MoEPosition, ProgressCallback, RunEvidence
    from mbridge_ep_overlap.runtime.watchdog import ProgressWatchdog

    original = MoELayer.dispatch, MoELayer.combine
    position = MoEPosition().install()
    try:
        layer = MoELayer.__new__(MoELayer)  # the real methods, without building a model
        layer.layer_number = 3
        layer.config = types.SimpleNamespace(overlap_dispatch_backward_with_experts_wgrad=False)
        layer.token_dispatcher = types.SimpleNamespace(token_dispatch=lambda h, p: (h, p), token_combine=lambda o: o)
        assert layer.dispatch("h", "p") == ("h", "p")
        assert position.snapshot() == {"layer": 3, "op": "dispatch", "phase": "forward", "microbatch": 0, "done": True}
        layer.dispatch("h", "p")
        assert position.snapshot()["microbatch"] == 1
        wd = ProgressWatchdog(0, run_files.faulthandler_file(tmp_path, 0), run_files.watchdog_file(tmp_path, 0))
        evidence = RunEvidence(tmp_path, 0, "2.11.0", wd)
        evidence.position = position
        ctx = types.SimpleNamespace(state=types.SimpleNamespace(train_state=types.SimpleNamespace(step=7)))
        ProgressCallback(evidence).on_train_step_end(ctx)
        assert wd.iteration == 7
        layer.combine("o")
        assert position.snapshot()["op"] == "combine" and position.snapshot()["microbatch"] == 0
    finally:
        position.uninstall()
    assert (MoELayer.dispatch, MoELayer.combine) == original


def test_run_evidence_start_in_a_rank(tmp_path):
    """RunEvidence.start as tools.run calls it: variables set for the process group, facts, tee, watchdog."""
    code = textwrap.dedent(f"""
        import os, sys, json
        os.environ.update(RANK="1", WORLD_SIZE="2", LOCAL_RANK="0")
        from mbridge_ep_overlap.target import shims
        shims.install()
        from mbridge_ep_overlap.runtime.rank_evidence import RunEvidence
        e = RunEvidence.start({str(tmp_path)!r}, None, stderr=sys.stderr, watchdog_flag="40")
        print(json.dumps({{k: os.environ.get(k) for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
              "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT")}}))
        print(e.watchdog.fixed_s, e.tee is not None, e.watchdog._thread is not None)
        e.stop()
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                            env={**os.environ, "TORCH_NCCL_TRACE_BUFFER_SIZE": "77"})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    env = json.loads(lines[-2])
    import torch

    _, file_name = ev.flight_recorder_names(torch.__version__)
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "77" and env["TORCH_FR_BUFFER_SIZE"] is None  # the user's value
    assert env[file_name] == str(run_files.flight_recorder_prefix(tmp_path)) and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert lines[-1] == "40.0 True True"
    found = json.loads(run_files.facts_file(tmp_path, 1).read_text())
    assert tuple(found) == run_files.FACT_KEYS and found["rank"] == 1 and found["versions"]["megatron-core"] == "0.19.2"


def test_evidence_callbacks_off_by_flag_or_variable(tmp_path, monkeypatch):
    from mbridge_ep_overlap.runtime.rank_evidence import evidence_callbacks

    args = types.SimpleNamespace(evidence="off", watchdog_s=None)
    assert evidence_callbacks(args, tmp_path, None) == []
    monkeypatch.setenv("EP_OVERLAP_EVIDENCE", "0")
    assert evidence_callbacks(types.SimpleNamespace(evidence=None, watchdog_s=None), tmp_path, None) == []
    assert not (tmp_path / run_files.EVIDENCE_DIR).exists()
