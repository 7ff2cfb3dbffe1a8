"""The job ``launch_slurm.py`` writes, submitted to a real Slurm (one node, GPUs as GRES of character devices).

What is real here: slurmctld, slurmd, munge, sbatch's parsing of every ``#SBATCH`` line, srun, the job's
output file, Slurm's time limit and job arrays, torchrun's c10d rendezvous, ``scripts/run_script.py``
starting on every rank and refusing to train without CUDA. Stand-ins, where training would need a GPU:
``rank_probe.py`` (a gloo all-reduce that prints the rank's environment) in place of run_script.py, and
``sleep`` in place of the run for the time-limit test. Each test says which it uses.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mbridge_ep_overlap.lab.launch import free_port
from mbridge_ep_overlap.tools.slurm_values import format_minutes, time_limit_minutes

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("rank_probe.py")
RECIPE = "qwen3_moe_proxy"
JOB = f"ep-overlap-{RECIPE}"
pytestmark = pytest.mark.slurm
INJECT = "$(touch INJECTED) `touch INJECTED`; touch INJECTED && touch INJECTED | touch INJECTED"


@pytest.fixture(scope="module")
def time_limited(slurm, tmp_path_factory):
    """Stand-in: ``srun sleep 600`` under the header launch_slurm renders for ``--time 1`` - submitted
    first, so Slurm's time limit runs out (60-90 s) while the dry run builds its config."""
    import argparse

    from mbridge_ep_overlap.tools.slurm import JobFiles, render

    root = tmp_path_factory.mktemp("time")
    args = argparse.Namespace(nodes=1, gpus_per_node=2, time="1", partition=slurm.partition, account=None,
                              workdir=str(root), container_image=None, container_mounts=None)
    script = render(args, [], {}, {}, JobFiles(root, "time-limit"))
    assert "#SBATCH --time=1\n" in script
    job = root / "sleep.sbatch"
    job.write_text(script[:script.index("srun ")] + "srun sleep 600\n")
    return slurm.submit(str(job), cwd=root), time.monotonic()


