"""Cluster calibration: a fit of rows the model made at known constants recovers them; the file
round-trips; plan --calibration uses it and says so; bad files and rows are exit 2 in one line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mbridge_ep_overlap.predict import Cluster, StepInputs, predict
from mbridge_ep_overlap.predict.calibrate import PROXY_RECIPE
from mbridge_ep_overlap.predict.cluster_calibration import (SCALE_OUT, SCALE_OUT_FITTED, ClusterCalibration, MeasuredRow,
                                                              fit_cluster, predicted_step, scale_out_link)
from mbridge_ep_overlap.predict.costs import default_calibration, gpu_spec
from mbridge_ep_overlap.tools.cli import main as cli
from mbridge_ep_overlap.lab.results import VariantResult

CLUSTER = Cluster(gpu="h200", num_gpus=8, gpus_per_node=8, nvlink_domain_size=8)
TRUE = dataclasses.replace(default_calibration(), gemm_efficiency=0.42, memory_efficiency=0.61,
                           nvlink_alltoall_efficiency=0.33)
SHAPES = ({}, {"hidden_size": 2048, "seq_length": 1024})


def _fields(shape: dict, variant: str) -> dict:
    s = dict(PROXY_RECIPE, expert_model_parallel_size=8, data_parallel_size=8, micro_batch_size=1,
             global_batch_size=64, seq_length=4096)
    s.update(shape, overlap_moe_expert_parallel_comm=variant != "off")
    return s


def _row(i: int, shape: dict, variant: str, *, profiled: bool = True) -> MeasuredRow:
    s = _fields(shape, variant)
    p = predict(StepInputs.from_summary(s, num_gpus=8), CLUSTER, TRUE)
    prof = {"iterations": 2, "compute_s": 2 * p.compute_s_per_step, "a2a_s": 2 * p.a2a_s_per_step} if profiled else None
    return MeasuredRow(id=f"r{i}", variant=variant, median_s=p.off_step_s if variant == "off" else p.on_step_s,
                       finalized=s, profile=prof)


def test_fit_recovers_the_bandwidth_and_efficiencies_the_rows_were_made_at():
    rows = [_row(0, SHAPES[0], "off"), _row(1, SHAPES[1], "off"), _row(2, SHAPES[0], "overlap")]
    cal = fit_cluster(rows, CLUSTER)
    peak = gpu_spec("h200")["nvlink_GBps_bidir"] / 2
    assert cal.fitted["nvlink_alltoall_efficiency"] * peak == pytest.approx(0.33 * peak, rel=1e-6)
    assert cal.fitted["gemm_efficiency"] == pytest.approx(0.42, rel=1e-6)
    assert cal.fitted["memory_efficiency"] == pytest.approx(0.61, rel=1e-6)
    assert set(cal.rows) == {"r0", "r1"}  # overlap rows are checked, never fitted
    assert max(abs(e) for e in cal.errors.values()) < 1e-6
    assert default_calibration().nvlink_alltoall_efficiency != pytest.approx(0.33)  # the fit moved it


def test_median_steps_alone_fit_one_compute_factor():
    rows = [_row(0, SHAPES[0], "off", profiled=False)]
    cal = fit_cluster(rows, CLUSTER)
    assert abs(cal.errors["r0"]) < 1e-3
    assert any("no profile" in h for h in cal.how)
    assert any("nvlink_alltoall_efficiency" in n for n in cal.not_fitted)


def test_no_overlap_off_row_is_refused():
    with pytest.raises(ValueError, match="no overlap-off row"):
        fit_cluster([_row(0, SHAPES[0], "overlap")], CLUSTER)


def test_the_file_round_trips_and_is_the_calibration_the_model_is_given(tmp_path):
    cal = fit_cluster([_row(0, SHAPES[0], "off"), _row(1, SHAPES[1], "off")], CLUSTER)
    cal.save(tmp_path / "c.json")
    loaded = ClusterCalibration.load(tmp_path / "c.json")
    assert loaded.fitted == cal.fitted
    given = loaded.calibration()
    assert given.nvlink_alltoall_efficiency == pytest.approx(0.33) and given.source == str(tmp_path / "c.json")
    row = _row(2, SHAPES[0], "off")
    assert predicted_step(row, CLUSTER, given) == pytest.approx(row.median_s, rel=1e-6)
    assert predicted_step(row, CLUSTER) != pytest.approx(row.median_s, rel=1e-3)  # shipped: another step
    assert default_calibration().nvlink_alltoall_efficiency != pytest.approx(0.33)  # nothing global changed


TWO_NODES = Cluster(gpu="h200", num_gpus=16, gpus_per_node=8, nvlink_domain_size=8)


def _two_node_row(i: int, shape: dict, cal) -> MeasuredRow:
    """An overlap-off row of EP 16 over two 8-GPU nodes, made by the model at ``cal`` (its scale-out link)."""
    s = dict(_fields(shape, "off"), expert_model_parallel_size=16, data_parallel_size=16, global_batch_size=128)
    p = predict(StepInputs.from_summary(s, num_gpus=16), dataclasses.replace(TWO_NODES, inter_link=cal.links[SCALE_OUT]),
                cal)
    prof = {"iterations": 2, "compute_s": 2 * p.compute_s_per_step, "a2a_s": 2 * p.a2a_s_per_step}
    return MeasuredRow(id=f"n{i}", variant="off", median_s=p.off_step_s, finalized=s, profile=prof)


def test_multi_node_rows_refit_the_scale_out_bandwidth():
    true = dataclasses.replace(TRUE, links={SCALE_OUT: scale_out_link("h200", 0.55, TRUE)})
    rows = [_two_node_row(0, SHAPES[0], true), _two_node_row(1, SHAPES[1], true)]
    cal = fit_cluster(rows, TWO_NODES)
    assert cal.fitted[SCALE_OUT_FITTED] == pytest.approx(0.55, rel=1e-6)
    assert any(SCALE_OUT_FITTED in h and "multi-node" in h for h in cal.how)
    assert max(abs(e) for e in cal.errors.values()) < 1e-6
    assert cal.calibration().links[SCALE_OUT].bandwidth_GBps == pytest.approx(400 / 8 * 0.55)


def test_one_node_rows_keep_the_default_scale_out_link_and_say_so(tmp_path):
    cal = fit_cluster([_row(0, SHAPES[0], "off"), _row(1, SHAPES[1], "off")], CLUSTER)
    assert SCALE_OUT_FITTED not in cal.fitted and SCALE_OUT not in cal.calibration().links
    assert any(n.startswith(f"{SCALE_OUT_FITTED}: no profiled") and "kept the default" in n for n in cal.not_fitted)


def _profile(r: MeasuredRow) -> dict | None:
    """The row's profile as trace.analyze writes it (off: every all-to-all second exposed)."""
    if r.profile is None:
        return None
    a2a, compute = r.profile["a2a_s"], r.profile["compute_s"]
    return {**r.profile, "comm_s": a2a, "hidden_s": 0.0, "exposed_s": a2a, "hidden_fraction": 0.0,
            "ideal_step_s": max(a2a, compute) / 2, "measured_step_s": r.median_s}


