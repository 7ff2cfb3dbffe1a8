"""The launchers' lines: torchrun's failure summary (the recorded texts of a SIGKILLed rank and of a rank that exited
with code 3, and the summary the installed torch formats), Slurm's step messages (rendered from the installed Slurm's
format strings; newer wordings from SchedMD/slurm excerpts) judged against MB iteration lines, and c10d's TCPStore
errors triggered for real on CPU."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mbridge_ep_overlap.diagnose import crashes, diagnose
from mbridge_ep_overlap.diagnose.signatures import all_signatures
from mbridge_ep_overlap.diagnose.signatures.launch import SLURM_BINARY, STORE_TRIGGERED

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = FIXTURES / "recorded_texts"
BY_ID = {s.id: s for s in all_signatures()}
SLURM_FILES = [Path("/usr/sbin/slurmstepd"), Path("/usr/bin/srun"),
               *sorted(Path("/usr/lib/x86_64-linux-gnu/slurm-wlm").glob("*.so"))]


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


def finding(d, sig_id):
    return next((f for f in d.findings if f.signature.id == sig_id), None)


def matches(sig_id: str, line: str) -> bool:
    return any(p.search(line) for p in BY_ID[sig_id].compiled())


# ---- torchrun's failure summary -----------------------------------------------------------------------------------
def test_sigkilled_rank_is_the_root_cause_killed_from_outside():
    d = diagnose([str(RECORDED / "rank_sigkilled.txt")])
    assert d.cause_ids[0] == "torchrun-rank-killed"
    f = finding(d, "torchrun-rank-killed")
    words = "\n".join(f.detail)
    assert "rank 1 (local rank 1) on host localhost, exit code -9 (SIGKILL)" in words
    assert "rank(s) 0: -15 (SIGTERM) from torchrun tearing them down" in words
    assert "does not show who killed it" in words and "dmesg" in words
    assert any(e.endswith(":43: exitcode  : -9 (pid: 716)") for e in f.evidence), f.evidence


def test_rank_that_exited_with_code_3_is_the_root_cause_and_the_sigterms_are_teardown():
    d = diagnose([str(RECORDED / "nccl_peer_exited.txt")])
    f = finding(d, "torchrun-rank-failed")
    assert f is not None and f.signature.generic
    words = "\n".join(f.detail)
    assert "rank 1 (local rank 1) on host localhost, exit code 3," in words
    assert "rank(s) 0: -15 (SIGTERM) from torchrun tearing them down" in words
    assert "no traceback of rank 1 in the logs" in words
    assert not finding(d, "torchrun-rank-killed")


def test_the_root_ranks_traceback_lines_are_pointed_at():
    summary = (RECORDED / "nccl_peer_exited.txt").read_text()
    ranks = ("[rank1]:Traceback (most recent call last):\n[rank1]:  File \"/w/train.py\", line 3, in <module>\n"
             "[rank1]:ValueError: bad batch\n[rank0]:RuntimeError: later\n")
    f = finding(run(ranks + summary), "torchrun-rank-failed")
    words = "\n".join(f.detail)
    assert "rank 1's traceback: starts at <stdin>:1; error <stdin>:3: ValueError: bad batch" in words
    assert "other ranks' errors, most likely consequences of rank 1's exit: rank 0: <stdin>:4: RuntimeError: later" in words


def _installed_summary(failures: dict[int, tuple[int, int]]) -> str:
    """The summary the installed torch formats (ChildFailedError over ProcessFailure records, no error files)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    records = {rank: ProcessFailure(local_rank=rank, pid=700 + rank, exitcode=code, error_file="/nonexistent/error.json")
               for rank, (code, _) in failures.items()}
    for rank, (_, stamp) in failures.items():
        records[rank].timestamp = stamp
    return f"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: {ChildFailedError('train.py', records)}"


@pytest.mark.parametrize("codes,root,sig_id", [
    ({0: (-15, 20), 1: (-9, 10)}, "1", "torchrun-rank-killed"),
    ({0: (1, 10), 1: (-15, 20), 2: (-15, 20)}, "0", "torchrun-rank-failed"),
    ({0: (-15, 10), 1: (-15, 20)}, "0", "torchrun-ranks-terminated"),
])
def test_the_installed_torchs_summary_is_read(codes, root, sig_id):
    text = _installed_summary(codes)
    assert crashes.ROOT_CAUSE in text
    summary = crashes.TorchrunSummary()
    for number, line in enumerate(text.splitlines(), 1):
        summary.feed(line, str(number))
    assert summary.roots()[0].rank == root
    assert {f.rank: f.exitcode for f in summary.failures} == {str(r): c for r, (c, _) in codes.items()}
    d = run(text)
    assert finding(d, sig_id) and f"rank {root} (local rank {root})" in "\n".join(finding(d, sig_id).detail)


