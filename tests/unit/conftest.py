"""Unit tests: CPU only, the real megatron-bridge / megatron-core, fake hardware only.

The import shims are installed first, explicitly, as every entry point that imports
Megatron-Bridge does (TE and NVRx are not installed here). The hub is switched off for the whole
session: recipes must build from shipped files.
"""

from __future__ import annotations

import copy
import os
import subprocess
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Hypothesis keeps its example database and caches in ./.hypothesis by default; unit tests write
# nothing into the checkout, so its home is a temporary folder removed when the session ends.
_HYPOTHESIS_HOME = tempfile.TemporaryDirectory(prefix="mbridge-ep-overlap-hypothesis-")
try:
    from hypothesis.configuration import set_hypothesis_home_dir
except ImportError:  # only test_bad_input needs hypothesis; it says so itself
    pass
else:
    set_hypothesis_home_dir(_HYPOTHESIS_HOME.name)

import pytest  # noqa: E402

from mbridge_ep_overlap.target import shims  # noqa: E402

shims.install()
from mbridge_ep_overlap.target.cluster import describe  # noqa: E402
from mbridge_ep_overlap.target.offline import offline_architectures  # noqa: E402


_ROOT = Path(__file__).resolve().parents[2]


def _checkout_state() -> str | None:
    """The checkout's changed, untracked and ignored entries (git's view, ignored folders as one
    entry; Python's byte-code caches left out), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "-C", str(_ROOT), "status", "--porcelain", "--ignored"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return "\n".join(line for line in out.stdout.splitlines() if "__pycache__" not in line)


@pytest.fixture(scope="session", autouse=True)
def _checkout_untouched():
    """Unit tests write nothing into the checkout: a file a test created or changed there fails the run."""
    before = _checkout_state()
    yield
    after = _checkout_state()
    if before is not None and after is not None and after != before:
        new = sorted(set(after.splitlines()) - set(before.splitlines()))
        pytest.fail(f"unit tests changed the checkout: {new[:10]}", pytrace=False)


@pytest.fixture(autouse=True)
def _restore_environ():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def _proxy_template():
    from mbridge_ep_overlap_recipes.proxy import proxy_base

    with offline_architectures():
        return proxy_base()


@pytest.fixture
def proxy_cfg(_proxy_template):
    """The proxy recipe's base config (overlap not yet on), a fresh copy per test."""
    return copy.deepcopy(_proxy_template)


@pytest.fixture
def h100x2():
    return describe("h100", 2, te_version="", deep_ep_version="")
