"""``bench tune`` on CPU: the search over fake torchrun launches (synthetic run summaries), the
files it writes, the NCCL per-process-group YAML against Megatron-Core's own reader, and every
knob option through run_script's dry run (MB's real finalize)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from mbridge_ep_overlap.base.errors import UsageError
from mbridge_ep_overlap.lab import bench, tune
from mbridge_ep_overlap.lab.launch import Run

OFF_S, OVERLAP_S = 4.5, 3.4
# effect of each setting on the fake run: (seconds per step, peak factor, loss perturbation)
EFFECTS = {
    "model.high_priority_a2a_comm_stream=true": (-0.05, 1.0, 0.0),
    "nccl:min_ctas=16": (-0.10, 1.0, 0.0),
    "nccl:cga_cluster_size=1": (-0.02, 1.0, 0.0),
    "nccl:max_ctas=4": (+0.05, 1.0, 0.0),
    "mbs=1": (-0.20, 0.9, 0.5),                      # faster, but its losses differ
    "env:CUDA_DEVICE_MAX_CONNECTIONS=8": (-0.10, 1.1, 0.0),  # faster, but 10% more memory
    "model.ep_overlap_early_attn_memory_release=true": (0.0, 0.95, 0.0),
}


class FakeCluster:
    """Stands in for ``launch.launch``: reads the spec file (``run_script.py --spec``), the other
    run_script flags, environment and NCCL YAML a real job would get, and returns the summary such a
    job would write."""

    def __init__(self, tmp: Path, run_s: float = 80.0):
        self.now, self.run_s, self.tmp = 0.0, run_s, tmp
        self.calls: list[dict] = []

    def clock(self) -> float:
        return self.now

    def launch(self, name, nproc, args, timeout_s=420, env=None, log_root=None, script="scripts/run_script.py"):
        self.now += self.run_s
        folder = Path(log_root) / name
        folder.mkdir(parents=True, exist_ok=True)
        spec = json.loads(Path(args[args.index("--spec") + 1]).read_text())
        overrides = list(spec["overrides"])
        keys = list(overrides)
        mbs = int(spec["micro_batch_size"])
        for o in overrides:
            if o.startswith("train.micro_batch_size="):
                mbs = int(o.split("=")[1])
        if mbs == 1:
            keys.append("mbs=1")
        nccl = {}
        for o in overrides:
            if o.startswith("dist.nccl_communicator_config_path="):
                nccl = yaml.safe_load(Path(o.split("=", 1)[1]).read_text())
                keys += [f"nccl:{k}={v}" for k, v in nccl["ep"].items()]
        keys += [f"env:{k}={v}" for k, v in (env or {}).items()]
        on = spec["ep_overlap"]
        step, peak, dloss = (OVERLAP_S, 43.6, 0.0) if on else (OFF_S, 38.1, 0.0)
        for key in keys:
            d, f, dl = EFFECTS.get(key, (0.0, 1.0, 0.0))
            step, peak, dloss = step + d, peak * f, dloss + dl
        self.calls.append({"name": name, "args": list(args), "spec": spec, "env": dict(env or {}), "nccl": nccl, "step": step})
        steps = [{"iteration": i, "loss": 10 - 0.1 * i + (dloss if i == 4 else 0.0), "skipped": False,
                  "step_time_s": step * (1.3 if i == 0 else 1.0)} for i in range(8)]
        compute = 2.77 if on else 2.62
        eff = {"iterations": 2, "a2a_s": 2 * 2.0, "comm_s": 2 * 2.03, "compute_s": 2 * compute,
               "hidden_s": 2 * (1.6 if on else 0.0), "exposed_s": 2 * (0.4 if on else 2.0),
               "hidden_fraction": 0.8 if on else 0.0, "ideal_step_s": compute, "measured_step_s": step + 0.05,
               "idle_step_s": 0.2 if on else 0.45,
               "phases": {"inside": {"a2a_only": 0.30, "idle": 0.05}, "outside": {"a2a_only": 0.10},
                          "first_forward_s": 0.2, "last_backward_s": 0.2, "outside_step_s": 0.5} if on else None}
        summary = {"finalized": {"hidden_size": 2048, "num_attention_heads": 32, "kv_channels": 128,
                                 "moe_ffn_hidden_size": 3072, "moe_router_topk": 8, "num_moe_experts": 16,
                                 "micro_batch_size": mbs, "seq_length": 4096, "global_batch_size": 64},
                   "peak_memory_gib_per_rank": [peak, peak - 0.5], "profile": {"steps": [6, 8], "overlap_efficiency": eff},
                   "steps": steps}
        return Run(name, 0, False, self.run_s, folder, summary)


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    c = FakeCluster(tmp_path)
    monkeypatch.setattr(bench, "launch", c.launch)
    monkeypatch.setattr(bench, "cuda_device_count", lambda: 8)  # the GPU node the fake launches stand for
    return c


def run_tune(cluster, out, budget, **kw):
    return tune.tune("qwen3_moe_proxy", 2, "long-seq", "throttled", out, budget, clock=cluster.clock, te=False, **kw)


def test_greedy_search_order_disqualification_and_winner(cluster, tmp_path, capsys):
    o = run_tune(cluster, tmp_path / "t", 10_000)
    names = [t.name for t in o.trials]
    assert names == [
        "off", "overlap", "overlap+hiprio",
        # exposed all-to-all inside the span (0.30 s) > added compute (0.15 s): more CTAs first
        "overlap+hiprio+nccl.ep.min_ctas=16", "overlap+hiprio+nccl.ep.cga_cluster_size=1",
        "overlap+hiprio+nccl.ep.max_ctas=4",
        "overlap+hiprio+nccl.ep.min_ctas=16+mbs=1", "overlap+hiprio+nccl.ep.min_ctas=16+cdmc=8",
        "overlap+hiprio+nccl.ep.min_ctas=16+early_attn_release"]
    assert o.order[:2] == ["a2a_priority", "nccl_ep"] and o.order[-1] == "early_attn_release"
    assert o.skipped["flex_num_sms"].startswith("only for the flex") and "Transformer Engine" in o.skipped["permute_fusion"]
    status = {t.name: t.status for t in o.trials}
    assert status["off"] == "baseline" and status["overlap"] == "ok"
    assert status["overlap+hiprio+nccl.ep.min_ctas=16+mbs=1"].startswith("disqualified: losses differ")
    assert status["overlap+hiprio+nccl.ep.min_ctas=16+cdmc=8"].startswith("disqualified: peak")
    assert o.winner.name == "overlap+hiprio+nccl.ep.min_ctas=16" and o.stopped == ""
    # every candidate ran with the shape's flags, the same seed/data and its own settings
    mbs1 = next(c for c in cluster.calls if "mbs_1" in c["name"])
    assert (mbs1["spec"]["micro_batch_size"], mbs1["spec"]["global_batch_size"]) == (1, 64)
    cdmc = next(c for c in cluster.calls if "cdmc" in c["name"])
    assert cdmc["env"] == {"NCCL_P2P_DISABLE": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    assert "env_vars.CUDA_DEVICE_MAX_CONNECTIONS=8" in cdmc["spec"]["overrides"]
    assert all(c["args"][c["args"].index("--profile-steps") + 1] == "6:8" for c in cluster.calls)
    out = capsys.readouterr().out
    assert "| 1 | overlap+hiprio+nccl.ep.min_ctas=16 **(winner)** | 3.250 |" in out


def test_files_written_for_the_winner(cluster, tmp_path):
    out = tmp_path / "t"
    run_tune(cluster, out, 10_000)
    t = json.loads((out / "tuned.json").read_text())
    yaml_path = (out / "nccl_communicator.yaml").resolve()
    assert t["ep_overlap"] is True and t["dispatcher"] == "alltoall"
    assert t["changes"] == ["hiprio", "nccl.ep.min_ctas=16"]
    assert t["overrides"] == ["model.high_priority_a2a_comm_stream=true",
                              f"dist.nccl_communicator_config_path={yaml_path}"]
    assert t["env"] == {} and t["nccl_communicator"] == {"ep": {"min_ctas": 16, "max_ctas": 32}}
    assert yaml.safe_load(yaml_path.read_text()) == {"ep": {"max_ctas": 32, "min_ctas": 16}}
    m = t["measured"]
    assert m["off_s"] == pytest.approx(4.5) and m["tuned_s"] == pytest.approx(3.25)
    assert m["share_of_gain"] == pytest.approx((4.5 - 3.25) / (4.5 - 2.77))
    assert m["share_of_gain_off_ideal"] == pytest.approx((4.5 - 3.25) / (4.5 - 2.62))
    assert m["peak_vs_off"] == pytest.approx(43.6 / 38.1 - 1) and m["loss_max_rel_diff"] == 0
    assert "3.250 s" in t["advice"] and "72% of the possible gain" in t["advice"]
    assert (out / "tuned.overrides").read_text().splitlines() == t["overrides"]
    results = bench.load_results(out / "results.json")
    assert len(results) == 9 and results[0].variant == "off"
    md = (out / "benchmarks.md").read_text()
    assert "Best share of the possible gain: 72% (overlap+hiprio+nccl.ep.min_ctas=16, throttled" in md
    assert "(winner)" in (out / "tune.md").read_text() and "Knob order: a2a_priority, nccl_ep" in (out / "tune.md").read_text()
    # bench report of the tune folder compares the micro-batch-halved row with off too
    rows = bench.report([out], tmp_path / "rep", "t")
    mbs1 = next(r for r in rows if r.variant.endswith("mbs=1"))
    assert mbs1.speedup == pytest.approx(4.5 / 3.05) and mbs1.parity.startswith("MISMATCH")


def test_budget_stops_the_search_and_a_rerun_resumes(cluster, tmp_path, capsys):
    out = tmp_path / "t"
    o = run_tune(cluster, out, 300)  # 80 s per run: off, overlap, then one candidate (88 s estimated) fits
    assert [t.name for t in o.trials] == ["off", "overlap", "overlap+hiprio"]
    assert o.stopped.startswith("budget: the next run (overlap+hiprio+nccl.ep.min_ctas=16)")
    assert o.winner.name == "overlap+hiprio" and (out / "tuned.json").exists()
    launched = len(cluster.calls)
    o2 = run_tune(cluster, out, 10_000)
    assert [t.cached for t in o2.trials[:3]] == [True, True, True] and len(o2.trials) == 9
    assert len(cluster.calls) == launched + 6  # only what was missing
    assert "resuming, 3 runs already measured" in capsys.readouterr().out
    assert o2.winner.name == "overlap+hiprio+nccl.ep.min_ctas=16"


def test_baselines_run_even_past_the_budget(cluster, tmp_path):
    o = run_tune(cluster, tmp_path / "t", 10)
    assert [t.name for t in o.trials] == ["off", "overlap"] and o.stopped.startswith("budget")


def test_overlap_off_wins_where_overlap_is_slower(cluster, tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "OVERLAP_S", 4.8)  # tuned, still above off's 4.5
    o = run_tune(cluster, tmp_path / "t", 10_000)
    assert o.winner.name == "off"
    t = json.loads((tmp_path / "t" / "tuned.json").read_text())
    assert t["ep_overlap"] is False and t["overrides"] == [] and "keep overlap off" in t["advice"]
    assert (tmp_path / "t" / "tuned.overrides").read_text() == ""


def test_a_failed_overlap_baseline_ends_the_search(cluster, tmp_path, monkeypatch):
    real = cluster.launch

    def failing(name, nproc, args, **kw):
        run = real(name, nproc, args, **kw)
        if "overlap" in name:
            run.returncode, run.summary = 1, None
        return run

    monkeypatch.setattr(bench, "launch", failing)
    o = run_tune(cluster, tmp_path / "t", 10_000)
    assert o.winner is None and "did not qualify" in o.stopped and not (tmp_path / "t" / "tuned.json").exists()


def test_knob_order_follows_the_trace():
    names = list(tune.KNOBS)
    contention = {"contention_s": 0.3, "exposed_inside_s": 0.1, "edges_s": 0.2, "idle_inside_s": 0.05,
                  "exposed_outside_s": 0.1}
    assert tune.order_knobs(names, contention) == [
        "a2a_priority", "nccl_ep", "flex_num_sms", "microbatches", "cuda_device_max_connections", "permute_fusion",
        "delay_wgrad", "early_attn_release"]
    assert tune.order_knobs(names, {**contention, "te": True})[:2] == ["a2a_priority", "delay_wgrad"]
    edges = {"contention_s": 0.05, "exposed_inside_s": 0.05, "edges_s": 0.8, "idle_inside_s": 0.3}
    assert tune.order_knobs(names, edges)[:4] == ["a2a_priority", "microbatches", "cuda_device_max_connections", "nccl_ep"]
    assert tune.order_knobs(names, {})[0] == "a2a_priority" and tune.order_knobs(names, {})[-1] == "early_attn_release"


def test_nccl_options_order_and_applicability():
    from mbridge_ep_overlap.spec import RunSpec

    base = RunSpec(recipe="qwen3_moe_proxy", micro_batch_size=2)
    ctx = tune.Context(base=base, dispatcher="alltoall", best=tune.Candidate(), evidence={"contention_s": 0.3,
                       "exposed_inside_s": 0.1}, te=False)
    assert [c.label for c in tune.KNOBS["nccl_ep"](ctx)][0] == "nccl.ep.max_ctas=4"
    ctx.dispatcher = "hybridep"
    assert isinstance(tune.KNOBS["nccl_ep"](ctx), str)
    assert [c.label for c in tune.KNOBS["flex_num_sms"](ctx)] == ["flex_sms=16", "flex_sms=32"]
    assert tune.KNOBS["microbatches"](ctx)[0].spec == {"micro_batch_size": 1}
    ctx.best = ctx.best.with_change(tune.KNOBS["microbatches"](ctx)[0])
    assert "cannot be halved" in tune.KNOBS["microbatches"](ctx)
    ctx.te = True
    assert tune.KNOBS["permute_fusion"](ctx)[0].overrides == ("model.moe_permute_fusion=true",)


def test_nccl_yaml_is_what_megatron_core_reads(tmp_path):
    """The generated file, read by MCore 0.19.2's own get_nccl_options, gives torch's NCCL options."""
    from megatron.core.parallel_state import get_nccl_options

    text = tune.nccl_yaml({"ep": {"max_ctas": 4, "min_ctas": 2, "cga_cluster_size": 1}, "ep_dp": {"max_ctas": 8}})
    cfgs = yaml.safe_load(text)
    assert cfgs == {"ep": {"cga_cluster_size": 1, "max_ctas": 4, "min_ctas": 2}, "ep_dp": {"max_ctas": 8}}
    opts = get_nccl_options("ep", cfgs)
    assert (opts.config.max_ctas, opts.config.min_ctas, opts.config.cga_cluster_size) == (4, 2, 1)
    assert get_nccl_options("tp", cfgs) is None


@pytest.mark.parametrize("bad,what", [
    ({"expt_dp": {"max_ctas": 4}}, "process-group name"),  # ProcessGroupCollection's name, not the YAML key
    ({"ep": {"max_channels": 4}}, "NCCL option"),
    ({"ep": {"max_ctas": 0}}, "ep.max_ctas"),
    ({"ep": {"min_ctas": 8, "max_ctas": 4}}, "ep.min_ctas"),
    ({"ep": {"net_name": "ethernet"}}, "net_name"),
    ({"ep": {}}, "NCCL options of ep"),
])
def test_nccl_config_is_checked(bad, what):
    with pytest.raises(UsageError, match=what):
        tune.nccl_yaml(bad)


def test_candidate_overrides_compose(tmp_path):
    c = tune.Candidate()
    for knob in ("a2a_priority", "nccl_ep"):
        ctx = tune.Context(base=None, dispatcher="alltoall", best=c, evidence={}, te=False)
        c = c.with_change(tune.KNOBS[knob](ctx)[0])
    c = c.with_change(tune.Change("microbatches", "mbs=1", spec={"micro_batch_size": 1}))
    c = c.with_change(tune.Change("cuda_device_max_connections", "cdmc=8", env={"CUDA_DEVICE_MAX_CONNECTIONS": "8"}))
    c = c.with_change(tune.Change("nccl_ep", "nccl.ep.cga_cluster_size=1", nccl={"ep": {"cga_cluster_size": 1}}))
    assert c.name == "overlap+hiprio+mbs=1+cdmc=8+nccl.ep.cga_cluster_size=1"  # a knob's new option replaces its old one
    v = c.variant("alltoall", tmp_path / "nccl")
    assert v.changes == {"ep_overlap": True, "dispatcher": "alltoall", "high_priority_a2a": False, "micro_batch_size": 1}
    assert v.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    path = next((tmp_path / "nccl").glob("*.yaml"))
    assert v.overrides == ("model.high_priority_a2a_comm_stream=true", "env_vars.CUDA_DEVICE_MAX_CONNECTIONS=8",
                           f"dist.nccl_communicator_config_path={path.resolve()}")
    assert yaml.safe_load(path.read_text()) == {"ep": {"cga_cluster_size": 1}}
    assert "train.micro_batch_size=1" in c.overrides(path)


def test_every_knob_option_finalizes_through_mb(tmp_path, capsys):
    """Each alltoall candidate, launched as bench would launch it (the spec file of the long-seq
    shape plus the candidate), is accepted by MB's real finalize in run_script's dry run."""
    from mbridge_ep_overlap.tools.run import main
    from mbridge_ep_overlap.runtime.spec_file import write_spec

    base = bench.shape_spec("qwen3_moe_proxy", "long-seq", 8, [])
    cand = tune.Candidate()
    for knob in ("a2a_priority", "nccl_ep", "microbatches", "cuda_device_max_connections", "early_attn_release"):
        ctx = tune.Context(base=base, dispatcher="alltoall", best=cand, evidence={}, te=False)
        cand = cand.with_change(tune.KNOBS[knob](ctx)[0])
    v = cand.variant("alltoall", tmp_path / "nccl")
    spec = write_spec(bench.variant_spec(base, v), tmp_path / "spec.json")
    code = main([*spec, "--dryrun", "--output-dir", str(tmp_path / "dry")])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "micro_batch_size: 1" in out and "num_microbatches: 32" in out and "global_batch_size: 64" in out
    assert "high_priority_a2a_comm_stream: True" in out and "CUDA_DEVICE_MAX_CONNECTIONS: 8" in out
    resolved = yaml.safe_load((tmp_path / "dry" / "qwen3_moe_proxy.yaml").read_text())
    assert resolved["dist"]["nccl_communicator_config_path"].endswith(".yaml")
    assert resolved["model"]["ep_overlap_early_attn_memory_release"] is True


def test_apply_tuned_to_a_recipe_config(tmp_path, proxy_cfg, h100x2):
    from mbridge_ep_overlap import enable_ep_overlap

    enable_ep_overlap(proxy_cfg, environment=h100x2)
    (tmp_path / "n.yaml").write_text(tune.nccl_yaml({"ep": {"max_ctas": 4}}))
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"ep_overlap": True, "dispatcher": "alltoall", "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "8"},
                                "overrides": ["model.high_priority_a2a_comm_stream=true", "train.micro_batch_size=1",
                                              f"dist.nccl_communicator_config_path={tmp_path / 'n.yaml'}",
                                              "env_vars.CUDA_DEVICE_MAX_CONNECTIONS=8"]}))
    tune.apply_tuned(proxy_cfg, path)
    assert proxy_cfg.model.high_priority_a2a_comm_stream is True and proxy_cfg.train.micro_batch_size == 1
    assert proxy_cfg.dist.nccl_communicator_config_path == str(tmp_path / "n.yaml")
    assert proxy_cfg.env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"


def tuned_json(**fields) -> str:
    return json.dumps({"ep_overlap": True, "dispatcher": "alltoall", "overrides": [], "env": {}, **fields})


def must_not_launch(*args, **kwargs):
    pytest.fail(f"a torchrun job was launched ({args[:1]}) although its input was refused")


BROKEN_TUNED = [  # (tuned.json content - None: no file, a folder: "<folder>" -, what the one line must say)
    (None, "unreadable tuned file", "FileNotFoundError"),
    ("<folder>", "unreadable tuned file", "IsADirectoryError"),
    (b"\xff\xfe{", "unreadable tuned file", "UnicodeDecodeError"),
    ("{not json", "unreadable tuned file", "JSONDecodeError: Expecting property name"),
    ("[" * 100_000 + "]" * 100_000, "unreadable tuned file", "RecursionError"),
    ("[]", "invalid tuned file", "(a JSON object, not list)"),
    (tuned_json(ep_overlap="yes"), "invalid tuned file", "ep_overlap = 'yes': true or false"),
    (tuned_json(overrides="a=b"), "invalid tuned file", "overrides = 'a=b': a list of key=value strings"),
    (tuned_json(overrides=["novalue", 3, "a=\0"]), "invalid tuned file",
     "overrides[0] = 'novalue': a key=value string; overrides[1] = 3: a key=value string; overrides[2] = 'a=\\x00'"),
    (tuned_json(env=["CUDA_DEVICE_MAX_CONNECTIONS=8"]), "invalid tuned file", "env = ['CUDA_DEVICE_MAX_CONNECTIONS=8']: a mapping"),
    (tuned_json(env={"CUDA_DEVICE_MAX_CONNECTIONS": ["8"]}), "invalid tuned file",
     "env 'CUDA_DEVICE_MAX_CONNECTIONS' = ['8']: a string or an integer"),
    (tuned_json(env={"NCCL_P2P_DISABLE": True}), "invalid tuned file", "env 'NCCL_P2P_DISABLE' = True: a string or an integer"),
    (tuned_json(env={"NCCL_MIN_NCHANNELS": 4.5}), "invalid tuned file", "env 'NCCL_MIN_NCHANNELS' = 4.5: a string"),
    (tuned_json(env={"NCCL_ALGO": None}), "invalid tuned file", "env 'NCCL_ALGO' = None: a string"),
    (tuned_json(env={"NCCL_ALGO": {"ring": 1}}), "invalid tuned file", "env 'NCCL_ALGO' = {'ring': 1}: a string"),
    (tuned_json(env={"NCCL_BUFFSIZE": 2**70}), "invalid tuned file", "env 'NCCL_BUFFSIZE' = a 71-bit integer: a string"),
    (tuned_json(env={"NCCL_ALGO": "Ring\0Tree"}), "invalid tuned file", "env 'NCCL_ALGO' = 'Ring\\x00Tree': a string"),
    (tuned_json(env={"NCCL-ALGO": "Ring"}), "invalid tuned file", "env name 'NCCL-ALGO': letters, digits and _"),
    (tuned_json(ep_overlap=1, env={"1X": 1}), "invalid tuned file",  # every problem, in one line
     "ep_overlap = 1: true or false; env name '1X': letters, digits and _, not starting with a digit)"),
]


@pytest.mark.parametrize("content,problem,needle", BROKEN_TUNED, ids=[n[:40] for _, _, n in BROKEN_TUNED])
def test_a_broken_tuned_file_is_usage_before_anything_is_launched(content, problem, needle, tmp_path, monkeypatch,
                                                                  capsys):
    """load_tuned names the file and every problem in one line; bench run --tuned says it (exit 2) before
    the GPU check, with no job started and no output folder."""
    from mbridge_ep_overlap.tools.cli import main

    path = tmp_path / "tuned.json"
    if content == "<folder>":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UsageError) as refused:
        tune.load_tuned(path)
    assert str(refused.value).startswith(f"{problem} '{path}'") and needle in str(refused.value)
    monkeypatch.setattr(bench, "launch", must_not_launch)
    monkeypatch.setattr(bench, "cuda_device_count", lambda: 0)  # the file is named, not the missing GPUs
    code = main(["bench", "run", "--tuned", str(path), "--variants", "off,tuned", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and problem in err and needle in err, err
    assert not (tmp_path / "o").exists()


NCCL_FILES = [  # (the YAML a tuned override points at, what the one line must say)
    ("ep:\n  max_ctas: many\n", "invalid NCCL communicator file '{path}': ep.max_ctas 'many'; allowed: an integer >= 0"),
    ("ep:\n  max_ctas: 4\n  min_ctas: 8\n", "invalid NCCL communicator file '{path}': ep.min_ctas 8; allowed: <= max_ctas (4)"),
    ("ep:\n  net_name: 7\n", "NCCL communicator file '{path}': ep.net_name 7; allowed: IB, socket"),
    ("expt_dp:\n  max_ctas: 4\n", "NCCL communicator file '{path}': NCCL process-group name 'expt_dp'"),
    ("- ep\n", "invalid NCCL communicator file '{path}': NCCL communicator config ['ep']"),
    ("ep: [unclosed\n", "unreadable NCCL communicator file '{path}'"),
]


@pytest.mark.parametrize("text,needle", NCCL_FILES, ids=["wrong-type", "min-above-max", "net-name", "unknown-group",
                                                       "not-a-mapping", "not-yaml"])
def test_a_tuned_nccl_file_megatron_cannot_use_is_usage(text, needle, tmp_path, monkeypatch, capsys):
    """MCore reads the file in every rank at initialisation (get_nccl_options): a value of the wrong
    type would fail there, after start-up; it is named before anything is launched."""
    from mbridge_ep_overlap.tools.cli import main

    nccl = tmp_path / "nccl_communicator.yaml"
    nccl.write_text(text)
    (tmp_path / "tuned.json").write_text(tuned_json(overrides=[f"dist.nccl_communicator_config_path={nccl}"]))
    with pytest.raises(UsageError, match="NCCL communicator file") as refused:
        tune.load_tuned(tmp_path / "tuned.json")
    assert needle.format(path=nccl) in str(refused.value)
    monkeypatch.setattr(bench, "launch", must_not_launch)
    code = main(["bench", "run", "--tuned", str(tmp_path / "tuned.json"), "--variants", "off,tuned", "--out",
                 str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle.format(path=nccl) in err, err


def test_tuned_environment_values_reach_the_launcher_as_strings(tmp_path):
    (tmp_path / "tuned.json").write_text(tuned_json(env={"CUDA_DEVICE_MAX_CONNECTIONS": 8, "NCCL_ALGO": "Ring"}))
    v = tune.load_tuned_variant(tmp_path / "tuned.json")
    assert v.env == {"CUDA_DEVICE_MAX_CONNECTIONS": "8", "NCCL_ALGO": "Ring"}
    assert v.source == f"tuned file {tmp_path / 'tuned.json'}"


def test_bench_tuned_variant_re_measures_the_winner(cluster, tmp_path):
    run_tune(cluster, tmp_path / "t", 10_000)
    v = tune.load_tuned_variant(tmp_path / "t" / "tuned.json")
    rows = bench.run_bench("qwen3_moe_proxy", 2, ["off", "overlap:hiprio", "tuned"], ["throttled"], tmp_path / "b",
                           steps=8, shape="long-seq", extra_variants={"tuned": v})
    tuned = next(r for r in rows if r.variant == "tuned")
    assert tuned.median_s == pytest.approx(3.25) and tuned.parity == "match"
    assert cluster.calls[-1]["nccl"] == {"ep": {"max_ctas": 32, "min_ctas": 16}}


@pytest.mark.parametrize("argv,needle", [
    (["bench", "tune"], "--budget"),
    (["bench", "tune", "--budget", "100", "--links", "infiniband"], "link"),
    (["bench", "tune", "--budget", "100", "--mem-tolerance", "2"], "--mem-tolerance"),
    (["bench", "tune", "--budget", "100", "--steps", "4"], "--steps"),
    (["bench", "run", "--tuned", "/nonexistent/tuned.json", "--variants", "off,tuned"], "tuned file"),
])
def test_tune_usage_errors(argv, needle, tmp_path, capsys):
    from mbridge_ep_overlap.tools.cli import main

    code = main([*argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_tune_links_shares_the_budget(cluster, tmp_path):
    outcomes = tune.tune_links("qwen3_moe_proxy", 2, "long-seq", ["throttled", "nvlink"], tmp_path / "t", 640,
                               clock=cluster.clock, te=False)
    assert [o.link for o in outcomes] == ["throttled", "nvlink"]
    # 320 s for the first link: baselines + 1 candidate (240 s); the 80 s it left over go to the second
    assert [len(o.trials) for o in outcomes] == [3, 4]
    assert (tmp_path / "t" / "throttled" / "tuned.json").exists() and (tmp_path / "t" / "nvlink" / "tuned.json").exists()


def test_bench_tune_command_line(cluster, tmp_path, capsys):
    """The one command of docs/benchmarks.md, on fake launches: 8 steps, warmup 3, profile 2 by default."""
    from mbridge_ep_overlap.tools.cli import main

    code = main(["bench", "tune", "--budget", "100000", "--shape", "long-seq", "--links", "throttled",
                 "--out", str(tmp_path / "t")])
    assert code == 0, capsys.readouterr().err
    first = cluster.calls[0]
    assert first["spec"]["max_steps"] == 8 and first["args"][first["args"].index("--profile-steps") + 1] == "6:8"
    assert json.loads((tmp_path / "t" / "tuned.json").read_text())["changes"] == ["hiprio", "nccl.ep.min_ctas=16"]
    assert "tune: winner:" in capsys.readouterr().out


def test_a_moved_tuned_folder_still_finds_its_nccl_file(cluster, tmp_path):
    import shutil

    run_tune(cluster, tmp_path / "t", 10_000)
    shutil.copytree(tmp_path / "t", tmp_path / "elsewhere")
    shutil.rmtree(tmp_path / "t")
    t = tune.load_tuned(tmp_path / "elsewhere" / "tuned.json")
    assert f"dist.nccl_communicator_config_path={(tmp_path / 'elsewhere' / 'nccl_communicator.yaml').resolve()}" in t["overrides"]
    (tmp_path / "elsewhere" / "nccl_communicator.yaml").unlink()
    with pytest.raises(UsageError, match="NCCL file"):
        tune.load_tuned(tmp_path / "elsewhere" / "tuned.json")


def test_a_resumed_state_with_a_bad_row_is_measured_afresh(cluster, tmp_path, capsys):
    """tune.json rows pass the same check as bench report's (bench.result_from_row): a row with a
    step time that is no number is not trusted - everything is measured again, and it says why."""
    run_tune(cluster, tmp_path / "t", 10_000)
    state = json.loads((tmp_path / "t" / "tune.json").read_text())
    state["trials"][0]["result"]["median_s"] = "fast"
    (tmp_path / "t" / "tune.json").write_text(json.dumps(state))
    capsys.readouterr()
    calls = len(cluster.calls)
    o = run_tune(cluster, tmp_path / "t", 10_000)
    out = capsys.readouterr().out
    assert "unreadable (a run's field median_s = 'fast'; allowed: a finite number > 0, or null); measuring afresh" in out
    assert len(cluster.calls) - calls == len(o.trials) and not any(t.cached for t in o.trials)


@pytest.mark.parametrize("gpus", [0, 1])
def test_tune_without_enough_gpus_launches_nothing(gpus, tmp_path, monkeypatch, capsys):
    """bench tune on a machine with fewer CUDA GPUs than --nproc: one line, exit 2, no torchrun job,
    no output folder (it used to run each baseline for seconds and fail in a rank's log)."""
    from mbridge_ep_overlap.tools.cli import main

    launched = []
    monkeypatch.setattr(bench, "launch", lambda *a, **k: launched.append(a))
    monkeypatch.setattr(bench, "cuda_device_count", lambda: gpus)
    code = main(["bench", "tune", "--budget", "60", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--nproc 2; allowed: at most the {gpus} CUDA GPU(s) this machine has (bench tune runs" in err
    assert launched == [] and not (tmp_path / "o").exists()
    # the request's own checks come first: a bad flag is still reported as such
    code = main(["bench", "tune", "--budget", "60", "--steps", "4", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "--steps" in err and "GPU" not in err


@pytest.mark.parametrize("kind", ["loop", "file"])
def test_tune_out_that_cannot_be_a_folder(kind, cluster, tmp_path, capsys):
    from mbridge_ep_overlap.tools.cli import main

    out = tmp_path / "o"
    if kind == "loop":
        out.symlink_to(out)
    else:
        out.write_text("")
    code = main(["bench", "tune", "--budget", "60", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "File exists" not in err, err
    why = "is a symbolic-link loop" if kind == "loop" else "exists and is not a folder"
    assert f"unusable --out '{out}'" in err and f"{out} {why}" in err
    assert cluster.calls == []


@pytest.mark.parametrize("extra,code,needle", [
    (["model.no_such_field=1"], 2, "unknown override 'model.no_such_field=1'; allowed: an existing config field"),
    (["model.moe_router_topk=0"], 1, "EP overlap refused (bench jobs: off on throttled; overlap on throttled): 1 "
                                     "violation(s)\n  - [error] router-topk"),
], ids=["bad-override", "refused"])
def test_tune_judges_its_baselines_before_the_first_job(extra, code, needle, h100x2, tmp_path, monkeypatch, capsys):
    """Both baselines are built as their jobs will build them (bench.check_jobs) before the GPU
    check: a refused config is exit 1 with every violation, not two failed baselines after minutes."""
    import dataclasses

    from mbridge_ep_overlap.tools.cli import main

    monkeypatch.setattr("mbridge_ep_overlap.target.probe.probe", lambda: dataclasses.replace(h100x2, source="probed"))
    monkeypatch.setattr(bench, "launch", must_not_launch)
    monkeypatch.setattr(bench, "cuda_device_count", lambda: 0)
    got = main(["bench", "tune", "--budget", "60", "--out", str(tmp_path / "o"), "--", *extra])
    err = capsys.readouterr().err
    assert got == code and needle in err and "GPU(s)" not in err and not (tmp_path / "o").exists(), err
