"""Nothing bad gets past us: every bad input gets exit 1 (refused, every violation) or 2 (bad usage,
one line), never a traceback - table-driven from the cases found by trying ~160 bad inputs, then
fuzzed with hypothesis; and a generated sbatch script is executed with srun/sbatch stubbed to prove
that injected text never runs."""

from __future__ import annotations

import json
import re
import os
import stat
import sys
import textwrap
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mbridge_ep_overlap.tools import cli, run, slurm

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
REPO = Path(__file__).resolve().parents[2]


def call(main, argv, capsys):
    """(exit code, stdout, stderr) of an entry point, SystemExit included."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, (argv, out[-2000:], err[-2000:])
    return code, out, err


def _cases(tool: str) -> list[tuple[list[str], int, str]]:
    """Rows of fixtures/bad_inputs.tsv for one entry point: (argv, exit code, text that must appear)."""
    rows = []
    for line in (Path(__file__).parent / "fixtures" / "bad_inputs.tsv").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        entry, code, needle, argv = line.split("\t")
        if entry == tool:
            rows.append(([a.replace("{fixtures}", str(FIXTURES)) for a in json.loads(argv)], int(code), needle))
    return rows


CLI_CASES = _cases("mbridge-ep-overlap")
RUN_CASES = _cases("run_script.py --dryrun")


@pytest.mark.parametrize("argv,code,needle", CLI_CASES, ids=[" ".join(c[0])[:60] for c in CLI_CASES])
def test_cli_bad_input(argv, code, needle, capsys):
    got, out, err = call(cli.main, argv, capsys)
    assert got == code, (got, out[-1500:], err[-1500:])
    assert needle in out + err, (out[-1500:], err[-1500:])
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err


def test_verify_log_malformed_loss_and_missing_iterations(tmp_path, capsys):
    bad = tmp_path / "bad.log"
    bad.write_text("iteration        3/      10 | elapsed time per iteration (ms): 100.0 | lm loss: 1.2.3 | "
                   "number of skipped iterations:   0 | number of nan iterations:   0 |\n")
    code, out, _ = call(cli.main, ["verify-log", str(bad)], capsys)
    assert code == 1 and "loss 1.2.3 (not a number)" in out
    summary_only = tmp_path / "rank0.log"
    summary_only.write_text("\n".join(line for line in (FIXTURES / "baseline_off.log").read_text().splitlines()
                                      if "lm loss" not in line))
    code, out, _ = call(cli.main, ["verify-log", str(summary_only)], capsys)
    assert code == 1 and "no iteration lines" in out and "finite" not in out


@pytest.mark.parametrize("content", ["{not json", "{}", "[1, 2]", '[{"variant": "off"}]'])
def test_bench_report_on_a_broken_results_file(content, tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(content)
    code, _, err = call(cli.main, ["bench", "report", str(tmp_path / "run"), "--out", str(tmp_path / "m")], capsys)
    assert code == 2 and "results.json" in err and len(err.strip().splitlines()) == 1


def test_bench_report_compares_each_shape_with_its_own_baseline(tmp_path):
    """Merging the 2026-11-30 long-seq evidence (two throttled long-seq runs, one with FFN 1536, one NVLink run) must
    give each row the speedup of its own run, not the last 'off' of its link."""
    from mbridge_ep_overlap.lab.bench import report

    rows = report([REPO / "docs/evidence/2026-11-30-h200x2-bench-long-seq"], tmp_path / "m", "t")
    hiprio = [r for r in rows if r.variant == "overlap:hiprio" and r.link == "throttled"]
    assert round(hiprio[0].speedup, 3) == 1.334 and hiprio[0].parity == "match"
    assert all(r.parity in ("baseline", "match") for r in rows if r.ok)


@pytest.mark.parametrize("argv,code,needle", RUN_CASES, ids=[" ".join(c[0][2:]) for c in RUN_CASES])
def test_run_script_bad_input(argv, code, needle, tmp_path, capsys):
    extra = [] if "--output-dir" in argv else ["--output-dir", str(tmp_path)]
    got, out, err = call(run.main, [*argv, "--dryrun", *extra], capsys)
    said = out if code == 1 else err  # a refusal is the dry run's report (stdout); bad usage one line on stderr
    assert got == code and needle in said, (got, out[-1500:], err[-1500:])
    assert "config:" not in out  # nothing was printed as if it had worked


def test_run_script_output_dir_is_checked_before_the_plan_is_printed(capsys):
    code, out, err = call(run.main, ["--recipe", "qwen3_moe_proxy", "--dryrun", "--output-dir", "/dev/null/sub"], capsys)
    assert code == 2 and "EP overlap plan" not in out


RECIPE_MODULES = {
    "raises_at_import": ("raise RuntimeError('boom at import')\n", "RuntimeError: boom at import"),
    "syntax_error": ("def f(:\n", "SyntaxError"),
    "exits_at_import": ("import sys\nsys.exit(0)\n", "SystemExit"),
    "exits_in_recipe": ("import sys\ndef f():\n    sys.exit(0)\n", "raised SystemExit"),
    "exits_with_text": ("import sys\ndef f():\n    sys.exit('bye')\n", "raised SystemExit: bye"),
}


@pytest.mark.parametrize("module", sorted(RECIPE_MODULES))
def test_a_recipe_module_that_fails_or_exits_is_bad_usage(module, tmp_path, monkeypatch, capsys):
    """Importing or calling a user's recipe may raise anything or call sys.exit: exit 2 naming it,
    never a traceback, never a silent exit 0 without a plan."""
    source, needle = RECIPE_MODULES[module]
    name = f"ep_overlap_probe_{module}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = call(cli.main, ["plan", "--recipe", f"{name}:f", "--gpu", "h200", "--num-gpus", "2"], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, (out, err)


@pytest.mark.parametrize("steps", ["²:³", "١:٢", "5:2", "3", "a:b", "1:1"])
def test_profile_steps_takes_ascii_a_lt_b_only(steps, capsys):
    with pytest.raises(SystemExit) as e:
        run.parse_args(["--recipe", "qwen3_moe_proxy", "--profile-steps", steps])
    assert e.value.code == 2 and "--profile-steps" in capsys.readouterr().err


def test_output_dir_that_is_a_symlink_loop_is_named_as_such(tmp_path, capsys):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    code, out, err = call(run.main, ["--recipe", "qwen3_moe_proxy", "--dryrun", "--output-dir", str(loop)], capsys)
    assert code == 2 and "symbolic-link loop" in err and "File exists" not in err


def test_malformed_architecture_file_is_named_not_blamed_on_the_network(tmp_path, capsys):
    folder = tmp_path / "Qwen--Qwen3-30B-A3B"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    code, _, err = call(cli.main, ["plan", "--recipe", "qwen3_30b_a3b", "--hf-config-dir", str(tmp_path)], capsys)
    assert code == 2 and "config.json" in err and "JSONDecodeError" in err and "network" not in err, err


def test_doctor_smoke_without_gpus_is_one_line_on_stderr(capsys):
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine can run the smoke check (a GPU node): nothing to refuse")
    code, out, err = call(cli.main, ["doctor", "--smoke"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "smoke check cannot run" in err


REAL_PROCESS_CASES = [
    (["-m", "mbridge_ep_overlap", "plan", "--set", "model.nope=1"], "unknown override"),
    (["scripts/run_script.py", "--recipe", "qwen3_moe_proxy", "--dryrun", "--output-dir", "{tmp}/o", "model.nope=1"],
     "unknown override"),
    (["scripts/run_script.py", "--recipe", "ep_overlap_no_such_module:f", "--dryrun", "--output-dir", "{tmp}/o"],
     "unknown recipe module"),
    (["scripts/launch_slurm.py", "--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2", "--dryrun",
      "model.nope=1"], "unknown override"),
]


@pytest.mark.parametrize("argv,needle", REAL_PROCESS_CASES,
                         ids=["plan", "run_script", "run_script-module", "launch_slurm"])
def test_bad_usage_is_one_line_in_a_real_process(argv, needle, tmp_path):
    """In a fresh interpreter importing Megatron prints ~25 warning lines on stderr (no TE, APEX or
    CUDA here) and megatron.training routes the root logger to stdout at INFO (MB's model modules
    log there while they are imported); an in-process test never sees them (once per process). Bad
    usage found after that import must still be exactly one line, and stdout empty."""
    import sys

    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    env = {k: v for k, v in os.environ.items() if k not in ("EP_OVERLAP_VERBOSE", "PYTHONWARNINGS")}
    result = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr[-3000:]
    assert result.stdout == "", result.stdout[-2000:]


MALFORMED_RECIPES = [":", "a:", ":f", "a.:f", "a..b:f", "1mod:f", "mod:1f", "mod:f:g", "mod:f ", " mod:f", "mod-x:f"]


def test_a_malformed_module_function_is_refused_before_megatron_is_imported(tmp_path):
    """MODULE:FUNCTION is checked as text first: bad usage in well under a second, not after the ~12 s
    Megatron import - for plan, run_script.py and launch_slurm.py alike."""
    script = textwrap.dedent(f"""
        import json, sys, time
        from mbridge_ep_overlap.tools import cli, run, slurm
        start, codes = time.perf_counter(), []
        for bad in {MALFORMED_RECIPES!r}:
            codes += [cli.main(["plan", "--recipe", bad]),
                      run.main(["--recipe", bad, "--dryrun", "--output-dir", {str(tmp_path / "o")!r}]),
                      slurm.main(["--recipe", bad, "--nodes", "1", "--dryrun"])]
        print(json.dumps({{"codes": codes, "seconds": time.perf_counter() - start,
                          "imported": [m for m in ("torch", "megatron") if m in sys.modules]}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["codes"] == [2] * 3 * len(MALFORMED_RECIPES), result.stderr[-2000:]
    assert answer["imported"] == [] and answer["seconds"] < 1.0, answer
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3 * len(MALFORMED_RECIPES) and all("malformed recipe" in line for line in lines), lines


SECTIONS = ["model", "train", "optimizer", "ddp", "dist", "scheduler"]


@pytest.mark.parametrize("section", SECTIONS)
def test_a_recipe_section_of_the_wrong_type_is_bad_usage(section, tmp_path, monkeypatch, capsys):
    """cfg.train = None is the same usage error as cfg.model = None (exit 2, one line naming the
    section), not a refusal of batch sizes nor MB's AttributeError; an override replacing the section
    (``--set train=None``) is bad usage too."""
    name = f"ep_overlap_probe_section_{section}"
    (tmp_path / f"{name}.py").write_text(
        "def k():\n    from mbridge_ep_overlap.spec import resolve_recipe\n"
        f"    cfg = resolve_recipe('qwen3_moe_proxy').config()\n    cfg.{section} = None\n    return cfg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for argv in (["--recipe", f"{name}:k"], ["--set", f"{section}=None"]):
        code, out, err = call(cli.main, ["plan", "--gpu", "h200", "--num-gpus", "2", *argv], capsys)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and section in err, (argv, err)


@pytest.mark.parametrize("flag,value", [("--te", "2.18 "), ("--te", " 2.18"), ("--te", "2.18\n"), ("--te", "2.18\t"),
                                        ("--te", "v2.18"), ("--te", "2.18 .0"), ("--deep-ep", "1.2.1 "),
                                        ("--deep-ep", "\u00a01.2.1")])
def test_a_version_flag_is_strict_pep440_without_blanks(flag, value, capsys):
    code, out, err = call(cli.main, ["plan", flag, value], capsys)
    assert code == 2 and out == "" and flag in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("value,ok", [("2.18.0", True), ("2.18", True), ("2.18.0+15288857", True), ("2.18.0rc1", True),
                                      ("2.18 ", False), ("\t2.18", False), ("v2.18", False), ("two", False)])
def test_described_versions_are_checked_the_same_way(value, ok):
    from mbridge_ep_overlap import UsageError, describe

    if ok:
        assert describe("h100", 2, te_version=value).te_version == value
    else:
        with pytest.raises(UsageError, match="te_version"):
            describe("h100", 2, te_version=value)


# ---- the Slurm script: quoted or refused, and proven by running it with stubs ---------------------
INJECT = "$(touch {m}) `touch {m}`; touch {m} && touch {m} | touch {m}"


@pytest.mark.parametrize("value", ["batch\ntouch /tmp/x", "a b", "a\tb", "'a'", '"a"', "a\\b", "", "x\0y",
                                   INJECT.format(m="/tmp/m")])
@pytest.mark.parametrize("flag", ["--partition", "--account", "--job-name", "--time", "--log-dir"])
def test_unsafe_sbatch_value_is_refused(flag, value, capsys):
    """sbatch cuts an #SBATCH value at the first blank and does not unquote it like a shell: a value
    that is not one plain word would be cut short or start a line of its own."""
    code, out, err = call(slurm.main, ["--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2",
                                       flag, value, "--dryrun"], capsys)
    assert code == 2 and flag in err and out == "" and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("value,ok", [("30", True), ("30:00", True), ("01:00:00", True), ("2-00", True),
                                      ("2-12:30", True), ("1-00:00:00", True), ("UNLIMITED", True),
                                      ("1 day", False), ("1h", False), ("١:٢", False), ("-1", False), ("1:2:3:4", False),
                                      ("99:99:99", False), ("0", False)])
def test_slurm_time_format(value, ok, capsys, tmp_path):
    code, out, err = call(slurm.main, ["--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2",
                                       "--time", value, "--dryrun", "--log-dir", str(tmp_path)], capsys)
    if ok:
        assert code == 0 and f"#SBATCH --time={value}\n" in out, err
    else:
        assert code == 2 and "--time" in err and out == "", err


def test_launch_slurm_typo_is_its_own_usage_error(capsys):
    code, _, err = call(slurm.main, ["--recipe", "qwen3_moe_proxy", "--nodez", "1"], capsys)
    assert code == 2 and err.startswith("launch_slurm.py: error:")


def _stub(bindir: Path, name: str, log: Path) -> None:
    path = bindir / name
    path.write_text(f'#!/bin/bash\nprintf "%s\\n" "{name}" "$@" >> {log}\n'
                    + ('echo node0\n' if name == "scontrol" else "") + 'exec "$@" 2>/dev/null || true\n'
                    if name == "srun" else f'#!/bin/bash\nprintf "%s\\n" "{name}" "$@" >> {log}\n'
                    + ('echo node0\n' if name == "scontrol" else ""))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_generated_job_script_never_runs_injected_text(tmp_path, capsys):
    marker = tmp_path / "INJECTED"
    payload = INJECT.format(m=marker)
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    code, script, err = call(slurm.main, [
        "--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2", "--dryrun",
        "--partition", "batch", "--account", "acct-1", "--job-name", "job_1",
        "--container-image", f"img; {payload}", "--container-mounts", f"/a:/b,{payload}",
        "--workdir", str(workdir), "--log-dir", str(tmp_path / "logs"), f"checkpoint.save='/ckpt/{payload}'"], capsys)
    assert code == 0, err
    bindir, calls = tmp_path / "bin", tmp_path / "calls.log"
    bindir.mkdir()
    for name in ("srun", "torchrun", "scontrol", "sbatch"):
        _stub(bindir, name, calls)
    job = tmp_path / "job.sbatch"
    job.write_text(script)
    result = subprocess.run(["bash", str(job)], env={"PATH": f"{bindir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "node0",
                                                     "SLURM_NNODES": "1", "SLURM_JOB_ID": "1"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), "injected text ran"
    recorded = calls.read_text()
    assert f"--container-image=img; {payload}" in recorded  # one argument, verbatim
    spec = tmp_path / "logs" / "job_1.spec.json"  # the override reaches the job as data, in its spec file
    assert f"scripts/run_script.py\n--spec\n{spec}\n" in recorded
    assert json.loads(spec.read_text())["overrides"] == [f"checkpoint.save='/ckpt/{payload}'"]


# ---- property-based: random flags and overrides, the exit-code contract holds -------------------
SIZE = st.one_of(st.integers(-3, 40), st.sampled_from(["0", "abc", "-1", "2.5", "[1,2]", "", "${x}", "None"]))
FIELDS = ["model.tensor_model_parallel_size", "model.pipeline_model_parallel_size", "model.expert_model_parallel_size",
          "model.num_moe_experts", "model.moe_router_topk", "model.num_layers", "model.seq_length",
          "model.recompute_granularity", "model.recompute_modules", "model.mtp_num_layers", "train.global_batch_size",
          "train.micro_batch_size", "mixed_precision", "model.moe_token_dispatcher_type", "env_vars.X",
          "model.virtual_pipeline_model_parallel_size", "model", "train", "model.nope", "+model.x", "a..b", "=1"]
OVERRIDE = st.builds(lambda k, v: f"{k}={v}", st.sampled_from(FIELDS), st.one_of(SIZE.map(str), st.text(max_size=8)))
FLAG = st.one_of(
    st.tuples(st.sampled_from(["--tp", "--pp", "--ep", "--vpp", "--num-gpus", "--global-batch-size",
                               "--micro-batch-size"]), SIZE.map(str)),
    st.tuples(st.sampled_from(["--dispatcher", "--gpu", "--te", "--resolve", "--ep-overlap", "--a2a-priority"]),
              st.sampled_from(["alltoall", "deepep", "hybridep", "ncclep", "auto", "h100", "gb300", "none", "2.18.0",
                               "auto", "off", "on", "high", "x"])),
    st.tuples(st.just("--delay-wgrad"), st.sampled_from(["on", "off"])),
)
CONTRACT = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                    derandomize=True)


def _argv(flags, overrides):
    return [a for f in flags for a in f] + list(overrides)


@CONTRACT
@given(flags=st.lists(FLAG, max_size=3), overrides=st.lists(OVERRIDE, max_size=3))
def test_plan_keeps_the_exit_code_contract(flags, overrides, capsys):
    code, _, err = call(cli.main, ["plan", *_argv(flags, overrides)], capsys)
    assert code in (0, 1, 2)
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err


@CONTRACT
@given(flags=st.lists(FLAG, max_size=3), overrides=st.lists(OVERRIDE, max_size=3))
def test_run_script_keeps_the_exit_code_contract(flags, overrides, tmp_path_factory, capsys):
    out_dir = tmp_path_factory.mktemp("run")
    code, _, err = call(run.main, ["--recipe", "qwen3_moe_proxy", *_argv(flags, overrides), "--dryrun",
                                   "--output-dir", str(out_dir)], capsys)
    assert code in (0, 1, 2)
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err


@CONTRACT
@given(flags=st.lists(FLAG, max_size=2), overrides=st.lists(OVERRIDE, max_size=2),
       partition=st.sampled_from(["batch", "a b", "x;y", "$(id)", "`id`", "p\nq", ""]), nodes=st.integers(-1, 3))
def test_launch_slurm_keeps_the_exit_code_contract(flags, overrides, partition, nodes, capsys):
    argv = ["--recipe", "qwen3_moe_proxy", "--nodes", str(nodes), "--gpus-per-node", "2", "--partition", partition,
            *_argv(flags, overrides), "--dryrun"]
    code, out, err = call(slurm.main, argv, capsys)
    assert code in (0, 1, 2)
    if code == 0:
        assert "\n" not in partition and out.startswith("#!/bin/bash\n")


LOG_LINE = st.builds(
    lambda it, ms, loss, sk, nan: (f"iteration {it:8d}/      10 | elapsed time per iteration (ms): {ms} | lm loss: {loss} | "
                                   f"number of skipped iterations: {sk} | number of nan iterations: {nan} |"),
    st.integers(0, 20), st.sampled_from(["100.0", "1e3", "5"]), st.sampled_from(["1.0", "1.2.3", "nan", "inf", "-2", "x"]),
    st.integers(0, 2), st.integers(0, 2))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], derandomize=True)
@given(lines=st.lists(st.one_of(LOG_LINE, st.text(max_size=40)), max_size=12), two=st.booleans())
def test_verify_log_keeps_the_exit_code_contract(lines, two, tmp_path_factory, capsys):
    folder = tmp_path_factory.mktemp("logs")
    a = folder / "a.log"
    a.write_text("\n".join(lines))
    code, _, _ = call(cli.main, ["verify-log", str(a), *([str(FIXTURES / "baseline_off.log")] if two else [])], capsys)
    assert code in (0, 1, 2)


def test_the_api_refuses_what_is_not_a_config_or_a_target(proxy_cfg):
    from mbridge_ep_overlap import UsageError, check_ep_overlap, describe, enable_ep_overlap

    for bad in (None, {}, proxy_cfg.model):
        with pytest.raises(UsageError, match="ConfigContainer"):
            enable_ep_overlap(bad)
    with pytest.raises(UsageError, match="ConfigContainer"):
        check_ep_overlap({})
    with pytest.raises(UsageError, match="ClusterEnvironment"):
        enable_ep_overlap(proxy_cfg, environment="h100")
    with pytest.raises(UsageError, match="GPU"):
        describe(None, 8)
    with pytest.raises(UsageError, match="number of GPUs"):
        describe("h100", True)
    with pytest.raises(UsageError, match="cuda_device_max_connections"):
        enable_ep_overlap(proxy_cfg, cuda_device_max_connections=True)
    proxy_cfg.env_vars = None  # a recipe may leave it None: enable creates the dict
    enable_ep_overlap(proxy_cfg, environment=describe("h200", 2, te_version=""))
    assert proxy_cfg.env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"


def test_an_override_mends_a_recipe_value(tmp_path, monkeypatch, capsys):
    """The values judged are the ones the run gets: a recipe's malformed value mended by an override
    is accepted; left as it is, it is refused with every violation (exit 1)."""
    (tmp_path / "ep_overlap_probe_mbs0.py").write_text(
        "def k():\n    from mbridge_ep_overlap.spec import resolve_recipe\n"
        "    cfg = resolve_recipe('qwen3_moe_proxy').config()\n    cfg.train.micro_batch_size = 0\n    return cfg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["plan", "--recipe", "ep_overlap_probe_mbs0:k", "--gpu", "h200", "--num-gpus", "2"]
    code, out, err = call(cli.main, [*argv, "--set", "train.micro_batch_size=2"], capsys)
    assert code == 0, out + err
    code, out, err = call(cli.main, argv, capsys)
    assert code == 1 and "batch-sizes" in out + err and "EP overlap refused" in out + err


def test_overlap_off_with_hybridep_gets_its_topology_and_the_node_verdict(capsys):
    """With overlap off a flex backend is set up and judged as with it on: HybridEP's topology
    variables, and a backend that failed this node's smoke check is refused."""
    from mbridge_ep_overlap.pipeline import build
    from mbridge_ep_overlap.spec import RunSpec, TargetSpec
    from mbridge_ep_overlap.target.cluster import describe

    spec = RunSpec(recipe="qwen3_moe_proxy", ep_overlap=False, dispatcher="hybridep",
                   target=TargetSpec(gpu="h200", num_gpus=2, deep_ep="1.2.1"))
    built = build(spec)
    assert built.cfg.model.moe_flex_dispatcher_backend == "hybridep"
    assert {k: built.cfg.env_vars[k] for k in ("USE_MNNVL", "NVLINK_DOMAIN_SIZE")} == {"USE_MNNVL": "0",
                                                                                        "NVLINK_DOMAIN_SIZE": "8"}
    sick = describe("h200", 2, deep_ep_version="1.2.1")
    sick = type(sick)(**{**sick.__dict__, "dispatcher_health": {"hybridep": "crashed (SIGSEGV) in HybridEPBuffer init",
                                                               "hybridep:USE_MNNVL=0": "crashed (SIGSEGV) in HybridEPBuffer init"}})
    from mbridge_ep_overlap import EPOverlapError

    with pytest.raises(EPOverlapError, match="dispatcher-healthy"):
        build(spec, target=sick)


def test_a_dispatcher_for_a_model_without_experts_is_bad_usage(monkeypatch, tmp_path, capsys):
    (tmp_path / "ep_overlap_probe_dense.py").write_text(
        "def k():\n    from mbridge_ep_overlap.spec import resolve_recipe\n"
        "    cfg = resolve_recipe('qwen3_moe_proxy').config()\n    cfg.model.num_moe_experts = None\n    return cfg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = call(cli.main, ["plan", "--recipe", "ep_overlap_probe_dense:k", "--gpu", "h100", "--num-gpus", "2",
                                     "--ep-overlap", "off", "--dispatcher", "deepep"], capsys)
    assert code == 2 and "no experts" in err, out + err


@pytest.mark.parametrize("line,rule", [("cfg.env_vars = 'A=1'", "env-vars-type"),
                                       ("cfg.model.expert_model_parallel_size = 'two'", "parallel-sizes")])
def test_a_recipe_value_enable_must_read_first_is_refused_by_its_rule(line, rule, tmp_path, monkeypatch, capsys):
    """Values enable reads while configuring (env_vars, the EP size) are named by their value rule
    (exit 1), not an AttributeError from inside the configuration."""
    name = f"ep_overlap_probe_bad_{rule.replace('-', '_')}"  # one module per case (imports are cached)
    (tmp_path / f"{name}.py").write_text(
        "def k():\n    from mbridge_ep_overlap.spec import resolve_recipe\n"
        f"    cfg = resolve_recipe('qwen3_moe_proxy').config()\n    {line}\n    return cfg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = call(cli.main, ["plan", "--recipe", f"{name}:k", "--gpu", "h200",
                                     "--num-gpus", "2", "--dispatcher", "hybridep", "--deep-ep", "1.2.1"], capsys)
    assert code == 1 and rule in out + err, out[-2000:] + err[-2000:]


@pytest.mark.parametrize("elapsed", ["0.0", "1.2.3"])
def test_verify_log_with_a_zero_or_malformed_elapsed_time_gives_a_verdict(elapsed, tmp_path, capsys):
    lines = (FIXTURES / "baseline_off.log").read_text().splitlines()
    bad = [re.sub(r"elapsed time per iteration \(ms\): [^\s|]+", f"elapsed time per iteration (ms): {elapsed}", x)
           for x in lines]
    cand = tmp_path / "cand.log"
    cand.write_text("\n".join(bad) + "\n")
    code, out, _ = call(cli.main, ["verify-log", str(FIXTURES / "baseline_off.log"), str(cand)], capsys)
    assert code in (0, 1) and "speedup" in out


def test_a_recipe_raising_any_base_exception_is_bad_usage(tmp_path, monkeypatch, capsys):
    (tmp_path / "ep_overlap_probe_genexit.py").write_text("def f():\n    raise GeneratorExit('odd')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = call(cli.main, ["plan", "--recipe", "ep_overlap_probe_genexit:f", "--gpu", "h200", "--num-gpus", "2"],
                        capsys)
    assert code == 2 and "GeneratorExit" in err and len(err.strip().splitlines()) == 1
