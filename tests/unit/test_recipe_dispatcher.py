"""A recipe that calls Megatron-Bridge's ``apply_flex_dispatcher_backend`` itself (MB's own recipes do).

On a GPU outside the backend's allow-list MB only logs a rank-0 warning and leaves the dispatcher
alltoall. Such a recipe is built for the target (``--gpu``) and its request recorded, so MB's silent
fallback is refused by rule ``recipe-flex-fallback`` - through ``plan --recipe MODULE:FUNCTION``, the
pipeline API and ``enable_ep_overlap`` - unless a dispatcher is chosen explicitly or ``resolve='auto'``
accepts it; a backend MB applied is "the recipe's". Where MB falls back (its source,
training/flex_dispatcher_backend.py): DeepEP outside sm80/sm90/B200/B300 (GB200, GB300, VR200),
NCCL EP outside sm90/sm100 (A100).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest

from mbridge_ep_overlap.core.provenance import Source
from mbridge_ep_overlap.tools import cli

MODULE = "ep_overlap_probe_recipe_flex"
RECIPE = '''
from megatron.bridge.training.flex_dispatcher_backend import apply_flex_dispatcher_backend  # as MB's recipes import it


def _asks(backend):
    from mbridge_ep_overlap.spec import resolve_recipe

    cfg = resolve_recipe("qwen3_moe_proxy").config()
    apply_flex_dispatcher_backend(cfg.model, backend)
    return cfg


def deepep():
    return _asks("deepep")


def ncclep():
    return _asks("ncclep")


def hybridep():
    return _asks("hybridep")
'''


@pytest.fixture(scope="module")
def recipe_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recipes")
    (folder / f"{MODULE}.py").write_text(RECIPE)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    sys.modules.pop(MODULE, None)


PLAN_ROWS = [
    # function, GPU, more flags, exit code, what the output must say
    ("deepep", "gb200", [], 1, ["recipe-flex-fallback", "the recipe asked for deepep", "fell back on NVIDIA GB200",
                                "--dispatcher alltoall", "EP overlap refused"]),
    ("deepep", "gb300", ["--ep-overlap", "off"], 1, ["recipe-flex-fallback", "config refused (EP overlap off)"]),
    ("ncclep", "a100", [], 1, ["recipe-flex-fallback", "the recipe asked for ncclep", "fell back on NVIDIA A100"]),
    ("deepep", "gb200", ["--dispatcher", "alltoall"], 0, ["dispatcher  : alltoall (requested)",
                                                          "(requested: dispatcher alltoall (the recipe asked for deepep"]),
    ("deepep", "gb200", ["--dispatcher", "hybridep"], 0, ["dispatcher  : hybridep (requested)"]),
    ("deepep", "gb200", ["--resolve", "auto"], 0, ["dispatcher  : alltoall (set by resolve: MB fell back from the "
                                                   "recipe's deepep request)", "WARNING: recipe-flex-fallback"]),
    ("deepep", "gb200", ["--ep-overlap", "off", "--resolve", "auto"], 0, ["WARNING", "ACCEPTED with EP overlap off"]),
    ("deepep", "h100", ["--deep-ep", "1.2.1"], 0, ["dispatcher  : deepep (the recipe's)"]),
    ("hybridep", "gb200", [], 0, ["dispatcher  : hybridep (the recipe's)"]),
    ("ncclep", "a100", ["--dispatcher", "alltoall"], 0, ["dispatcher  : alltoall (requested)"]),
]


@pytest.mark.parametrize("function,gpu,flags,code,needles", PLAN_ROWS,
                         ids=[f"{r[0]}-{r[1]}{''.join(r[2])}" for r in PLAN_ROWS])
def test_plan_of_a_recipe_that_asks_mb_for_a_flex_backend(recipe_dir, function, gpu, flags, code, needles, capsys):
    try:
        got = cli.main(["plan", "--recipe", f"{MODULE}:{function}", "--gpu", gpu, "--num-gpus", "2", "--no-predict",
                        *flags])
    except SystemExit as e:
        got = e.code
    out, err = capsys.readouterr()
    assert got == code, out[-3000:] + err[-3000:]
    for needle in needles:
        assert needle in out, (needle, out[-3000:])
    if code == 0 and "deepep" in function and "--dispatcher" not in flags and "auto" not in flags:
        assert "alltoall (default)" not in out


def test_the_real_command_refuses_it(recipe_dir):
    """The same refusal from the installed command in a process of its own: exit 1, nothing hidden."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(recipe_dir), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "mbridge_ep_overlap", "plan", "--recipe", f"{MODULE}:deepep",
                             "--gpu", "gb200", "--num-gpus", "2"], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "recipe-flex-fallback" in result.stdout and "alltoall (default)" not in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_the_pipeline_api_refuses_it(recipe_dir):
    from mbridge_ep_overlap import EPOverlapError, RunSpec, build
    from mbridge_ep_overlap.spec import TargetSpec

    spec = RunSpec(recipe=f"{MODULE}:deepep", target=TargetSpec(gpu="gb200", num_gpus=2))
    with pytest.raises(EPOverlapError) as excinfo:
        build(spec)
    (violation,) = [v for v in excinfo.value.violations if v.severity.value == "error"]
    assert violation.rule_id == "recipe-flex-fallback" and "NVIDIA GB200" in violation.current
    built = build(spec.replace(dispatcher="alltoall"))
    assert built.plan.dispatcher == "alltoall" and built.plan.dispatcher_source is Source.REQUESTED
    assert build(spec.replace(target=TargetSpec(gpu="h100", num_gpus=2))).plan.dispatcher_source is Source.RECIPE


