"""The job's exported environment wins over ``cfg.env_vars`` (MB's ``setdefault``): the plan judges it.

``plan --env KEY=VALUE`` (and ``launch_slurm.py``, which exports the same values last in the job
script) describe what the launcher exports; the plan shows the value in force and the rules judge it:
CUDA_DEVICE_MAX_CONNECTIONS=1 with overlap on is refused with the launcher fix.
"""

from __future__ import annotations

import pytest

from mbridge_ep_overlap import UsageError
from mbridge_ep_overlap.spec import RunSpec, TargetSpec
from mbridge_ep_overlap.tools.cli import main

FIX = "unset CUDA_DEVICE_MAX_CONNECTIONS in the launcher, or export CUDA_DEVICE_MAX_CONNECTIONS=32"


@pytest.mark.parametrize("flags,code,expected", [
    ([], 0, "env CUDA_DEVICE_MAX_CONNECTIONS=32  (default: set in cfg.env_vars)"),
    (["--env", "CUDA_DEVICE_MAX_CONNECTIONS=32"], 0, "env CUDA_DEVICE_MAX_CONNECTIONS=32  (default: set in cfg.env_vars)"),
    (["--env", "CUDA_DEVICE_MAX_CONNECTIONS=1"], 1, FIX),
    (["--env", "CUDA_DEVICE_MAX_CONNECTIONS=32", "--env", "CUDA_DEVICE_MAX_CONNECTIONS=1"], 1, FIX),  # last wins
    (["--env", "CUDA_DEVICE_MAX_CONNECTIONS=1", "--ep-overlap", "off"], 0, "EP overlap off (as asked)"),
    (["--env", "CUDA_DEVICE_MAX_CONNECTIONS=16"], 0, "env CUDA_DEVICE_MAX_CONNECTIONS=16  (set by an override: what the run gets"),
    (["--env", "CUDA_DEVICE_MAX_CONNECTIONS=99"], 1, "cuda-device-max-connections-value"),
    (["--env", "CUDA_DEVICE_MAX_CONNECTIONS=abc"], 1, "cuda-device-max-connections-value"),
    (["--env", "NCCL_DEBUG=INFO"], 0, "env CUDA_DEVICE_MAX_CONNECTIONS=32  (default: set in cfg.env_vars)"),
])
def test_plan_judges_the_exported_value(flags, code, expected, capsys):
    assert main(["plan", "--recipe", "qwen3_30b_a3b", "--no-predict", *flags]) == code
    out = capsys.readouterr().out
    assert expected in out
    if code == 1:
        assert "REFUSED" in out.splitlines()[0]


@pytest.mark.parametrize("env,words", [
    (("1X=2",), "malformed exported environment"),
    (("NOEQUALS",), "malformed exported environment"),
    (("A=1\nB=2",), "a value on one line"),
    ("A=1", "a tuple of 'KEY=VALUE' strings"),
])
def test_malformed_exports_are_one_usage_error(env, words):
    with pytest.raises(UsageError, match=words):
        RunSpec(recipe="qwen3_30b_a3b", target=TargetSpec(env=env)).validated()


def test_a_run_on_this_machine_reads_its_own_environment():
    with pytest.raises(UsageError, match="reads its own environment"):
        TargetSpec(this_machine=True, env=("CUDA_DEVICE_MAX_CONNECTIONS=1",)).validated()


def test_plan_flag_error_names_the_flag(capsys):
    assert main(["plan", "--recipe", "qwen3_30b_a3b", "--env", "=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "(--env)" in err[0]


@pytest.mark.parametrize("flags,code,export", [
    ([], 0, "export CUDA_DEVICE_MAX_CONNECTIONS=32"),
    (["--env", "CUDA_DEVICE_MAX_CONNECTIONS=16"], 0, "export CUDA_DEVICE_MAX_CONNECTIONS=16"),
    (["--env", "CUDA_DEVICE_MAX_CONNECTIONS=1"], 1, None),
])
def test_launch_slurm_exports_and_judges_the_same_values(flags, code, export, tmp_path, capsys):
    from mbridge_ep_overlap.tools.slurm import main as slurm

    assert slurm(["--recipe", "qwen3_30b_a3b", "--nodes", "2", "--partition", "batch", "--dryrun",
                  "--log-dir", str(tmp_path), *flags]) == code
    out = capsys.readouterr().out
    if export:
        exports = [line for line in out.splitlines() if line.startswith("export CUDA_DEVICE_MAX_CONNECTIONS=")]
        assert exports == [export]
        assert "export NCCL_NVLS_ENABLE=0" in out
    else:
        assert FIX in out and not any(line.startswith("export ") for line in out.splitlines())


@pytest.mark.parametrize("flags,expected", [([], "CUDA_DEVICE_MAX_CONNECTIONS: 32  (default)"),
                                            (["--env", "CUDA_DEVICE_MAX_CONNECTIONS=16"],
                                             "CUDA_DEVICE_MAX_CONNECTIONS: 16  (set by an override)")])
def test_the_finalized_value_is_the_one_in_force(flags, expected, capsys):
    """The finalized section shows what the run gets: the launcher's exported value wins over cfg.env_vars."""
    assert main(["plan", "--recipe", "qwen3_30b_a3b", "--no-predict", *flags]) == 0
    assert expected in capsys.readouterr().out.splitlines()