@pytest.fixture(scope="module")
def dry(slurm, time_limited, array_build, tmp_path_factory):
    """``launch_slurm.py ... --dryrun > job.sbatch``, as a user types it, with shell metacharacters in
    the work folder's name and in an override (both must reach the job verbatim, never run)."""
    root = tmp_path_factory.mktemp("dry")
    workdir = root / f"w {INJECT.replace('/', '_')}"
    workdir.symlink_to(REPO)
    marker = root / "MARKER"
    argv = [sys.executable, str(REPO / "scripts" / "launch_slurm.py"), "--recipe", RECIPE, "--nodes", "1",
            "--gpus-per-node", "2", "--gpu", "h200", "--partition", slurm.partition, "--time", "5",
            "--workdir", str(workdir), "--log-dir", str(root / "logs"), "--dryrun",
            f"checkpoint.save='/ckpt/$(touch {marker})'"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    (root / "job.sbatch").write_text(result.stdout)
    return root, result.stdout, marker


def _stand_in(script: str, command: str) -> str:
    """The generated script with the process torchrun starts (run_script.py and its flags) replaced."""
    head, sep, _ = script.rpartition("scripts/run_script.py")
    assert sep, script
    return f"{head}{command}\n"


def _exports(script: str) -> dict[str, str]:
    return {m.group(1): shlex.split(m.group(2))[0] for m in re.finditer(r"^export ([A-Z_0-9]+)=(\S+)$", script, re.M)
            if "$" not in m.group(2)}


def _probe_lines(text: str) -> list[dict]:
    """Every ``PROBE {json}`` record in the job's output, wherever it starts (a line may hold two)."""
    decoder = json.JSONDecoder()
    return [decoder.raw_decode(text, m.end())[0] for m in re.finditer(r"PROBE (?=\{)", text)]


def test_submitted_as_a_user_would_every_line_accepted_and_run_script_starts_on_every_rank(slurm, dry):
    """Real run_script.py on both ranks: each builds the plan and refuses to train without CUDA (exit 2),
    so the job fails - as it must on a node without GPUs - after srun -> torchrun -> run_script.py ran."""
    root, script, marker = dry
    fresh = root / "fresh"  # a folder without logs/: the output folder is the job's own (made by the dry run)
    fresh.mkdir()
    job_id = slurm.submit(str(root / "job.sbatch"), cwd=fresh)
    job = slurm.wait(job_id)
    out = root / "logs" / f"{JOB}-{job_id}.out"
    assert job["StdOut"] == str(out) and out.exists(), job
    # each rank's exit 2 is in torchrun's summary; torchrun itself exits 1, and srun and the job carry that
    assert (job["JobState"], job["ExitCode"]) == ("FAILED", "1:0"), job
    assert (job["NumNodes"], job["TimeLimit"], job["Partition"], job["JobName"]) == ("1", "00:05:00", slurm.partition, JOB)
    assert job["TresPerNode"] == "gres:gpu:2", job  # --gpus-per-node scheduled on the GRES
    text = out.read_text()
    lines = text.splitlines()
    assert lines[0].endswith(f"{JOB}.config.yaml") and lines[1].endswith(f"{JOB}.baseline.yaml"), lines[:4]
    assert lines[2].endswith(f"{JOB}.plan.json") and lines[3].endswith(f"sbatch {root}/logs/{JOB}.baseline.sbatch")
    assert text.count("cannot train on this machine") == 2, text[-4000:]  # one per rank: both started
    assert re.search(r"rank\s*:\s*\d \(local_rank: \d\)\s*\n\s*exitcode\s*:\s*2", text), text[-3000:]
    assert not marker.exists() and not (root / "INJECTED").exists() and not (fresh / "INJECTED").exists()
    # the override reached the job verbatim, as data: in the spec file every rank read
    spec = json.loads((root / "logs" / f"{JOB}.spec.json").read_text())
    assert spec["overrides"] == [f"checkpoint.save='/ckpt/$(touch {marker})'"], spec


def test_stand_in_rendezvous_forms_with_the_plans_environment_on_every_rank(slurm, dry, tmp_path):
    """Stand-in: rank_probe.py (gloo all-reduce, prints its environment) in place of run_script.py."""
    _, script, _ = dry
    exports = _exports(script)
    assert exports["CUDA_DEVICE_MAX_CONNECTIONS"] == "32" and exports["NCCL_NVLS_ENABLE"] == "0"
    job = tmp_path / "probe.sbatch"
    job.write_text(_stand_in(script, f"{shlex.quote(str(PROBE))} {' '.join(sorted(exports))}"))
    slurm.env["MASTER_PORT"] = str(free_port())
    fields = slurm.wait(slurm.submit(str(job), cwd=tmp_path))
    text = Path(fields["StdOut"]).read_text()
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), text[-3000:]
    ranks = _probe_lines(text)
    assert sorted(r["rank"] for r in ranks) == [0, 1] and {r["world_size"] for r in ranks} == {2}, text[-3000:]
    assert all(r["sum"] == 3 and r["env"] == exports for r in ranks), ranks


def test_stand_in_a_failing_rank_fails_the_job_with_its_exit_code(slurm, dry, tmp_path):
    """Stand-in: rank 1 of rank_probe.py exits 7 after the all-reduce."""
    _, script, _ = dry
    job = tmp_path / "fail.sbatch"
    job.write_text(_stand_in(script, shlex.quote(str(PROBE))))
    slurm.env.update(MASTER_PORT=str(free_port()), PROBE_FAIL_RANK="1", PROBE_EXIT_CODE="7")
    try:
        fields = slurm.wait(slurm.submit(str(job), cwd=tmp_path))
    finally:
        del slurm.env["PROBE_FAIL_RANK"], slurm.env["PROBE_EXIT_CODE"]
    text = Path(fields["StdOut"]).read_text()
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] != "0:0", fields
    # torchrun exits 1 for any failed worker and names the rank and its code; srun and the job carry it
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)\s*\n\s*exitcode\s*:\s*7", text), text[-3000:]


