"""bench's flags: nothing after ``--`` or among the tuning flags is dropped silently; --report names every bad row."""

from __future__ import annotations

import json

import pytest

from mbridge_ep_overlap.tools.cli import main

# flags after --, the flags the one line must name, and the variant syntax it must give
DROPPED = [
    (["--dispatcher", "hybridep"], ["--dispatcher"], "--variants off,overlap,deepep,hybridep"),
    (["--dispatcher", "hybridep", "--delay-wgrad", "on"], ["--dispatcher --delay-wgrad"], "overlap+delay_wgrad"),
    (["--ep-overlap", "off"], ["--ep-overlap"], "--variants off,overlap"),
    (["--a2a-priority", "high"], ["--a2a-priority"], "overlap:hiprio"),
    (["--gpu", "h100", "--num-gpus", "8"], ["--gpu --num-gpus"], "bench runs on this machine"),
    (["--resolve", "auto", "--ep", "2"], ["--resolve"], "bench runs on this machine"),
    (["--recipe", "qwen3_30b_a3b"], ["--recipe"], "use bench --recipe"),
]


@pytest.mark.parametrize("extra,named,syntax", DROPPED, ids=[" ".join(r[0]) for r in DROPPED])
def test_run_flags_bench_would_drop_are_refused(extra, named, syntax, tmp_path, monkeypatch, capsys):
    from mbridge_ep_overlap.lab import bench

    launched = []
    monkeypatch.setattr(bench, "launch", lambda *a, **k: launched.append(a))
    monkeypatch.setattr(bench, "cuda_device_count", lambda: 2)
    code = main(["bench", "--variants", "off,overlap", "--links", "nvlink", "--out", str(tmp_path / "o"), "--", *extra])
    out, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1 and out == "", err
    for needle in [*named, syntax, "unused run flags after --"]:
        assert needle in err, (needle, err)
    assert launched == [] and not (tmp_path / "o").exists()


KEPT = [  # flags after -- that bench carries into every variant's spec
    (["--ep", "2", "--seq-length", "512"], {"expert_model_parallel_size": 2, "seq_length": 512}),
    (["--set", "train.train_iters=3", "model.moe_router_topk=2"], {"overrides": ("train.train_iters=3", "model.moe_router_topk=2")}),
    (["--hf-config-dir", "/tmp/archs"], {"hf_config_dir": "/tmp/archs"}),
    (["--force-balance"], {"force_balance": True}),
]


@pytest.mark.parametrize("extra,fields", KEPT, ids=[" ".join(r[0]) for r in KEPT])
def test_what_bench_takes_after_double_dash_reaches_the_spec(extra, fields):
    from mbridge_ep_overlap.lab.bench import shape_spec

    spec = shape_spec("qwen3_moe_proxy", "default", 4, extra)
    for name, value in fields.items():
        got = getattr(spec, name)
        assert (got[-len(value):] if name == "overrides" else got) == value, (name, got)


TUNE_ONLY = [
    (["--budget", "60"], "--budget"),
    (["--dispatcher", "hybridep"], "--dispatcher"),
    (["--mem-tolerance", "0.1"], "--mem-tolerance"),
    (["--min-gain", "0.01"], "--min-gain"),
    (["--budget", "60", "--min-gain", "0.01"], "--budget --min-gain"),
    (["--report", "somewhere", "--dispatcher", "deepep"], "--dispatcher"),
]


@pytest.mark.parametrize("flags,named", TUNE_ONLY, ids=[" ".join(r[0]) for r in TUNE_ONLY])
def test_tune_only_flags_on_a_plain_bench_are_refused(flags, named, tmp_path, monkeypatch, capsys):
    from mbridge_ep_overlap.lab import bench

    launched = []
    monkeypatch.setattr(bench, "launch", lambda *a, **k: launched.append(a))
    monkeypatch.setattr(bench, "cuda_device_count", lambda: 2)
    code = main(["bench", "--links", "nvlink", "--out", str(tmp_path / "o"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"unused tune-only flags '{named}'" in err and "only with --tune" in err, err
    assert launched == [] and not (tmp_path / "o").exists()


def _rows():
    from test_bench import good_rows

    return good_rows()


BAD_ROWS = [  # (row index -> changes), what the one line must name
    ({1: {"median_s": "fast"}}, ["row 2 (nvlink/overlap), field median_s = 'fast'"]),
    ({0: {"median_s": "x"}, 1: {"peak_gib": "y"}},
     ["2 bad rows", "row 1 (nvlink/off), field median_s = 'x'", "row 2 (nvlink/overlap), field peak_gib = 'y'"]),
    ({0: {"ok": "yes"}, 1: {"colour": "red"}}, ["2 bad rows", "row 1 (nvlink/off), field ok = 'yes'",
                                               "row 2 (nvlink/overlap), field colour = 'red'"]),
]


@pytest.mark.parametrize("changes,needles", BAD_ROWS, ids=["one", "two-fields", "two-kinds"])
def test_report_names_every_bad_row(changes, needles, tmp_path, capsys):
    rows = _rows()
    for i, change in changes.items():
        rows[i].update(change)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.json").write_text(json.dumps(rows))
    code = main(["bench", "--report", str(bad), "--out", str(tmp_path / "merged")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not (tmp_path / "merged").exists()


def test_report_names_every_bad_folder(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    rows = _rows()
    rows[0]["median_s"] = "x"
    (a / "results.json").write_text(json.dumps(rows))
    code = main(["bench", "--report", str(a), str(b), str(tmp_path / "missing"), "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "3 folders" in err and "row 1 (nvlink/off), field median_s = 'x'" in err and str(b) in err
    assert str(tmp_path / "missing") in err
