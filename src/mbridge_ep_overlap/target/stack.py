"""The software stack of a described target: Transformer Engine and DeepEP as the cluster has them.

Contract: ``REFERENCE_TE_VERSION`` is the Transformer Engine of the software stack Megatron-Bridge
0.6.2 is released and benchmarked with (source below); a dry-run target has it unless told
otherwise. ``te_version(flag)`` / ``deep_ep_version(flag)`` map a command-line value (a version,
"none", or None for the default) onto ``ClusterEnvironment`` values ("" = known missing,
None = unknown); ``is_version`` is what such a version must look like.

Versions outside what the rules know are never passed silently:

* a Transformer Engine older than ``OLDEST_TE_VERSION`` (1.0) cannot run Megatron-Core 0.19.2 -
  ``require_possible_te`` refuses it (``UsageError``, exit 2 at the command line);
* a TE outside ``KNOWN_TE`` (2.7 to 2.18) or a DeepEP outside ``KNOWN_DEEP_EP`` (1.0 to 1.2), by
  major.minor, is possible but unchecked: ``unknown_versions`` says so in one sentence each, which
  the advice rule ``stack-versions-known`` prints with the plan ("TE 99.0 is newer than any version
  these rules were checked against (2.18); results assume 2.18 behaviour"). The verdict is the
  rules' as they are; the advice says what it rests on.
"""

from __future__ import annotations

from ..base.errors import UsageError

# Megatron-Bridge 0.6.2's own lock: its sdist pyproject.toml pins, in [tool.uv]
# override-dependencies, "transformer-engine @ git+https://github.com/NVIDIA/TransformerEngine.git@
# 15288857644368b8b7bdddd9bead7d6d3d04de80" and records that commit's metadata as
# version = "2.18.0+15288857" ([[tool.uv.dependency-metadata]]), with nvidia-cudnn-frontend==1.26.0.
REFERENCE_TE_VERSION = "2.18.0"

# Megatron-Core 0.19.2's fp8_utils.py dispatches on the TE version down to 1.0 ("Supported TE versions:
# 1.0 - 1.14"); anything older falls to its "Fallback impl if TE version is invalid or TE is not installed".
OLDEST_TE_VERSION = "1.0"
# The oldest TE the rules' own gates name (MB 0.6.2 comm_overlap.py: TE >= 2.7.0 for delayed wgrad with
# overlapped grad reduce or gradient-accumulation fusion) to the reference stack's.
KNOWN_TE = ("2.7", "2.18")
# The DeepEP releases the dispatcher rules were written against (1.2.1 on the GPU node).
KNOWN_DEEP_EP = ("1.0", "1.2")


def _minor(version: str) -> tuple[int, int]:
    from packaging.version import Version

    release = Version(version).release
    return (release + (0,))[:2]


def require_possible_te(version: str | None, what: str = "te version") -> None:
    """``UsageError`` for a Transformer Engine Megatron-Core 0.19.2 cannot run with (older than 1.0)."""
    if version and is_version(version) and _minor(version) < _minor(OLDEST_TE_VERSION):
        raise UsageError(what, version, f"{OLDEST_TE_VERSION} or newer (Megatron-Core 0.19.2 calls an older "
                         "Transformer Engine invalid), or 'none'", "impossible")


def unknown_versions(te: str | None, deep_ep: str | None) -> list[str]:
    """One sentence for each of ``te`` / ``deep_ep`` outside the versions the rules were checked against."""
    out = []
    for name, version, (low, high) in (("TE", te, KNOWN_TE), ("DeepEP", deep_ep, KNOWN_DEEP_EP)):
        if not version or not is_version(version):
            continue
        if _minor(version) > _minor(high):
            out.append(f"{name} {version} is newer than any version these rules were checked against ({high}); "
                       f"results assume {high} behaviour")
        elif _minor(version) < _minor(low):
            out.append(f"{name} {version} is older than any version these rules were checked against ({low} to "
                       f"{high}); what Megatron-Core needs of a {name} that old is not checked here")
    return out


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
