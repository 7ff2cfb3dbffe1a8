"""verify-log on real MB log excerpts from the 2x H200 functional runs, and on broken logs."""

import re
from pathlib import Path

import pytest

from mbridge_ep_overlap.tools.cli import main
from mbridge_ep_overlap.base.errors import UsageError
from mbridge_ep_overlap.tools.logs import parse
from mbridge_ep_overlap.tools.verify_log import verify

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


# ---- numerics shared with diagnose, warm-up by position, streaming -----------------------------------
def _with_line(tmp_path, line: str, name: str = "x.log") -> str:
    p = tmp_path / name
    p.write_text(Path(ON).read_text() + line + "\n")
    return str(p)


GRAD_NORM_BLOWUP = (" [2026-02-03 06:40:25] iteration        7/      10 | consumed samples:       163840 | elapsed time "
                    "per iteration (ms): 700.1 | learning rate: 3.000000E-04 | global batch size: 16 | lm loss: "
                    "9.589217E+00 | loss scale: 1.0 | grad norm: 224119.688 | number of skipped iterations:   0 | "
                    "number of nan iterations:   0")


@pytest.mark.parametrize("line,needle", [
    (GRAD_NORM_BLOWUP, "grad norm 224119.688"),
    (GRAD_NORM_BLOWUP.replace("grad norm: 224119.688", "grad norm: 1.9").replace("9.589217E+00", "2.500000E+01"),
     "loss 2.500000E+01"),
    (GRAD_NORM_BLOWUP.replace("grad norm: 224119.688", "grad norm: 1.9").replace("iterations:   0", "iterations:   2"),
     "2 NaN iterations"),
    (GRAD_NORM_BLOWUP.replace("grad norm: 224119.688", "grad norm: nan"), "grad norm nan"),
    (GRAD_NORM_BLOWUP.replace("lm loss: 9.589217E+00 |", "").replace("nan iterations:   0", "nan iterations:   1"),
     "no lm loss logged"),
])
def test_bad_numerics_are_never_healthy(tmp_path, line, needle, capsys):
    log = _with_line(tmp_path, line)
    code = main(["verify-log", log])
    out = capsys.readouterr().out
    assert code == 1 and needle in out and "losses: UNHEALTHY" in out and "finite" not in out


def test_grad_norm_blowup_found_against_earlier_values(tmp_path):
    log = _with_line(tmp_path, GRAD_NORM_BLOWUP.replace("224119.688", "400.000"))
    assert any("grad norm 400.000" in p and "x the median" in p for p in parse(log).unhealthy())
    assert not parse(_with_line(tmp_path, GRAD_NORM_BLOWUP.replace("224119.688", "3.000"), "ok.log")).unhealthy()


def test_negative_warmup_is_bad_usage(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["verify-log", "--warmup", "-5", ON])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--warmup" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(UsageError, match="--warmup"):
        verify([ON], warmup=-5)


def _shifted(tmp_path, src: str, by: int, name: str) -> str:
    import re

    text = re.sub(r"iteration\s+(\d+)/\s*(\d+)", lambda m: f"iteration {int(m.group(1)) + by:8d}/{int(m.group(2)) + by:8d}",
                  Path(src).read_text())
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_warmup_is_counted_by_position(tmp_path):
    """A log numbered from 100 has the same steady window as the same log numbered from 1."""
    _, plain = verify([OFF, ON])
    off100, on100 = _shifted(tmp_path, OFF, 99, "off.log"), _shifted(tmp_path, ON, 99, "on.log")
    assert parse(on100).steady_ms(2) == parse(ON).steady_ms(2)
    _, shifted = verify([off100, on100])
    speed = lambda lines: next(x for x in lines if "speedup" in x).split("speedup ")[1].split("x")[0]  # noqa: E731
    assert speed(shifted) == speed(plain)


def test_no_speedup_for_logs_with_no_common_iteration(tmp_path):
    code, lines = verify([OFF, _shifted(tmp_path, ON, 1000, "later.log")])
    assert code == 1
    assert any("no iteration in common" in x for x in lines)
    assert not any(re.search(r"speedup [0-9]", x) for x in lines), lines


def test_a_large_log_is_streamed(tmp_path):
    """24 MB of log (60 000 iteration lines among filler) in a few MB of memory: reading the file whole,
    as before, needs more than its size."""
    import tracemalloc

    head = Path(ON).read_text()
    big = tmp_path / "big.log"
    filler = "[default0]: some unrelated framework chatter that fills a log line to a realistic length .....\n"
    with open(big, "w") as f:
        f.write(head)
        for i in range(7, 60_007):
            f.write(f" [2026-11-30 10:45:41] iteration {i:8d}/  200000 | consumed samples: {16 * i:12d} | elapsed time "
                    f"per iteration (ms): 707.0 | learning rate: 2.6E-04 | global batch size:    16 | lm loss: "
                    f"{9.5 - i * 1e-6:.6E} | loss scale: 1.0 | grad norm: 2.180 | number of skipped iterations:   0 | "
                    f"number of nan iterations:   0 |\n")
            f.write(filler)
    size = big.stat().st_size
    assert size > 24e6
    tracemalloc.start()
    report = parse(str(big))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(report.series) == 60_006 and not report.unhealthy()
    assert peak < 10e6, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.0f} MB log"
