"""Benchmark bookkeeping on synthetic run summaries (no GPU): windows, speedup, parity, outputs."""

import dataclasses
import json
from pathlib import Path

import pytest

from mbridge_ep_overlap.tools.bench import compare_to_baseline, markdown, plot, run_bench, summarize_run
from mbridge_ep_overlap.core.errors import UsageError


def summary(times, losses, profile=None):
    steps = [{"iteration": i, "loss": l, "skipped": False, "step_time_s": t} for i, (t, l) in enumerate(zip(times, losses))]
    return {"steps": steps, "peak_memory_gib_per_rank": [10.0, 12.5], "finalized": {}, "profile": profile}


PROFILE = {"steps": [5, 7], "overlap_efficiency": {"iterations": 2, "hidden_fraction": 0.8, "exposed_s": 0.2,
                                                   "ideal_step_s": 0.9, "a2a_s": 1.0}}


def test_steady_window_skips_warmup_and_profiled_steps():
    r = summarize_run("off", "nvlink", summary([9, 9, 1, 2, 3, 50, 50], [5] * 7, PROFILE), warmup=2, tokens_per_step=600)
    assert r.median_s == 2 and r.spread_s == (1, 3) and r.tokens_per_s == 300 and r.peak_gib == 12.5


def test_speedup_and_parity_against_off_on_the_same_link(tmp_path: Path):
    off = summarize_run("off", "throttled", summary([2, 2, 2, 2], [10.0, 9.0, 8.0, 7.0]), 1, 100)
    on = summarize_run("overlap", "throttled", summary([2, 1.6, 1.6, 1.6], [10.0, 9.0, 8.0, 7.0], PROFILE), 1, 100)
    bad = summarize_run("overlap:cdmc1", "throttled", summary([2, 1.9, 1.9, 1.9], [10.0, 9.0, 8.5, 7.0]), 1, 100)
    results = [off, on, bad]
    compare_to_baseline(results)
    assert on.speedup == pytest.approx(1.25) and on.parity == "match"
    assert bad.parity.startswith("MISMATCH")
    table = markdown(results, "t")
    assert "| throttled | overlap | 1.600 |" in table and "80%" in table
    assert plot(results, tmp_path / "p.png") and (tmp_path / "p.png").stat().st_size > 1000


def test_unknown_variant_or_link_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="variant"):
        run_bench("qwen3_moe_proxy", 2, ["fast"], ["nvlink"], tmp_path)
    with pytest.raises(UsageError, match="link"):
        run_bench("qwen3_moe_proxy", 2, ["overlap"], ["infiniband"], tmp_path)


