"""Rule ``block-scaled-recipe-on-gpu``: the compute capabilities Transformer Engine runs MXFP8, NVFP4 and FP8 block
scaling on, against the messages of the diagnose signatures that quote TE's refusals (TE is not installed here)."""

from __future__ import annotations

import dataclasses

import pytest
from megatron.core.utils import PkgVersion  # the type MCore compares versions with

from mbridge_ep_overlap import check_ep_overlap
from mbridge_ep_overlap.core.rules.base import release_before, version_at_least
from mbridge_ep_overlap.core.rules.environment import RECIPE_COMPUTE_CAPABILITY
from mbridge_ep_overlap.diagnose.signatures import all_signatures
from mbridge_ep_overlap.target.cluster import describe

RULE = "block-scaled-recipe-on-gpu"


def _refused(cfg, mixed: str, gpu: str, cc=None, te: str = "2.18.0") -> bool:
    cfg.mixed_precision = mixed
    env = describe(gpu, 16, te_version=te, deep_ep_version=None)
    if cc is not None:
        env = dataclasses.replace(env, compute_capability=cc)
    return RULE in {v.rule_id for v in check_ep_overlap(cfg, environment=env)}


@pytest.mark.parametrize(("mixed", "gpu", "cc", "te", "refused"), [
    ("bf16_with_mxfp8_mixed", "h100", None, "2.18.0", True),  # 'Device compute capability 10.0 or higher ... MXFP8'
    ("bf16_with_mxfp8_mixed", "b200", None, "2.18.0", False),
    ("bf16_with_mxfp8_mixed", "gb300", None, "2.18.0", False),
    ("bf16_with_mxfp8_mixed", "b200", (12, 0), "2.18.0", True),  # RTX PRO 6000: 'not supported on 12.0+'
    ("bf16_with_nvfp4_mixed", "h200", None, "2.18.0", True),
    ("bf16_with_nvfp4_mixed", "b300", None, "2.18.0", False),
    ("bf16_with_fp8_subchannel_scaling_mixed", "h100", None, "2.18.0", False),
    ("bf16_with_fp8_subchannel_scaling_mixed", "a100", None, "2.18.0", True),
    ("bf16_with_fp8_subchannel_scaling_mixed", "b200", None, "2.18.0", False),
    ("bf16_with_fp8_subchannel_scaling_mixed", "b200", None, "2.8.0", True),  # 'requires Hopper' before TE 2.9
    ("bf16_with_fp8_subchannel_scaling_mixed", "b200", None, "2.9.0.dev0+abc123", False),  # a 2.9 build has it
    ("bf16_with_fp8_subchannel_scaling_mixed", "b200", None, "2.9.0rc1", False),
    ("bf16_with_fp8_current_scaling_mixed", "b200", (12, 0), "2.18.0", False),  # tensor-wise FP8 runs there
    ("bf16_mixed", "h100", None, "2.18.0", False),
])
def test_recipe_on_gpu(proxy_cfg, mixed, gpu, cc, te, refused):
    assert _refused(proxy_cfg, mixed, gpu, cc, te) is refused


def test_ranges_are_the_ones_the_signatures_quote():
    """Each range's first capability is the one TE's refusal names, in the signature linked to the rule."""
    linked = [s for s in all_signatures() if s.rule == RULE]
    assert {s.id for s in linked} >= {"te-mxfp8-needs-compute-capability-10", "te-mxfp8-not-on-compute-capability-12",
                                      "te-nvfp4-needs-compute-capability-10", "te-fp8-block-scaling-needs-cuda-12-9"}
    text = " ".join(e for s in linked for e in s.emitted)
    for recipe, (first, end) in RECIPE_COMPUTE_CAPABILITY.items():
        assert f"compute capability {first[0]}.{first[1]} or higher" in text, recipe
        if end is not None:
            assert f"not supported on {end[0]}.{end[1]}+ architectures" in text, recipe


def test_the_two_version_comparisons_differ_exactly_on_development_builds():
    # another package's gate (MCore's is_te_min_version) orders a dev build before its release, as packaging does
    assert (PkgVersion("2.7.0.dev0") >= PkgVersion("2.7.0")) is version_at_least("2.7.0.dev0", "2.7.0") is False
    assert version_at_least("2.7.0", "2.7.0") and version_at_least("2.8.1", "2.7.0")
    # a package's own code from a release on: its dev build of that release already has it
    assert release_before("2.9.0.dev0+abc123", "2.9") is False and release_before("2.8.1", "2.9") is True
    assert release_before(None, "2.9") is False and version_at_least("not a version", "2.7.0") is False