def test_a_segfaulted_root_stays_with_the_crash_signature():
    text = _installed_summary({0: (-15, 20), 1: (-11, 10)})
    d = run(text)
    assert d.findings[0].signature.id == "segmentation-fault"
    assert "rank 1 (local rank 1)" in d.findings[0].detail[0]
    assert not finding(d, "torchrun-rank-killed") and not finding(d, "torchrun-rank-failed")


def test_srun_labels_do_not_hide_the_summary():
    text = "".join(f"  3: {line}\n" for line in (RECORDED / "rank_sigkilled.txt").read_text().splitlines())
    assert run(text).cause_ids[0] == "torchrun-rank-killed"


# ---- Slurm ----------------------------------------------------------------------------------------------------------
def _strings(path: Path) -> list[str]:
    return [m.decode() for m in re.findall(rb"[\x20-\x7e]{12,}", path.read_bytes())]


def _rendered(fmt: str) -> re.Pattern:
    """What a printf format prints (its %-fields match anything but a line end)."""
    parts = re.split(r"%(?:l{0,2}[dusx]|p?s)", fmt)
    return re.compile(".+?".join(re.escape(p) for p in parts))


SLURM_SIGS = [s for s in all_signatures() if SLURM_BINARY in s.source]


@pytest.mark.skipif(not all(p.is_file() for p in SLURM_FILES[:2]), reason="Slurm's binaries are not installed")
@pytest.mark.parametrize("sig", [s for s in SLURM_SIGS if s.emitted], ids=lambda s: s.id)
def test_slurm_text_renders_from_a_format_string_of_the_installed_binaries(sig):
    named = Path(sig.source.removeprefix("installed:").split(" ")[0])
    assert named.is_file(), named
    formats = {s for p in SLURM_FILES if p.is_file() for s in _strings(p) if "%" in s}
    named_formats = {s for s in _strings(named) if "%" in s}
    messages = [re.sub(r"^(?:slurmstepd|srun): error: ", "", line) for line in sig.emitted]
    for line, message in zip(sig.emitted, messages):
        assert matches(sig.id, line), (sig.id, line)
        assert any(_rendered(f).fullmatch(message) for f in formats), (sig.id, line)
    assert any(_rendered(f).fullmatch(m) for f in named_formats for m in messages), (sig.id, named)


_MB_LINE = (" [{stamp}] iteration {it:8d}/{total:8d} | consumed samples: {samples:12d} | elapsed time per iteration (ms): "
            "{ms:.1f} | learning rate: 3.000000E-04 | global batch size:    16 | lm loss: 1.061510E+01 | loss scale: 1.0 "
            "| grad norm: 1.851 | number of skipped iterations:   0 | number of nan iterations:   0 |")


def _iterations(start: float, count: int, every_s: float, total: int = 10000) -> list[str]:
    return [_MB_LINE.format(stamp=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start + i * every_s)), it=i + 1,
                            total=total, samples=16 * (i + 1), ms=every_s * 1000) for i in range(count)]


def test_the_iteration_lines_are_mbs_format():
    fixture = next(line for line in (FIXTURES / "logs" / "overlap_alltoall.log").read_text().splitlines()
                   if " iteration " in line)
    ours = _iterations(time.time(), 1, 10.0)[0]
    shape = lambda line: re.sub(r"\s+", " ", re.sub(r"\d+(?:\.\d+)?(?:E[+-]\d+)?", "N",  # noqa: E731
                                                    re.sub(r" load_balancing_loss: [^|]+\|", "", line)))
    assert shape(ours) == shape(fixture)


def _cancel(at: float, reason: str = " DUE TO TIME LIMIT") -> str:
    return (f"slurmstepd: error: *** JOB 4242 ON gpu-node-07 CANCELLED AT "
            f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(at))}{reason} ***")


