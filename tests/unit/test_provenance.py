"""Provenance words that are true: each plan line and finalized field names exactly one
``core.provenance.Source`` - requested, the recipe's, default, set by resolve, set by an override -
and it is the one that happened (tables: config x arguments, recipe x flags)."""

from __future__ import annotations

import json

import pytest

from mbridge_ep_overlap import enable_ep_overlap
from mbridge_ep_overlap.core.provenance import Source
from mbridge_ep_overlap.tools import cli

R, Q, D, S, O = Source.RECIPE, Source.REQUESTED, Source.DEFAULT, Source.RESOLVE, Source.OVERRIDE  # noqa: E741 - a letter per source


def test_the_vocabulary_is_five_words():
    assert [s.value for s in Source] == ["requested", "the recipe's", "default", "set by resolve", "set by an override"]


def _overlap_on_in_recipe(cfg):
    """A config whose recipe enabled overlap itself, with its own priority and connections."""
    from megatron.bridge.training.comm_overlap import CommOverlapConfig

    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False, overlap_moe_expert_parallel_comm=True,
                                         delay_wgrad_compute=False)
    cfg.model.high_priority_a2a_comm_stream = False
    cfg.env_vars = {"CUDA_DEVICE_MAX_CONNECTIONS": "16"}


# config, enable_ep_overlap arguments -> dispatcher, delay wgrad, a2a priority, CUDA_DEVICE_MAX_CONNECTIONS
API_ROWS = [
    ("plain", {}, (D, D, D, D)),
    ("plain", {"dispatcher": "alltoall", "delay_wgrad": False, "high_priority_a2a": False,
               "cuda_device_max_connections": 8}, (Q, Q, Q, Q)),
    ("plain", {"high_priority_a2a": True}, (D, D, Q, D)),
    ("overlap on", {}, (R, R, R, R)),
    ("overlap on", {"high_priority_a2a": True, "delay_wgrad": False}, (R, Q, Q, R)),
    ("overlap on", {"dispatcher": "alltoall"}, (Q, R, R, R)),
]


@pytest.mark.parametrize("config,kwargs,expected", API_ROWS, ids=[f"{r[0]}-{sorted(r[1])}" for r in API_ROWS])
def test_enable_labels_each_choice_with_who_made_it(config, kwargs, expected, proxy_cfg, h100x2):
    if config == "overlap on":
        _overlap_on_in_recipe(proxy_cfg)
    plan = enable_ep_overlap(proxy_cfg, environment=h100x2, **kwargs)
    got = (plan.dispatcher_source, plan.delay_wgrad_source, plan.high_priority_a2a_source,
           plan.env_source("CUDA_DEVICE_MAX_CONNECTIONS"))
    assert got == expected
    lines = plan.change_lines()
    for prefix, source in zip(("  dispatcher  :", "  delay wgrad :", "  a2a stream  :",
                               "  env CUDA_DEVICE_MAX_CONNECTIONS="), expected):
        (line,) = [line for line in lines if line.startswith(prefix)]
        assert f"({source.value}" in line and all(f"({s.value}" not in line for s in Source if s is not source), line
    changed = [line for line in lines[1:] if "->" in line or line.startswith("  env ")]
    assert changed and all(line.split("  (", 1)[1].startswith(tuple(s.value for s in Source)) for line in changed), changed


# plan flags (qwen3_moe_proxy on 2x H200, its registry entry choosing alltoall and no delayed wgrad)
# -> dispatcher, delay wgrad, a2a priority, CUDA_DEVICE_MAX_CONNECTIONS (plan and finalized field)
CLI_ROWS = [
    ([], (R, R, D, D)),
    (["--dispatcher", "alltoall", "--delay-wgrad", "off", "--a2a-priority", "default"], (Q, Q, Q, D)),
    (["--set", "env_vars.CUDA_DEVICE_MAX_CONNECTIONS=8"], (R, R, D, O)),
    (["--set", "model.high_priority_a2a_comm_stream=false"], (R, R, O, D)),
    (["--gpu", "gb200", "--dispatcher", "deepep", "--resolve", "auto"], (S, R, D, D)),  # MB's fallback, accepted
]
FINALIZED = ("moe_token_dispatcher_type", "delay_wgrad_compute", "high_priority_a2a_comm_stream",
             "CUDA_DEVICE_MAX_CONNECTIONS")


@pytest.mark.parametrize("flags,expected", CLI_ROWS, ids=[" ".join(r[0]) or "default" for r in CLI_ROWS])
def test_plan_labels_each_choice_and_finalized_field(flags, expected, capsys):
    assert cli.main(["plan", "--no-predict", "--json", *flags]) == 0
    data = json.loads(capsys.readouterr().out)
    plan = data["plan"]
    assert (plan["dispatcher_source"], plan["delay_wgrad_source"], plan["high_priority_a2a_source"]) == \
        tuple(s.value for s in expected[:3])
    assert tuple(data["finalized_sources"][k] for k in FINALIZED) == tuple(s.value for s in expected)
    assert all(c["source"] in {s.value for s in Source} for c in plan["changes"])
    assert cli.main(["plan", "--no-predict", *flags]) == 0
    out = capsys.readouterr().out
    finalized = out.split("finalized by Megatron-Bridge", 1)[1].splitlines()
    for name, source in zip(FINALIZED, expected):
        (line,) = [line for line in finalized if line.startswith(f"{name}: ")]
        assert line.endswith(f"  ({source.value})"), line


def test_no_line_claims_a_request_nobody_made(capsys):
    """The default plan of the proxy: nothing on the command line, so no choice is 'requested' but
    overlap itself (what running the plan asks for)."""
    assert cli.main(["plan", "--no-predict", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    requested = [c["path"] for c in data["plan"]["changes"] if c["source"] == "requested"]
    assert requested == ["comm_overlap.overlap_moe_expert_parallel_comm"]
    assert [k for k, v in data["finalized_sources"].items() if v == "requested"] == ["overlap_moe_expert_parallel_comm"]