def _results(tmp_path, rows: list[MeasuredRow]):
    out = tmp_path / "results.json"
    out.write_text(json.dumps([VariantResult(variant=r.variant, link="nvlink", ok=True, median_s=r.median_s,
                                             step_times=[r.median_s] * 3, finalized=r.finalized,
                                             overlap_efficiency=_profile(r)).__dict__ for r in rows], default=str))
    return out


def test_calibrate_then_plan_uses_the_file_and_says_so(tmp_path, capsys):
    res = _results(tmp_path, [_row(0, SHAPES[0], "off"), _row(1, SHAPES[1], "off"), _row(2, SHAPES[0], "overlap")])
    out = tmp_path / "cal.json"
    assert cli(["calibrate", str(res), "-o", str(out), "--gpu", "h200", "--num-gpus", "8"]) == 0
    printed = capsys.readouterr().out
    assert "nvlink_alltoall_efficiency  : 0.33" in printed
    plain = ["plan", "--gpu", "h200", "--num-gpus", "8", "--predict", "--json"]
    assert cli(plain) == 0
    without = json.loads(capsys.readouterr().out)
    assert cli([*plain, "--calibration", str(out)]) == 0
    with_cal = json.loads(capsys.readouterr().out)
    assert with_cal["calibration"]["file"] == str(out)
    assert "calibration" not in without
    assert with_cal["prediction"]["off_step_s"] != pytest.approx(without["prediction"]["off_step_s"], rel=1e-3)
    assert cli([*plain[:-1], "--calibration", str(out)]) == 0
    assert f"calibration in use: {out}" in capsys.readouterr().out


