"""The generated sbatch job: the plan's environment is exported, the command matches run_script;
the way back is written beside it; nothing is submitted without confirmation. (The same script
submitted to a real Slurm: tests/slurm.)"""

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mbridge_ep_overlap.tools.slurm import main
from mbridge_ep_overlap.tools.slurm_values import format_minutes, time_limit_minutes

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _log_dir(tmp_path, monkeypatch):
    """Every job written here goes to a temporary folder (a job writes its files into --log-dir)."""
    monkeypatch.chdir(tmp_path)


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
                 f"scripts/run_script.py --spec {tmp_path}/logs/ep-overlap-qwen3_30b_a3b.spec.json\n"):
        assert line in out, line
    # the job is given the run description as data: the spec it was judged with, read back as run_script reads it
    from mbridge_ep_overlap.runtime.spec_file import read_spec

    spec = read_spec(tmp_path / "logs" / "ep-overlap-qwen3_30b_a3b.spec.json")
    assert (spec.recipe, spec.ep_overlap, spec.overrides) == ("qwen3_30b_a3b", True, ("train.train_iters=50",))
    assert (spec.target.num_gpus, "NCCL_NVLS_ENABLE=0" in spec.target.env) == (16, True)
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
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, str(repo / "scripts" / "launch_slurm.py"), "--recipe", "qwen3_30b_a3b",
                             "--nodes", "2", "--dryrun", "--log-dir", str(tmp_path / "logs")],
                            capture_output=True, text=True, timeout=300, cwd=repo)
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


def test_without_sbatch_nothing_is_written_and_the_answer_is_one_line(tmp_path, monkeypatch, capsys):
    """Not a dry run, no sbatch on PATH: exit 2 in one line, before the build (nothing written)."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    start = time.perf_counter()
    code = main(["--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2", "--log-dir", str(tmp_path / "logs"),
                 "--yes"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "missing sbatch" in err, err
    assert not (tmp_path / "logs").exists() and time.perf_counter() - start < 5


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


# ---- the time limit, as Slurm reads it (the same table runs against a real sbatch in tests/slurm) ----
TIMES = [("5", 5), ("5:30", 6), ("90", 90), ("01:00:00", 60), ("1-2", 1560), ("1-02:30", 1590), ("1-2:30:15", 1591),
         ("UNLIMITED", None), ("infinite", None)]
REFUSED_TIMES = ["99:99:99", "10:60", "1-24", "0", "0:0", "-1", "1:2:3:4", "1-2-3", "abc", "1h", ":", "1:", ""]


@pytest.mark.parametrize("value,minutes", TIMES)
def test_time_limit_minutes_as_slurm_counts_them(value, minutes):
    assert time_limit_minutes(value) == minutes


@pytest.mark.parametrize("value", REFUSED_TIMES)
def test_time_limit_out_of_range_or_no_limit_is_refused(value):
    """Slurm carries 99:99:99 over into 4-04:41:00 and reads 0 as no limit: refused, naming --time."""
    from mbridge_ep_overlap import UsageError

    with pytest.raises(UsageError, match="--time"):
        time_limit_minutes(value)


def test_format_minutes_is_slurms_time_limit_text():
    assert [format_minutes(m) for m in (5, 60, 1591, None)] == ["00:05:00", "01:00:00", "1-02:31:00", "UNLIMITED"]


# ---- ask before spending ---------------------------------------------------------------------------
def test_without_yes_a_shell_that_cannot_ask_is_refused_before_anything_is_built(tmp_path, capsys, monkeypatch):
    """pytest's stdin is not a terminal: no --yes, no --dryrun -> exit 2 in one line, at once."""
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    start = time.perf_counter()
    code = main(["--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2", "--log-dir", str(tmp_path / "l")])
    err = capsys.readouterr().err
    assert code == 2 and "--yes" in err and len(err.strip().splitlines()) == 1, err
    assert time.perf_counter() - start < 5 and not (tmp_path / "l").exists()


