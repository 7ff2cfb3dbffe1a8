"""One rule for names at every boundary: GPU kinds and dispatcher names are case-insensitive,
normalised to the canonical spelling (the catalogue key, the dispatcher name) where they come in -
the API, the flags, a RunSpec - and a name that is no kind or dispatcher in any case is refused
listing the canonical spellings."""

from __future__ import annotations

import pytest

from mbridge_ep_overlap import RunSpec, UsageError
from mbridge_ep_overlap.base.choices import dispatcher_name as validate_name
from mbridge_ep_overlap.core.enable import Options
from mbridge_ep_overlap.spec import TargetSpec
from mbridge_ep_overlap.target.cluster import describe

NAMES = [("dispatcher", "DeepEP", "deepep"), ("dispatcher", "AllToAll", "alltoall"), ("dispatcher", "hybridep", "hybridep"),
         ("gpu", "H100", "h100"), ("gpu", "GB300", "gb300"), ("gpu", "b200", "b200")]


@pytest.mark.parametrize("kind, given, canonical", NAMES)
def test_every_boundary_normalises_the_name(kind, given, canonical):
    if kind == "dispatcher":
        assert validate_name(given) == canonical
        assert Options(dispatcher=given).validated().dispatcher == canonical
        assert RunSpec(recipe="qwen3_moe_proxy", dispatcher=given).validated().dispatcher == canonical
    else:
        assert describe(given, 8).gpu_name == describe(canonical, 8).gpu_name
        assert TargetSpec(gpu=given).validated().gpu == canonical
        assert RunSpec(recipe="qwen3_moe_proxy", target=TargetSpec(gpu=given)).validated().target.gpu == canonical


@pytest.mark.parametrize("kind, given, canonical", NAMES)
def test_the_flags_take_the_same_names(kind, given, canonical):
    from mbridge_ep_overlap.tools.run import parse_args

    args = parse_args(["--recipe", "qwen3_moe_proxy", f"--{kind}", given])
    assert getattr(args, kind) == canonical


@pytest.mark.parametrize("call", [lambda: validate_name("DeepEPP"), lambda: Options(dispatcher="Fast").validated(),
                                  lambda: TargetSpec(gpu="H1000").validated(), lambda: describe("X100", 8),
                                  lambda: validate_name(3)])
def test_a_name_that_is_none_in_any_case_is_refused_with_the_canonical_spellings(call):
    with pytest.raises(UsageError) as e:
        call()
    assert ("deepep" in str(e.value)) or ("h100" in str(e.value))


def test_a_bad_flag_name_is_exit_2_naming_the_canonical_choices(capsys):
    from mbridge_ep_overlap.tools.run import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(["--recipe", "qwen3_moe_proxy", "--gpu", "H1000"])
    assert e.value.code == 2 and "h100" in capsys.readouterr().err
