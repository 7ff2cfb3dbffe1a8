"""py-spy dumps read by ``diagnose.pyspy``: a real dump of a stuck two-rank job (recorded with
``scripts/diagnose/record_pyspy_dumps.py``), lines rendered from py-spy's own format strings (its source kept as
an excerpt), the divergent rank named, and no reading of other ``Thread`` lines; and dumps of real stuck GPU runs
of the proxy under EP overlap (``fixtures/recorded_pyspy/``, with the facts files whose pids name the ranks)."""

from __future__ import annotations

import random
from pathlib import Path

from mbridge_ep_overlap.diagnose import diagnose, pyspy

FIXTURES = Path(__file__).parent / "fixtures"
DUMPS = FIXTURES / "recorded_texts" / "pyspy_dumps.txt"
EXCERPTS = FIXTURES / "upstream_text" / "py-spy" / "src"
GPU = FIXTURES / "recorded_pyspy"


def _diagnose_text(tmp_path, text: str):
    log = tmp_path / "job.log"
    log.write_text(text)
    return diagnose([str(log)])


def _render(fmt: str, *values) -> str:
    """A Rust ``format!`` string with its ``{}`` filled in order (and ``\\"`` unescaped)."""
    out = fmt[1:-1].replace('\\"', '"')
    for v in values:
        out = out.replace("{}", str(v), 1)
    return out


def test_every_format_the_reader_reads_is_in_py_spys_source():
    source = "\n".join(p.read_text(encoding="utf-8") for p in EXCERPTS.glob("*.txt"))
    for fmt in pyspy.FORMATS:
        assert fmt in source, fmt


def test_the_recorded_dump_names_the_rank_that_holds_the_collective_up(tmp_path):
    d = diagnose([str(DUMPS)])
    top = d.findings[0]
    assert top.signature.id == "py-spy-stacks" and not top.signature.generic
    pids = [line.split()[1].rstrip(":") for line in DUMPS.read_text().splitlines() if line.startswith("Process ")]
    assert len(pids) == 2
    assert f"pid {pids[0]} waits in all_reduce" in top.signature.cause
    assert f"while pid {pids[1]} is elsewhere" in top.signature.cause
    assert any("load_next_batch (train.py:5)" in line for line in top.detail)


def test_rendered_dump_places_the_odd_rank_and_the_dispatch(tmp_path):
    def process(rank, frames):
        lines = [_render(pyspy.FORMATS[0], 100 + rank, f"/usr/bin/python -u pretrain_gpt.py --local-rank={rank}"),
                 "Python v3.12.3 (/usr/bin/python3.12)", "",
                 _render(pyspy.FORMATS[1], 100 + rank, _render(pyspy.FORMATS[3], "active"), "MainThread")]
        lines += [_render(pyspy.FORMATS[4], f, file, line) if line else _render(pyspy.FORMATS[5], f, file)
                  for f, file, line in frames]
        return lines + [""]
    waiting = [("all_to_all_single", "torch/distributed/distributed_c10d.py", 4381),
               ("dispatch_postprocess", "megatron/core/transformer/moe/token_dispatcher.py", 600),
               ("forward", "megatron/core/transformer/moe/moe_layer.py", 250)]
    straggler = [("ncclGroupEnd", "libnccl.so.2", 0),
                 ("_moe_layer_forward", "megatron/core/transformer/moe/moe_layer.py", 300),
                 ("forward", "megatron/core/transformer/transformer_layer.py", 400)]
    text = "\n".join(process(0, waiting) + process(1, waiting) + process(2, straggler) + process(3, waiting))
    top = _diagnose_text(tmp_path, text).findings[0]
    assert top.signature.id == "py-spy-stacks"
    assert "rank 0, rank 1, rank 3 wait in all_to_all_single, while rank 2 is elsewhere" in top.signature.cause
    assert any(line.startswith("rank 0") and "dispatch" in line for line in top.detail)


