"""The generated sbatch job: the plan's environment is exported, the command matches run_script."""

import subprocess

import pytest

from mbridge_ep_overlap.tools.slurm import main


def script(capsys, *argv):
    code = main([*argv, "--dryrun"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_qwen3_30b_two_nodes(capsys, tmp_path):
    code, out, err = script(capsys, "--recipe", "qwen3_30b_a3b", "--nodes", "2", "--gpus-per-node", "8",
                            "--partition", "batch", "train.train_iters=50")
    assert code == 0, err
    for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=8", "#SBATCH --partition=batch",
                 "export CUDA_DEVICE_MAX_CONNECTIONS=32", "export NCCL_NVLS_ENABLE=0",
                 "torchrun --nnodes $SLURM_NNODES --nproc_per_node 8",
                 "scripts/run_script.py --recipe qwen3_30b_a3b --ep-overlap on train.train_iters=50"):
        assert line in out, line
    # the exports come before the process starts
    assert out.index("export CUDA_DEVICE_MAX_CONNECTIONS") < out.index("srun ")
    path = tmp_path / "job.sbatch"
    path.write_text(out)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_hybridep_exports_topology(capsys):
    code, out, _ = script(capsys, "--recipe", "qwen3_30b_a3b_hybridep", "--nodes", "2")
    assert code == 0
    for line in ("export NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=8", "export NVLINK_DOMAIN_SIZE=8", "export USE_MNNVL=0"):
        assert line in out


def test_user_env_value_is_kept(capsys):
    code, out, _ = script(capsys, "--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2",
                          "env_vars.CUDA_DEVICE_MAX_CONNECTIONS=8")
    assert code == 0 and "export CUDA_DEVICE_MAX_CONNECTIONS=8" in out


def test_refused_config_is_not_rendered(capsys):
    code, out, err = script(capsys, "--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2",
                            "model.mtp_num_layers=3")
    assert code == 1 and "#!/bin/bash" not in out and "mtp-layers" in out  # the refusal: the report on stdout
    assert "every violation is listed on stdout" in err


@pytest.mark.parametrize("argv", [["--recipe", "nope", "--nodes", "1"], ["--recipe", "qwen3_moe_proxy", "--nodes", "0"]])
def test_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main([*argv, "--dryrun"]))
    assert e.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_script_entry_prints_only_the_job_script(tmp_path):
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, str(repo / "scripts" / "launch_slurm.py"), "--recipe", "qwen3_30b_a3b",
                             "--nodes", "2", "--dryrun"], capture_output=True, text=True, timeout=300, cwd=repo)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=ep-overlap-qwen3_30b_a3b")
    job = tmp_path / "job.sbatch"
    job.write_text(result.stdout)
    assert subprocess.run(["bash", "-n", str(job)]).returncode == 0


@pytest.mark.parametrize("argv,needle", [
    (["--recipe", "qwen3_30b_a3b", "--nodes", "2", "--num-gpus", "8"], "inconsistent --num-gpus 8; allowed: 16"),
    (["--recipe", "qwen3_30b_a3b", "--nodes", "2", "--gpus-per-node", "4", "--num-gpus", "16"], "allowed: 8"),
    (["--recipe", "qwen3_30b_a3b", "--gpu", "gb200", "--nodes", "4", "--gpus-per-node", "8"], "at most 4"),
])
def test_job_size_flags_that_disagree_are_usage(capsys, argv, needle):
    """--num-gpus is a run flag; the job's size is --nodes x --gpus-per-node and wins silently no more."""
    code, out, err = script(capsys, *argv)
    assert code == 2 and out == "" and needle in err and len(err.strip().splitlines()) == 1, err