def test_enable_ep_overlap_refuses_it_and_leaves_the_config_untouched(recipe_dir):
    """The API on a config built the way every tool builds a recipe (recorded, for the target)."""
    from mbridge_ep_overlap import EPOverlapError, check_ep_overlap, describe, enable_ep_overlap
    from mbridge_ep_overlap.spec import resolve_recipe
    from mbridge_ep_overlap.target.simulate import simulate

    gb200 = describe("gb200", 2)
    with simulate(gb200):
        cfg = resolve_recipe(f"{MODULE}:deepep").config()
    assert [v.rule_id for v in check_ep_overlap(cfg, environment=gb200)] == ["recipe-flex-fallback"]
    before = copy.deepcopy(cfg)
    with pytest.raises(EPOverlapError, match="recipe-flex-fallback"):
        enable_ep_overlap(cfg, environment=gb200)
    assert cfg == before and cfg.comm_overlap is None  # nothing changed on refusal
    plan = enable_ep_overlap(cfg, "alltoall", environment=gb200)  # the fix the refusal names
    assert plan.dispatcher == "alltoall"
    assert not [v for v in check_ep_overlap(cfg, environment=gb200) if v.severity.value == "error"]  # finalize agrees


def test_recording_restores_mb_and_is_no_config_field(recipe_dir, tmp_path):
    """MB's function is itself again after a recipe (one that fails included); a call outside a recipe
    build records nothing; the record is no dataclass field, so the YAML of a run never holds it."""
    from megatron.bridge.training import flex_dispatcher_backend as mb

    from mbridge_ep_overlap.core.dispatcher import RECIPE_REQUEST, recording_recipe_requests
    from mbridge_ep_overlap.spec import resolve_recipe
    from mbridge_ep_overlap.target.cluster import describe
    from mbridge_ep_overlap.target.simulate import simulate

    code = mb.apply_flex_dispatcher_backend.__code__
    with pytest.raises(RuntimeError), recording_recipe_requests():
        assert mb.apply_flex_dispatcher_backend.__code__ is not code
        raise RuntimeError("a recipe that fails")
    assert mb.apply_flex_dispatcher_backend.__code__ is code and not hasattr(mb, "_ep_overlap_record_request")
    with simulate(describe("gb200", 2)):
        cfg = resolve_recipe("qwen3_moe_proxy").config()
        mb.apply_flex_dispatcher_backend(cfg.model, "deepep")  # not while a recipe builds: nothing recorded
        assert getattr(cfg.model, RECIPE_REQUEST, None) is None
        with recording_recipe_requests():
            mb.apply_flex_dispatcher_backend(cfg.model, "deepep")
    assert getattr(cfg.model, RECIPE_REQUEST).applied is False
    cfg.to_yaml(str(tmp_path / "cfg.yaml"))
    assert RECIPE_REQUEST not in (tmp_path / "cfg.yaml").read_text()