def test_a_time_limit_hit_while_iterating_steadily_is_too_short():
    start = time.mktime((2026, 12, 3, 0, 0, 0, 0, 0, -1))
    lines = _iterations(start, 360, 10.0) + [_cancel(start + 3595)]
    d = run("\n".join(lines))
    assert d.cause_ids[0] == "slurm-time-limit-too-short" and not finding(d, "slurm-time-limit")
    words = "\n".join(finding(d, "slurm-time-limit-too-short").detail)
    assert "steady pace" in words and "the last iteration seen is 360" in words
    assert "mean step time 10000.0 ms" in words and "remaining 9640 of 10000 iterations need about 26.8 h" in words
    assert not any(w.startswith("step: iteration") for w in words.splitlines())


def test_a_time_limit_after_the_iterations_stopped_says_something_stopped_first():
    start = time.mktime((2026, 12, 3, 0, 0, 0, 0, 0, -1))
    lines = _iterations(start, 60, 10.0) + [_cancel(start + 4 * 3600)]
    d = run("\n".join(lines))
    f = finding(d, "slurm-time-limit")
    assert f is not None and not finding(d, "slurm-time-limit-too-short") and not d.recognised
    words = "\n".join(f.detail)
    assert "iterations had stopped before the cancel" in words and "the last iteration seen is 60" in words
    assert "something stopped or hung first" in words


def test_a_time_limit_before_any_iteration():
    f = finding(run(_cancel(time.time())), "slurm-time-limit")
    assert "no iteration line was logged before the cancel" in f.detail[0]


def test_the_other_slurm_cancels():
    at = time.time()
    assert run(_cancel(at, " DUE TO PREEMPTION")).cause_ids == ["slurm-preempted"]
    assert run(_cancel(at, " DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS")).cause_ids == ["slurm-node-failure"]
    plain = run(_cancel(at, ""))
    assert [f.signature.id for f in plain.findings] == ["slurm-cancelled"] and not plain.recognised
    newer = run(_cancel(at, " DUE to SIGNAL Terminated"))  # newer Slurm (SchedMD/slurm excerpt)
    assert [f.signature.id for f in newer.findings] == ["slurm-cancelled"]
    node = run("srun: error: Node failure on gpu-node-07")
    assert node.cause_ids == ["slurm-node-failure"] and "gpu-node-07" in node.findings[0].detail[0]
    task = run("srun: error: gpu-node-07: task 3: Exited with exit code 1")
    assert task.findings[0].signature.id == "slurm-task-exit-code" and "node gpu-node-07" in task.findings[0].detail[0]


OOM_22_05 = ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4242.0. Some of your processes may have been "
             "killed by the cgroup out-of-memory handler.")
OOM_NEWER = "slurmstepd: error: Detected 2 oom_kill events in StepId=4243.0. Some of the step tasks have been OOM Killed."


@pytest.mark.parametrize("line,job", [(OOM_22_05, "4242"), (OOM_NEWER, "4243"),
                                      ("srun: error: gpu-node-07: task 3: Out Of Memory", "JOB")])
def test_the_cgroup_oom_kill_is_host_memory(line, job):
    d = run(line)
    assert d.cause_ids == ["slurm-oom-kill"] and d.findings[0].signature.symptom == "oom"
    assert f"host memory, not GPU memory: `sacct -j {job} --format=JobID,MaxRSS,ReqMem`" in d.findings[0].detail[0]


def test_the_oom_kill_is_who_killed_the_sigkilled_rank():
    d = run(OOM_22_05 + "\n" + (RECORDED / "rank_sigkilled.txt").read_text())
    assert d.cause_ids[:2] == ["slurm-oom-kill", "torchrun-rank-killed"]
    assert "Slurm's cgroup OOM kill (<stdin>:1): host memory" in "\n".join(finding(d, "torchrun-rank-killed").detail)
    assert "rank 1 on localhost with SIGKILL" in "\n".join(finding(d, "slurm-oom-kill").detail)


def test_the_newer_slurm_wording_is_in_its_excerpt():
    body = (FIXTURES / "upstream_text/slurm/src/plugins/task/cgroup/task_cgroup_memory.c@L290-294.txt").read_text()
    fmt = re.search(r'error\("(Detected %"PRIu64" oom_kill event%s in %ps\. [^"]+)"', body).group(1)
    assert _rendered(fmt.replace('%"PRIu64"', "%lu")).fullmatch(OOM_NEWER.removeprefix("slurmstepd: error: "))


# ---- c10d's TCPStore, triggered for real ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store_errors() -> dict[str, str]:
    done = subprocess.run([sys.executable, str(FIXTURES / "c10d_store_errors.py")], capture_output=True, text=True,
                          timeout=240)
    cases: dict[str, str] = {}
    for stream in (done.stdout, done.stderr):
        for part in re.split(r"^=== ", stream, flags=re.M)[1:]:
            name, _, body = part.partition("\n")
            cases[name] = cases.get(name, "") + body
    assert set(cases) >= {"bind-libuv", "bind-classic", "connect", "lost-closed", "lost-pipe", "lost-reset"}, done.stderr
    return cases


