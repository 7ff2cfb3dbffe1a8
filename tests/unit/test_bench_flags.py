"""bench's flags: nothing after ``--`` is dropped silently, each flag exists only on the subcommand it acts on
(``bench run|report|tune``; the old one-level spellings are refused naming the new one), ``bench report``
names every bad row."""

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
    code = main(["bench", "run", "--variants", "off,overlap", "--links", "nvlink", "--out", str(tmp_path / "o"), "--", *extra])
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


ELSEWHERE = [
    (["--budget", "60"], "--budget", "tune"),
    (["--dispatcher", "hybridep"], "--dispatcher", "tune"),
    (["--mem-tolerance", "0.1"], "--mem-tolerance", "tune"),
    (["--min-gain", "0.01"], "--min-gain", "tune"),
    (["--budget", "60", "--min-gain", "0.01"], "--budget", "tune"),
    (["--tune"], "--tune", "tune"),
    (["--report", "somewhere", "--dispatcher", "deepep"], "--report", "report"),
    (["--calibration", "cal.json"], "--calibration", "report"),
]


@pytest.mark.parametrize("flags,named,where", ELSEWHERE, ids=[" ".join(r[0]) for r in ELSEWHERE])
def test_flags_of_another_subcommand_on_bench_run_are_refused(flags, named, where, tmp_path, monkeypatch, capsys):
    from mbridge_ep_overlap.lab import bench

    launched = []
    monkeypatch.setattr(bench, "launch", lambda *a, **k: launched.append(a))
    monkeypatch.setattr(bench, "cuda_device_count", lambda: 2)
    with pytest.raises(SystemExit) as e:
        main(["bench", "run", "--links", "nvlink", "--out", str(tmp_path / "o"), *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"`bench run {named}`: {named} is a flag of `mbridge-ep-overlap bench {where}`" in err, err
    assert launched == [] and not (tmp_path / "o").exists()


# the spellings before bench had subcommands, and the new spelling the one line must name
OLD_SPELLINGS = [
    (["bench", "--report", "x"], "`bench --report` is now `mbridge-ep-overlap bench report DIR..."),
    (["bench", "--out", "o", "--report", "x"], "`bench --report` is now `mbridge-ep-overlap bench report DIR..."),
    (["bench", "--tune", "--budget", "60"], "`bench --tune` is now `mbridge-ep-overlap bench tune --budget SECONDS`"),
    (["bench", "--budget", "60", "--tune"], "`bench --tune` is now `mbridge-ep-overlap bench tune --budget SECONDS`"),
    (["bench", "--variants", "off,overlap"], "`bench --variants` is now `mbridge-ep-overlap bench run --variants"),
    (["bench", "--calibration", "c.json"], "`bench --calibration` is now `mbridge-ep-overlap bench report DIR... --calib"),
    (["bench", "--min-gain", "0.01"], "`bench --min-gain` is now `mbridge-ep-overlap bench tune --min-gain"),
    (["bench", "tune", "--budget", "60", "--variants", "off"], "`bench tune --variants`: --variants is a flag of "
                                                                "`mbridge-ep-overlap bench run`"),
    (["bench", "tune", "--budget", "60", "--tune"], "`bench tune --tune`: `bench tune` is the knob search, drop --tune"),
]


@pytest.mark.parametrize("argv,line", OLD_SPELLINGS, ids=[" ".join(r[0]) for r in OLD_SPELLINGS])
def test_an_old_bench_spelling_is_refused_naming_the_new_one(argv, line, tmp_path, monkeypatch, capsys):
    from mbridge_ep_overlap.lab import bench, tune

    launched = []
    monkeypatch.setattr(bench, "launch", lambda *a, **k: launched.append(a))
    monkeypatch.setattr(tune, "tune_links", lambda *a, **k: launched.append(a))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and line in err, err
    assert launched == [] and list(tmp_path.iterdir()) == []


def test_bench_help_and_its_subcommands_help_are_not_old_spellings(capsys):
    for argv in (["bench", "--help"], ["bench", "run", "--help"], ["bench", "report", "-h"], ["bench", "tune", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0, argv
    assert "{run,report,tune}" in capsys.readouterr().out


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
    code = main(["bench", "report", str(bad), "--out", str(tmp_path / "merged")])
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
    code = main(["bench", "report", str(a), str(b), str(tmp_path / "missing"), "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "3 folders" in err and "row 1 (nvlink/off), field median_s = 'x'" in err and str(b) in err
    assert str(tmp_path / "missing") in err