def test_gpus_per_node_defaults_to_the_gpu_kinds_node(capsys):
    code, out, err = script(capsys, "--recipe", "qwen3_30b_a3b", "--gpu", "gb200", "--nodes", "4")
    assert code == 0, err
    assert "#SBATCH --gpus-per-node=4" in out and "--nproc_per_node 4" in out
    code, out, err = script(capsys, "--recipe", "qwen3_30b_a3b", "--nodes", "2", "--num-gpus", "16")
    assert code == 0 and "#SBATCH --gpus-per-node=8" in out, err


def test_without_sbatch_the_script_is_written_and_the_answer_is_one_line(tmp_path, monkeypatch, capsys):
    """Not a dry run, no sbatch on PATH: exit 2 in one line naming where the script is."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    code = main(["--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2", "--log-dir", str(tmp_path / "logs")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "sbatch" in err, err
    assert list((tmp_path / "logs").glob("*.sbatch"))


ENV_MODULE = "ep_overlap_probe_slurm_env"
ENV_ROWS = [  # the line a recipe adds, the exit code of plan and launch_slurm alike, what names it
    ("cfg.env_vars['NCCL_DEBUG'] = None", 1, "env-var-values"),
    ("cfg.env_vars['NCCL_DEBUG'] = object()", 1, "env-var-values"),
    ("cfg.env_vars['NCCL_DEBUG'] = ['INFO']", 1, "env-var-values"),
    ("cfg.env_vars['NCCL_DEBUG'] = 2**70", 1, "env-var-values"),
    ("cfg.env_vars[''] = '1'", 1, "env-vars-type"),
    ("cfg.env_vars['CUDA_DEVICE_MAX_CONNECTIONS'] = 'abc'", 1, "cuda-device-max-connections-value"),
    # no rule covers it; MB's finalize (MCore) refuses it in plan, so launch_slurm must too
    ("cfg.model.moe_hybridep_num_sms = 16; cfg.model.moe_deepep_num_sms = 20", 1, "Conflicting deprecated SM-count"),
    ("cfg.env_vars['NCCL_DEBUG'] = 'INFO'", 0, "export NCCL_DEBUG=INFO"),
    ("cfg.env_vars['NCCL_DEBUG'] = 5", 0, "export NCCL_DEBUG=5"),
]


@pytest.fixture(scope="module")
def env_recipes(tmp_path_factory):
    import sys

    folder = tmp_path_factory.mktemp("env_recipes")
    body = ["from mbridge_ep_overlap.spec import resolve_recipe\n"]
    for n, (line, _, _) in enumerate(ENV_ROWS):
        body.append(f"def r{n}():\n    cfg = resolve_recipe('qwen3_moe_proxy').config()\n    {line}\n    return cfg\n")
    (folder / f"{ENV_MODULE}.py").write_text("\n".join(body))
    sys.path.insert(0, str(folder))
    yield
    sys.path.remove(str(folder))
    sys.modules.pop(ENV_MODULE, None)


@pytest.mark.parametrize("n", range(len(ENV_ROWS)), ids=[r[0][:48] for r in ENV_ROWS])
def test_launch_slurm_refuses_exactly_what_plan_refuses(env_recipes, n, capsys):
    """A value plan refuses is never rendered (no ``export NAME=None`` or object repr): exit 1 listing
    the violation, like plan; what plan accepts is exported as the run gets it."""
    from mbridge_ep_overlap.tools import cli

    _, code, needle = ENV_ROWS[n]
    recipe = f"{ENV_MODULE}:r{n}"
    assert cli.main(["plan", "--recipe", recipe, "--gpu", "h200", "--num-gpus", "2", "--no-predict"]) == code
    plan_out = capsys.readouterr().out
    got, out, err = script(capsys, "--recipe", recipe, "--gpu", "h200", "--nodes", "1", "--gpus-per-node", "2")
    assert got == code, out[-2000:] + err[-2000:]
    if code:
        assert "#!/bin/bash" not in out and needle in out and needle in plan_out, err[-2000:]  # plan's report
    else:
        assert needle in out and "ACCEPTED" in plan_out
    assert "=None" not in out and "object at 0x" not in out