def test_all_in_the_same_call_is_said_as_a_symptom(tmp_path):
    text = "\n".join(["Process 7: python train.py", "", 'Thread 7 (idle): "MainThread"',
                      "    all_reduce (torch/distributed/distributed_c10d.py:3252)",
                      "Process 8: python train.py", "", 'Thread 8 (idle): "MainThread"',
                      "    all_reduce (torch/distributed/distributed_c10d.py:3252)"])
    top = _diagnose_text(tmp_path, text).findings[0]
    assert top.signature.id == "py-spy-stacks" and top.signature.generic
    assert "not among the dumped processes" in top.signature.cause


def test_other_thread_lines_are_not_read_as_py_spy(tmp_path):
    text = ("Thread 0x00007f0000000000 (most recent call first):\n"
            '  File "/x/train.py", line 3 in f\n'
            "Thread 5 started the data loader\n")
    d = _diagnose_text(tmp_path, text)
    assert "py-spy-stacks" not in d.cause_ids


def test_any_text_never_raises():
    rng = random.Random(7)
    pieces = ["Process ", "Thread ", " (idle)", ': "MainThread"', "    ", " (", ":", ")", "12", "all_to_all", "\n", "x"]
    for _ in range(300):
        dumps = pyspy.PySpyDumps()
        for line in "".join(rng.choice(pieces) for _ in range(40)).splitlines():
            dumps.feed(line, "f:1")
        pyspy.findings(dumps)


# ---- dumps of real stuck runs on a GPU node ---------------------------------------------------------------------------
def _spied(folder):
    return next(f for f in diagnose([str(folder)]).findings if f.signature.id == "py-spy-stacks")


def test_a_gpu_stall_names_the_rank_that_is_not_waiting_with_ranks_from_the_facts():
    import json

    planted = json.loads((GPU / "stall" / "injected-fault.json").read_text())
    f = _spied(GPU / "stall")
    waiting = 1 - planted["rank"]
    assert f"rank {waiting} waits in a CUDA synchronize" in f.signature.cause
    assert f"rank {planted['rank']} is elsewhere" in f.signature.cause
    assert any(e.endswith(f"rank {planted['rank']}: not in a collective or a wait") for e in f.evidence)
    assert any(d.startswith(f"rank {waiting} (") and "dispatch, forward pass" in d for d in f.detail)


def test_a_gpu_hang_with_both_ranks_in_the_same_call_says_what_that_can_mean():
    f = _spied(GPU / "hang")
    assert f.signature.generic and "went out of step earlier" in f.signature.cause
    assert all(e.split(": ", 2)[1] in ("rank 0", "rank 1") for e in f.evidence)
    assert all("a CUDA synchronize" in e for e in f.evidence)


def test_the_dumps_alone_name_processes_by_pid():
    f = pyspy.PySpyDumps()
    for i, line in enumerate((GPU / "stall" / "pyspy-dumps.txt").read_text().splitlines()):
        f.feed(line, f"x:{i}")
    (found,) = pyspy.findings(f)
    assert all(": pid " in e for e in found.evidence)


def _dump(pid: int, frames: list[str]) -> list[str]:
    """One process's dump in py-spy's layout (the format the excerpt tests above check)."""
    return ([f"Process {pid}: python train.py", "Python v3.12.3 (/usr/bin/python3.12)", "", f'Thread {pid} (idle): "MainThread"']
            + [f"    {f}" for f in frames])


def _findings_of(lines: list[str]):
    d = pyspy.PySpyDumps()
    for i, line in enumerate(lines):
        d.feed(line, f"x:{i}")
    return pyspy.findings(d)


def test_a_rank_waiting_on_a_queue_of_the_standard_library_is_the_straggler():
    (f,) = _findings_of(_dump(1, ["all_reduce (torch/distributed/distributed_c10d.py:2501)", "step (train.py:10)"])
                        + _dump(2, ["wait (threading.py:355)", "get (queue.py:171)", "next_batch (train.py:20)"]))
    assert "pid 1 waits in all_reduce, while pid 2 is elsewhere" in f.signature.cause


def test_ranks_in_different_calls_without_a_majority_say_so():
    (f,) = _findings_of(_dump(1, ["all_reduce (torch/distributed/distributed_c10d.py:2501)"])
                        + _dump(2, ["all_to_all (torch/distributed/distributed_c10d.py:4000)"]))
    assert "different calls (pid 1 in all_reduce; pid 2 in all_to_all)" in f.signature.cause
    assert "same call" not in f.signature.cause