def test_cost_lines_name_size_limit_gpu_hours_and_predicted_time():
    import argparse

    from mbridge_ep_overlap.tools.slurm import cost_lines

    args = argparse.Namespace(nodes=2, gpus_per_node=8, partition="batch", account=None, ep_overlap="on")
    prediction = {"prediction": {"on_step_s": 1.5, "off_step_s": 2.0}}
    text = "\n".join(cost_lines(args, 90, 100, prediction))
    for needle in ("2 x 8 = 16 GPUs", "01:30:00", "at most 24.0 GPU-hours", "batch", "(your default)",
                   "1.500 s with EP overlap on (off: 2.000 s", "100 steps", "2.5 min predicted"):
        assert needle in text, (needle, text)
    assert "MORE than the time limit" in "\n".join(cost_lines(args, 1, 100, prediction))
    assert "unbounded" in "\n".join(cost_lines(args, None, 100, {"error": "outside the model"}))
    assert "not made (outside the model)" in "\n".join(cost_lines(args, None, 100, {"error": "outside the model"}))


# ---- keep the way back -----------------------------------------------------------------------------
def test_dry_run_writes_both_configs_as_plain_megatron_bridge_yaml_the_plan_and_the_rollback(tmp_path, capsys):
    """The configs load with MB's own YAML loader in a process where mbridge_ep_overlap cannot be
    imported (TE is absent here: the import shim file is loaded on its own, outside the package, as
    a stand-in for it), and load back to exactly what was written."""
    logs = tmp_path / "logs"
    code, out, err = script(capsys, "--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2", "--gpu", "h200",
                            "--log-dir", str(logs))
    assert code == 0, err
    job = "ep-overlap-qwen3_moe_proxy"
    names = sorted(p.name for p in logs.iterdir())
    assert names == sorted(f"{job}{s}" for s in (".config.yaml", ".baseline.yaml", ".plan.json", ".baseline.sbatch",
                                                 ".spec.json", ".baseline.spec.json"))
    rollback = f"sbatch {logs / job}.baseline.sbatch"
    body = out.splitlines()[out.splitlines().index("set -euo pipefail") + 1:]
    first = body[:4]  # right after the #SBATCH header and set -e: the job's first log lines
    assert [line.split(": ", 1)[1].rstrip("'") for line in first] == [
        str(logs / f"{job}.config.yaml"), str(logs / f"{job}.baseline.yaml"), str(logs / f"{job}.plan.json"), rollback]
    assert rollback in err
    baseline = (logs / f"{job}.baseline.sbatch").read_text()
    assert f"--spec {logs / job}.baseline.spec.json\n" in baseline and f"--spec {logs / job}.spec.json\n" in out
    assert "export CUDA_DEVICE_MAX_CONNECTIONS" not in baseline
    specs = [json.loads((logs / f"{job}{s}").read_text()) for s in (".spec.json", ".baseline.spec.json")]
    assert [s["ep_overlap"] for s in specs] == [True, False]
    plan = json.loads((logs / f"{job}.plan.json").read_text())
    assert plan["job"]["nodes"] == 1 and plan["plan"] and plan["finalized"] and plan["spec"]["ep_overlap"] is True
    probe = f"""
import importlib.util, json, sys, yaml
sys.modules["mbridge_ep_overlap"] = None  # the package cannot be imported
spec = importlib.util.spec_from_file_location("te_stand_in", {str(REPO / "src/mbridge_ep_overlap/target/shims.py")!r})
shims = sys.modules["te_stand_in"] = importlib.util.module_from_spec(spec); spec.loader.exec_module(shims); shims.install()
from megatron.bridge.training.config import ConfigContainer
from megatron.training.config.yaml_utils import safe_yaml_representers
out = {{}}
for name in ("config", "baseline"):
    path = {str(logs / job)!r} + "." + name + ".yaml"
    cfg = ConfigContainer.from_yaml(path)
    with safe_yaml_representers():  # MB's own writer: dtypes, enums and callables as it spells them
        loaded = yaml.safe_load(yaml.safe_dump(cfg.to_dict()))
    written = yaml.safe_load(open(path))
    # MB's loader drops the fields finalize derives (init=False: the scheduler's step counts, the
    # dataset's split matrix and mock flag) and finalize recomputes them; every other section is exact
    same = [key for key in written if key not in ("scheduler", "dataset") and written[key] == loaded[key]]
    out[name] = [type(cfg).__module__ + "." + type(cfg).__qualname__, cfg.model.overlap_moe_expert_parallel_comm,
                 sorted(same) == sorted(k for k in written if k not in ("scheduler", "dataset")) and len(same) > 5]
print(json.dumps(out))
"""
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    mb = "megatron.bridge.training.config.ConfigContainer"
    assert got == {"config": [mb, True, True], "baseline": [mb, False, True]}, got


