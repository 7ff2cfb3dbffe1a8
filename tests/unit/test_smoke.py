"""The dispatcher smoke check and crash reporting, on CPU.

Verdicts are classified from log trees laid out as torchrun writes them with ``--log-dir --redirects
3 --tee 3`` (``<run>/attempt_0/<rank>/std{out,err}.log`` plus torchrun's own failure summary), with
faulthandler's report as Python 3.12 prints it; two tests launch the real worker under torchrun
(gloo, ``selftest-*`` backends) to check the whole path: process group, timeout kill, log parsing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import pytest

from mbridge_ep_overlap.core.dispatcher import IPC_HEALTH_KEY, health
from mbridge_ep_overlap.target import smoke_verdicts
from mbridge_ep_overlap.target.cluster import describe
from mbridge_ep_overlap.lab import launch, smoke
from mbridge_ep_overlap.lab.smoke import Verdict, classify

REPO = Path(__file__).resolve().parents[2]
RUN = "torchrun/none_k2j4x9/attempt_0"
STACK = '''Fatal Python error: Segmentation fault

Current thread 0x00007f5638f8eb80 (most recent call first):
  File "/tmp/ep-overlap-site/deep_ep/hybrid_ep_buffer.py", line 94 in __init__
  File "/tmp/ep-overlap-site/mbridge_ep_overlap/lab/smoke_worker.py", line 206 in run_hybridep
  File "/tmp/ep-overlap-site/mbridge_ep_overlap/lab/smoke_worker.py", line 311 in main
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in _run_module_as_main

Extension modules: numpy._core._multiarray_umath, torch._C, torch._C._nn, deep_ep_cpp, hybrid_ep_cpp (total: 5)
'''
BEFORE_INIT = ("info: rank {r} of 2, backend hybridep, pid 91{r}\nstage: import deep_ep\n"
               "stage: init process group (nccl)\nstage: allocator path\n"
               "info: HybridEP allocator: fabric handles (cuMemCreate FABRIC; every GPU advertises "
               "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED; USE_MNNVL=unset)\nstage: HybridEPBuffer init\n")
SUMMARY = '''torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
mbridge_ep_overlap.lab.smoke_worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_18:33:17
  host      : h200-node
  rank      : 1 (local_rank: 1)
  exitcode  : {code1} (pid: 9226)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 9226
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_18:33:17
  host      : h200-node
  rank      : 0 (local_rank: 0)
  exitcode  : -11 (pid: 9225)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 9225
============================================================
'''


def tree(stdout: dict[int, str], stderr: dict[int, str] | None = None, launcher: str = "") -> dict[str, str]:
    logs = {"launcher.log": launcher}
    for rank, text in stdout.items():
        logs[f"{RUN}/{rank}/stdout.log"] = text
        logs[f"{RUN}/{rank}/stderr.log"] = (stderr or {}).get(rank, "")
    return logs


def write_tree(folder: Path, logs: dict[str, str]) -> None:
    for name, text in logs.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


# ---- classification from fake outcomes ---------------------------------------------------------------
def test_signal_11_is_a_crash_in_the_stage_with_each_rank_stack():
    logs = tree({0: BEFORE_INIT.format(r=0), 1: BEFORE_INIT.format(r=1)}, {0: STACK, 1: STACK},
                SUMMARY.format(code1=-11))
    v = classify("hybridep", 1, False, logs, seconds=21, timeout_s=180)
    assert v.status == "crashed" and v.signal == "SIGSEGV" and v.stage == "HybridEPBuffer init"
    assert v.line() == "hybridep: crashed (SIGSEGV) in HybridEPBuffer init on this node"
    assert v.stack[0] == 'File "/tmp/ep-overlap-site/deep_ep/hybrid_ep_buffer.py", line 94 in __init__'
    assert any("fabric handles" in i for i in v.info)
    assert "Python stack of rank 0" in v.report() and "hybrid_ep_buffer.py" in v.report()


def test_a_signal_seen_only_in_torchruns_summary_is_still_a_crash():
    logs = tree({0: BEFORE_INIT.format(r=0), 1: BEFORE_INIT.format(r=1)}, launcher=SUMMARY.format(code1=-15))
    v = classify("hybridep", 1, False, logs)
    assert (v.status, v.signal, v.rank, v.stage) == ("crashed", "SIGSEGV", "0", "HybridEPBuffer init")


def test_timeout_is_a_hang_in_each_ranks_last_stage():
    logs = tree({0: "stage: init process group (nccl)\nstage: dispatch\n",
                 1: "stage: init process group (nccl)\nstage: HybridEPBuffer init\n"})
    v = classify("hybridep", -9, True, logs, timeout_s=180)
    assert v.status == "hung"
    assert v.text == "hung (timeout after 180 s) in dispatch (rank 0), HybridEPBuffer init (rank 1)"
    same = classify("deepep", -9, True, tree({0: "stage: combine\n", 1: "stage: combine\n"}), timeout_s=150)
    assert same.line() == "deepep: hung (timeout after 150 s) in combine on this node"


def test_a_workers_wrong_result_line_wins_over_the_ranks_torchrun_terminated():
    logs = tree({0: "stage: check combine\nwrong: check combine: max |diff| 3 (expected each token times 2)\n",
                 1: "stage: Buffer destroy\n"}, launcher=SUMMARY.format(code1=-15).replace("-11", "3"))
    v = classify("deepep", 1, False, logs)
    assert v.status == "wrong" and v.stage == "check combine"
    assert v.line() == "deepep: wrong result in check combine on this node: max |diff| 3 (expected each token times 2)"


def test_exit_0_with_every_rank_ok_is_usable_and_anything_less_is_not():
    ok = "stage: all_to_all_single\nstage: check all_to_all_single\nresult: ok\n"
    assert classify("alltoall", 0, False, tree({0: ok, 1: ok}), seconds=12).line() == "alltoall: usable (12 s)"
    half = classify("alltoall", 0, False, tree({0: ok, 1: "stage: all_to_all_single\n"}))
    assert half.status == "failed" and half.stage == "all_to_all_single"


def test_exception_missing_package_and_cpu_box():
    err = classify("deepep", 1, False, tree({0: "stage: buffer sizing\nerror: buffer sizing: RuntimeError: "
                                                "NVSHMEM is disabled during compilation\n", 1: ""}))
    assert err.line() == "deepep: failed in buffer sizing on this node: RuntimeError: NVSHMEM is disabled during compilation"
    miss = classify("hybridep", 1, False, tree({0: "missing: deep_ep 1.2.1 has no HybridEPBuffer\n", 1: ""}))
    assert miss.line() == "hybridep: not installed: deep_ep 1.2.1 has no HybridEPBuffer"
    results = smoke.run()  # this CPU box: nothing is launched
    assert {v.status for v in results.values()} == {"cannot_run"}
    assert smoke.report_lines(results) == ["dispatcher smoke check: cannot run: no CUDA GPU (torch.cuda.is_available() is False)"]


def test_doctor_smoke_on_a_cpu_box_is_one_line_and_exit_2(monkeypatch, capsys):
    from mbridge_ep_overlap.tools import cli, doctor

    assert cli.build_parser().parse_args(["doctor", "--smoke"]).smoke is True
    monkeypatch.setattr(doctor, "doctor_lines", lambda: ["mbridge-ep-overlap doctor"])
    assert cli.main(["doctor", "--smoke"]) == 2  # bad usage: one line on stderr, nothing else
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1, out
    assert "dispatcher smoke check cannot run" in out.err and "no CUDA GPU (torch.cuda.is_available() is False)" in out.err
    assert "Traceback" not in out.out + out.err
    assert doctor.main(argparse.Namespace(smoke=False)) == 0  # plain doctor reports, never fails


# ---- HybridEP: the USE_MNNVL=0 retry names the cause ---------------------------------------------------
FABRIC = ["HybridEP allocator: fabric handles (cuMemCreate FABRIC; ...)"]


@pytest.fixture
def gpu_node(monkeypatch, tmp_path):
    """A pretend GPU node: the checks are faked, the cache goes to tmp_path."""
    for module in (smoke, smoke_verdicts):  # the cache and its key live in target.smoke_verdicts
        monkeypatch.setattr(module, "cannot_run_reason", lambda nproc=2: None)
        monkeypatch.setattr(module, "host_key", lambda line=None: "h200-node | GPUs ab12 | driver 580.95 | deep_ep 1.2.1 (x)")
    monkeypatch.setattr(smoke, "_installed_problem", lambda backend: None)
    monkeypatch.setenv("EP_OVERLAP_SMOKE_CACHE", str(tmp_path / "smoke.json"))
    monkeypatch.delenv("USE_MNNVL", raising=False)
    calls = []

    def fake_check(outcomes):
        def check_one(backend, nproc=2, timeout_s=None, log_dir=None, env=None, name=None):
            calls.append((name or backend, dict(env or {})))
            return outcomes[name or backend]
        monkeypatch.setattr(smoke, "check_one", check_one)
        return calls

    return fake_check


def test_hybridep_crash_then_ipc_usable_names_the_fabric_path(gpu_node, tmp_path):
    crash = Verdict("hybridep", "crashed", stage="HybridEPBuffer init", signal="SIGSEGV", info=FABRIC)
    calls = gpu_node({"alltoall": Verdict("alltoall", "usable"), "deepep": Verdict("deepep", "usable"),
                      "hybridep": crash, IPC_HEALTH_KEY: Verdict(IPC_HEALTH_KEY, "usable")})
    results = smoke.run()
    assert calls[-1] == (IPC_HEALTH_KEY, {"USE_MNNVL": "0"})
    line = results["hybridep"].line()
    assert line.startswith("hybridep: crashed (SIGSEGV) in HybridEPBuffer init on this node; with USE_MNNVL=0")
    assert "fabric-handle path" in line
    cached = json.loads((tmp_path / "smoke.json").read_text())
    assert list(cached) == ["h200-node | GPUs ab12 | driver 580.95 | deep_ep 1.2.1 (x)"]
    texts = {name: v.text for name, v in smoke.load().items()}
    assert texts == {"alltoall": "usable", "deepep": "usable",
                     "hybridep": "crashed (SIGSEGV) in HybridEPBuffer init", IPC_HEALTH_KEY: "usable"}
    # the one reader of the verdicts (rules, auto, doctor, the GPU suite): the plan's USE_MNNVL=0 on an
    # NVLink domain of <= 8 GPUs takes the IPC verdict; a caller's USE_MNNVL=1 takes the fabric one
    node = describe("h200", 2)
    node = dataclasses.replace(node, dispatcher_health=texts)
    assert health("hybridep", node) == "usable"
    assert health("hybridep", node, {"USE_MNNVL": "1"}) == "crashed (SIGSEGV) in HybridEPBuffer init"
    assert health("hybridep", dataclasses.replace(node, nvlink_domain_size=72)) == "crashed (SIGSEGV) in HybridEPBuffer init"


def test_hybridep_failure_on_ipc_handles_is_not_blamed_on_fabric(gpu_node):
    ipc_info = ["HybridEP allocator: CUDA IPC handles (fabric handles not advertised by every GPU: [0, 0])"]
    calls = gpu_node({"hybridep": Verdict("hybridep", "hung", stage="dispatch_with_permute", timeout_s=180,
                                          info=ipc_info)})
    results = smoke.run(backends=("hybridep",), cache=False)
    assert len(calls) == 1 and "not the fabric-handle path" in results["hybridep"].cause


def test_cache_round_trip_and_what_auto_reads(gpu_node, tmp_path, monkeypatch):
    gpu_node({})
    results = {"alltoall": Verdict("alltoall", "usable", seconds=11.0),
               "deepep": Verdict("deepep", "failed", stage="buffer sizing", detail="RuntimeError: no NVSHMEM")}
    path = smoke.save(results)
    back = smoke.load()
    assert {k: v.to_dict() for k, v in back.items()} == {k: v.to_dict() for k, v in results.items()}
    assert smoke.load(max_age_s=-1) is None and smoke.load(key="another host") is None
    assert smoke.cached_verdicts() == {"alltoall": "usable", "deepep": "failed in buffer sizing: RuntimeError: no NVSHMEM"}
    assert smoke.cached_verdicts(describe("h200", 2)) is None  # a described (dry-run) target is not this node
    path.write_text("{not json")
    assert smoke.cached_verdicts() is None


def test_cached_verdicts_on_a_cpu_box_is_none():
    assert smoke.cached_verdicts() is None


# ---- crash reports of launched runs (lab.launch) -------------------------------------------------------
def test_run_reports_a_signal_as_a_crash_with_faulthandlers_stack(tmp_path):
    rank0 = "stage: x\n" + STACK
    rank1 = "Thread 0x00007f00 (most recent call first):\n  File \"/x/threading.py\", line 359 in wait\n"
    write_tree(tmp_path, tree({0: "> training\n", 1: "> training\n"}, {0: rank0, 1: rank1}, SUMMARY.format(code1=-15)))
    run = launch.Run("te-hybridep", 1, False, 33.0, tmp_path, None)
    assert run.crash() == "SIGSEGV in rank 0 at hybrid_ep_buffer.py:94 in __init__"
    first, *rest = run.describe_failure().splitlines()
    assert first == "run 'te-hybridep' crashed (SIGSEGV) in rank 0 at hybrid_ep_buffer.py:94 in __init__; rank 1: SIGTERM after 33s"
    assert "  Python stack of rank 0 (faulthandler, most recent call first):" in rest
    assert '    File "<frozen runpy>", line 198 in _run_module_as_main' in rest


@pytest.mark.parametrize("header", ["Stack (most recent call first):",
                                    "Current thread 0x00007f5638f8eb80 [python] (most recent call first):"])
def test_faulthandler_formats(header):
    text = f"Fatal Python error: Aborted\n\n{header}\n  File \"a.py\", line 3 in <module>\n\nExtension modules: x"
    (crash,) = launch.rank_crashes({f"{RUN}/0/stderr.log": text})
    assert (crash.signal, crash.stack) == ("SIGABRT", ['File "a.py", line 3 in <module>'])


def test_teed_output_without_rank_files_is_read_per_rank():
    teed = "[default0]:stage: HybridEPBuffer init\n[default1]:stage: HybridEPBuffer init\n" + "".join(
        f"[default1]:{line}\n" for line in STACK.splitlines())
    v = classify("hybridep", 1, False, {"launcher.log": teed})
    assert (v.status, v.rank, v.stage) == ("crashed", "1", "HybridEPBuffer init") and v.stack


def test_launch_command_port_and_script():
    cmd = launch.launch_command("x", 2, ["--a"], Path("/tmp/x"), REPO, "tests/functional/force_delay_wgrad.py", 12345)
    assert cmd[cmd.index("--master_port") + 1] == "12345"
    assert cmd[cmd.index("--tee") + 2].endswith("tests/functional/force_delay_wgrad.py")
    assert 0 < launch.free_port() < 65536


# ---- the real worker under torchrun (gloo, no GPU) --------------------------------------------------------
def test_real_torchrun_segv_is_classified_with_its_stack(tmp_path):
    v = smoke.check_one("selftest-segv", 2, 60, tmp_path)
    assert v.status == "crashed" and v.signal == "SIGSEGV" and v.stage == "selftest step" and v.rank == "0"
    assert any("smoke_worker.py" in f and "run_selftest" in f for f in v.stack)


def smoke_workers_under(folder: Path) -> list[str]:
    """Live (not zombie) smoke_worker processes whose working directory lies under ``folder``: the
    check runs torchrun in its log folder, so only this test's workers qualify."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "smoke_worker" in cmdline and state != "Z" and (cwd == str(folder) or cwd.startswith(f"{folder}/")):
            found.append(f"{entry.name}: {cmdline}")
    return found


