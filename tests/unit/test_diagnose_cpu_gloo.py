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


def test_a_rank_that_raised_is_named_above_the_peer_that_lost_it():
    # rank 1 raised; rank 0's all_reduce lost its peer, exited at the same second, and torchrun named rank 0
    for paths in ([GLOO / "raise-ranks"], [GLOO / "raise-ranks", GLOO / "raise-torchrun.log"]):
        d = diagnose([str(p) for p in paths])
        assert d.cause_ids[0] == "nccl-remote-error", (paths, d.cause_ids)
        own = next(x for x in _finding(d, "nccl-remote-error").detail if x.startswith("rank(s) that raised"))
        assert "rank 1: " in own and "custom failure in rank 1 data loader" in own and "rank 0" not in own, own
        peer = next(x for x in _finding(d, "nccl-remote-error").detail if x.startswith("the connection to peer"))
        assert "[127.0.0.1]:16592 was" in peer, peer  # the sentence's full stop is not the peer's
    failed = _finding(d, "torchrun-rank-failed").detail
    assert any(x.startswith("rank 0's error follows from another rank") and "rank 1: " in x for x in failed), failed
    assert not any(x.startswith("other ranks' errors, most likely consequences") for x in failed), failed


def test_a_gloo_timeout_names_the_rank_that_waited_and_the_one_that_did_not():
    for paths in ([GLOO / "hang-ranks"], [GLOO / "hang-ranks", GLOO / "hang-torchrun.log"]):
        d = diagnose([str(p) for p in paths])
        assert d.symptom == "hang" and d.cause_ids[0] == "gloo-operation-timeout", (paths, d.cause_ids)
        ranks = next(x for x in _finding(d, "gloo-operation-timeout").detail if x.startswith("rank(s) that timed out"))
        assert ranks.startswith("rank(s) that timed out waiting: 0; rank(s) in the logs without a timeout or an "
                                "error of their own: 1 "), ranks


def test_gloos_lost_peer_as_the_installed_torch_prints_it(tmp_path):
    script = tmp_path / "case.py"
    script.write_text(
        "import datetime, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=20))\n"
        "x = torch.ones(4)\n"
        "dist.all_reduce(x)\n"
        "if dist.get_rank() == 1:\n"
        "    raise RuntimeError('custom failure in rank 1')\n"
        "dist.all_reduce(x)\n")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--log-dir",
                           str(tmp_path / "logs"), "--redirects", "3", str(script)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0, done.stderr
    d = diagnose([str(tmp_path / "logs")])
    assert d.cause_ids[0] == "nccl-remote-error", (d.cause_ids, done.stderr[-2000:])
    own = next(x for x in _finding(d, "nccl-remote-error").detail if x.startswith("rank(s) that raised"))
    assert "rank 1: " in own and "custom failure in rank 1" in own, own


def test_colour_codes_and_a_log_gzipped_twice_read_as_the_plain_log(tmp_path):
    plain = (GLOO / "shape-detail-torchrun.log").read_text()
    coloured = "".join(f"\x1b[1;31m{line}\x1b[0m\x1b]8;;https://x\x07\x1b]8;;\x07\n" for line in plain.splitlines())
    (tmp_path / "colour.log").write_text(coloured)
    (tmp_path / "twice.log.gz").write_bytes(gzip.compress(gzip.compress(plain.encode())))
    want = diagnose([str(GLOO / "shape-detail-torchrun.log")])
    for name in ("colour.log", "twice.log.gz"):
        got = diagnose([str(tmp_path / name)])
        assert got.cause_ids == want.cause_ids, (name, got.cause_ids)
        assert [f.evidence for f in got.findings] == [[e.replace(str(GLOO / "shape-detail-torchrun.log"),
                                                                 str(tmp_path / name)) for e in f.evidence]
                                                      for f in want.findings], name
