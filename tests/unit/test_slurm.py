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
    assert code == 1 and out == "" and "mtp-layers" in err


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
