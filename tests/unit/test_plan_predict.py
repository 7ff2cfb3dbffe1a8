"""The step-time prediction where the tools use it: ``plan --predict``, the predicted-gain advice
rules (``Facts.prediction``) and ``dispatcher="auto"``. CPU only, real Megatron-Bridge config
building, described targets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from mbridge_ep_overlap.core import engine
from mbridge_ep_overlap.core.dispatcher import decide
from mbridge_ep_overlap.base.errors import Severity
from mbridge_ep_overlap.core.facts import Facts
from mbridge_ep_overlap.core import prediction as pconfig
from mbridge_ep_overlap.target.cluster import ClusterEnvironment, describe
from mbridge_ep_overlap.tools.cli import main


def _plan(capsys, *argv: str):
    code = main(["plan", *argv])
    return code, capsys.readouterr().out


# --- plan -------------------------------------------------------------------------------------
def test_plan_predict_prints_off_on_speedup_for_the_issue_command(capsys):
    code, out = _plan(capsys, "--recipe", "qwen3_30b_a3b", "--predict")
    assert code == 0
    block = out[out.index("predicted step time"):].split("\n\n")[0]
    for label in ("step, overlap off", "step, overlap on", "speedup", "all-to-all hidden", "defaults used"):
        assert label in block, label
    assert "16x h100" in block and "alltoall" in block
    # docs/prediction.md "In plan" shows this output, not a hand-typed copy
    assert block in (Path(__file__).resolve().parents[2] / "docs" / "prediction.md").read_text()


def test_plan_json_prediction_default_on_across_nodes_off_inside_one(capsys):
    code, out = _plan(capsys, "--recipe", "qwen3_30b_a3b", "--json")  # 16 H100 = 2 nodes: on by default
    p = json.loads(out)["prediction"]
    assert code == 0 and p["gpu"] == "h100" and p["num_gpus"] == 16 and p["dispatcher"] == "alltoall"
    assert p["speedup"] == pytest.approx(p["off_step_s"] / p["on_step_s"])
    assert 0 <= p["hidden_fraction"] <= 1 and isinstance(p["defaults_used"], list)
    assert {d["dispatcher"] for d in p["dispatchers"]} == {"alltoall", "deepep", "hybridep", "ncclep"}
    code, out = _plan(capsys, "--json")  # the proxy on 2 H200: one node, off by default
    assert code == 0 and json.loads(out)["prediction"] is None
    code, out = _plan(capsys, "--recipe", "qwen3_30b_a3b", "--no-predict")
    assert code == 0 and "predicted step time" not in out


def test_plan_says_why_no_prediction(capsys):
    code, out = _plan(capsys, "--gpu", "a100", "--num-gpus", "2", "--json", "--predict")
    assert code == 0 and "no hardware model for a100" in json.loads(out)["prediction"]["error"]


def _strict_json(text: str):
    """json.loads that refuses Infinity / NaN (not JSON, RFC 8259)."""
    def refuse(token: str):
        raise AssertionError(f"{token} on stdout: not JSON")

    return json.loads(text, parse_constant=refuse)


# the new-user probe's commands: each refused (exit 1) with the value rule named, in strict JSON, no prediction
PROBES = [
    (["--global-batch-size", str(2 * 10**400)], "sizes-fit-int64"),
    (["--seq-length", str(10**400)], "sizes-fit-int64"),
    (["--seq-length", str(10**200)], "sizes-fit-int64"),
    (["--set", "model.moe_ffn_hidden_size=-1"], "moe-ffn-hidden-size"),
    (["--set", "model.num_query_groups=0"], "num-query-groups"),
    (["--set", "model.kv_channels=0"], "kv-channels"),
    (["--set", "model.vocab_size=-5"], "vocab-size"),
    (["--set", "model.moe_expert_capacity_factor=0"], "moe-capacity-factor"),
    (["--set", "model.moe_expert_capacity_factor=inf"], "moe-capacity-factor"),  # inf reaches the JSON as "inf"
]


@pytest.mark.parametrize("argv,rule", PROBES, ids=[f"{a[-1][:30]}" for a, _ in PROBES])
def test_plan_refuses_values_no_run_can_have(capsys, argv, rule):
    code, out = _plan(capsys, "--json", "--predict", *argv)
    data = _strict_json(out)
    assert code == 1 and data["accepted"] is False and "prediction" not in data
    assert rule in {v["rule_id"] for v in data["violations"]}
    code, out = _plan(capsys, "--predict", *argv)  # the text form: one refusal, no traceback
    assert code == 1 and out.startswith("qwen3_moe_proxy on described: 2x h200: REFUSED") and f"[error] {rule}:" in out
    if argv[-1].endswith("=inf"):
        assert next(v for v in data["violations"] if v["rule_id"] == rule)["current"] == "inf"


def test_plan_accepted_with_a_prediction_not_made(capsys):
    """A valid config the model does not cover: accepted, the prediction 'not made' with the reason."""
    # a thin proxy (it must fit in memory: fits-in-gpu-memory refuses 2000 full-size proxy layers on 2 H200)
    thin = ["--set", "model.num_layers=2000", "--set", "model.hidden_size=256", "--set", "model.moe_ffn_hidden_size=128",
            "--set", "model.ffn_hidden_size=256", "--set", "model.seq_length=512", "--set", "dataset.seq_length=512"]
    code, out = _plan(capsys, "--json", "--predict", *thin)
    data = _strict_json(out)
    assert code == 0 and data["accepted"] is True
    assert data["prediction"] == {"error": "the config is outside the model (a model chunk of 2000 layers: "
                                           "the replay simulates at most 1024)"}
    code, out = _plan(capsys, "--predict", *thin)
    assert code == 0 and "predicted step time: not made (the config is outside the model (a model chunk" in out


def test_plan_json_writer_never_writes_infinity_or_nan(capsys):
    """Whatever non-finite number reaches the writer becomes a string; ints too long to print, their size."""
    import argparse

    from mbridge_ep_overlap.tools import plan
    from mbridge_ep_overlap.tools.plan_report import Outcome

    data = {"a": float("inf"), "b": [float("-inf"), {"c": float("nan")}], "d": (1.5, 10**5000), "e": 2**64}
    with mock.patch.object(plan, "judge", return_value=Outcome(0, [], data)), \
            mock.patch.object(plan, "spec_from_args"):
        assert plan.main(argparse.Namespace(json=True, predict=None, rules=False)) == 0
    assert _strict_json(capsys.readouterr().out) == {"a": "inf", "b": ["-inf", {"c": "nan"}],
                                                     "d": [1.5, "a 16610-bit integer"], "e": 2**64}


def test_building_the_cli_loads_no_prediction_code():
    code = ("import sys; from mbridge_ep_overlap.tools.cli import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m.startswith('mbridge_ep_overlap.predict')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- advice rules -----------------------------------------------------------------------------
def _overlap_on(cfg, ep: int, backend: str | None = None):
    from megatron.bridge.training.comm_overlap import CommOverlapConfig

    cfg.model.expert_model_parallel_size = ep
    cfg.train.global_batch_size = 64
    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False, overlap_moe_expert_parallel_comm=True)
    if backend:
        cfg.model.moe_token_dispatcher_type, cfg.model.moe_flex_dispatcher_backend = "flex", backend
    return cfg


def _advice(report):
    return {v.rule_id: v for v in report.violations if v.severity is Severity.ADVICE}


def test_one_evaluation_predicts_once(proxy_cfg):
    cfg = _overlap_on(proxy_cfg, 16)
    with mock.patch.object(pconfig, "for_config", wraps=pconfig.for_config) as spy:
        report = engine.evaluate(cfg, describe("h100", 16, te_version="", deep_ep_version=None))
    assert spy.call_count == 1
    assert {"predicted-gain-alltoall"} <= set(report.passed) and not _advice(report)


@pytest.mark.parametrize("ep,backend,rule",
                         [(4, None, "predicted-gain-alltoall"), (8, "deepep", "predicted-gain-deepep")])
def test_advice_quotes_the_predicted_numbers(proxy_cfg, ep, backend, rule):
    cfg = _overlap_on(proxy_cfg, ep, backend)
    env = describe("h100", ep, te_version="", deep_ep_version=None)
    v = _advice(engine.evaluate(cfg, env))[rule]
    p = Facts(cfg, env).prediction.prediction
    assert f"predicted {p.speedup:.2f}x" in v.current and "at best" in v.current
    assert v.severity is Severity.ADVICE and "1.03x" in v.required


@pytest.mark.parametrize("env", [
    describe("a100", 16, te_version="", deep_ep_version=None),  # a GPU kind without a hardware model
    ClusterEnvironment(),  # nothing known (a CPU login node, no target described)
])
def test_advice_is_not_checked_without_a_prediction(proxy_cfg, env):
    report = engine.evaluate(_overlap_on(proxy_cfg, 4), env)
    assert "predicted-gain-alltoall" in report.not_checked
    assert "predicted-gain-alltoall" not in report.unreadable


def test_advice_never_crashes_on_a_config_outside_the_model(proxy_cfg):
    cfg = _overlap_on(proxy_cfg, 16)
    cfg.model.transformer_impl = "inference_optimized"  # no cost model for it
    report = engine.evaluate(cfg, describe("h100", 16, te_version="", deep_ep_version=None))
    assert "predicted-gain-alltoall" in report.not_checked and "predicted-gain-alltoall" not in report.unreadable


# --- dispatcher="auto" --------------------------------------------------------------------------
def test_auto_ranks_installed_backends_by_the_prediction(proxy_cfg):
    proxy_cfg.model.expert_model_parallel_size = 16
    env = describe("h100", 16, deep_ep_version="1.2.1")
    d = decide("auto", proxy_cfg.model, env, "error", keep_current=False)
    assert d.reason.startswith("auto: predicted step on 16x") and all(b in d.reason for b in ("alltoall", "deepep"))
    # the proxy's flex backends are within the model's 10%: alltoall stays
    assert d.dispatcher == "alltoall"
    # DeepEP not known to be installed: nothing to rank, the rules as before
    assert not decide("auto", proxy_cfg.model, describe("h100", 16), "error", keep_current=False).reason.startswith(
        "auto: predicted")


def test_auto_picks_a_clearly_faster_backend_end_to_end():
    from mbridge_ep_overlap.pipeline import build
    from mbridge_ep_overlap.spec import RunSpec, TargetSpec

    built = build(RunSpec(recipe="qwen3_30b_a3b", dispatcher="auto", target=TargetSpec(deep_ep="1.2.1")))
    assert built.plan.dispatcher == "deepep" and "auto: predicted step" in built.plan.dispatcher_reason
    cp = Facts(built.cfg, built.target).prediction
    assert cp.prediction.dispatcher == "deepep"
    assert not {"predicted-gain-alltoall", "predicted-gain-deepep"} & {v.rule_id for v in built.report.violations}


def test_auto_keeps_its_rules_when_the_gpu_is_not_modelled(proxy_cfg):
    proxy_cfg.model.expert_model_parallel_size = 16
    env = describe("vr200", 16, deep_ep_version="1.2.1")  # in the catalogue, not in hardware.json
    d = decide("auto", proxy_cfg.model, env, "error", keep_current=False)
    assert not d.reason.startswith("auto: predicted")
