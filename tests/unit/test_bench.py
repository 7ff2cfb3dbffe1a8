"""Benchmark bookkeeping on synthetic run summaries (no GPU): windows, speedup, parity, outputs."""

import dataclasses
import json
from pathlib import Path

import pytest

from mbridge_ep_overlap.lab.bench import compare_to_baseline, markdown, plot, run_bench, summarize_run
from mbridge_ep_overlap.base.errors import UsageError


def summary(times, losses, profile=None):
    steps = [{"iteration": i, "loss": loss, "skipped": False, "step_time_s": t} for i, (t, loss) in enumerate(zip(times, losses))]
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
    """Every bench shape is a valid RunSpec for the proxy: launched as bench launches it (its spec
    file, ``spec_file.write_spec``, read by run_script.py --spec), MB's real finalize accepts it, and
    each keeps 16 microbatches of 8192 tokens per rank (the docs' commands rely on that)."""
    from mbridge_ep_overlap.lab.bench import SHAPES, shape_spec, variant_spec
    from mbridge_ep_overlap.tools.run import main
    from mbridge_ep_overlap.runtime.spec_file import write_spec

    spec = variant_spec(shape_spec("qwen3_moe_proxy", shape, 12, []), "overlap")
    code = main([*write_spec(spec, tmp_path / "spec.json"), "--dryrun", "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    ffn = next(o.split("=")[1] for o in SHAPES[shape]["overrides"] if o.startswith("model.moe_ffn_hidden_size="))
    assert f"moe_ffn_hidden_size: {ffn}" in out and "hidden_size: 2048" in out and "num_microbatches: 16" in out
    fields = {k: v.split("  (", 1)[0] for k, v in (line.split(": ", 1) for line in out.splitlines() if ": " in line)}
    assert int(fields["micro_batch_size"]) * int(fields["seq_length"]) == 8192
    if shape == "long-seq":
        assert (fields["seq_length"], fields["num_attention_heads"], fields["kv_channels"]) == ("4096", "32", "128")


def test_flags_after_double_dash_win_over_the_shape():
    from mbridge_ep_overlap.lab.bench import shape_spec

    spec = shape_spec("qwen3_moe_proxy", "long-seq", 12, ["--seq-length", "2048", "model.moe_ffn_hidden_size=1536"])
    assert spec.seq_length == 2048 and spec.micro_batch_size == 2
    assert spec.overrides[-1] == "model.moe_ffn_hidden_size=1536" and "model.moe_ffn_hidden_size=3072" in spec.overrides


def test_unknown_shape_is_a_usage_error(capsys, tmp_path):
    from mbridge_ep_overlap.tools.cli import main

    with pytest.raises(SystemExit) as excinfo:
        main(["bench", "run", "--shape", "huge", "--out", str(tmp_path / "never")])
    err = capsys.readouterr().err
    assert excinfo.value.code == 2 and "--shape" in err and len(err.strip().splitlines()) == 1


def test_report_merges_folders_each_against_its_own_baseline(tmp_path):
    from mbridge_ep_overlap.lab.bench import report
    from mbridge_ep_overlap.lab.tables import write_json as _write_json

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
    from mbridge_ep_overlap.lab.bench import shape_label

    fin = {"hidden_size": 2048, "moe_ffn_hidden_size": 3072, "moe_router_topk": 8, "num_moe_experts": 16,
           "micro_batch_size": 16, "seq_length": 512}
    assert shape_label(fin) == "h2048 ffn3072 top8/16 mbs16 seq512"
    assert shape_label({**fin, "num_attention_heads": 32, "kv_channels": 128, "micro_batch_size": 2,
                        "seq_length": 4096}) == "h2048 attn32x128 ffn3072 top8/16 mbs2 seq4096"
    assert shape_label({}) == "-"


# ---- share of the possible gain, idle, memory and compute deltas, the summary line -----
REPO = Path(__file__).resolve().parents[2]


def test_share_of_gain_recomputed_for_the_stop10_evidence(tmp_path):
    """bench report recomputes the new columns from old results.json files: the 2026-11-30 long-seq throttled
    high-priority row reaches (4.496 - 3.371) / (4.496 - 2.772) = 65% of the possible gain."""
    from mbridge_ep_overlap.lab.bench import report, summary_line

    rows = report([REPO / "docs/evidence/2026-11-30-h200x2-bench-long-seq"], tmp_path / "m", "t")
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
    assert "2026-11-30-h200x2-bench-long-seq" in line and "60% against the off run's ideal" in line
    md = (tmp_path / "m" / "benchmarks.md").read_text()
    assert "| 65% (60%) | match |" in md and ">=0.201" in md and line in md


def test_summary_line_skips_mismatches_unrecognized_a2a_and_throttled_flex():
    from mbridge_ep_overlap.lab.bench import summary_line

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
    from mbridge_ep_overlap.lab import bench
    from mbridge_ep_overlap.lab.launch import Run

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
    from mbridge_ep_overlap.lab import bench

    launched = []
    monkeypatch.setattr(bench, "launch", lambda *a, **k: launched.append(a))
    monkeypatch.setattr(bench, "cuda_device_count", lambda: 0)  # the override is named, not the GPUs
    with pytest.raises(UsageError, match="override"):
        bench.run_bench("qwen3_moe_proxy", 2, ["overlap"], ["nvlink"], tmp_path / "o", steps=4, profile=0,
                        extra=extra)
    assert launched == []


# ---- bench report on readable but odd results.json files ----------------------------------------
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
    """Each of these crashed `bench report` (TypeError, AttributeError) after validation of the
    file's JSON alone, some after partial outputs were written, or ([]) exited 1 without a reason."""
    from mbridge_ep_overlap.tools.cli import main

    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir(), bad.mkdir()
    (good / "results.json").write_text(json.dumps(good_rows()))
    (bad / "results.json").write_text(json.dumps(rows()))  # NaN / Infinity as Python's json writes them
    code = main(["bench", "report", str(good), str(bad), "--out", str(tmp_path / "merged")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"invalid bench results file '{bad / 'results.json'}'" in err and needle in err, err
    assert not (tmp_path / "merged").exists()  # nothing written before every file passed


def test_report_of_deeply_nested_json_is_one_line(tmp_path, capsys):
    from mbridge_ep_overlap.tools.cli import main

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text("[" * 100_000 + "]" * 100_000)
    code = main(["bench", "report", str(tmp_path / "r"), "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert code == 2 and "unreadable bench results file" in err and len(err.strip().splitlines()) == 1


def test_the_row_check_knows_every_field_and_passes_real_evidence():
    from mbridge_ep_overlap.lab.results import ROW_FIELDS, VariantResult, load_results

    assert set(ROW_FIELDS) == {f.name for f in dataclasses.fields(VariantResult)}
    for path in sorted((REPO / "docs/evidence").glob("*/results.json")):
        assert load_results(path), path


def test_an_ok_row_without_a_steady_window_renders(tmp_path):
    """bench tune judges such a row 'failed: no steady-window step time'; the table must still be made."""
    from mbridge_ep_overlap.lab.bench import VariantResult

    off = summarize_run("off", "nvlink", summary([2, 2, 2, 2], [10.0, 9.0, 8.0, 7.0]), 1, 100)
    rows = [off, VariantResult("overlap", "nvlink", ok=True, step_times=[2.0])]
    compare_to_baseline(rows)
    assert "| nvlink | overlap | - | - | - | - | - |" in markdown(rows, "t")
    assert plot(rows, tmp_path / "p.png")


def test_plot_of_failed_rows_only_has_no_legend_warning(tmp_path, recwarn):
    from mbridge_ep_overlap.lab.bench import VariantResult

    assert plot([VariantResult("off", "nvlink", ok=False, error="x")], tmp_path / "p.png")
    assert not [w for w in recwarn if "legend" in str(w.message)]


# ---- bench on a machine without (enough) GPUs; --out that cannot be a folder ------------------------
@pytest.mark.parametrize("gpus", [0, 1])
def test_bench_without_enough_gpus_launches_nothing(gpus, tmp_path, monkeypatch, capsys):
    """It used to start torchrun anyway: 17 s, exit 1, a row 'failed: run 'nvlink__off' exit code 1'
    and the real cause only in a rank's stderr.log."""
    from mbridge_ep_overlap.lab import bench
    from mbridge_ep_overlap.tools.cli import main

    launched = []
    monkeypatch.setattr(bench, "launch", lambda *a, **k: launched.append(a))
    monkeypatch.setattr(bench, "cuda_device_count", lambda: gpus)
    code = main(["bench", "run", "--variants", "off", "--links", "nvlink", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"too many GPUs for this machine: --nproc 2; allowed: at most the {gpus} CUDA GPU(s)" in err
    assert launched == [] and not (tmp_path / "x").exists()
    # the request's own checks come first: a bad flag is still reported as such
    code = main(["bench", "run", "--variants", "fast", "--links", "nvlink", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "unknown variant 'fast'" in err and "GPU" not in err


def test_gpu_count_without_torch_is_one_line_not_a_traceback(monkeypatch):
    import sys

    from mbridge_ep_overlap.lab import bench

    monkeypatch.setitem(sys.modules, "torch", None)  # torch missing: one line, no traceback
    with pytest.raises(UsageError, match="missing torch"):
        bench.require_gpus(1)


@pytest.mark.parametrize("kind", ["loop", "dangling", "file", "loop-parent"])
def test_bench_out_that_cannot_be_a_folder(kind, tmp_path, monkeypatch, capsys):
    """A symbolic-link loop used to read "cannot use '...': File exists" (mkdir(exist_ok=True))."""
    from mbridge_ep_overlap.lab import bench
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
    code = main(["bench", "run", "--variants", "off", "--links", "nvlink", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "File exists" not in err, err
    assert f"unusable --out '{out}'" in err and why in err, err
    assert launched == []
    code = main(["bench", "report", str(REPO / "docs/evidence/2026-11-30-h200x2-bench-long-seq"), "--out", str(out)])
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
    code = cli.main(["bench", "report", str(run), "--out", str(tmp_path / "out")])
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


# ---- bench run --tuned: the tuned settings judged by the pipeline before anything is launched -----------
def fake_node(te: str = "", **facts):
    """A GPU node as the probe would describe it (fake hardware): 2x H100, TE as given, no DeepEP."""
    from mbridge_ep_overlap.target.cluster import describe

    return dataclasses.replace(describe("h100", 2, te_version=te, deep_ep_version=""), source="probed", **facts)


def must_not_launch(*args, **kwargs):
    pytest.fail(f"a torchrun job was launched ({args[:1]}) although its input was refused")


def tuned_file(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"ep_overlap": True, "dispatcher": "alltoall", "overrides": [], "env": {}, **fields}))
    return path


JUDGED_TUNED = [  # (tuned.json fields, exit code, what stderr must say; {path}: the tuned file)
    ({"overrides": ["model.no_such_field=1"]}, 2,
     ["unknown override (variant tuned, tuned file {path}) 'model.no_such_field=1'; allowed: an existing config field"]),
    ({"overrides": ["model..x=1"]}, 2, ["malformed override (variant tuned, tuned file {path}) 'model..x=1'"]),
    ({"overrides": ["=1"]}, 2, ["malformed override (variant tuned, tuned file {path}) '=1'"]),
    ({"overrides": ["model=3"]}, 2, ["invalid override (variant tuned, tuned file {path}) 'model=3'; allowed: a field inside model"]),
    ({"overrides": ["model.hidden_size=${oops}"]}, 2, ["invalid override (variant tuned, tuned file {path})"]),
    ({"dispatcher": "fastest"}, 2, ["unknown dispatcher (variant tuned, tuned file {path}) 'fastest'"]),
    ({"overrides": ["comm_overlap.delay_wgrad_compute=true"]}, 1,
     ["EP overlap refused (bench jobs: tuned on nvlink, throttled, from tuned file {path})", "delay-wgrad-needs-te"]),
    ({"overrides": ["model.moe_router_topk=0", "comm_overlap.delay_wgrad_compute=true"]}, 1,  # every violation
     ["router-topk", "top-0 of 16 experts", "delay-wgrad-needs-te"]),
    ({"overrides": ["model.moe_router_topk=abc"]}, 2,
     ["wrong type for override model.moe_router_topk (variant tuned, tuned file {path}) 'abc'; allowed: int"]),
    ({"ep_overlap": False, "overrides": ["model.moe_router_topk=0"]}, 1,
     ["config refused (EP overlap off) (bench jobs: tuned on nvlink, throttled, from tuned file {path})", "router-topk"]),
    ({"dispatcher": "hybridep", "env": {"CUDA_HOME": "/nonexistent"}}, 1,  # a variable the job is launched with
     ["hybridep-jit-nvcc", "CUDA_HOME=/nonexistent"]),
    ({"env": {"CUDA_DEVICE_MAX_CONNECTIONS": "abc"}, "overrides": ["model.moe_router_topk=0"]}, 1,
     ["field env_vars.CUDA_DEVICE_MAX_CONNECTIONS = 'abc'", "router-topk"]),
    ({"overrides": ["env_vars.CUDA_DEVICE_MAX_CONNECTIONS=abc"]}, 1, ["field env_vars.CUDA_DEVICE_MAX_CONNECTIONS = 'abc'"]),
]


@pytest.mark.parametrize("fields,code,needles", JUDGED_TUNED,
                         ids=["unknown-key", "empty-segment", "no-key", "whole-section", "unresolvable", "dispatcher",
                              "rule", "every-rule", "wrong-type-value", "overlap-off", "environment",
                              "environment-and-override", "env-vars-override"])
def test_tuned_settings_are_judged_before_anything_is_launched(fields, code, needles, tmp_path, monkeypatch, capsys):
    """bench run --tuned builds each job's spec as run_script.py will (pipeline.build, the rules `plan`
    evaluates) on this machine with the job's variables: a setting MB cannot apply is bad usage in one
    line naming the file (exit 2), one the rules refuse exit 1 with every violation - before the GPU
    check, with no job started and no output folder."""
    from mbridge_ep_overlap.lab import bench
    from mbridge_ep_overlap.tools.cli import main

    node = fake_node(deep_ep_version="1.2.1", hybrid_ep_available=True, deep_ep_nvshmem=True)
    monkeypatch.setattr("mbridge_ep_overlap.target.probe.probe", lambda: node)
    monkeypatch.setattr(bench, "launch", must_not_launch)
    monkeypatch.setattr(bench, "cuda_device_count", lambda: 0)  # the settings are named, not the missing GPUs
    path = tuned_file(tmp_path, **fields)
    got = main(["bench", "run", "--tuned", str(path), "--variants", "off,tuned", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert got == code and all(n.format(path=path) in err for n in needles), err
    assert "GPU(s)" not in err and not (tmp_path / "o").exists()
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err


def test_each_job_is_judged_with_its_own_variables_before_the_first_starts(tmp_path, monkeypatch):
    """The target each job is judged on is this machine as the job sees it: the link's and the
    variant's variables, the multicast-off ones launch adds, WORLD_SIZE; then the jobs run with the
    same (string) values."""
    from mbridge_ep_overlap import pipeline
    from mbridge_ep_overlap.lab import bench
    from mbridge_ep_overlap.lab.launch import MULTICAST_OFF, Run

    events = []
    real_build = pipeline.build

    def build(spec, **kwargs):
        events.append(("judged", spec.ep_overlap, kwargs["target"]))
        return real_build(spec, **kwargs)

    def fake_launch(name, nproc, args, timeout_s=420, env=None, log_root=None, **kwargs):
        events.append(("launched", name, env))
        s = summary([1, 1, 1, 1], [10.0, 9.0, 8.0, 7.0])
        s["finalized"] = {"global_batch_size": 8, "seq_length": 4}
        return Run(name, 0, False, 1.0, tmp_path, s)

    monkeypatch.setattr(pipeline, "build", build)
    monkeypatch.setattr("mbridge_ep_overlap.target.probe.probe", lambda: fake_node())
    monkeypatch.setattr(bench, "launch", fake_launch)
    monkeypatch.setattr(bench, "cuda_device_count", lambda: 2)
    from mbridge_ep_overlap.lab.tune import load_tuned_variant

    tuned = load_tuned_variant(tuned_file(tmp_path, env={"CUDA_DEVICE_MAX_CONNECTIONS": 8}))
    bench.run_bench("qwen3_moe_proxy", 2, ["tuned"], ["nvlink", "throttled"], tmp_path / "o", steps=4, profile=0,
                    extra_variants={"tuned": tuned})
    judged = [e for e in events if e[0] == "judged"]
    assert [e[0] for e in events] == ["judged"] * 4 + ["launched"] * 4
    assert [e[1] for e in judged] == [False, False, True, True]  # off, tuned; each on nvlink, throttled
    for (_, _, target), link in zip(judged, ["nvlink", "throttled"] * 2):
        assert target.world_size == 2 and target.env_vars["WORLD_SIZE"] == "2" and not target.described
        assert MULTICAST_OFF.items() <= target.env_vars.items()
        assert (target.env_vars.get("NCCL_P2P_DISABLE") == "1") == (link == "throttled")
    assert judged[2][2].env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
    assert [e[2]["CUDA_DEVICE_MAX_CONNECTIONS"] for e in events if e[0] == "launched" and "tuned" in e[1]] == ["8", "8"]


def test_a_good_tuned_file_reaches_the_gpu_check(tmp_path, monkeypatch, capsys):
    from mbridge_ep_overlap.lab import bench
    from mbridge_ep_overlap.tools.cli import main

    monkeypatch.setattr("mbridge_ep_overlap.target.probe.probe", lambda: fake_node())
    monkeypatch.setattr(bench, "launch", must_not_launch)
    monkeypatch.setattr(bench, "cuda_device_count", lambda: 0)
    path = tuned_file(tmp_path, overrides=["model.high_priority_a2a_comm_stream=true"],
                      env={"CUDA_DEVICE_MAX_CONNECTIONS": "8"})
    code = main(["bench", "run", "--tuned", str(path), "--variants", "off,tuned", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "too many GPUs for this machine" in err and len(err.strip().splitlines()) == 1, err


# ---- bench report grows linearly with the rows, its output unchanged ------------------------------
def _baselines_as_before(results) -> list:
    """The off row each row was compared with up to this change (quadratic: each row scanned every
    earlier one): the reference ``bench.baselines`` must equal, row for row."""
    from mbridge_ep_overlap.lab.bench import workload_key

    chosen = []
    for i, r in enumerate(results):
        offs = [o for o in results[: i + 1] if o.variant == "off" and o.ok and workload_key(o) == workload_key(r)]
        offs = offs or [o for o in results if o.variant == "off" and o.ok and workload_key(o) == workload_key(r)]
        chosen.append(offs[-1] if r.ok and offs else None)
    return chosen


def same_rows(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def synthetic_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` valid results.json rows (results.ROW_FIELDS) over 2 links, 4 workloads (one without
    finalized fields, one whose global batch is a list), off rows before and after the rest, failed
    rows and failed offs, with and without profiles."""
    import random

    rnd = random.Random(seed)
    shapes = [{}, {"hidden_size": 2048, "moe_ffn_hidden_size": 1536, "moe_router_topk": 8, "num_moe_experts": 16,
                   "micro_batch_size": 16, "seq_length": 512, "global_batch_size": 512}]
    shapes += [{**shapes[1], "micro_batch_size": 8}, {**shapes[1], "global_batch_size": [512]}]
    rows = []
    for i in range(n):
        variant = rnd.choice(["off", "off", "overlap", "overlap:hiprio", "tuned"])
        row = {"variant": variant, "link": rnd.choice(["nvlink", "throttled"]), "ok": rnd.random() > 0.05,
               "finalized": rnd.choice(shapes)}
        if not row["ok"]:
            rows.append({**row, "error": "failed: run 'x' exit code 1"})
            continue
        median = rnd.uniform(1, 5)
        profile = {"iterations": 2, "a2a_s": rnd.choice([0.0, 4.0]), "compute_s": rnd.uniform(4, 6), "comm_s": 4.1,
                   "hidden_s": 1.5, "exposed_s": 0.5, "hidden_fraction": 0.75, "ideal_step_s": rnd.uniform(1, 2),
                   "measured_step_s": median + 0.05}
        rows.append({**row, "step_times": [median] * 4, "median_s": median, "spread_s": [median, median],
                     "tokens_per_s": 8192 / median, "peak_gib": rnd.uniform(30, 50),
                     "losses": {str(k): 10 - k + (0.5 if rnd.random() < 0.2 and k == 3 else 0.0) for k in range(4)},
                     "overlap_efficiency": profile if rnd.random() < 0.7 else None})
    return rows


@pytest.mark.parametrize("seed", range(5))
def test_each_row_gets_the_off_row_the_quadratic_search_chose(seed):
    from mbridge_ep_overlap.lab.bench import baselines
    from mbridge_ep_overlap.lab.results import result_from_row

    rows = [result_from_row(d) for d in synthetic_rows(150, seed)]
    assert same_rows(baselines(rows), _baselines_as_before(rows))


def test_the_evidence_gets_the_off_rows_it_got_before():
    from mbridge_ep_overlap.lab.bench import baselines
    from mbridge_ep_overlap.lab.results import load_results

    merged = []
    for path in sorted((REPO / "docs/evidence").glob("*/results.json")):
        rows = load_results(path)
        merged += rows
        assert same_rows(baselines(rows), _baselines_as_before(rows)), path
    assert same_rows(baselines(merged), _baselines_as_before(merged))


SMALL_REPORT = """\
### small

| link | variant | median step s | spread s | speedup vs off | tokens/s | peak GiB | peak vs off | A2A hidden | exposed A2A s/step | idle s/step | compute +s/step vs off | ideal step s | share of possible gain (vs off's ideal) | losses | shape |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
| nvlink | overlap | 3.000 | 3.000-3.000 | 1.300x | 33 | 12.5 | +0% | 75% | 0.250 | >=0.600 | - | 2.500 | 64% (-) | match | h2048 ffn3072 top8/16 mbs2 seq4096 |
| nvlink | off | 4.000 | 4.000-4.000 | 1.000x | 25 | 12.5 | - | - | - | - | - | - | - | baseline | h2048 ffn3072 top8/16 mbs2 seq4096 |
| nvlink | overlap:hiprio | 2.800 | 2.800-2.800 | 1.429x | 36 | 12.5 | +0% | 75% | 0.250 | >=0.600 | - | 2.500 | 80% (-) | MISMATCH: iteration 2: 8.0 vs 8.5 (rel diff 6.25e-02 > 7.81e-03) | h2048 ffn3072 top8/16 mbs2 seq4096 |
| throttled | off | 5.000 | 5.000-5.000 | 1.000x | 20 | 12.5 | - | 75% | 0.250 | >=0.600 | - | 2.500 | - | baseline | h2048 ffn3072 top8/16 mbs2 seq4096 |
| throttled | overlap | 3.500 | 3.500-3.500 | 1.429x | 29 | 12.5 | +0% | 75% | 0.250 | >=0.600 | +0.000 | 2.500 | 60% (60%) | match | h2048 ffn3072 top8/16 mbs1 seq4096 |
| nvlink | off | 3.900 | 3.900-3.900 | 1.000x | 26 | 12.5 | - | - | - | - | - | - | - | baseline | h2048 ffn3072 top8/16 mbs2 seq4096 |
| nvlink | tuned | 2.600 | 2.600-2.600 | 1.500x | 38 | 12.5 | +0% | 75% | 0.250 | >=0.600 | - | 2.500 | 93% (-) | match | h2048 ffn3072 top8/16 mbs2 seq4096 |
| throttled | overlap | 3.500 | 3.500-3.500 | - | 29 | 12.5 | - | 75% | 0.250 | >=0.600 | - | 2.500 | - |  | h2048 ffn3072 top8/16 mbs2 seq4096 |
| nvlink | deepep | - | - | - | - | - | - | - | - | - | - | - | - | failed: failed: run 'nvlink__deepep' exit code 1 | - |

Best share of the possible gain: 93% (tuned, nvlink, h2048 ffn3072 top8/16 mbs2 seq4096, -)

`>=`: idle from a profile recorded before `trace.analyze` measured it (a lower bound, short by at most the non-all-to-all collectives' time)."""


def test_the_table_of_a_small_case_is_what_it_was(tmp_path):
    """markdown of ``small_case`` as the quadratic original wrote it (byte for byte), also through
    bench report."""
    from mbridge_ep_overlap.lab.bench import report
    from mbridge_ep_overlap.lab.tables import write_json as _write_json

    rows = small_case()
    compare_to_baseline(rows)
    assert markdown(rows, "small") == SMALL_REPORT
    _write_json(small_case(), tmp_path / "run")
    report([tmp_path / "run"], tmp_path / "m", "small")
    run = SMALL_REPORT.replace("seq4096, -)", f"seq4096, {tmp_path / 'run'})")  # the row's folder, filled in
    assert (tmp_path / "m" / "benchmarks.md").read_text() == run + "\n"


def test_a_report_of_20000_rows_takes_seconds(tmp_path, capsys):
    """8,000 rows took 114 s (every row scanned every earlier one for its off row, and a plot with a
    legend entry and a labelled bar per row, 530,000 pixels wide); now the work grows linearly."""
    import time

    from mbridge_ep_overlap.lab.bench import PLOT_MAX_ROWS
    from mbridge_ep_overlap.tools.cli import main

    (tmp_path / "big").mkdir()
    rows = synthetic_rows(20_000)
    (tmp_path / "big" / "results.json").write_text(json.dumps(rows))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "benchmarks.png").write_bytes(b"a plot of another run")
    start = time.perf_counter()
    code = main(["bench", "report", str(tmp_path / "big"), "--out", str(tmp_path / "out")])
    seconds = time.perf_counter() - start
    out = capsys.readouterr().out
    assert code == 0 and seconds < 20, seconds
    table = (tmp_path / "out" / "benchmarks.md").read_text().splitlines()
    assert sum(1 for line in table if line.startswith("| nvlink |") or line.startswith("| throttled |")) == 20_000
    measured = sum(1 for d in rows if d["ok"])
    assert f"benchmarks.png: not drawn ({measured} measured rows, more than the {PLOT_MAX_ROWS}" in out
    assert not (tmp_path / "out" / "benchmarks.png").exists()  # no stale plot beside the new table


def test_plot_limit(tmp_path):
    from mbridge_ep_overlap.lab.bench import PLOT_MAX_ROWS, VariantResult, too_many_to_plot

    rows = [VariantResult("off", "nvlink", ok=True, step_times=[1.0])] * PLOT_MAX_ROWS
    failed = [VariantResult("off", "nvlink", ok=False, error="x")]
    assert too_many_to_plot(rows + failed) == ""  # failed rows draw nothing
    assert too_many_to_plot(rows + rows[:1]).startswith(f"{PLOT_MAX_ROWS + 1} measured rows")
    assert not plot(rows + rows[:1], tmp_path / "p.png") and not (tmp_path / "p.png").exists()


def small_case() -> list:
    """Rows in the order a merged report meets them: a row before its off, two offs of one workload,
    a loss mismatch, another global batch (no off), a failed row."""
    from mbridge_ep_overlap.lab.bench import VariantResult

    fin = {"hidden_size": 2048, "moe_ffn_hidden_size": 3072, "moe_router_topk": 8, "num_moe_experts": 16,
           "micro_batch_size": 2, "seq_length": 4096, "global_batch_size": 64}
    prof = {"steps": [5, 7], "overlap_efficiency": {"iterations": 2, "a2a_s": 2.0, "compute_s": 5.0, "comm_s": 2.1,
                                                    "hidden_s": 1.5, "exposed_s": 0.5, "hidden_fraction": 0.75,
                                                    "ideal_step_s": 2.5, "measured_step_s": 3.4}}

    def row(variant, link, times, losses, profile=None, **finalized):
        return summarize_run(variant, link, {**summary(times, losses, profile), "finalized": {**fin, **finalized}}, 1, 100)

    same, other = [10.0, 9.0, 8.0], [10.0, 9.0, 8.5]
    return [row("overlap", "nvlink", [4, 3, 3], same, prof), row("off", "nvlink", [4, 4, 4], same),
            row("overlap:hiprio", "nvlink", [4, 2.8, 2.8], other, prof), row("off", "throttled", [5, 5, 5], same, prof),
            row("overlap", "throttled", [5, 3.5, 3.5], same, prof, micro_batch_size=1),
            row("off", "nvlink", [4, 3.9, 3.9], same), row("tuned", "nvlink", [4, 2.6, 2.6], same, prof),
            row("overlap", "throttled", [5, 3.5, 3.5], same, prof, global_batch_size=128),
            VariantResult("deepep", "nvlink", ok=False, error="failed: run 'nvlink__deepep' exit code 1")]
