"""diagnose on what runs leave behind: logs, torchrun folders, a run's evidence folder (facts, watchdog,
faulthandler, flight recorder), two runs compared; and the command's exit-code contract."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mbridge_ep_overlap.base import run_files
from mbridge_ep_overlap.base.errors import UsageError
from mbridge_ep_overlap.diagnose import Diagnosis, diagnose, schedule
from mbridge_ep_overlap.diagnose.sources import Held, join
from mbridge_ep_overlap.tools.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = FIXTURES / "logs"
FR_RUN = FIXTURES / "diagnose" / "fr-skipped-combine"
SITE = Path(__import__("megatron.core").core.__file__).resolve().parents[1]


def run_cli(argv, capsys, stdin: bytes | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, (out, err)
    return code, out, err


@pytest.mark.parametrize("log", ["baseline_off.log", "overlap_alltoall.log", "overlap_deepep.log", "torchrun-long-seq"])
def test_healthy_runs_are_nothing_wrong(log, capsys):
    d = diagnose([str(LOGS / log)])
    assert d.exit_code == 0 and not d.findings, d.lines()
    code, out, _ = run_cli(["diagnose", str(LOGS / log)], capsys)
    assert code == 0 and "nothing wrong found" in out


def test_api_is_importable_and_callable_both_ways():
    import mbridge_ep_overlap

    assert mbridge_ep_overlap.Diagnosis is Diagnosis
    d = mbridge_ep_overlap.diagnose([str(LOGS / "baseline_off.log")])
    assert isinstance(d, Diagnosis) and d.exit_code == 0


def test_pasted_log_on_stdin(capsys, monkeypatch):
    text = b"[rank3]: RuntimeError: DeepEP error: timeout (dispatch CPU)\n"
    code, out, _ = run_cli(["diagnose", "-"], capsys, stdin=text, monkeypatch=monkeypatch)
    assert code == 1
    assert "symptom: hang" in out and "[deepep-dispatch-timeout]" in out and "<stdin>:1" in out
    assert "rule that refuses it up front: deepep-built-with-nvshmem (the evidence does not give the config)" in out


def test_unrecognised_failure_shows_the_lines(tmp_path, capsys):
    log = tmp_path / "slurm-123.out"
    log.write_text("starting\n0: RuntimeError: the flux capacitor is misaligned\nbye\n")
    code, out, _ = run_cli(["diagnose", str(log)], capsys)
    assert code == 1 and "not recognised" in out
    assert f"{log}:2: RuntimeError: the flux capacitor is misaligned" in out


def test_flight_recorder_names_the_missing_rank_and_collective():
    d = diagnose([str(FR_RUN)])
    assert d.cause_ids == ["collective-not-joined"] and d.symptom == "hang"
    detail = " ".join(d.findings[0].detail)
    assert "rank(s) {1} did not join" in detail and "all_to_all" in detail and "sequence number 6" in detail
    assert "combine at fr_probe.py" in detail or "combine at skip_combine.py" in detail


def test_flight_recorder_live_dump_on_cpu(tmp_path):
    """The same divergence recorded now, by torch's own recorder, read by torch's own analyzer."""
    probe = FIXTURES / "diagnose" / "fr_probe.py"
    port = str(29700 + os.getpid() % 200)
    procs = [subprocess.Popen([sys.executable, str(probe), str(r), str(tmp_path), port]) for r in (0, 1)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    d = diagnose([str(tmp_path)])
    assert d.cause_ids[0] == "collective-not-joined"
    assert "rank(s) {1} did not join" in " ".join(d.findings[0].detail)


def _frame(func: str, basename: str) -> tuple[str, str, int]:
    """A frame at the first line of ``func`` in the installed megatron-core file."""
    import ast

    path = next((SITE / "core").rglob(basename))
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == func:
            return func, str(path), node.lineno + 1
    raise AssertionError(f"{func} not in {path}")


def test_frames_map_to_the_schedule_vocabulary():
    stack = [_frame("hybrid_ep_combine", "fused_a2a.py"), _frame("combine", "token_dispatcher.py"),
             _frame("combined_forward_backward_step", "combined_1f1b.py")]
    # token_dispatcher.combine: pick the _HybridEPManager one by its class span
    import ast

    td = next((SITE / "core").rglob("token_dispatcher.py"))
    for node in ast.walk(ast.parse(td.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "_HybridEPManager":
            line = next(n.lineno for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "combine")
            stack[1] = ("combine", str(td), line + 1)
    p = schedule.place(stack)
    assert (p.phase, p.backend, p.schedule, p.direction) == ("combine", "hybridep", "combined 1F1B (EP overlap)",
                                                             "forward")
    back = schedule.place([("backward", _frame("backward", "fused_a2a.py")[1], _frame("hybrid_ep_dispatch", "fused_a2a.py")[2]),
                           _frame("combined_forward_backward_step", "combined_1f1b.py")])
    assert back.direction == "backward"
    alltoall = [f for f in [_frame("token_dispatch", "token_dispatcher.py")]]
    assert schedule.place(alltoall).phase == "dispatch"
    assert schedule.place([("f", "/x/y.py", 3)]).words() == "outside MCore's dispatch/combine and schedule"


def _evidence(tmp_path: Path, rank: int, facts: dict | None = None, watchdog: list[dict] | None = None,
              faulthandler: str | None = None) -> Path:
    run_files.evidence_dir(tmp_path).mkdir(parents=True, exist_ok=True)
    if facts is not None:
        run_files.facts_file(tmp_path, rank).write_text(json.dumps({"rank": rank, **facts}))
    if watchdog is not None:
        run_files.watchdog_file(tmp_path, rank).write_text("".join(json.dumps(e) + "\n" for e in watchdog))
    if faulthandler is not None:
        run_files.faulthandler_file(tmp_path, rank).write_text(faulthandler)
    return tmp_path


FACTS_ON = {"overlap_moe_expert_parallel_comm": True, "moe_token_dispatcher_type": "flex",
            "moe_flex_dispatcher_backend": "hybridep", "cuda_device_max_connections": "32", "microbatches_per_step": 4}


def test_watchdog_stall_names_rank_and_place_in_the_schedule(tmp_path):
    fn, file, line = _frame("hybrid_ep_dispatch", "fused_a2a.py")
    f2, file2, line2 = _frame("combined_forward_backward_step", "combined_1f1b.py")
    dump = (f"Thread 0x00007f00 (most recent call first):\n  File \"{file}\", line {line} in {fn}\n"
            f"  File \"{file2}\", line {line2} in {f2}\n")
    stall = {"event": "stall", "rank": 1, "iteration": 7, "seconds_since_progress": 120.0, "threshold_s": 60.0,
             "time": 0}
    run = _evidence(tmp_path, 1, facts=FACTS_ON, watchdog=[stall], faulthandler=dump)
    d = diagnose([str(run)])
    assert d.findings[0].signature.id == "progress-stalled" and not d.recognised
    text = "\n".join(d.lines())
    assert "rank 1: no iteration for 120.0 s" in text and "after iteration 7" in text
    assert "rank 1 training thread: dispatch, forward pass, backend hybridep, combined 1F1B (EP overlap)" in text


def test_facts_name_a_slow_path_and_whether_the_rule_passes(tmp_path):
    run = _evidence(tmp_path, 0, facts={**FACTS_ON, "cuda_device_max_connections": "1"})
    d = diagnose([str(run)])
    assert d.cause_ids == ["cuda-device-max-connections-1"] and d.findings[0].rule_passes is False
    assert "cuda-device-max-connections (this run's config FAILS it)" in "\n".join(d.lines())
    run2 = _evidence(tmp_path / "b", 0, facts={**FACTS_ON, "microbatches_per_step": 1})
    assert diagnose([str(run2)]).cause_ids == ["one-microbatch-per-rank"]
    run3 = _evidence(tmp_path / "c", 0, facts=FACTS_ON)
    assert diagnose([str(run3)]).exit_code == 0


def test_a_real_crash_names_signal_rank_and_stack(tmp_path):
    code = ("import faulthandler, os, signal\nfaulthandler.enable()\n"
            "def token_dispatch():\n    os.kill(os.getpid(), signal.SIGSEGV)\ntoken_dispatch()\n")
    script = tmp_path / "rank1.py"
    script.write_text(code)
    run_files.evidence_dir(tmp_path / "run").mkdir(parents=True)
    with open(run_files.faulthandler_file(tmp_path / "run", 1), "w") as err:
        assert subprocess.run([sys.executable, str(script)], stderr=err, timeout=60).returncode == -signal.SIGSEGV
    d = diagnose([str(tmp_path / "run")])
    assert d.symptom == "crash signal" and d.findings[0].signature.id == "segmentation-fault"
    detail = "\n".join(d.findings[0].detail)
    assert "rank 1: SIGSEGV at rank1.py:4 in token_dispatch" in detail


def test_torchrun_exit_codes_in_a_slurm_log(tmp_path):
    log = tmp_path / "slurm-9.out"
    log.write_text("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\nFailures:\n"
                   "[1]:\n  time      : 2026-12-01_10:00:00\n  host      : node1\n  rank      : 3 (local_rank: 3)\n"
                   "  exitcode  : -11 (pid: 1234)\n")
    d = diagnose([str(log)])
    assert d.findings[0].signature.id == "segmentation-fault"
    assert any("rank 3: SIGSEGV" in x for x in d.findings[0].detail)


def _renumbered(src: Path, dst: Path, slower: float = 1.0) -> Path:
    import re

    def fix(m):
        return f"elapsed time per iteration (ms): {float(m.group(1)) * slower:.1f}"
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "run.log").write_text(re.sub(r"elapsed time per iteration \(ms\): ([0-9.]+)", fix, src.read_text()))
    return dst


def test_two_runs_no_speedup(tmp_path):
    ref = _renumbered(LOGS / "baseline_off.log", tmp_path / "off")
    same = _renumbered(LOGS / "baseline_off.log", tmp_path / "on")
    _evidence(same, 0, facts={**FACTS_ON, "microbatches_per_step": 1})
    d = diagnose([str(ref), str(same)])
    assert d.findings[0].signature.id == "one-microbatch-per-rank"
    assert any("speed-up 1.000x" in e for e in d.findings[0].evidence)
    faster = _renumbered(LOGS / "baseline_off.log", tmp_path / "fast", slower=0.8)
    assert diagnose([str(ref), str(faster)]).exit_code == 0
    d = diagnose([str(ref), str(_renumbered(LOGS / "baseline_off.log", tmp_path / "nofacts"))])
    assert d.findings[0].signature.id == "overlap-gained-nothing" and not d.recognised


def test_numerics_from_iteration_lines(tmp_path):
    report = json.loads((FIXTURES / "failure_reports" / "megatron-bridge-2403.json").read_text())
    log = tmp_path / "gn.log"
    log.write_text((LOGS / "overlap_alltoall.log").read_text() + report["log"] + "\n")
    d = diagnose([str(log)])
    assert d.cause_ids[0] == "grad-norm-blowup" and d.symptom == "wrong numerics"
    assert f"{log}:" in d.findings[0].evidence[0] and "grad norm 224119.688" in d.findings[0].evidence[0]


@pytest.mark.parametrize("make,needle", [
    (lambda p: p / "missing.log", "missing PATH"),
    (lambda p: (p / "empty.log").write_text("") and None or p / "empty.log", "nothing to read in"),
    (lambda p: (p / "d").mkdir() or p / "d", "nothing to read in"),
    (lambda p: (p / "b.bin").write_bytes(b"\0\1\2" * 1000) and None or p / "b.bin", "binary"),
])
def test_bad_paths_are_one_line_exit_2(tmp_path, capsys, make, needle):
    path = make(tmp_path)
    code, out, err = run_cli(["diagnose", str(path)], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and not out
    with pytest.raises(UsageError):
        diagnose([str(path)])


def test_huge_lines_and_binary_beside_logs(tmp_path, capsys):
    (tmp_path / "huge.log").write_bytes(b"x" * (3 << 20) + b" RuntimeError: DeepEP error: timeout (dispatch CPU)\nok\n")
    (tmp_path / "core.bin").write_bytes(b"\0" * 100)
    (tmp_path / "r.log").write_text("AssertionError: overlap_moe_expert_parallel_comm is only supported with "
                                    "expert model parallelism\n")
    code, out, _ = run_cli(["diagnose", str(tmp_path)], capsys)
    assert code == 1 and "[overlap-needs-expert-parallel]" in out and "not read: core.bin (binary)" in out
    assert "rule that refuses it up front: ep-size" in out


def test_json_output(capsys):
    code, out, _ = run_cli(["diagnose", "--json", str(FR_RUN)], capsys)
    data = json.loads(out)
    assert code == 1 and data["findings"][0]["id"] == "collective-not-joined" and data["symptom"] == "hang"


def test_a_known_bad_deepep_nvshmem_pairing_in_the_facts_outranks_the_timeout(tmp_path):
    versions = {"deep-ep": "1.2.1+309785a", "nvshmem": "3.5.19", "torch": "2.9.0"}
    run = _evidence(tmp_path / "bad", 0, facts={**FACTS_ON, "versions": versions})
    (run / "rank0.log").write_text("[rank0]: RuntimeError: DeepEP error: timeout (dispatch CPU)\n")
    d = diagnose([str(run)])
    assert d.cause_ids[:2] == ["deepep-nvshmem-queue-pair-layout", "deepep-dispatch-timeout"]
    assert '"nvshmem": "3.5.19"' in d.findings[0].evidence[0]
    good = _evidence(tmp_path / "good", 0, facts={**FACTS_ON, "versions": {**versions, "nvshmem": "3.4.5"}})
    (good / "rank0.log").write_text("[rank0]: RuntimeError: DeepEP error: timeout (dispatch CPU)\n")
    assert diagnose([str(good)]).cause_ids == ["deepep-dispatch-timeout"]


def test_srun_label_around_torchrun_prefix_is_one_prefix():
    """srun --label pads its task number (`` 187: ``) and torchrun adds ``[rank187]:``: both come off, the rank
    is read, and a traceback keeps its indentation."""
    from mbridge_ep_overlap.diagnose import sources

    log = ("  7: [rank7]: Traceback (most recent call last):\n"
           '  7: [rank7]:   File "/x/megatron/core/transformer/moe/fused_a2a.py", line 60, in get_buffer\n'
           "  7: [rank7]:     or _buffer.group != group\n"
           "  7: [rank7]: AttributeError: 'Buffer' object has no attribute 'group'\n")
    src = sources.TextSource("-", data=log.encode())
    got = [(rank, text) for _where, rank, text, _raw in sources.lines(src)]
    assert got[1] == ("7", '  File "/x/megatron/core/transformer/moe/fused_a2a.py", line 60, in get_buffer')
    assert got[2] == ("7", "    or _buffer.group != group")
    assert diagnose(["-"], stdin=io.BytesIO(log.encode())).cause_ids[0] == "attribute-error:Buffer.group"


def test_a_held_line_is_given_back_once_and_joined_with_one_space():
    held = Held()
    assert held.take() is None
    held.hold("must be divisible", "log:3")
    held.hold("Could not find NCCL_LIBRARY using the following names:", "log:4")  # a new hold replaces the old
    assert held.take() == ("log:4", "Could not find NCCL_LIBRARY using the following names:")
    assert held.take() is None
    held.hold("", "log:5")  # an empty line is still a held line
    held.clear()
    assert held.take() is None
    assert join("num_experts (6) must be divisible  ", "  by ep (4)") == "num_experts (6) must be divisible by ep (4)"
