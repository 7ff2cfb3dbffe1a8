"""Transformer Engine and DeepEP versions outside what the rules know are never passed silently.

Older than Megatron-Core 0.19.2 can run with (TE < 1.0): refused, exit 2, one line. Possible but
outside the versions the rules were checked against (TE 2.7 to 2.18, DeepEP 1.0 to 1.2, by
major.minor): the plan keeps its verdict and prints the advice ``stack-versions-known`` saying what
it assumes. Inside the range: no advice.
"""

from __future__ import annotations

import pytest

from mbridge_ep_overlap import UsageError, check_ep_overlap, describe
from mbridge_ep_overlap.spec import RunSpec, TargetSpec
from mbridge_ep_overlap.target.stack import require_possible_te, unknown_versions
from mbridge_ep_overlap.tools.cli import main

NEWER = "TE 99.0 is newer than any version these rules were checked against (2.18); results assume 2.18 behaviour"


@pytest.mark.parametrize("te,deep_ep,expected", [
    ("99.0", None, [NEWER]),
    ("2.19.0.dev0", None, ["TE 2.19.0.dev0 is newer than any version these rules were checked against (2.18); "
                           "results assume 2.18 behaviour"]),
    ("1.0", None, ["TE 1.0 is older than any version these rules were checked against (2.7 to 2.18); "
                   "what Megatron-Core needs of a TE that old is not checked here"]),
    ("2.6.9", None, ["TE 2.6.9 is older than any version these rules were checked against (2.7 to 2.18); "
                     "what Megatron-Core needs of a TE that old is not checked here"]),
    ("2.18.0+15288857", None, []), ("2.18.3", None, []), ("2.7.0", None, []), ("2.12", None, []),
    ("", None, []), (None, None, []),
    (None, "1.2.1", []), (None, "1.0.0", []),
    (None, "2.0", ["DeepEP 2.0 is newer than any version these rules were checked against (1.2); "
                   "results assume 1.2 behaviour"]),
    ("99.0", "0.9", [NEWER, "DeepEP 0.9 is older than any version these rules were checked against (1.0 to 1.2); "
                     "what Megatron-Core needs of a DeepEP that old is not checked here"]),
])
def test_versions_outside_the_rules_are_named(te, deep_ep, expected):
    assert unknown_versions(te, deep_ep) == expected


@pytest.mark.parametrize("te,impossible", [("0.9", True), ("0.8.0", True), ("0.99.1", True), ("1.0", False),
                                           ("1.0.0rc1", False), ("99.0", False), ("", False), (None, False)])
def test_te_older_than_megatron_core_can_run_is_refused(te, impossible):
    if impossible:
        with pytest.raises(UsageError, match="impossible te version"):
            require_possible_te(te)
        with pytest.raises(UsageError, match="1.0 or newer"):
            describe("h100", 16, te_version=te)
        with pytest.raises(UsageError, match="impossible te version"):
            RunSpec(recipe="qwen3_30b_a3b", target=TargetSpec(te=te)).validated()
    else:
        require_possible_te(te)
        describe("h100", 16, te_version=te)


@pytest.mark.parametrize("flags,code,advice", [
    (["--te", "99.0"], 0, NEWER),
    (["--te", "1.0"], 0, "TE 1.0 is older than any version these rules were checked against (2.7 to 2.18)"),
    (["--deep-ep", "7.1"], 0, "DeepEP 7.1 is newer than any version these rules were checked against (1.2)"),
    (["--te", "2.18.0"], 0, None),
    ([], 0, None),
])
def test_plan_says_when_a_version_is_outside_the_rules(flags, code, advice, capsys):
    assert main(["plan", "--recipe", "qwen3_30b_a3b", "--no-predict", *flags]) == code
    out = capsys.readouterr().out
    if advice is None:
        assert "stack-versions-known" not in out
    else:
        assert "stack-versions-known" in out and advice in out


def test_plan_refuses_an_impossible_te_in_one_line(capsys):
    assert main(["plan", "--recipe", "qwen3_30b_a3b", "--te", "0.9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "impossible te version (--te) '0.9'" in err[0] and "1.0 or newer" in err[0]


def test_api_check_advises_on_a_newer_te(proxy_cfg):
    found = {v.rule_id: v for v in check_ep_overlap(proxy_cfg, environment=describe("h100", 2, te_version="99.0"))}
    assert "stack-versions-known" in found and NEWER in str(found["stack-versions-known"].current)
