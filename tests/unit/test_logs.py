"""verify-log on real MB log excerpts from the 2x H200 functional runs, and on broken logs."""

from pathlib import Path

import pytest

from mbridge_ep_overlap.tools.cli import main
from mbridge_ep_overlap.core.errors import UsageError
from mbridge_ep_overlap.tools.logs import parse, verify

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
OFF, ON = str(FIXTURES / "baseline_off.log"), str(FIXTURES / "overlap_alltoall.log")


def test_reads_config_summary_and_iterations():
    on, off = parse(ON), parse(OFF)
    assert on.overlap_active and not off.overlap_active
    assert on.value("moe_token_dispatcher_type") == "alltoall"
    assert sorted(on.iterations) == [1, 2, 3, 4, 5, 6]
    assert on.iterations[1]["loss"] == pytest.approx(10.61095)
    assert not on.unhealthy()


def test_two_logs_give_speedup_and_parity(capsys):
    assert main(["verify-log", OFF, ON]) == 0
    out = capsys.readouterr().out
    assert "EP overlap ACTIVE (overlap_moe_expert_parallel_comm=True, dispatcher=alltoall" in out
    assert "EP overlap NOT active (overlap_moe_expert_parallel_comm=False" in out
    assert "speedup" in out and "losses match" in out


def test_loss_mismatch_and_fallback_warnings_fail(tmp_path):
    text = Path(ON).read_text().replace("lm loss: 9.660059E+00", "lm loss: 9.960059E+00")
    bad = tmp_path / "bad.log"
    bad.write_text(text + "\nWARNING: DeepEP is only applicable to Ampere... Current GPU: NVIDIA GB200. Falling back to alltoall.\n")
    code, lines = verify([OFF, str(bad)])
    assert code == 1
    assert any("losses DIFFER" in line for line in lines) and any("SILENT FALLBACK" in line for line in lines)


def test_torchrun_prefixed_lines_are_read(tmp_path):
    prefixed = tmp_path / "p.log"
    prefixed.write_text("".join(f"[default1]:{line}\n" for line in Path(ON).read_text().splitlines()))
    assert parse(str(prefixed)).overlap_active


def test_nan_loss_is_unhealthy(tmp_path):
    nan_log = tmp_path / "nan.log"
    nan_log.write_text(Path(ON).read_text().replace("lm loss: 9.660059E+00", "lm loss: nan"))
    code, lines = verify([str(nan_log)])
    assert code == 1 and any("iteration 6: loss nan" in line for line in lines)


@pytest.mark.parametrize("content", ["", "hello\nworld\n", "iteration one | lm loss: x\n"])
def test_not_a_training_log_is_a_clear_error(tmp_path, content, capsys):
    p = tmp_path / "x.log"
    p.write_text(content)
    with pytest.raises(UsageError, match="Megatron-Bridge training log"):
        parse(str(p))
    assert main(["verify-log", str(p)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_missing_file(capsys):
    assert main(["verify-log", "/nonexistent/run.log"]) == 2
    assert "readable file" in capsys.readouterr().err


def test_real_deepep_run_reads_as_active_flex_with_matching_losses(capsys):
    """An excerpt of the DeepEP functional run on 2x H200 (MB summary block + iteration lines)."""
    deepep = str(FIXTURES / "overlap_deepep.log")
    log = parse(deepep)
    assert log.overlap_active and log.value("moe_token_dispatcher_type") == "flex"
    assert sorted(log.iterations) == [1, 2, 3, 4, 5, 6] and not log.unhealthy()
    assert main(["verify-log", OFF, deepep]) == 0
    out = capsys.readouterr().out
    assert "dispatcher=flex, backend=deepep" in out and "losses match" in out


RUNS = FIXTURES / "torchrun-long-seq"  # real excerpts: rank 0 has the summary, rank 1 the iterations


def test_a_run_folder_merges_its_ranks(capsys):
    """torchrun --log-dir keeps a file per rank; MB prints the summary on rank 0 and the iteration
    lines on the last rank, so only the folder gives both."""
    on = parse(RUNS / "overlap_hiprio")
    assert on.overlap_active and on.value("high_priority_a2a_comm_stream") == "True"
    assert sorted(on.iterations) == list(range(1, 13))
    assert main(["verify-log", str(RUNS / "off"), str(RUNS / "overlap_hiprio")]) == 0
    out = capsys.readouterr().out
    assert "EP overlap NOT active" in out and "high-priority all-to-all stream" in out
    speedup = float(out.split("speedup ")[1].split("x")[0])
    assert speedup > 1.0 and "losses match" in out


def test_rank_logs_without_iteration_lines_say_where_they_are(capsys):
    rank0_off = str(RUNS / "off" / "attempt_0" / "0" / "stdout.log")
    rank0_on = str(RUNS / "overlap_hiprio" / "attempt_0" / "0" / "stdout.log")
    assert main(["verify-log", rank0_off, rank0_on]) == 1
    out = capsys.readouterr().out
    assert "no iteration lines: MB prints them on the last rank only" in out
    assert f"not compared (no iteration lines in {rank0_off} and {rank0_on})" in out


def test_empty_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["verify-log", str(tmp_path)]) == 2
    assert "*.log" in capsys.readouterr().err