def test_a_config_naming_a_class_of_this_package_is_not_exported(tmp_path):
    from mbridge_ep_overlap import UsageError
    from mbridge_ep_overlap.core.export import _check

    with pytest.raises(UsageError, match=r"model\.spec.*mbridge_ep_overlap\.x\.Y"):
        _check({"model": {"spec": {"_target_": "mbridge_ep_overlap.x.Y"}}}, "")


@pytest.mark.parametrize("answer,submit", [("y\n", True), ("yes\n", True), ("Y\n", True), ("n\n", False), ("\n", False),
                                           ("", False), ("sure\n", False)])
def test_only_yes_at_the_prompt_submits(answer, submit, monkeypatch, capsys):
    import argparse
    import io

    from mbridge_ep_overlap.tools.slurm import _confirm

    monkeypatch.setattr(sys, "stdin", io.StringIO(answer))
    assert _confirm(argparse.Namespace(yes=False)) is submit
    assert "submit? [y/N]" in capsys.readouterr().err
    assert _confirm(argparse.Namespace(yes=True)) is True


# ---- --variants: one job array, task i runs variant i ------------------------------------------------
ARRAY_JOB = "ep-overlap-qwen3_moe_proxy"


@pytest.fixture(scope="module")
def array_dry(tmp_path_factory):
    """``--variants overlap:hiprio,overlap`` dry run (off is added first, as bench adds it)."""
    import contextlib
    import io

    root = tmp_path_factory.mktemp("array")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2", "--gpu", "h200",
                     "--time", "30", "--log-dir", str(root / "run"), "--workdir", str(REPO),
                     "--variants", "overlap:hiprio,overlap", "--max-steps", "6", "--dryrun"])
    assert code == 0, err.getvalue()[-3000:]
    return root, out.getvalue(), err.getvalue()


