"""The software stack of a described target: Transformer Engine and DeepEP as the cluster has them.

Contract: ``REFERENCE_TE_VERSION`` is the Transformer Engine of the software stack Megatron-Bridge
0.6.2 is released and benchmarked with (source below); a dry-run target has it unless told
otherwise. ``te_version(flag)`` / ``deep_ep_version(flag)`` map a command-line value (a version,
"none", or None for the default) onto ``ClusterEnvironment`` values ("" = known missing,
None = unknown); ``is_version`` is what such a version must look like.
"""

from __future__ import annotations

# Megatron-Bridge 0.6.2's own lock: its sdist pyproject.toml pins, in [tool.uv]
# override-dependencies, "transformer-engine @ git+https://github.com/NVIDIA/TransformerEngine.git@
# 15288857644368b8b7bdddd9bead7d6d3d04de80" and records that commit's metadata as
# version = "2.18.0+15288857" ([[tool.uv.dependency-metadata]]), with nvidia-cudnn-frontend==1.26.0.
REFERENCE_TE_VERSION = "2.18.0"


def is_version(text: str) -> bool:
    """A PEP 440 version such as 2.18.0 or 2.18.0+15288857 (what the version gates compare), written
    as such: starting with a digit and without the blanks ``packaging`` would strip ('2.18 ')."""
    from packaging.version import InvalidVersion, Version

    if not text[:1].isdigit() or text != text.strip():
        return False
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def te_version(flag: str | None) -> str | None:
    if flag is None:
        return REFERENCE_TE_VERSION
    return "" if flag == "none" else flag


def deep_ep_version(flag: str | None) -> str | None:
    if flag is None:
        return None
    return "" if flag == "none" else flag
