"""Failures recorded on CPU with torch's gloo backend (fixtures/cpu_gloo/README.md): each named, the rank that
diverged or crashed first, and the consequence ranked below its cause."""

from __future__ import annotations

import gzip
import io
import subprocess
import sys
from pathlib import Path

import torch

from mbridge_ep_overlap.diagnose import diagnose
from mbridge_ep_overlap.diagnose.signatures import all_signatures

GLOO = Path(__file__).parent / "fixtures" / "cpu_gloo"
BY_ID = {s.id: s for s in all_signatures()}


def _finding(d, sig_id):
    return next(f for f in d.findings if f.signature.id == sig_id)


def test_a_segfaulting_rank_ranks_above_the_peer_it_left_behind():
    d = diagnose([str(GLOO / "segv-torchrun.log")])
    assert [f.signature.id for f in d.findings][:2] == ["segmentation-fault", "nccl-remote-error"]
    remote = _finding(d, "nccl-remote-error")
    assert any("ranked below [segmentation-fault]" in x for x in remote.detail)
    peer = next(x for x in remote.detail if x.startswith("the connection to peer"))
    assert "[127.0.0.1]:10475" in peer and "gloo" in peer  # gloo names the peer before the words, not a '.' after


def test_a_collective_mismatch_is_named_by_gloo_and_by_the_detail_check():
    for name in ("shape-torchrun.log", "shape-detail-torchrun.log"):
        d = diagnose([str(GLOO / name)])
        assert d.cause_ids[0] == "collective-mismatch", (name, d.cause_ids)


def test_ranks_that_miss_a_monitored_barrier_are_a_hang():
    d = diagnose([str(GLOO / "hang-detail-torchrun.log")])
    assert d.symptom == "hang" and d.cause_ids[0] == "monitored-barrier-missing-ranks", d.cause_ids


def test_timeout_dumps_name_the_rank_not_in_the_collective_the_other_waits_in():
    d = diagnose([str(GLOO / "hang-faulthandler")])
    assert d.symptom == "hang" and d.cause_ids[0] == "faulthandler-timeout", d.cause_ids
    detail = _finding(d, "faulthandler-timeout").detail
    assert any(x.startswith("rank 0: waits in torch.distributed.all_reduce") for x in detail), detail
    assert any(x.startswith("rank 1: not in a torch.distributed call") for x in detail), detail
    assert "rank(s) 1 are not in the all_reduce that rank(s) 0 wait in: the one(s) that diverged" in detail


def test_faulthandlers_own_timeout_line_is_the_signatures_text(tmp_path):
    script = tmp_path / "stall.py"
    script.write_text("import faulthandler, sys, time\nfaulthandler.dump_traceback_later(0.2, file=sys.stderr)\n"
                      "time.sleep(2)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    first = done.stderr.splitlines()[0]
    assert BY_ID["faulthandler-timeout"].compiled()[0].search(first), done.stderr


def test_the_cpu_allocators_refusal_is_named_as_made_by_torch():
    try:
        torch.empty(2**62, dtype=torch.uint8)
    except RuntimeError as e:
        text = f"RuntimeError: {e}"
    d = diagnose(["-"], stdin=io.BytesIO(text.encode()))
    assert d.cause_ids[0] == "cpu-out-of-memory", (text, d.cause_ids)
    assert diagnose([str(GLOO / "cpu-oom.log")]).cause_ids[0] == "cpu-out-of-memory"


def test_a_gzipped_log_and_a_truncated_one_are_read(tmp_path):
    text = (GLOO / "shape-detail-torchrun.log").read_bytes()
    whole, cut = tmp_path / "job.log.gz", tmp_path / "cut.log.gz"
    whole.write_bytes(gzip.compress(text))
    cut.write_bytes(gzip.compress(text * 50)[: len(gzip.compress(text * 50)) * 3 // 4])  # a job killed mid-write
    for path in (whole, cut):
        assert diagnose([str(path)]).cause_ids[0] == "collective-mismatch", path
    assert diagnose(["-"], stdin=io.BytesIO(gzip.compress(text))).cause_ids[0] == "collective-mismatch"


def test_a_padded_lower_case_nan_loss_is_read():
    line = (" [2026-11-30 10:44:33] iteration        3/       6 | consumed samples:           48 | elapsed time per "
            "iteration (ms): 637.6 | lm loss:          nan | loss scale: 1.0 | grad norm:    nan |")
    d = diagnose(["-"], stdin=io.BytesIO(line.encode()))
    assert "non-finite-loss" in d.cause_ids, d.cause_ids