@pytest.mark.parametrize("shape", ["comm-bound", "balanced", "long-seq"])
def test_benchmark_shapes_finalize_through_mb(shape, tmp_path, capsys):
    """Every bench shape is a valid RunSpec for the proxy: launched as run_script flags
    (flags.to_argv, what bench hands torchrun), MB's real finalize accepts it, and each keeps 16
    microbatches of 8192 tokens per rank (the docs' commands rely on that)."""
    from mbridge_ep_overlap.tools.bench import SHAPES, shape_spec, variant_spec
    from mbridge_ep_overlap.tools.flags import to_argv
    from mbridge_ep_overlap.tools.run import main

    spec = variant_spec(shape_spec("qwen3_moe_proxy", shape, 12, []), "overlap")
    code = main([*to_argv(spec), "--dryrun", "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    ffn = next(o.split("=")[1] for o in SHAPES[shape]["overrides"] if o.startswith("model.moe_ffn_hidden_size="))
    assert f"moe_ffn_hidden_size: {ffn}" in out and "hidden_size: 2048" in out and "num_microbatches: 16" in out
    fields = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert int(fields["micro_batch_size"]) * int(fields["seq_length"]) == 8192
    if shape == "long-seq":
        assert (fields["seq_length"], fields["num_attention_heads"], fields["kv_channels"]) == ("4096", "32", "128")


def test_flags_after_double_dash_win_over_the_shape():
    from mbridge_ep_overlap.tools.bench import shape_spec

    spec = shape_spec("qwen3_moe_proxy", "long-seq", 12, ["--seq-length", "2048", "model.moe_ffn_hidden_size=1536"])
    assert spec.seq_length == 2048 and spec.micro_batch_size == 2
    assert spec.overrides[-1] == "model.moe_ffn_hidden_size=1536" and "model.moe_ffn_hidden_size=3072" in spec.overrides


def test_unknown_shape_is_a_usage_error(capsys, tmp_path):
    from mbridge_ep_overlap.tools.cli import main

    with pytest.raises(SystemExit) as excinfo:
        main(["bench", "--shape", "huge", "--out", str(tmp_path / "never")])
    err = capsys.readouterr().err
    assert excinfo.value.code == 2 and "--shape" in err and len(err.strip().splitlines()) == 1


def test_report_merges_folders_each_against_its_own_baseline(tmp_path):
    from mbridge_ep_overlap.tools.bench import _write_json, report

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    _write_json([summarize_run("off", "nvlink", summary([1, 1, 1], [10.0, 9.0, 8.0]), 1, 100),
                 summarize_run("deepep", "nvlink", summary([1, 0.8, 0.8], [10.0, 9.0, 8.0]), 1, 100)], a)
    _write_json([summarize_run("off", "throttled", summary([3, 3, 3], [10.0, 9.0, 8.0]), 1, 100),
                 summarize_run("overlap", "throttled", summary([3, 2, 2], [10.0, 9.0, 8.1]), 1, 100)], b)
    rows = report([a, b], tmp_path / "merged", "t")
    assert [(r.link, r.variant, round(r.speedup, 3)) for r in rows] == [
        ("nvlink", "off", 1.0), ("nvlink", "deepep", 1.25), ("throttled", "off", 1.0), ("throttled", "overlap", 1.5)]
    assert rows[1].parity == "match" and rows[3].parity.startswith("MISMATCH")
    assert "| nvlink | deepep | 0.800 |" in (tmp_path / "merged" / "benchmarks.md").read_text()
    with pytest.raises(UsageError, match="--report folder"):
        report([tmp_path / "missing"], tmp_path / "m2", "t")


def test_row_without_recognized_all_to_all_shows_no_efficiency():
    prof = {"steps": [5, 7], "overlap_efficiency": {"iterations": 2, "a2a_s": 0.0, "hidden_fraction": None,
                                                    "exposed_s": 0.0, "ideal_step_s": 1.0}}
    rows = [summarize_run("off", "nvlink", summary([1, 1, 1], [10.0, 9.0, 8.0]), 1, 100),
            summarize_run("hybridep", "nvlink", summary([1, 0.5, 0.5], [10.0, 9.0, 8.0], prof), 1, 100)]
    compare_to_baseline(rows)
    assert ("| nvlink | hybridep | 0.500 | 0.500-0.500 | 2.000x | 200 | 12.5 | +0% | - | - | - | - | - | - | match | - |"
            in markdown(rows, "t"))


def test_shape_label_from_finalized_fields():
    from mbridge_ep_overlap.tools.bench import shape_label

    fin = {"hidden_size": 2048, "moe_ffn_hidden_size": 3072, "moe_router_topk": 8, "num_moe_experts": 16,
           "micro_batch_size": 16, "seq_length": 512}
    assert shape_label(fin) == "h2048 ffn3072 top8/16 mbs16 seq512"
    assert shape_label({**fin, "num_attention_heads": 32, "kv_channels": 128, "micro_batch_size": 2,
                        "seq_length": 4096}) == "h2048 attn32x128 ffn3072 top8/16 mbs2 seq4096"
    assert shape_label({}) == "-"


# ---- issue 16: share of the possible gain, idle, memory and compute deltas, the summary line -----
REPO = Path(__file__).resolve().parents[2]


def test_share_of_gain_recomputed_for_the_stop10_evidence(tmp_path):
    """bench --report recomputes the new columns from old results.json files: the stop-10 throttled
    high-priority row reaches (4.496 - 3.371) / (4.496 - 2.772) = 65% of the possible gain."""
    from mbridge_ep_overlap.tools.bench import report, summary_line

    rows = report([REPO / "docs/evidence/bench-2xh200-stop10"], tmp_path / "m", "t")
    hiprio = [r for r in rows if r.variant == "overlap:hiprio" and r.link == "throttled"]
    assert hiprio[0].share_of_gain == pytest.approx((4.496305 - 3.371048) / (4.496305 - 2.772429), abs=1e-4)
    assert hiprio[0].share_of_gain == pytest.approx(0.653, abs=1e-3)
    assert hiprio[0].share_of_gain_off_ideal == pytest.approx((4.496305 - 3.371048) / (4.496305 - 2.617679), abs=1e-4)
    assert hiprio[0].peak_vs_off == pytest.approx(43.612 / 38.123 - 1)
    assert hiprio[0].compute_vs_off_s == pytest.approx((5.544857 - 5.235358) / 2, abs=1e-5)
    # idle from a profile written before trace.analyze measured it: a lower bound, marked as such
    assert hiprio[0].idle_estimated and hiprio[0].idle_step_s == pytest.approx(
        3.420632 - (5.544857 + 4.087341 - 3.193699) / 2, abs=1e-5)
    off = [r for r in rows if r.variant == "off"]
    assert all(r.share_of_gain is None for r in off)
    line = summary_line(rows)
    assert line.startswith("Best share of the possible gain: 65% (overlap:hiprio, throttled, h2048 attn32x128 ffn3072")
    assert "bench-2xh200-stop10" in line and "60% against the off run's ideal" in line
    md = (tmp_path / "m" / "benchmarks.md").read_text()
    assert "| 65% (60%) | match |" in md and ">=0.201" in md and line in md


def test_summary_line_skips_mismatches_unrecognized_a2a_and_throttled_flex():
    from mbridge_ep_overlap.tools.bench import summary_line

    prof = lambda ideal: {"steps": [5, 7], "overlap_efficiency": {  # noqa: E731
        "iterations": 2, "hidden_fraction": 0.8, "exposed_s": 0.2, "ideal_step_s": ideal, "a2a_s": 1.0}}
    off = summarize_run("off", "throttled", summary([4, 4, 4], [10.0, 9.0, 8.0], prof(2.0)), 1, 100)
    good = summarize_run("overlap", "throttled", summary([4, 3, 3], [10.0, 9.0, 8.0], prof(2.0)), 1, 100)
    bad = summarize_run("overlap:hiprio", "throttled", summary([4, 2.5, 2.5], [10.0, 9.0, 8.5], prof(2.0)), 1, 100)
    flex = summarize_run("hybridep", "throttled", summary([4, 2.2, 2.2], [10.0, 9.0, 8.0], prof(2.0)), 1, 100)
    rows = [off, good, bad, flex]
    compare_to_baseline(rows)
    assert good.share_of_gain == pytest.approx(0.5) and bad.parity.startswith("MISMATCH")
    assert summary_line(rows).startswith("Best share of the possible gain: 50% (overlap, throttled")
    good.disqualified = "disqualified: peak"
    assert summary_line(rows).startswith("Best share of the possible gain: - ")


def test_new_profiles_give_idle_directly_and_more_microbatches_compare_with_off():
    fin = {"hidden_size": 2048, "moe_ffn_hidden_size": 3072, "moe_router_topk": 8, "num_moe_experts": 16,
           "seq_length": 4096, "global_batch_size": 64}
    prof = {"steps": [5, 7], "overlap_efficiency": {"iterations": 2, "a2a_s": 2.0, "compute_s": 5.0, "comm_s": 2.1,
                                                    "hidden_s": 1.5, "exposed_s": 0.5, "hidden_fraction": 0.75,
                                                    "ideal_step_s": 2.5, "measured_step_s": 3.4, "idle_step_s": 0.123}}
    off = summarize_run("off", "throttled", {**summary([4, 4, 4], [10.0, 9.0, 8.0]), "finalized": {**fin, "micro_batch_size": 2}}, 1, 1)
    more = summarize_run("overlap", "throttled", {**summary([4, 3, 3], [10.0, 9.0, 8.0], prof),
                                                  "finalized": {**fin, "micro_batch_size": 1}}, 1, 1)
    other = summarize_run("overlap", "throttled", {**summary([4, 3, 3], [10.0, 9.0, 8.0], prof),
                                                   "finalized": {**fin, "micro_batch_size": 1, "global_batch_size": 128}}, 1, 1)
    rows = [off, more, other]
    compare_to_baseline(rows)
    assert more.speedup == pytest.approx(4 / 3) and more.idle_step_s == 0.123 and not more.idle_estimated
    assert more.share_of_gain == pytest.approx(1 / 1.5)
    assert other.speedup is None and other.parity == ""  # another global batch: no baseline
    row = markdown(rows, "t").splitlines()[5]
    assert row.startswith("| throttled | overlap | 3.000 |") and "| 0.123 |" in row and "| 67% (-) | match |" in row


def test_no_profile_flag_when_profile_is_zero(tmp_path, monkeypatch):
    from mbridge_ep_overlap.tools import bench
    from mbridge_ep_overlap.tools.launch import Run

    seen = []

    def fake_launch(name, nproc, args, timeout_s=420, env=None, log_root=None):
        seen.append(args)
        s = summary([1, 1, 1, 1], [10.0, 9.0, 8.0, 7.0])
        s["finalized"] = {"global_batch_size": 8, "seq_length": 4}
        return Run(name, 0, False, 1.0, tmp_path, s)

    monkeypatch.setattr(bench, "launch", fake_launch)
    monkeypatch.setattr(bench, "cuda_device_count", lambda: 2)
    rows = bench.run_bench("qwen3_moe_proxy", 2, ["overlap"], ["nvlink"], tmp_path / "o", steps=4, profile=0)
    assert all("--profile-steps" not in a for a in seen) and rows[1].run_s == 1.0 and rows[1].run == str(tmp_path / "o")


@pytest.mark.parametrize("extra", [["model.no_such_field=1"], ["model.hidden_size=${oops}"], ["model=3"]])
def test_bad_override_is_usage_before_any_launch(tmp_path, monkeypatch, extra):
    """An override after ``--`` that MB cannot apply is bad usage (exit 2) found before torchrun
    starts, not a failed row per variant."""
    from mbridge_ep_overlap.tools import bench

    launched = []
    monkeypatch.setattr(bench, "launch", lambda *a, **k: launched.append(a))
    monkeypatch.setattr(bench, "cuda_device_count", lambda: 0)  # the override is named, not the GPUs
    with pytest.raises(UsageError, match="override"):
        bench.run_bench("qwen3_moe_proxy", 2, ["overlap"], ["nvlink"], tmp_path / "o", steps=4, profile=0,
                        extra=extra)
    assert launched == []


# ---- bench --report on readable but odd results.json files ----------------------------------------
def good_rows() -> list[dict]:
    off = summarize_run("off", "nvlink", summary([2, 2, 2, 2], [10.0, 9.0, 8.0, 7.0]), 1, 100)
    on = summarize_run("overlap", "nvlink", summary([2, 1.6, 1.6, 1.6], [10.0, 9.0, 8.0, 7.0], PROFILE), 1, 100)
    return json.loads(json.dumps([off.__dict__, on.__dict__], default=str))


def odd(row: int, **changes):
    def make() -> list[dict]:
        rows = good_rows()
        rows[row].update(changes)
        return rows
    return make


def without_hidden_fraction() -> list[dict]:
    rows = good_rows()
    del rows[1]["overlap_efficiency"]["hidden_fraction"]
    return rows


ODD_FILES = [  # (rows, what the one line must name)
    (odd(1, median_s="fast"), "row 2 (nvlink/overlap), field median_s = 'fast'; allowed: a finite number > 0"),
    (odd(0, median_s=float("nan")), "row 1 (nvlink/off), field median_s = nan;"),
    (odd(1, overlap_efficiency="x"), "row 2 (nvlink/overlap), field overlap_efficiency = 'x'; allowed: a profile"),
    (lambda: [], "a list of rows (found an empty list)"),
    (without_hidden_fraction, "row 2 (nvlink/overlap), field overlap_efficiency.hidden_fraction = None; allowed: a finite"),
    (odd(1, overlap_efficiency={**PROFILE["overlap_efficiency"], "iterations": 0}), "overlap_efficiency.iterations = 0;"),
    (odd(1, overlap_efficiency={**PROFILE["overlap_efficiency"], "phases": {"inside": "x"}}),
     "field overlap_efficiency.phases.inside = 'x'; allowed: a mapping of finite numbers, or null"),
    (odd(0, spread_s=[1.0]), "row 1 (nvlink/off), field spread_s = [1.0]; allowed: two finite numbers"),
    (odd(0, step_times=[1.0, "x"]), "field step_times = [1.0, 'x']; allowed: a list of finite numbers > 0"),
    (odd(0, peak_gib=float("inf")), "field peak_gib = inf;"),
    (odd(0, losses={"first": 1.0}), "field losses = {'first': 1.0}; allowed: a mapping of iteration number"),
    (odd(0, skipped=[True]), "field skipped = [True];"),
    (odd(1, speedup=-1), "row 2 (nvlink/overlap), field speedup = -1;"),
    (odd(0, ok="yes"), "field ok = 'yes'; allowed: true or false"),
    (odd(0, finalized=[]), "field finalized = [];"),
    (odd(0, colour="red"), "field colour = 'red'; allowed: only VariantResult fields"),
    (lambda: [good_rows()[0], 7], "row 2, field (the row itself) = 7;"),
    (lambda: [{"variant": "off", "ok": True}], "row 1 (None/off), field link = None; allowed: a non-empty string (missing)"),
]


@pytest.mark.parametrize("rows,needle", ODD_FILES, ids=[n.split(";")[0][-40:] for _, n in ODD_FILES])
def test_report_refuses_an_odd_row_naming_file_row_and_field(rows, needle, tmp_path, capsys):
    """Each of these crashed `bench --report` (TypeError, AttributeError) after validation of the
    file's JSON alone, some after partial outputs were written, or ([]) exited 1 without a reason."""
    from mbridge_ep_overlap.tools.cli import main

    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir(), bad.mkdir()
    (good / "results.json").write_text(json.dumps(good_rows()))
    (bad / "results.json").write_text(json.dumps(rows()))  # NaN / Infinity as Python's json writes them
    code = main(["bench", "--report", str(good), str(bad), "--out", str(tmp_path / "merged")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"invalid bench results file '{bad / 'results.json'}'" in err and needle in err, err
    assert not (tmp_path / "merged").exists()  # nothing written before every file passed


def test_report_of_deeply_nested_json_is_one_line(tmp_path, capsys):
    from mbridge_ep_overlap.tools.cli import main

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text("[" * 100_000 + "]" * 100_000)
    code = main(["bench", "--report", str(tmp_path / "r"), "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert code == 2 and "unreadable bench results file" in err and len(err.strip().splitlines()) == 1


def test_the_row_check_knows_every_field_and_passes_real_evidence():
    from mbridge_ep_overlap.tools.results import ROW_FIELDS, VariantResult, load_results

    assert set(ROW_FIELDS) == {f.name for f in dataclasses.fields(VariantResult)}
    for path in sorted((REPO / "docs/evidence").glob("*/results.json")):
        assert load_results(path), path


def test_an_ok_row_without_a_steady_window_renders(tmp_path):
    """bench --tune judges such a row 'failed: no steady-window step time'; the table must still be made."""
    from mbridge_ep_overlap.tools.bench import VariantResult

    off = summarize_run("off", "nvlink", summary([2, 2, 2, 2], [10.0, 9.0, 8.0, 7.0]), 1, 100)
    rows = [off, VariantResult("overlap", "nvlink", ok=True, step_times=[2.0])]
    compare_to_baseline(rows)
    assert "| nvlink | overlap | - | - | - | - | - |" in markdown(rows, "t")
    assert plot(rows, tmp_path / "p.png")


def test_plot_of_failed_rows_only_has_no_legend_warning(tmp_path, recwarn):
    from mbridge_ep_overlap.tools.bench import VariantResult

    assert plot([VariantResult("off", "nvlink", ok=False, error="x")], tmp_path / "p.png")
    assert not [w for w in recwarn if "legend" in str(w.message)]


# ---- bench on a machine without (enough) GPUs; --out that cannot be a folder ------------------------
@pytest.mark.parametrize("gpus", [0, 1])
def test_bench_without_enough_gpus_launches_nothing(gpus, tmp_path, monkeypatch, capsys):
    """It used to start torchrun anyway: 17 s, exit 1, a row 'failed: run 'nvlink__off' exit code 1'
    and the real cause only in a rank's stderr.log."""
    from mbridge_ep_overlap.tools import bench
    from mbridge_ep_overlap.tools.cli import main

    launched = []
    monkeypatch.setattr(bench, "launch", lambda *a, **k: launched.append(a))
    monkeypatch.setattr(bench, "cuda_device_count", lambda: gpus)
    code = main(["bench", "--variants", "off", "--links", "nvlink", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"too many GPUs for this machine: --nproc 2; allowed: at most the {gpus} CUDA GPU(s)" in err
    assert launched == [] and not (tmp_path / "x").exists()
    # the request's own checks come first: a bad flag is still reported as such
    code = main(["bench", "--variants", "fast", "--links", "nvlink", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "unknown variant 'fast'" in err and "GPU" not in err


def test_gpu_count_without_torch_is_one_line_not_a_traceback(monkeypatch):
    import sys

    from mbridge_ep_overlap.tools import bench

    monkeypatch.setitem(sys.modules, "torch", None)  # torch missing: one line, no traceback
    with pytest.raises(UsageError, match="missing torch"):
        bench.require_gpus(1)


@pytest.mark.parametrize("kind", ["loop", "dangling", "file", "loop-parent"])
def test_bench_out_that_cannot_be_a_folder(kind, tmp_path, monkeypatch, capsys):
    """A symbolic-link loop used to read "cannot use '...': File exists" (mkdir(exist_ok=True))."""
    from mbridge_ep_overlap.tools import bench
    from mbridge_ep_overlap.tools.cli import main

    launched = []
    monkeypatch.setattr(bench, "launch", lambda *a, **k: launched.append(a))
    monkeypatch.setattr(bench, "cuda_device_count", lambda: 2)
    link = tmp_path / "o"
    out = link / "sub" if kind == "loop-parent" else link
    if kind in ("loop", "loop-parent"):
        link.symlink_to(link)
        why = f"{link} is a symbolic-link loop"
    elif kind == "dangling":
        link.symlink_to(tmp_path / "nowhere")
        why = f"{link} is a symbolic link to {tmp_path / 'nowhere'}, which does not exist"
    else:
        link.write_text("")
        why = f"{link} exists and is not a folder"
    code = main(["bench", "--variants", "off", "--links", "nvlink", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "File exists" not in err, err
    assert f"unusable --out '{out}'" in err and why in err, err
    assert launched == []
    code = main(["bench", "--report", str(REPO / "docs/evidence/bench-2xh200-stop10"), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and why in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("row", [
    {"variant": "off", "link": "nvlink", "ok": True, "median_s": 10**400},
    {"variant": "off", "link": "nvlink", "ok": True, "step_times": [10**400]},
    {"variant": "off", "link": "nvlink", "ok": True, "losses": {"1" * 5001: 1.0}},
    {"variant": "off", "link": "nvlink", "ok": True, "losses": {"1": 10**400}},
    {"variant": "off", "link": "nvlink", "ok": True, "overlap_efficiency": {"phases": {"inside": {"idle": 10**400}}}},
], ids=["median-huge", "step-huge", "iteration-5001-digits", "loss-huge", "phase-huge"])
def test_report_of_huge_numbers_is_one_line(row, tmp_path, capsys):
    """Integers beyond int64 (Python's json reads them exactly) are refused by name, never an
    OverflowError or the 4300-digit text limit."""
    from mbridge_ep_overlap.tools import cli

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text("[" + _json_row(row) + "]")
    code = cli.main(["bench", "--report", str(run), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "results.json" in err, err
    assert not (tmp_path / "out").exists()


def _json_row(row) -> str:
    import json
    import sys

    sys.set_int_max_str_digits(0)  # json.dumps of a 401-digit int needs no limit; 5001-digit keys are str
    try:
        return json.dumps(row)
    finally:
        sys.set_int_max_str_digits(4300)
