"""A shipped recipe function called directly builds offline, whatever the environment.

``HF_HUB_OFFLINE`` unset and every socket connection refused: a recipe that reached for the hub
would retry for minutes; each must build from the architecture file the package ships in seconds.
The README's quick start, which calls a recipe as written, runs the same way.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import socket
import time
from pathlib import Path

import pytest

from mbridge_ep_overlap.spec import registered_recipes
from mbridge_ep_overlap.target import offline

REPO = Path(__file__).resolve().parents[2]
RECIPES = registered_recipes()
SHIPPED = sorted(name for name, entry in RECIPES.items() if entry.function.startswith("mbridge_ep_overlap_recipes."))
BUILD_SECONDS = 10  # a hub retry loop takes minutes; a build from the shipped file takes about a second


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network disabled in this test")

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _function(name: str):
    module, _, attr = RECIPES[name].function.partition(":")
    return getattr(importlib.import_module(module), attr)


def test_every_shipped_recipe_is_covered():
    assert {"qwen3_30b_a3b", "qwen3_30b_a3b_hybridep", "qwen3_235b_a22b", "deepseek_v3", "qwen3_moe_proxy",
            "qwen3_moe_proxy_te", "qwen3_moe_proxy_packed"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipe_called_directly_builds_without_the_hub(name, no_network):
    from megatron.bridge.training.config import ConfigContainer

    fn = _function(name)
    start = time.monotonic()
    cfg = fn()
    elapsed = time.monotonic() - start
    assert isinstance(cfg, ConfigContainer)
    assert elapsed < BUILD_SECONDS, f"{name}() took {elapsed:.1f} s"
    assert offline._depth == 0, "the recipe left its offline context open"
    assert fn.__wrapped__ is not fn  # the undecorated recipe stays reachable


def test_a_recipe_inside_an_outer_context_answers_from_its_folder(tmp_path, no_network):
    """The recipe's own context defers to an enclosing one: ``--hf-config-dir`` still wins."""
    import json

    source = offline.HF_CONFIG_DIR / "Qwen--Qwen3-30B-A3B" / "config.json"
    data = json.loads(source.read_text())
    data["num_hidden_layers"] = 4
    (tmp_path / "Qwen--Qwen3-30B-A3B").mkdir()
    (tmp_path / "Qwen--Qwen3-30B-A3B" / "config.json").write_text(json.dumps(data))
    with offline.offline_architectures(tmp_path):
        cfg = _function("qwen3_30b_a3b")()
    assert cfg.model.num_layers == 4
    assert _function("qwen3_30b_a3b")().model.num_layers == json.loads(source.read_text())["num_hidden_layers"]


def test_readme_quick_start_runs_as_written(no_network):
    snippet = re.search(r"## Quick start\s+```python\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    assert "offline_architectures" not in snippet
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, "README.md", "exec"), {})
    assert "EP overlap plan" in out.getvalue()
