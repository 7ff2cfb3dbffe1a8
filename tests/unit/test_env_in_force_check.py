"""The GPU-node check of the CUDA_DEVICE_MAX_CONNECTIONS in force (scripts/gpu/env_in_force.py): its
argument handling and its reading of what the ranks record, on synthetic records (no GPU)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check = _load("env_in_force", "scripts/gpu/env_in_force.py")
rank_entry = _load("env_in_force_rank", "scripts/gpu/env_in_force_rank.py")
CASES = {c.name: c for c in check.CASES}


def record(rank=0, launcher=None, cfg="32", after="32", cuda_at_apply=False, init=("32", True), exit="trained"):
    return {"rank": rank, "variable": check.VARIABLE, "launcher": launcher, "cfg_env_vars": cfg,
            "at_apply": None if after is None else {"before": launcher, "after": after, "cuda_initialized": cuda_at_apply},
            "at_cuda_init": None if init is None else {"value": init[0], "after_apply": init[1]}, "exit": exit}


@pytest.mark.parametrize("case, records, rc, log, wrong", [
    ("recipe", {0: record(), 1: record(rank=1)}, 0, "", None),
    ("recipe", {0: record(after="8", init=("8", True))}, 0, "", "after MB applied cfg.env_vars, expected '32'"),
    ("recipe", {0: record(cuda_at_apply=True)}, 0, "", "already initialised"),
    ("recipe", {0: record(init=("32", False))}, 0, "", "initialised before MB applied"),
    ("recipe", {0: record(cfg="1", after="1", init=("1", True))}, 0, "", "enable_ep_overlap sets '32'"),
    ("launcher", {0: record(launcher="8", after="8", init=("8", True))}, 0, "", None),
    ("launcher", {0: record(launcher="8", after="32", init=("32", True))}, 0, "", "expected '8'"),
    ("launcher", {0: record(launcher="8", after=None, init=None, exit="error: X")}, 1, "", "never applied"),
    ("launcher-1", {0: record(launcher="1", after="1", init=("1", True))}, 0, "WARN cuda-device-max-connections", None),
    ("launcher-1", {0: record(launcher="1", after="1", init=("1", True))}, 0, "", "did not warn"),
    ("launcher-1", {0: record(launcher="1", after="32", init=("32", True))}, 0, "cuda-device-max-connections",
     "expected '1'"),
    ("recipe", {}, 1, "", "no rank wrote"),
])
def test_judge_reads_what_the_ranks_recorded(case, records, rc, log, wrong):
    why = check.judge(CASES[case], rc, False, records, log)
    if wrong is None:
        assert why == []
    else:
        assert any(wrong in w for w in why), why


def test_a_timed_out_run_does_not_hold():
    assert check.judge(CASES["recipe"], None, True, {0: record()}, "") == ["timed out (return code None)"]


def test_records_are_read_back_by_rank_and_a_torn_file_is_skipped(tmp_path):
    (tmp_path / "env_in_force-rank0.json").write_text(json.dumps(record()))
    (tmp_path / "env_in_force-rank1.json").write_text("{")
    assert list(check.read_records(tmp_path)) == [0]


@pytest.mark.parametrize("argv", [[], ["out", "--timeout", "0"], ["out", "--steps", "0"], ["out", "--bogus"]])
def test_bad_usage_is_exit_2(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert check.main(argv) == 2


def test_the_rank_entry_needs_an_output_folder():
    assert rank_entry._output_dir(["--x", "1", "--output-dir", "/o"]) == Path("/o")
    assert rank_entry._output_dir(["--output-dir=/p"]) == Path("/p")
    with pytest.raises(SystemExit):
        rank_entry._output_dir(["--recipe", "r"])


def test_the_check_launches_run_script_flags_the_parser_accepts():
    from mbridge_ep_overlap.lab.launch import proxy_args
    from mbridge_ep_overlap.tools.run import parse_args

    args = parse_args(proxy_args(2, steps=2, micro_batch=1, microbatches=2)
                      + ["--ep-overlap", "on", "--dispatcher", "alltoall", "--output-dir", "o", "--summary-json", "o/s"])
    assert args.ep_overlap == "on" and args.dispatcher == "alltoall"