def _fake_bin(folder: Path) -> Path:
    """srun and scontrol that print what they were given (the task's command line), no cluster."""
    folder.mkdir()
    (folder / "srun").write_text('#!/bin/bash\nprintf "SRUN %s\\n" "$@"\n')
    (folder / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    for f in folder.iterdir():
        f.chmod(0o755)
    return folder


def test_variants_array_task_i_runs_variant_i_with_the_same_spec(array_dry, tmp_path):
    from mbridge_ep_overlap.spec import RunSpec, TargetSpec
    from mbridge_ep_overlap.lab.bench import variant_spec
    from mbridge_ep_overlap.runtime.spec_file import read_spec
    from mbridge_ep_overlap.tools.slurm_variants import slug

    root, out, err = array_dry
    run = root / "run"
    assert "#SBATCH --array=0-2\n" in out and f"#SBATCH --output={run}/%x-%A_%a.out" in out
    assert f"sbatch --array=0 {run}/{ARRAY_JOB}.sbatch" in err  # the rollback: the off task alone
    assert (run / f"{ARRAY_JOB}.sbatch").read_text() == out
    manifest = json.loads((run / "variants.json").read_text())
    assert [t["variant"] for t in manifest["tasks"]] == ["off", "overlap:hiprio", "overlap"]
    assert manifest["cluster"] == {"gpu": "h200", "num_gpus": 2, "gpus_per_node": 2, "nodes": 1}
    path = tmp_path / "job.sbatch"
    path.write_text(out)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    fake = _fake_bin(tmp_path / "bin")
    base = RunSpec(recipe="qwen3_moe_proxy", max_steps=6)  # the flags given: one spec for every task
    for task in manifest["tasks"]:
        env = {"PATH": f"{fake}:/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": str(task["task"]), "SLURM_JOB_NODELIST": "n1",
               "SLURM_JOB_ID": "7", "SLURM_NNODES": "1"}
        result = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        argv = [line[5:] for line in result.stdout.splitlines() if line.startswith("SRUN ")]
        folder = run / task["folder"]
        assert task["folder"] == f"runs/nvlink__{task['variant'].replace(':', '_')}" and folder.is_dir()
        assert f"variant {task['variant']} (array task {task['task']})" in result.stdout
        run_args = argv[argv.index("scripts/run_script.py") + 1:]
        assert run_args[-4:] == ["--output-dir", str(folder), "--summary-json", str(folder / "summary.json")]
        assert argv[argv.index("--log-dir") + 1] == str(folder / "torchrun")
        plan = json.loads((run / task["plan"]).read_text())
        assert plan["variant"] == task["variant"] and plan["array_task"] == task["task"]
        assert (run / task["config"]).exists()
        spec_file = run / f"{ARRAY_JOB}.{slug(task['variant'])}.spec.json"
        assert run_args[:-4] == ["--spec", str(spec_file)], run_args  # the task's run description, as data
        written = read_spec(spec_file)
        assert written.target.gpu == "h200" and written.target.num_gpus == 2  # the cluster it was judged for
        assert written.replace(target=TargetSpec()) == variant_spec(base, task["variant"])  # only the variant differs
    bad = subprocess.run(["bash", str(path)], capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": f"{fake}:/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": "3"})
    assert bad.returncode == 2 and "no variant (0-2)" in bad.stderr


def test_variants_export_each_variants_own_plan_environment(array_dry):
    _, out, _ = array_dry
    blocks = out.split('case "${SLURM_ARRAY_TASK_ID')[1].split(";;")
    off, hiprio, overlap = blocks[:3]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in off and "export CUDA_DEVICE_MAX_CONNECTIONS=32" in overlap
    assert all("export NCCL_NVLS_ENABLE=0" in b for b in (off, hiprio, overlap))
    specs = [json.loads(Path(shlex.split(b.split("SPEC_FILE=", 1)[1].splitlines()[0])[0]).read_text())
             for b in (off, hiprio, overlap)]
    assert [(s["ep_overlap"], s["high_priority_a2a"]) for s in specs] == [(False, None), (True, True), (True, False)]


@pytest.mark.parametrize("argv, needle", [
    (["--variants", "off,fast"], "unknown variant 'fast'"),
    (["--variants", "off,overlap,off"], "repeated: off"),
    (["--variants", "overlap", "--ep-overlap", "off"], "--ep-overlap off"),
    (["--variants", "overlap", "--dispatcher", "deepep"], "--dispatcher deepep"),
])
def test_variants_bad_usage_is_one_line_before_the_build(capsys, tmp_path, argv, needle):
    start = time.perf_counter()
    code = main(["--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2", "--log-dir", str(tmp_path / "l"),
                 "--dryrun", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "l").exists() and time.perf_counter() - start < 5


def test_a_refused_variant_refuses_the_whole_array_every_violation_listed(capsys, tmp_path):
    code = main(["--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2", "--log-dir", str(tmp_path / "l"),
                 "--variants", "off,overlap,overlap:hiprio", "--dryrun", "model.mtp_num_layers=3"])
    captured = capsys.readouterr()
    assert code == 1 and "#!/bin/bash" not in captured.out, captured.err[-2000:]
    assert "variant overlap (array task 1):" in captured.out and "variant overlap:hiprio (array task 2):" in captured.out
    assert "variant off (array task 0)" not in captured.out  # off is accepted: only the refused are reported
    assert captured.out.count("mtp-layers") >= 2 and "2 of 3 variants refused" in captured.err
    assert not (tmp_path / "l").exists()


def test_array_cost_lines_total_gpu_hours_over_every_task():
    import argparse

    from mbridge_ep_overlap.spec import RunSpec
    from mbridge_ep_overlap.tools.slurm_variants import Task, cost_lines

    args = argparse.Namespace(nodes=2, gpus_per_node=8, partition=None, account="a1")
    tasks = [Task(0, "off", RunSpec(recipe="qwen3_moe_proxy", ep_overlap=False)),
             Task(1, "overlap", RunSpec(recipe="qwen3_moe_proxy", ep_overlap=True)),
             Task(2, "deepep", RunSpec(recipe="qwen3_moe_proxy", ep_overlap=True))]
    predictions = {"off": {"off_step_s": 2.0, "on_step_s": 1.5}, "overlap": {"off_step_s": 2.0, "on_step_s": 1.5},
                   "deepep": {"error": "no bandwidth model"}}
    text = "\n".join(cost_lines(args, 90, tasks, predictions, 60))
    for needle in ("3 (0=off, 1=overlap, 2=deepep)", "2 x 8 = 16 GPUs per task", "01:30:00 per task",
                   "at most 72.0 GPU-hours for the array (3 tasks x 16 GPUs x 01:30:00)", "off: 2.000 s",
                   "overlap: 1.500 s (step-time model; 60 steps 1.5 min)", "deepep: not made (no bandwidth model)"):
        assert needle in text, (needle, text)


# ---- bench report on such a folder: measured vs predicted ------------------------------------------
def _array_folder(root: Path, median: dict[str, float | None]) -> Path:
    """A run folder as the array leaves it: variants.json and each task's summary (None: none left)."""
    from mbridge_ep_overlap.predict.calibrate import PROXY_RECIPE

    fin = dict(PROXY_RECIPE, expert_model_parallel_size=8, data_parallel_size=8, micro_batch_size=1,
               global_batch_size=64, seq_length=4096)
    tasks = []
    for i, (variant, step) in enumerate(median.items()):
        folder = f"runs/nvlink__{variant}"
        tasks.append({"task": i, "variant": variant, "link": "nvlink", "folder": folder})
        if step is None:
            continue
        (root / folder).mkdir(parents=True)
        steps = [{"iteration": n + 1, "step_time_s": 9.0 if n == 0 else step, "loss": 10.0 - n} for n in range(5)]
        summary = {"steps": steps, "finalized": dict(fin, overlap_moe_expert_parallel_comm=variant != "off")}
        (root / folder / "summary.json").write_text(json.dumps(summary))
    (root / "variants.json").write_text(json.dumps({
        "schema": "mbridge-ep-overlap variant array 1", "job": "j", "warmup": 1, "tasks": tasks,
        "cluster": {"gpu": "h200", "num_gpus": 8, "gpus_per_node": 8, "nodes": 1}}))
    return root


def test_bench_report_of_an_array_folder_puts_the_prediction_beside_each_measured_step(tmp_path, capsys):
    from mbridge_ep_overlap.predict import Cluster, StepInputs, predict
    from mbridge_ep_overlap.tools.cli import main as cli

    run = _array_folder(tmp_path / "run", {"off": 2.0, "overlap": 1.6, "overlap:hiprio": None})
    assert cli(["bench", "report", str(run), "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    fin = json.loads((run / "runs/nvlink__off/summary.json").read_text())["finalized"]
    p = predict(StepInputs.from_summary(fin, num_gpus=8), Cluster(gpu="h200", num_gpus=8, gpus_per_node=8))
    assert "| link | variant | measured step s | predicted step s | error | calibration |" in out
    assert f"| nvlink | off | 2.000 | {p.off_step_s:.3f} | {p.off_step_s / 2 - 1:+.1%} | shipped calibration |" in out
    assert "| nvlink | overlap | 1.600 |" in out and "1.250x" in out  # speedup against its own off task
    assert "failed: array task 2 left no" in out and "j-<array id>_2.out" in out
    rows = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert rows[0]["predicted_s"] == pytest.approx(p.off_step_s) and rows[2]["ok"] is False


def test_bench_report_predicts_with_the_calibration_file_when_given(tmp_path, capsys):
    import dataclasses

    from mbridge_ep_overlap.predict.cluster_calibration import ClusterCalibration
    from mbridge_ep_overlap.tools.cli import main as cli

    run = _array_folder(tmp_path / "run", {"off": 2.0, "overlap": 1.6})
    cal = ClusterCalibration(gpu="h200", fitted={"gemm_efficiency": 0.2, "memory_efficiency": 0.3,
                                                 "nvlink_alltoall_efficiency": 0.1}, cluster={}, rows=())
    cal.save(tmp_path / "cal.json")
    assert cli(["bench", "report", str(run), "--out", str(tmp_path / "a")]) == 0
    assert cli(["bench", "report", str(run), "--out", str(tmp_path / "b"), "--calibration", str(tmp_path / "cal.json")]) == 0
    capsys.readouterr()
    shipped, fitted = (json.loads((tmp_path / d / "results.json").read_text()) for d in "ab")
    loaded = ClusterCalibration.load(tmp_path / "cal.json")
    assert fitted[0]["prediction"] == f"calibration {tmp_path / 'cal.json'}" and dataclasses.is_dataclass(loaded)
    assert fitted[0]["predicted_s"] > shipped[0]["predicted_s"] * 1.5  # lower efficiencies: a longer step
    with pytest.raises(SystemExit) as e:
        cli(["bench", "run", "--calibration", str(tmp_path / "cal.json")])
    assert e.value.code == 2
    assert cli(["bench", "report", str(run), "--out", str(tmp_path / "c"), "--calibration", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "is a flag of `mbridge-ep-overlap bench report`" in err[0] and "cannot read" in err[1]