def test_own_submit_path_asks_first_then_submits_on_yes(slurm, tmp_path, monkeypatch, capsys):
    """Real run_script.py again; the path without --dryrun: asked, cost printed, submitted on 'y'."""
    import io

    from mbridge_ep_overlap.tools.slurm import main

    monkeypatch.setenv("PATH", slurm.env["PATH"])
    monkeypatch.chdir(tmp_path)
    argv = ["--recipe", RECIPE, "--nodes", "1", "--gpus-per-node", "2", "--gpu", "h200", "--partition", slurm.partition,
            "--time", "0:30", "--workdir", str(REPO), "--log-dir", str(tmp_path / "logs")]
    stdin = io.StringIO("y\n")
    stdin.isatty = lambda: True  # a terminal that answers "y"
    monkeypatch.setattr(sys, "stdin", stdin)
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = captured.out
    for needle in ("1 x 2 = 2 GPUs", "00:01:00", "at most 0.0 GPU-hours", slurm.partition, "predicted step",
                   "Slurm says"):
        assert needle in out, (needle, out)
    assert "submit? [y/N]" in captured.err
    job_id = re.search(r"submitted job (\d+): output (\S+)", out)
    assert job_id, out
    out = Path(job_id.group(2))
    deadline = time.monotonic() + 180  # queued behind the other jobs (--exclusive); its first lines are enough
    while time.monotonic() < deadline and len(out.read_text().splitlines() if out.exists() else []) < 4:
        time.sleep(0.5)
    subprocess.run(["scancel", job_id.group(1)])
    fields = slurm.wait(job_id.group(1))
    assert fields["StdOut"] == str(out) and out.read_text().splitlines()[3].endswith(".baseline.sbatch"), fields


ACCEPTED = ["5", "5:30", "90", "01:00:00", "1-2", "1-02:30", "1-2:30:15", "UNLIMITED", "infinite"]
REFUSED_BY_BOTH = ["1:2:3:4", "1-2-3", "abc", "1h", ":", "1:"]
CARRIED_OVER_BY_SLURM = ["99:99:99", "10:60", "1-24", "0", "-1"]  # Slurm accepts them as another (or no) limit


def test_the_time_validator_agrees_with_the_real_sbatch(slurm, tmp_path):
    from mbridge_ep_overlap import UsageError

    def limit(value: str) -> str | None:
        result = slurm.sbatch("--parsable", "--hold", f"--time={value}", "--wrap", "true", cwd=tmp_path)
        if result.returncode != 0:
            return None
        job_id = result.stdout.strip().split(";")[0]
        subprocess.run(["scancel", job_id])
        return slurm.job(job_id)["TimeLimit"]

    for value in ACCEPTED:
        assert limit(value) == format_minutes(time_limit_minutes(value)), value
    for value in REFUSED_BY_BOTH + CARRIED_OVER_BY_SLURM:
        with pytest.raises(UsageError):
            time_limit_minutes(value)
    assert [limit(v) for v in REFUSED_BY_BOTH] == [None] * len(REFUSED_BY_BOTH)
    assert [limit(v) for v in CARRIED_OVER_BY_SLURM] == ["4-04:41:00", "00:11:00", "2-00:00:00", "UNLIMITED", "UNLIMITED"]