def test_real_torchrun_hang_is_killed_at_the_timeout(tmp_path):
    v = smoke.check_one("selftest-hang", 2, 10, tmp_path)
    assert v.status == "hung" and v.line() == "selftest-hang: hung (timeout after 10 s) in selftest step on this node"
    assert not launch._live  # the process group was killed and reaped
    # torchrun's workers run in sessions of their own: the timeout must end them too, not orphan them
    deadline = time.monotonic() + 3  # SIGKILL is delivered asynchronously
    while smoke_workers_under(tmp_path.resolve()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert smoke_workers_under(tmp_path.resolve()) == []


def test_the_worker_checks_what_the_routing_implies():
    from mbridge_ep_overlap.lab import smoke_worker as w

    for rank in range(2):
        for t in range(w.TOKENS):
            experts = w.experts_of(rank, t)
            assert len(set(experts)) == w.TOPK and all(0 <= e < w.EXPERTS for e in experts)
    x = w.make_tokens(1)
    assert w.identities(x[:2]) == [(2, 1, 1), (2, 1, 2)]
    assert max(x.float().max().item() * w.TOPK, 2 * 64) <= 256  # combined values stay exact in bf16
    rows = w.expected_rows(2, range(0, 8))
    assert len(rows) == len(set(rows)) and 0 < len(rows) < 2 * w.TOKENS
    assert sys.modules["mbridge_ep_overlap.lab.smoke_worker"].BACKENDS == smoke.BACKENDS


def test_ranks_terminated_after_an_exception_are_not_a_crash(tmp_path):
    write_tree(tmp_path, tree({0: "", 1: ""}, {0: "Traceback (most recent call last):\nValueError: x\n"},
                              SUMMARY.replace("-11", "1").format(code1=-15)))
    run = launch.Run("local-off", 1, False, 20.0, tmp_path, None)
    assert run.crash() is None
    assert run.describe_failure().splitlines()[0] == "run 'local-off' exit code 1 after 20s"


@pytest.mark.parametrize("outcomes,code", [
    ({"alltoall": "usable", "deepep": "usable", "hybridep": "usable"}, 0),
    ({"alltoall": "usable", "deepep": "crashed", "hybridep": "usable"}, 1),
    ({"alltoall": "usable", "deepep": "usable", "hybridep": "hung", IPC_HEALTH_KEY: "hung"}, 1),
    ({"alltoall": "usable", "deepep": "usable", "hybridep": "crashed", IPC_HEALTH_KEY: "usable"}, 0),
    ({"alltoall": "usable", "deepep": "usable", "hybridep": "crashed", IPC_HEALTH_KEY: "wrong"}, 1),
    ({"alltoall": "usable", "deepep": "missing", "hybridep": "missing"}, 0),
])
def test_doctor_smoke_exit_code_says_whether_a_backend_failed(gpu_node, monkeypatch, capsys, outcomes, code):
    """0: every installed backend passed on the path training takes here; 1: one crashed, hung or
    was wrong (HybridEP judged on its CUDA-IPC run when the fabric path failed); not installed is a fact."""
    from mbridge_ep_overlap.tools import doctor

    gpu_node({name: Verdict(name, status, stage="x", signal="SIGSEGV", info=FABRIC) for name, status in outcomes.items()})
    if outcomes.get("deepep") == "missing":
        monkeypatch.setattr(smoke, "_installed_problem", lambda b: None if b == "alltoall" else "deep_ep not importable")
    monkeypatch.setattr(doctor, "doctor_lines", lambda: ["mbridge-ep-overlap doctor"])
    assert doctor.main(argparse.Namespace(smoke=True)) == code
    assert "Traceback" not in capsys.readouterr().out