def _shape(line: str) -> str:
    return re.sub(r"\d+", "N", line.strip())


STORE_CASES = {"c10d-store-port-in-use": ("bind-libuv", "bind-classic"), "c10d-store-connect-timeout": ("connect",),
               "c10d-store-connection-lost": ("lost-closed", "lost-pipe", "lost-reset")}


@pytest.mark.parametrize("sig_id", sorted(STORE_CASES))
def test_store_errors_are_read_from_what_torch_prints(sig_id, store_errors):
    assert STORE_TRIGGERED in BY_ID[sig_id].source
    printed = {_shape(line) for case in STORE_CASES[sig_id] for line in store_errors[case].splitlines()}
    for line in BY_ID[sig_id].emitted:  # the emitted text is what torch printed, numbers aside
        assert _shape(line) in printed, (sig_id, line)
    for case in STORE_CASES[sig_id]:
        d = run(store_errors[case])
        assert finding(d, sig_id), (case, [f.signature.id for f in d.findings])
        assert d.findings[0].signature.id == sig_id or BY_ID[sig_id].generic


def test_store_details_name_the_port_and_the_address(store_errors):
    port = re.search(r"port: (\d+)", store_errors["bind-libuv"]).group(1)
    assert f"port(s) {port} already in use" in finding(run(store_errors["bind-libuv"]), "c10d-store-port-in-use").detail[0]
    host_port = re.search(r"connect to \((127\.0\.0\.1, \d+)\)", store_errors["connect"]).group(1)
    assert f"({host_port}): nothing accepted within 1000ms" in finding(run(store_errors["connect"]),
                                                                       "c10d-store-connect-timeout").detail[0]
    lost = finding(run(store_errors["lost-reset"]), "c10d-store-connection-lost").detail[0]
    assert "Connection reset by peer" in lost and "the process hosting the store exited first" in lost


def test_an_unresolvable_master_addr_is_said():
    lines = ("[W1203 02:54:58.164655678 socket.cpp:764] [c10d] The IPv6 network addresses of (nonexistent.invalid, "
             "60707) cannot be retrieved (gai error: -2 - Name or service not known).\n"
             "torch.distributed.DistNetworkError: The client socket has timed out after 1000ms while trying to connect "
             "to (nonexistent.invalid, 60707).")
    f = finding(run(lines), "c10d-store-connect-timeout")
    assert "the host name does not resolve here" in f.detail[0] and "MASTER_ADDR is wrong" in f.detail[0]


# ---- never raises ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "Root Cause (first observed failure):\n  rank      : x\n  exitcode  : \n[0]:\n  traceback : ",
    "Root Cause (first observed failure):\n  time : \n  host : \n  rank : 99999999999999999999 (local_rank: 1)\n"
    "  exitcode : -999999999999 (pid: )\n",
    "Failures:\n  exitcode  : -9 (pid: 1)\n=====\n  rank : 3\n",
    "*** JOB  ON  CANCELLED AT  DUE TO TIME LIMIT ***\n*** JOB 1 ON n CANCELLED AT 9999-99-99T99:99:99 DUE TO TIME LIMIT ***",
    "Detected 18446744073709551616 oom-kill event(s) in StepId=. Some of your processes",
    "The client socket has timed out after ms while trying to connect to (, )\nrecvValue failed on SocketImpl(: Broken pipe",
    " [9999-99-99 99:99:99] iteration 1/ 0 | elapsed time per iteration (ms): nan |\n"
    "*** JOB 1 ON n CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***",
    "\x00\xff" * 50 + "\n[rank99999999]:Traceback (most recent call last)",
])
def test_edge_lines_never_raise(text):
    d = run(text)
    assert d.lines()


@pytest.mark.parametrize("code,name", [(-7, "SIGBUS"), (-4, "SIGILL"), (-8, "SIGFPE")])
def test_a_rank_that_died_of_another_signal_is_not_said_to_have_exited(code, name):
    d = run(_installed_summary({0: (code, 10), 1: (-15, 20)}))
    f = finding(d, "torchrun-rank-failed")
    assert f is not None and f"died of {name} (exit code {code})" in f.signature.cause
    assert "above 0" not in f.signature.cause and "faulthandler" in f.signature.fix