def test_a_controller_that_does_not_answer_is_one_line(slurm, tmp_path, monkeypatch, capsys):
    from mbridge_ep_overlap.tools.slurm import main

    dead = tmp_path / "slurm.conf"
    conf = Path(os.environ["SLURM_CONF"]).read_text()
    # a port nobody listens on; MessageTimeout=2 so the client gives up in 2 s, not the default ~18 s
    dead.write_text(re.sub(r"^SlurmctldPort=.*$", f"SlurmctldPort={free_port()}", conf, flags=re.M) + "MessageTimeout=2\n")
    monkeypatch.setenv("SLURM_CONF", str(dead))
    code = main(["--recipe", RECIPE, "--nodes", "1", "--gpus-per-node", "2", "--log-dir", str(tmp_path / "l"), "--yes"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Unable to contact slurm controller" in err, err
    assert not (tmp_path / "l").exists()


def test_stand_in_the_time_limit_is_enforced(slurm, time_limited):
    """Stand-in: ``sleep 600`` in place of the run (fixture ``time_limited``): Slurm ends it at --time=1."""
    job_id, start = time_limited
    fields = slurm.wait(job_id, timeout_s=max(30.0, 240 - (time.monotonic() - start)))
    minutes, seconds = (int(x) for x in fields["RunTime"].split(":")[1:])  # HH:MM:SS, under an hour here
    assert fields["JobState"] == "TIMEOUT" and 1 <= minutes * 60 + seconds / 60 and minutes < 3, fields


@pytest.fixture(scope="module")
def array_build(slurm, time_limited, tmp_path_factory):
    """``launch_slurm.py --variants off,overlap --dryrun``, started - not waited for - while the
    time-limit job runs, so its build overlaps that wait and the other build (``dry`` asks for it)."""
    root = tmp_path_factory.mktemp("array")
    argv = [sys.executable, str(REPO / "scripts" / "launch_slurm.py"), "--recipe", RECIPE, "--nodes", "1",
            "--gpus-per-node", "2", "--gpu", "h200", "--partition", slurm.partition, "--time", "5",
            "--workdir", str(REPO), "--log-dir", str(root / "run"), "--variants", "off,overlap", "--max-steps", "4",
            "--dryrun"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root)
    yield root, proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


@pytest.fixture(scope="module")
def array_dry(array_build):
    root, proc = array_build
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return root, out


def test_stand_in_variant_array_each_task_runs_its_variant_and_bench_report_reads_the_folder(slurm, array_dry, capsys):
    """Stand-in: rank_probe.py in place of run_script.py, given the task's run_script arguments (its
    spec file, its folder); it writes the summary a run writes (rank 0), naming what it got."""
    from mbridge_ep_overlap.tools.cli import main as cli

    root, script = array_dry
    run = root / "run"
    job = root / "array.sbatch"
    job.write_text(script.replace("scripts/run_script.py", shlex.quote(str(PROBE)), 1))
    slurm.env["MASTER_PORT"] = str(free_port())
    array_id = slurm.submit(str(job), cwd=root)
    for task, variant, flag in ((0, "off", "off"), (1, "overlap", "on")):
        fields = slurm.wait(f"{array_id}_{task}")
        out = run / f"{JOB}-{array_id}_{task}.out"
        text = out.read_text() if out.exists() else ""
        assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), (fields, text[-3000:])
        assert fields["StdOut"] == str(out) and f"variant {variant} (array task {task})" in text, text[-2000:]
        folder = run / "runs" / f"nvlink__{variant}"
        summary = json.loads((folder / "summary.json").read_text())
        argv, spec = summary["probe_argv"], summary["probe_spec"]
        assert argv == ["--spec", str(run / f"{JOB}.{variant}.spec.json"), "--output-dir", str(folder),
                        "--summary-json", str(folder / "summary.json")], argv
        assert spec["ep_overlap"] is (flag == "on") and spec["max_steps"] == 4, spec
        ranks = _probe_lines(text)
        assert sorted(r["rank"] for r in ranks) == [0, 1] and all(r["sum"] == 3 for r in ranks), text[-2000:]
        assert sorted(p.name for p in (folder / "torchrun").rglob("*.log")), list(folder.rglob("*"))  # rank logs
    assert cli(["bench", "report", str(run), "--out", str(root / "report")]) == 0
    table = capsys.readouterr().out
    assert "| nvlink | off |" in table and "| nvlink | overlap |" in table and "failed" not in table, table
    assert "| measured step s | predicted step s | error |" in table and "not made" in table  # the probe is no model