@pytest.mark.parametrize("content", ["not json", "[]", json.dumps({"schema": "other"}),
                                     json.dumps({"schema": "mbridge-ep-overlap cluster calibration 1", "gpu": "h200",
                                                 "fitted": {"gemm_efficiency": -1}})])
def test_a_bad_calibration_file_is_one_line_exit_2(tmp_path, capsys, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert cli(["plan", "--gpu", "h200", "--num-gpus", "8", "--calibration", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--calibration" in err[0] and "Traceback" not in err[0]


def test_a_missing_calibration_file_and_calibration_without_predict_are_exit_2(tmp_path, capsys):
    assert cli(["plan", "--calibration", str(tmp_path / "none.json")]) == 2
    assert cli(["plan", "--no-predict", "--calibration", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "cannot read" in err[0] and "with --predict" in err[1]


def test_calibrate_bad_results_and_unusable_rows_are_exit_2(tmp_path, capsys):
    bad = tmp_path / "results.json"
    bad.write_text("{")
    assert cli(["calibrate", str(bad), "-o", str(tmp_path / "c.json"), "--gpu", "h200", "--num-gpus", "8"]) == 2
    only_on = _results(tmp_path, [_row(0, SHAPES[0], "overlap")])
    assert cli(["calibrate", str(only_on), "-o", str(tmp_path / "c.json"), "--gpu", "h200", "--num-gpus", "8"]) == 2
    assert cli(["calibrate", str(only_on), "-o", str(tmp_path / "c.json"), "--gpu", "nope", "--num-gpus", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "no overlap-off row" in err[1] and "--gpu" in err[2]
    assert not (tmp_path / "c.json").exists()


def test_rows_of_a_throttled_link_or_another_variant_are_not_used(tmp_path, capsys):
    from mbridge_ep_overlap.tools.calibrate import measured_rows

    res = _results(tmp_path, [_row(0, SHAPES[0], "off"), _row(1, SHAPES[1], "off")])
    data = json.loads(res.read_text())
    data[1]["link"] = "throttled"
    data.append(dict(data[0], variant="overlap+delay_wgrad"))
    res.write_text(json.dumps(data))
    assert [r.id for r in measured_rows([str(res)])] == [f"{res}#1"]
    err = capsys.readouterr().err
    assert f"not used: {res}#2 (off, link throttled" in err and f"{res}#3 (overlap+delay_wgrad" in err


def test_plan_on_two_nodes_predicts_with_the_fitted_scale_out_link(tmp_path, capsys):
    fitted = {"gemm_efficiency": 0.42, "memory_efficiency": 0.61, "nvlink_alltoall_efficiency": 0.33}
    for name, extra in (("kept", {}), ("slow", {SCALE_OUT_FITTED: 0.2})):
        ClusterCalibration(gpu="h200", fitted={**fitted, **extra}, cluster={}, rows=()).save(tmp_path / f"{name}.json")
    steps = {}
    for name in ("kept", "slow"):
        assert cli(["plan", "--recipe", "qwen3_30b_a3b", "--gpu", "h200", "--num-gpus", "16", "--json",
                    "--calibration", str(tmp_path / f"{name}.json")]) == 0
        steps[name] = json.loads(capsys.readouterr().out)["prediction"]
    assert steps["slow"]["off_step_s"] > steps["kept"]["off_step_s"]  # a NIC at 20% instead of 80% of line rate
    assert "as calibrated (10.0 GB/s per GPU)" in json.dumps(steps["slow"]) and "as calibrated" not in json.dumps(steps["kept"])
