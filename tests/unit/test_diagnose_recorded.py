"""diagnose on the failures recorded on a GPU node (tests/unit/fixtures/recorded): each is named with
the rank at fault and the step of the schedule the evidence carries, checked against the
``injected-fault.json`` the fault injector wrote (diagnose never reads it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mbridge_ep_overlap.diagnose import diagnose

RECORDED = Path(__file__).parent / "fixtures" / "recorded"


def truth(case: str) -> dict:
    return json.loads((RECORDED / case / "injected-fault.json").read_text())


def finding(d, sig_id: str):
    found = {f.signature.id: f for f in d.findings}
    assert sig_id in found, [f.signature.id for f in d.findings]
    return found[sig_id]


def detail(f) -> str:
    return "\n".join(f.detail)


def test_hang_names_the_rank_that_skipped_the_combine_and_the_step():
    t = truth("hang")
    d = diagnose([str(RECORDED / "hang")])
    assert d.exit_code == 1
    assert d.findings[0].signature.id == "collective-not-joined"
    text = detail(d.findings[0])
    # the first diverging collective: the other rank issued the forward combine, rank 1 did not
    assert f"rank(s) {{{t['rank']}}} did not join; the ranks that did are {t['where']}, {t['phase']} pass" in text
    stalled = detail(finding(d, "progress-stalled"))
    assert f"microbatch {t['microbatch']}, iteration {t['step']}" in stalled
    # the main (training) thread's stack is read, not the watchdog thread's
    assert "training thread: dispatch, forward pass" in stalled
    assert "watchdog.py" not in stalled


def test_stall_names_rank_1_in_the_dispatch_of_layer_1():
    t = truth("stall")
    d = diagnose([str(RECORDED / "stall")])
    assert d.findings[0].signature.id == "collective-not-joined"
    assert f"rank(s) {{{t['rank']}}} did not join" in detail(d.findings[0])
    stalled = detail(finding(d, "progress-stalled"))
    assert (f"rank {t['rank']}: last entered the {t['phase']} {t['where']} of MoE layer {t['layer']}, "
            f"microbatch {t['microbatch']}, iteration {t['step']} (not returned)") in stalled
    other = 1 - t["rank"]
    assert f"rank {other}: last entered the forward dispatch of MoE layer {t['layer']}," not in stalled


def test_crash_names_sigsegv_in_rank_0_in_a_dispatch():
    t = truth("crash")
    d = diagnose([str(RECORDED / "crash")])
    f = finding(d, "segmentation-fault")
    first = next(line for line in f.detail if line.startswith("rank "))
    assert first.startswith(f"rank {t['rank']}: SIGSEGV")
    assert f"; {t['where']}, {t['phase']} pass" in first


def test_nccl_timeout_names_the_rank_the_collective_and_where_rank_0_waits():
    t = truth("nccl_timeout")
    d = diagnose([str(RECORDED / "nccl_timeout")])
    assert d.exit_code == 1
    assert any("flight recorder" in r for r in d.read)  # both ranks left their dumps
    top = d.findings[0]
    assert top.signature.id == "collective-not-joined"
    text = detail(top)
    other = 1 - t["rank"]
    # the rank that did not join, and the collective: the dispatch's all-to-all on the EP group
    assert (f"collective nccl:all_to_all (group 25:EXPERT_MODEL_PARALLEL_GROUP), sequence number 193: "
            f"rank(s) {{{t['rank']}}} did not join; the ranks that did are {t['where']}, {t['phase']} pass") in text
    # where the other rank waits: from its NCCL watchdog's stack of the timed-out collective
    assert (f"rank {other} waits in ALLTOALL_BASE (group 25:EXPERT_MODEL_PARALLEL_GROUP, sequence number 193): "
            f"{t['where']}, {t['phase']} pass") in text
    # each printed stack goes to its own timed-out collective: the parameter all-gather is no dispatch
    assert ("rank 0 waits in COALESCED (group 31:EXPERT_DATA_PARALLEL_GROUP, sequence number 4): "
            "not in a dispatch or combine") in text
    # the step: the iteration after the last one logged
    assert f"step: iteration {t['step']} (the last iteration logged is {t['step'] - 1}; none after it)" in text
    # the layer: from each rank's progress watchdog, which fires at half the process-group timeout,
    # before NCCL's own watchdog ends the job
    assert f"layer (the watchdog's last MoE position): rank {other}: MoE layer 2; rank {t['rank']}: MoE layer {t['layer']}" in text
    stalled = detail(finding(d, "progress-stalled"))
    assert (f"rank {t['rank']}: last entered the {t['phase']} {t['where']} of MoE layer {t['layer']}, "
            f"microbatch {t['microbatch']}, iteration {t['step']} (not returned)") in stalled
    # the threshold: half of the 1-minute process-group timeout
    assert all("(threshold 30.0 s)" in line for line in finding(d, "progress-stalled").evidence)
    # what the stack itself does not carry is said, not guessed
    assert "layer and microbatch: not in the stack" in text
    assert "nccl-watchdog-timeout" in {f.signature.id for f in d.findings}


def test_nccl_timeout_without_the_watchdog_says_the_layer_is_not_in_the_evidence(tmp_path):
    # the same recording as a run with the library's evidence off would leave it: no watchdog events,
    # faulthandler files left empty (NCCL's own watchdog text and the flight recorder remain)
    run = tmp_path / "nccl_timeout"
    shutil.copytree(RECORDED / "nccl_timeout", run)
    for path in (run / "evidence").glob("watchdog-rank*.jsonl"):
        path.unlink()
    for path in (run / "evidence").glob("faulthandler-rank*.log"):
        path.write_text("")
    d = diagnose([str(run)])
    assert d.findings[0].signature.id == "collective-not-joined"
    nccl = finding(d, "nccl-watchdog-timeout")
    assert any(x.startswith("layer not in the evidence") for x in nccl.detail)
    assert "faulthandler stacks not in the evidence" in detail(d.findings[0])
    assert "progress-stalled" not in {f.signature.id for f in d.findings}


def test_no_gain_is_one_microbatch_per_rank_from_the_facts():
    d = diagnose([str(RECORDED / "no_gain")])
    assert d.findings[0].signature.id == "one-microbatch-per-rank"
    assert d.findings[0].rule_passes is False


@pytest.mark.parametrize("case", ["hang", "stall", "nan"])
def test_watchdog_position_is_read_for_every_rank(case):
    d = diagnose([str(RECORDED / case)])
    stalled = detail(finding(d, "progress-stalled"))
    assert "rank 0: last entered" in stalled and "rank 1: last entered" in stalled
