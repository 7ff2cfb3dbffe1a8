"""The test-only fault injector (tests/functional/fault_injector.py) and the recording driver
(tests/functional/record_failures.py, scripts/gpu/record_failures.sh): what can be checked on CPU."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _load(name: str):
    sys.path.insert(0, str(REPO / "tests" / "functional"))  # record_failures imports fault_injector
    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / "functional" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


fi = _load("fault_injector")
rf = _load("record_failures")


def test_parse_fault():
    f = fi.parse_fault("hang:rank=1,layer=2,step=3,microbatch=1")
    assert (f.kind, f.rank, f.layer, f.step, f.microbatch, f.where) == ("hang", 1, 2, 3, 1, "combine")
    assert fi.parse_fault("stall:seconds=12.5").seconds == 12.5 and fi.parse_fault("stall").where == "dispatch"
    assert fi.parse_fault("none").kind == "none"
    for bad, needle in (("melt", "unknown fault"), ("hang:rank", "bad item"), ("hang:layer=0", "1-based"),
                        ("hang:rank=-1", "number >= 0"), ("hang:step=1.5", "number >= 0")):
        with pytest.raises(ValueError, match=needle):
            fi.parse_fault(bad)


def test_injector_fires_once_at_its_layer_step_and_microbatch(tmp_path):
    fault = fi.parse_fault("crash:rank=1,layer=2,step=2,microbatch=3")
    inj = fi.Injector(fault, 1, tmp_path / "injected-fault.json", lambda: 4)
    fired = []
    for step in (1, 2, 3):
        for mb in range(4):
            for layer in (1, 2, 3):
                for op in ("dispatch", "combine"):
                    if inj.due(layer, op) is not None:
                        fired.append((step, mb, layer, op))
    assert fired == [(2, 3, 2, "dispatch")]
    other = fi.Injector(fault, 0, None, lambda: 4)  # another rank: never
    assert all(other.due(2, "dispatch") is None for _ in range(12))


def _layer(number: int, splits):
    from megatron.core.transformer.moe.moe_layer import MoELayer

    layer = MoELayer.__new__(MoELayer)  # the real methods, without building a model
    layer.layer_number = number
    layer.config = types.SimpleNamespace(overlap_dispatch_backward_with_experts_wgrad=False)
    layer.token_dispatcher = types.SimpleNamespace(token_dispatch=lambda h, p: (h, p), token_combine=lambda o: o + 1,
                                                   input_splits=splits)
    return layer


@pytest.fixture
def restore_moe_layer():
    from megatron.core.transformer.moe.moe_layer import MoELayer

    saved = MoELayer.dispatch, MoELayer.combine
    yield
    MoELayer.dispatch, MoELayer.combine = saved


def test_hang_skips_the_combine_with_the_combined_shape(tmp_path, restore_moe_layer):
    inj = fi.install(fi.parse_fault("hang:rank=0,layer=1,step=1,microbatch=1"), 0, tmp_path / "f.json")
    inj.microbatches = lambda: 2
    layer = _layer(1, [3, 4])
    x = torch.ones(5, 8)
    assert torch.equal(layer.combine(x), x + 1)  # microbatch 0: the real combine
    skipped = layer.combine(x)
    assert skipped.shape == (7, 8) and not skipped.any()  # rows = sum(input_splits), no communication
    record = json.loads((tmp_path / "f.json").read_text())
    assert record["kind"] == "hang" and record["where"] == "combine" and record["fired_step"] == 1 \
        and record["fired_microbatch"] == 1 and record["layer"] == 1 and record["fired_rank"] == 0


def test_nan_poisons_the_combined_output(tmp_path, restore_moe_layer):
    inj = fi.install(fi.parse_fault("nan:rank=0,layer=2,step=1,microbatch=0"), 0, None)
    inj.microbatches = lambda: 4
    assert torch.isnan(_layer(2, None).combine(torch.ones(2, 2))).all()
    assert not torch.isnan(_layer(2, None).combine(torch.ones(2, 2))).any()  # once


def test_a_bad_fault_is_exit_2_before_anything_runs():
    result = subprocess.run([sys.executable, str(REPO / "tests/functional/fault_injector.py"), "--dryrun"],
                            capture_output=True, text=True, timeout=60, env={"EP_OVERLAP_FAULT": "melt", "PATH": ""})
    assert result.returncode == 2 and "unknown fault 'melt'" in result.stderr and "Traceback" not in result.stderr


def test_with_override_replaces_flags_and_appends_overrides():
    base = ["--recipe", "r", "--global-batch-size", "16", "--max-steps", "6"]
    assert rf.with_override(base, ["--global-batch-size", "4", "--watchdog-s", "20", "dist.x=1"]) == \
        ["--recipe", "r", "--global-batch-size", "4", "--max-steps", "6", "--watchdog-s", "20", "dist.x=1"]


def test_every_case_is_a_valid_fault_and_no_gain_has_one_microbatch_per_rank():
    for fault, _, timeout in rf.CASES.values():
        fi.parse_fault(fault)
        assert timeout <= 200
    args = rf.with_override(rf.proxy(rf.STEPS), rf.CASES["no_gain"][1])
    gbs = int(args[args.index("--global-batch-size") + 1])
    mbs = int(args[args.index("--micro-batch-size") + 1])
    assert gbs == mbs * rf.NPROC  # data parallel = EP = 2 ranks, one microbatch each


def test_overhead_pairs_alternate_and_their_median_is_the_cost():
    order = rf.overhead_runs(3)
    assert [n for n, _ in order] == ["evidence_on_1", "evidence_off_1", "evidence_off_2", "evidence_on_2",
                                     "evidence_on_3", "evidence_off_3"]
    assert all(v == ("1" if n.startswith("evidence_on") else "0") for n, v in order)

    def summary(times):
        return {"steps": [{"step_time_s": t} for t in times]}

    out = rf.overhead({"evidence_on_1": summary([9, 9, 1.01, 1.01, 1.01, 1.01]),
                       "evidence_off_1": summary([9, 9, 1.0, 1.0, 1.0, 1.0]),
                       "evidence_off_2": summary([9, 9, 2.0, 2.0, 2.0, 2.0]),
                       "evidence_on_2": summary([9, 9, 2.1, 2.1, 2.1, 2.1]),
                       "evidence_on_3": summary([9, 9, 1.0, 1.0, 1.0, 1.0]),
                       "evidence_off_3": summary([9, 9, 1.0, 1.0, 1.0, 1.0])})
    assert out["runs"]["evidence_on_1"]["median_s"] == 1.01
    assert out["pairs_percent"] == {"1": 1.0, "2": 5.0, "3": 0.0}
    assert math.isclose(out["overhead_percent"], 1.0) and out["range_percent"] == [0.0, 5.0]
    assert rf.overhead({"evidence_on_1": None, "evidence_off_1": summary([1.0])})["overhead_percent"] is None


def test_prune_keeps_head_and_tail(tmp_path):
    log = tmp_path / "a" / "stderr.log"
    log.parent.mkdir()
    log.write_bytes(b"H" * 1000 + b"M" * 5000 + b"T" * 1000)
    (tmp_path / "a" / "model.pt").write_bytes(b"x")
    rf.prune(tmp_path, keep=2000)
    data = log.read_bytes()
    assert data.startswith(b"H" * 1000) and data.endswith(b"T" * 1000) and b"bytes pruned" in data
    assert not (tmp_path / "a" / "model.pt").exists()


def test_expected_evidence_names_what_is_missing(tmp_path):
    from mbridge_ep_overlap.base import run_files

    missing = rf.expected_evidence("hang", tmp_path)
    assert "a watchdog stall event" in missing and "injected-fault.json (the fault never fired)" in missing
    for r in range(rf.NPROC):
        run_files.facts_file(tmp_path, r).parent.mkdir(parents=True, exist_ok=True)
        run_files.facts_file(tmp_path, r).write_text("{}")
    run_files.watchdog_file(tmp_path, 1).write_text("{}\n")
    (tmp_path / "injected-fault.json").write_text("{}")
    assert rf.expected_evidence("hang", tmp_path) == []


def test_driver_and_script_usage_is_exit_2(tmp_path):
    with pytest.raises(SystemExit) as e:
        rf.main([str(tmp_path), "--only", "melt"])
    assert e.value.code == 2
    result = subprocess.run(["bash", str(REPO / "scripts/gpu/record_failures.sh")], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2 and "usage: bash scripts/gpu/record_failures.sh OUT_DIR" in result.stderr
