"""scripts/run_script.py flags, as a table; dry runs go through MB's real finalize."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mbridge_ep_overlap.tools.run import main

REPO = Path(__file__).resolve().parents[2]


def dry(capsys, tmp_path, *argv):
    code = main([*argv, "--dryrun", "--output-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    fields = {k: v.split("  (", 1)[0] for k, v in  # the value, without its source word
            (line.split(": ", 1) for line in out.splitlines() if ": " in line and not line.startswith((" ", "#")))}
    return code, fields, out, err


# flags -> expected finalized fields (a subset)
TABLE = [
    (["--recipe", "qwen3_moe_proxy"], {"overlap_moe_expert_parallel_comm": "True", "moe_token_dispatcher_type": "alltoall"}),
    (["--recipe", "qwen3_moe_proxy", "--ep-overlap", "off"],
     {"overlap_moe_expert_parallel_comm": "False", "delay_wgrad_compute": "False"}),
    (["--recipe", "qwen3_moe_proxy", "--dispatcher", "hybridep"],
     {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"}),
    (["--recipe", "qwen3_moe_proxy", "--ep", "4", "--num-gpus", "4", "--global-batch-size", "32"],
     {"expert_model_parallel_size": "4", "data_parallel_size": "4", "num_microbatches": "4"}),
    (["--recipe", "qwen3_moe_proxy", "--ep", "8", "--num-gpus", "8", "--global-batch-size", "64"],
     {"expert_model_parallel_size": "8", "data_parallel_size": "8"}),
    (["--recipe", "qwen3_moe_proxy", "--pp", "2", "--vpp", "2", "--num-gpus", "4", "--global-batch-size", "16"],
     {"pipeline_model_parallel_size": "2", "virtual_pipeline_model_parallel_size": "2", "overlap_moe_expert_parallel_comm": "True"}),
    (["--recipe", "qwen3_moe_proxy", "--max-steps", "3", "--micro-batch-size", "1", "--seq-length", "512"],
     {"micro_batch_size": "1", "num_microbatches": "8"}),
    (["--recipe", "qwen3_moe_proxy", "train.global_batch_size=32"], {"global_batch_size": "32"}),
    (["--recipe", "qwen3_30b_a3b", "--ep-overlap", "on", "--dispatcher", "alltoall"],
     {"overlap_moe_expert_parallel_comm": "True", "expert_model_parallel_size": "16"}),
    (["--recipe", "qwen3_moe_proxy", "--a2a-priority", "high"],
     {"overlap_moe_expert_parallel_comm": "True", "high_priority_a2a_comm_stream": "True"}),
    (["--recipe", "qwen3_moe_proxy"], {"high_priority_a2a_comm_stream": "True"}),  # the default
    (["--recipe", "qwen3_moe_proxy", "--a2a-priority", "default"], {"high_priority_a2a_comm_stream": "False"}),
    (["--recipe", "qwen3_30b_a3b", "--ep-overlap", "off"], {"overlap_moe_expert_parallel_comm": "False"}),
    (["--recipe", "deepseek_v3", "--ep-overlap", "off"], {"overlap_moe_expert_parallel_comm": "False"}),
]


@pytest.mark.parametrize("argv,expected", TABLE, ids=[" ".join(a) for a, _ in TABLE])
def test_flag_table(argv, expected, capsys, tmp_path):
    code, fields, out, err = dry(capsys, tmp_path, *argv)
    assert code == 0, err[-3000:]
    for k, v in expected.items():
        assert fields.get(k) == v, (k, fields.get(k), v)
    recipe = argv[argv.index("--recipe") + 1]
    assert f"config: {tmp_path / (recipe + '.yaml')}" in out and (tmp_path / f"{recipe}.yaml").exists()


def test_ep_overlap_off_really_turns_a_recipes_overlap_off(capsys, tmp_path):
    from mbridge_ep_overlap import RunSpec, build

    assert build(RunSpec(recipe="qwen3_235b_a22b")).cfg.comm_overlap.overlap_moe_expert_parallel_comm is True
    code, fields, _, _ = dry(capsys, tmp_path, "--recipe", "qwen3_235b_a22b", "--ep-overlap", "off")
    assert code == 0 and fields["overlap_moe_expert_parallel_comm"] == "False"
    assert "comm_overlap:" in (tmp_path / "qwen3_235b_a22b.yaml").read_text()


def test_delay_wgrad_on_is_separate_and_needs_te_here(capsys, tmp_path):
    code, _, out, err = dry(capsys, tmp_path, "--recipe", "qwen3_moe_proxy", "--delay-wgrad", "on")
    assert code == 1 and "delay-wgrad-needs-te" in out  # the report, a refusal too, is on stdout


def test_refused_override_exits_1_with_every_violation(capsys, tmp_path):
    code, _, out, _ = dry(capsys, tmp_path, "--recipe", "qwen3_moe_proxy", "model.mtp_num_layers=2",
                          "model.moe_token_dispatcher_type=allgather")
    assert code == 1 and "mtp-layers" in out and "dispatcher-type" in out


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--recipe", "nope"], "unknown recipe 'nope'"),
        (["--recipe", "qwen3_moe_proxy", "--bogus"], "unrecognized argument '--bogus'"),
        (["--recipe", "qwen3_moe_proxy", "--dispatcher", "nccl"], "invalid choice: 'nccl'"),
        (["--recipe", "qwen3_moe_proxy", "--ep", "0"], "argument --ep: must be an integer >= 1, got '0'"),
        (["--recipe", "qwen3_moe_proxy", "garbage"], "malformed override 'garbage'"),
        (["--recipe", "qwen3_moe_proxy", "model.no_such_field=[1"], "override"),
        (["--recipe", "qwen3_moe_proxy", "--ep-overlap", "off", "--a2a-priority", "high"],
         "(--a2a-priority) True; allowed: False or None while EP overlap is off"),
        (["--recipe", "qwen3_moe_proxy", "--ep-overlap", "off", "--delay-wgrad", "on"], "(--delay-wgrad) True"),
    ],
)
def test_usage_errors_are_one_line_exit_2(argv, needle, capsys, tmp_path):
    with pytest.raises(SystemExit) as excinfo:
        code = main([*argv, "--dryrun", "--output-dir", str(tmp_path)])
        raise SystemExit(code)
    err = capsys.readouterr().err.strip()
    assert excinfo.value.code == 2
    assert needle in err and "Traceback" not in err
    assert len(err.splitlines()) == 1, err


def test_script_entry_point_dry_run(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "run_script.py"), "--recipe", "qwen3_30b_a3b", "--ep-overlap", "on",
         "--dispatcher", "alltoall", "--dryrun", "--output-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "overlap_moe_expert_parallel_comm: True" in result.stdout


def test_training_without_a_gpu_is_one_line_exit_2_after_the_plan(capsys, tmp_path, monkeypatch):
    """Training here (no CUDA GPU) would die in Megatron's initialize with a bare assertion; the
    config is still built and judged first (a refusal stays exit 1 on any machine)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = main(["--recipe", "qwen3_moe_proxy", "--output-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2 and "cannot train on this machine" in err and "--dryrun" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "overlap" in out  # the plan was printed before the answer
    code = main(["--recipe", "qwen3_moe_proxy", "--output-dir", str(tmp_path), "model.mtp_num_layers=2"])
    assert code == 1 and "mtp-layers" in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["--dryrun", "--summary-json", "s.json"], "--summary-json applies to training"),
    (["--dryrun", "--profile-steps", "2:4"], "--profile-steps applies to training"),
    (["--dryrun", "--evidence", "off"], "--evidence applies to training"),
    (["--dryrun", "--watchdog-s", "30"], "--watchdog-s applies to training"),
    (["--watchdog-s", "-3"], "--watchdog-s must be a number of seconds >= 0 (0: watchdog off), got '-3'"),
    (["--watchdog-s", "soon"], "--watchdog-s must be a number of seconds >= 0"),
    (["--evidence", "maybe"], "invalid choice: 'maybe'"),
])
def test_training_only_flags_with_dryrun_are_usage(argv, needle, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--recipe", "qwen3_moe_proxy", "--output-dir", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_unwritable_summary_json_is_usage_before_anything_is_built(capsys, tmp_path, monkeypatch):
    from mbridge_ep_overlap import pipeline

    monkeypatch.setattr(pipeline, "build", lambda *a, **k: pytest.fail("built before the path was checked"))
    (tmp_path / "file").write_text("")
    for bad in (tmp_path / "file" / "s.json", tmp_path):
        code = main(["--recipe", "qwen3_moe_proxy", "--output-dir", str(tmp_path / "o"), "--summary-json", str(bad)])
        err = capsys.readouterr().err
        assert code == 2 and "cannot use" in err and "Traceback" not in err, err
