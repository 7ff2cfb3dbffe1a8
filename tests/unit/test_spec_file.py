"""The run description as a file (``runtime.spec_file``, ``run_script.py --spec``): written and read
back to the same spec, checked as the flags are, every bad file one line of bad usage (exit 2)."""

import json

import pytest

from mbridge_ep_overlap.base.errors import UsageError
from mbridge_ep_overlap.spec import RunSpec, TargetSpec
from mbridge_ep_overlap.tools.run import main
from mbridge_ep_overlap.runtime.spec_file import SPEC_SCHEMA, read_spec, spec_json, write_spec

SPEC = RunSpec(recipe="qwen3_moe_proxy", dispatcher="alltoall", delay_wgrad=False, high_priority_a2a=True,
               resolve="auto", expert_model_parallel_size=2, max_steps=6, force_balance=True,
               overrides=("train.train_iters=6", "model.moe_ffn_hidden_size=512"),
               target=TargetSpec(gpu="h200", num_gpus=2, te="none", env=("NCCL_NVLS_ENABLE=0",)))


def test_a_spec_written_reads_back_as_the_same_spec(tmp_path):
    argv = write_spec(SPEC, tmp_path / "job" / "run.spec.json")
    assert argv == ["--spec", str(tmp_path / "job" / "run.spec.json")]
    data = json.loads((tmp_path / "job" / "run.spec.json").read_text())
    assert data["schema"] == SPEC_SCHEMA and data["target"]["env"] == ["NCCL_NVLS_ENABLE=0"]
    assert read_spec(argv[1]) == SPEC.validated()


def test_a_training_run_probes_its_own_node_whatever_target_the_file_names(tmp_path):
    from mbridge_ep_overlap.runtime.flags import spec_from_args
    from mbridge_ep_overlap.tools.run import parse_args

    args = parse_args([*write_spec(SPEC, tmp_path / "s.json"), "--output-dir", str(tmp_path)])
    assert spec_from_args(args, this_machine=True) == SPEC.replace(target=TargetSpec(this_machine=True))
    assert spec_from_args(args).target == SPEC.target  # a dry run judges the file's target


def _file(tmp_path, content) -> str:
    path = tmp_path / "bad.spec.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


GOOD = {"schema": SPEC_SCHEMA, "recipe": "qwen3_moe_proxy"}


@pytest.mark.parametrize("content, needle", [
    ("{not json", "malformed spec file"),
    ([1, 2], "a JSON object"),
    ({"recipe": "qwen3_moe_proxy"}, "unknown schema of spec file"),
    ({**GOOD, "schema": "mbridge-ep-overlap run spec 2"}, "'mbridge-ep-overlap run spec 2'"),
    ({"schema": SPEC_SCHEMA}, "missing field recipe"),
    ({**GOOD, "colour": "blue"}, "unknown field of the run in spec file"),
    ({**GOOD, "target": {"gpu": "h200", "nodes": 2}}, "unknown field of target"),
    ({**GOOD, "target": "h200"}, "target in spec file"),
    ({**GOOD, "ep_overlap": "yes"}, "invalid ep_overlap (in spec file"),
    ({**GOOD, "dispatcher": "fast"}, "unknown dispatcher (in spec file"),
    ({**GOOD, "max_steps": 0}, "invalid max_steps (in spec file"),
    ({**GOOD, "overrides": "a=1"}, "invalid overrides (in spec file"),
    ({**GOOD, "recipe": "qwen3_moe_prox"}, "unknown recipe (in spec file"),
])
def test_a_bad_spec_file_is_one_line_of_bad_usage(tmp_path, capsys, content, needle):
    path = _file(tmp_path, content)
    with pytest.raises(UsageError, match="spec file"):
        read_spec(path)
    assert main(["--spec", path, "--dryrun", "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err


def test_an_unreadable_spec_file_is_bad_usage(tmp_path, capsys):
    assert main(["--spec", str(tmp_path / "none.json"), "--dryrun", "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unreadable spec file" in err, err


@pytest.mark.parametrize("extra, named", [
    (["--dispatcher", "deepep"], "--dispatcher"), (["--recipe", "qwen3_moe_proxy"], "--recipe"),
    (["--gpu", "h100"], "--gpu"), (["train.train_iters=3"], "key=value override"), (["--set", "a.b=1"], "--set"),
    (["--moe_a2a_overlap", "false"], "--ep-overlap"),  # MB's spelling is the same flag
])
def test_spec_with_another_run_description_flag_is_refused_naming_it(tmp_path, capsys, extra, named):
    path = write_spec(SPEC, tmp_path / "s.json")[1]
    with pytest.raises(SystemExit) as e:
        main(["--spec", path, *extra, "--dryrun", "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and named in err and "--spec FILE describes" in err, err


def test_neither_recipe_nor_spec_is_bad_usage(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--dryrun"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "--recipe (or --spec FILE)" in err


def test_a_dry_run_of_a_spec_file_is_the_dry_run_of_its_flags(tmp_path, capsys):
    spec = RunSpec(recipe="qwen3_moe_proxy", max_steps=6, overrides=("train.train_iters=6",),
                   target=TargetSpec(gpu="h200", num_gpus=2))
    flags = ["--recipe", "qwen3_moe_proxy", "--max-steps", "6", "--gpu", "h200", "--num-gpus", "2", "train.train_iters=6"]
    assert main([*flags, "--dryrun", "--output-dir", str(tmp_path / "a")]) == 0
    by_flags = capsys.readouterr().out.replace(str(tmp_path / "a"), "OUT")
    assert main([*write_spec(spec, tmp_path / "s.json"), "--dryrun", "--output-dir", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out.replace(str(tmp_path / "b"), "OUT") == by_flags
    assert spec_json(spec)["max_steps"] == 6
