"""What the plan says (tools.plan_report), for plan, run_script.py --dryrun and launch_slurm.py alike:
the verdict first, what changed and why, only the rules that fail, advise or could not be checked
(all with --rules); the report on stdout, refusals included; the libraries' warnings on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from mbridge_ep_overlap.core.rules import RULES

from mbridge_ep_overlap.tools import cli, run, slurm

PROXY = "qwen3_moe_proxy on described: 2x h200: "

# plan flags, exit code, what the first line starts with, what stdout must say, what it must not say
PLAN_ROWS = [
    ([], 0, PROXY + "ACCEPTED with EP overlap on (alltoall): the alltoall dispatch and combine hidden behind "
                    "expert compute of 4 microbatches",
     ["what changed (field: old -> new, why):", "comm_overlap.overlap_moe_expert_parallel_comm: None -> True",
      "rules that fail, advise or could not be checked (", "--rules lists all", "num_microbatches: 4"],
     ["full-recompute", "  pass  "]),
    (["--rules"], 0, PROXY + "ACCEPTED with EP overlap on", [f"rules ({len(RULES)}):", "full-recompute", "  pass  ", "  n/a  "], []),
    (["--num-gpus", "8", "--ep", "8"], 0,
     "qwen3_moe_proxy on described: 8x h200: ACCEPTED with EP overlap on (alltoall) - but 1 microbatch per rank: "
     "overlap has nothing to pair (global_batch_size 16 / (micro_batch_size 2 x data-parallel size 8))",
     ["raise global_batch_size to 32 or more (--resolve auto does)"], ["hidden behind"]),
    (["--num-gpus", "8", "--ep", "8", "--resolve", "auto"], 0,
     "qwen3_moe_proxy on described: 8x h200: ACCEPTED with EP overlap on (alltoall): the alltoall dispatch and combine "
     "hidden behind expert compute of 2 microbatches",
     ["train.global_batch_size: 16 -> 32  (set by resolve: microbatches:", "global_batch_size: 32  (set by resolve)",
      "num_microbatches: 2  (set by resolve)"], ["nothing to pair"]),
    (["--ep-overlap", "off"], 0, PROXY + "ACCEPTED with EP overlap off (as asked)",
     ["no overlap plan", "overlap_moe_expert_parallel_comm: False"], ["what changed"]),
    (["--dispatcher", "hybridep"], 0, PROXY + "ACCEPTED with EP overlap on (hybridep)",
     ["model.moe_token_dispatcher_type: alltoall -> flex", "dispatcher  : hybridep (requested)"], []),
    (["--set", "model.mtp_num_layers=2"], 1, PROXY + "REFUSED", ["[error] mtp-layers:", "Fix: set model.mtp_num_layers"],
     ["what changed", "finalized by"]),
    (["--set", "model.mtp_num_layers=2", "--set", "model.recompute_granularity=selective",
      "--set", "model.recompute_modules=[moe]"], 1, PROXY + "REFUSED", ["mtp-layers", "moe-recompute", "2 violation(s)"], []),
    # a rule about several fields shows each field with its value, not a list of field names
    (["--te", "none", "--set", "model.moe_permute_fusion=true"], 1, PROXY + "REFUSED",
     ["te-features-need-te", "= {'model.moe_permute_fusion': True}"], ["['moe_permute_fusion']"]),
]


@pytest.mark.parametrize("flags,code,first,needles,absent", PLAN_ROWS, ids=[" ".join(r[0]) or "default" for r in PLAN_ROWS])
def test_plan_report(flags, code, first, needles, absent, capsys):
    got = cli.main(["plan", "--no-predict", *flags])
    out, err = capsys.readouterr()
    assert got == code, out[-3000:] + err[-3000:]
    lines = [line for line in out.splitlines() if not line.startswith("INFO:")]  # megatron's root logger in-process
    assert lines[0].startswith(first), lines[0]
    for needle in needles:
        assert needle in out, (needle, out[-3000:])
    for needle in absent:
        assert needle not in out, (needle, out[-3000:])
    assert "Traceback" not in out + err


def test_rules_shown_by_default_are_exactly_those_not_passing(capsys):
    assert cli.main(["plan", "--no-predict", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rules"]
    loud = [r["rule"] for r in rows if r["status"] not in ("pass", "n/a")]
    assert cli.main(["plan", "--no-predict"]) == 0
    out = capsys.readouterr().out
    section = out.split("rules that fail, advise or could not be checked", 1)[1].split("\n\n", 1)[0]
    shown = [line.split()[0] for line in section.splitlines()[1:] if line.startswith("  ") and not line.startswith("   ")]
    assert shown == loud and f"({len(loud)} of {len(rows)};" in section


def test_the_verdict_carries_the_prediction_when_one_is_made(capsys):
    assert cli.main(["plan", "--recipe", "qwen3_30b_a3b", "--predict", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)["prediction"]
    assert cli.main(["plan", "--recipe", "qwen3_30b_a3b", "--predict"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("qwen3_30b_a3b on described: 16x h100: ACCEPTED with EP overlap on (alltoall)"), first
    assert f"predicted {p['off_step_s']:.4g} s -> {p['on_step_s']:.4g} s per step ({p['speedup']:.3f}x)" in first


def test_advice_says_why_and_where_measurements_come_from(capsys):
    """The advice beside a predicted 1.5x said 'predicted to gain little' and quoted 2x H200 numbers for
    a 16x H100 target; the reason is in the value found (another dispatcher predicted faster)."""
    assert cli.main(["plan", "--recipe", "qwen3_30b_a3b", "--predict"]) == 0
    out = capsys.readouterr().out
    advice = out[out.index("predicted-gain-alltoall"):].split("\n\n", 1)[0]
    assert "gain little" not in advice and "0.88-1.02x" not in advice
    assert "found: model.moe_token_dispatcher_type = deepep predicted" in advice and "on 2x H200 only" in advice


def test_a_created_comm_overlap_shows_the_values_the_run_gets(capsys):
    """The JSON showed the EP flags of a created CommOverlapConfig as None (its state when created)."""
    assert cli.main(["plan", "--no-predict", "--json"]) == 0
    changes = json.loads(capsys.readouterr().out)["plan"]["changes"]
    created = next(c for c in changes if c["path"] == "comm_overlap")
    assert created["new"] == {"type": "CommOverlapConfig", "overlap_moe_expert_parallel_comm": True,
                              "delay_wgrad_compute": False}
    assert cli.main(["plan", "--no-predict"]) == 0
    assert ("comm_overlap: None -> CommOverlapConfig(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=False)"
            in capsys.readouterr().out)


def _report(out: str) -> list[str]:
    return [line for line in out.splitlines() if not line.startswith(("INFO:", "config: "))]


@pytest.mark.parametrize("flags,code", [([], 0), (["--dispatcher", "hybridep"], 0), (["--set", "model.mtp_num_layers=2"], 1)],
                         ids=["accepted", "hybridep", "refused"])
def test_one_layout_for_plan_dryrun_and_slurm(flags, code, tmp_path, capsys):
    """The same report, on stdout, from all three; launch_slurm.py writes it as comment lines of the job.
    All three are given the GPUs (launch_slurm.py by its node flags): the finalized data-parallel size
    is then "requested" in each."""
    gpus = ["--gpu", "h200", "--num-gpus", "2"]
    assert cli.main(["plan", "--no-predict", *gpus, *flags]) == code
    plan = _report(capsys.readouterr().out)
    assert run.main(["--recipe", "qwen3_moe_proxy", "--dryrun", "--output-dir", str(tmp_path), *gpus, *flags]) == code
    out, err = capsys.readouterr()
    assert _report(out) == plan, (out[-2000:], err[-2000:])
    assert slurm.main(["--recipe", "qwen3_moe_proxy", "--nodes", "1", "--gpus-per-node", "2", "--gpu", "h200",
                       "--dryrun", "--log-dir", str(tmp_path / "logs"), *flags]) == code
    out, err = capsys.readouterr()
    if code:
        assert _report(out) == plan and "launch_slurm.py:" in err and "#!/bin/bash" not in out
        return
    script = out.splitlines()
    assert script[0] == "#!/bin/bash" and script[1].startswith("#SBATCH --job-name="), script[:3]
    at = next(i for i, line in enumerate(script) if i and not line.startswith("#SBATCH"))
    assert [line[2:] for line in script[at:at + len(plan)]] == plan  # after the #SBATCH header, before any command
    assert all(line.startswith("#") for line in script[:at + len(plan)]) and any(line.startswith("srun") for line in script)


@pytest.mark.parametrize("flags", [["--rules"], ["--predict"]])
def test_report_flags_of_a_dry_run_are_refused_when_training(flags, capsys):
    with pytest.raises(SystemExit) as e:
        run.main(["--recipe", "qwen3_moe_proxy", *flags])
    assert e.value.code == 2 and "applies to a --dryrun" in capsys.readouterr().err


# --- the libraries' warnings -----------------------------------------------------------------------
def _collect(action):
    from mbridge_ep_overlap.runtime.upstream_warnings import Collector

    c = Collector().start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = c._show  # catch_warnings restored the original; the collector's is wanted
            action()
    finally:
        c.stop()
    return c


def _import_module_that_warns(tmp_path, name):
    (tmp_path / f"{name}.py").write_text("import warnings\nwarnings.warn('Apex is not installed. Falling back')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        __import__(name)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def _root_warning():
    import logging

    logging.getLogger().warning("Disabling tensor parallel communication overlap due to TP size < 2.")


def _own_handler_warning():
    """As transformers logs: its library logger has its own stderr handler and does not propagate."""
    import io
    import logging

    library = logging.getLogger("transformers")
    printed = io.StringIO()
    handler = logging.StreamHandler(printed)
    library.addHandler(handler)
    saved = library.propagate
    library.propagate = False
    try:
        logging.getLogger("transformers.configuration_utils").warning("`torch_dtype` is deprecated! Use `dtype` instead!")
    finally:
        library.removeHandler(handler)
        library.propagate = saved
    assert printed.getvalue() == ""  # collected, not printed by the library's handler


WARNING_ROWS = [  # what is raised, import noise count, the warnings about the run (message part -> count)
    ("import", 1, {}),
    ("runtime", 0, {"UserWarning: moe_hybridep_num_sms is deprecated": 1}),
    ("runtime-twice", 0, {"UserWarning: moe_hybridep_num_sms is deprecated": 2}),
    ("root-logger", 0, {"warning from root: Disabling tensor parallel communication overlap": 1}),
    ("both", 1, {"UserWarning: moe_hybridep_num_sms is deprecated": 1}),
    ("own-handler", 0, {"warning from transformers.configuration_utils: `torch_dtype` is deprecated": 1}),
]


@pytest.mark.parametrize("kind,noise,about", WARNING_ROWS, ids=[r[0] for r in WARNING_ROWS])
def test_warnings_split_into_import_noise_and_warnings_about_the_run(kind, noise, about, tmp_path):
    def action():
        if kind in ("import", "both"):
            _import_module_that_warns(tmp_path, f"ep_overlap_warns_{kind.replace('-', '_')}")
        if kind in ("runtime", "both", "runtime-twice"):
            for _ in range(2 if kind == "runtime-twice" else 1):
                warnings.warn("moe_hybridep_num_sms is deprecated. Use moe_flex_dispatcher_num_sms instead.")
        if kind == "root-logger":
            _root_warning()
        if kind == "own-handler":
            _own_handler_warning()

    c = _collect(action)
    assert len(c.import_noise) == noise
    assert {next(k for k in about if k in text): n for text, n in c.about_run.items()} == about
    summary = "\n".join(c.summary())
    assert (f"({noise} warnings from importing Megatron" in summary) == bool(noise)
    assert ("raised about this config" in summary) == bool(about)
    if kind == "runtime-twice":
        assert "(2 times)" in summary


@pytest.mark.parametrize("verbose", [False, True], ids=["default", "-v"])
def test_the_real_command_collapses_import_noise_unless_verbose(verbose, tmp_path):
    argv = [sys.executable, "-m", "mbridge_ep_overlap", *(["-v"] if verbose else []), "plan", "--no-predict"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith(PROXY + "ACCEPTED"), r.stdout[:500]
    if verbose:
        assert "warnings.warn(" in r.stderr and "warnings from importing Megatron" not in r.stderr
    else:
        assert "warnings.warn(" not in r.stderr and "warnings from importing Megatron on this machine" in r.stderr
        assert "raised about this config" in r.stderr and "-v or EP_OVERLAP_VERBOSE=1" in r.stderr
        assert "[transformers]" not in r.stderr  # its own handler's line is collected with the rest
    assert "Traceback" not in r.stderr and "UserWarning" not in r.stdout
