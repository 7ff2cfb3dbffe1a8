"""Build Megatron-Bridge recipes without the Hugging Face hub.

Contract: MB's recipes call ``AutoBridge.from_hf_pretrained("<org>/<model>")`` at call time,
which reads only the model's ``config.json``. Inside ``offline_architectures(extra_dir)`` such an
id is answered, in this order, from ``extra_dir`` (``<org>--<model>/config.json`` or
``<org>/<model>/config.json``: ``--hf-config-dir``), from the architecture files this package
ships (``hf_configs/``, public configs), or from the local Hugging Face hub cache
(``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``, any snapshot holding a
``config.json``), always through MB's real ``AutoBridge`` conversion so the providers are exactly
what MB builds. An id found nowhere is refused with one ``UsageError`` naming the model; the
network is never touched. A local folder path is passed through. Nothing outside the context is
changed. Inside an enclosing ``offline_architectures`` a nested one without a folder of its own
changes nothing: the enclosing one (and its ``extra_dir``) answers.

``builds_offline(recipe)`` wraps a recipe function so that calling it is offline whatever the
environment (``HF_HUB_OFFLINE`` set or not, a network or none): every shipped recipe is decorated
with it, so ``qwen3_30b_a3b()`` works as written.
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from ..base.errors import UsageError

HF_CONFIG_DIR = Path(__file__).parent / "hf_configs"
_depth = 0  # how many offline_architectures contexts are open (a nested one defers to the outer)


def shipped_models() -> dict[str, Path]:
    return {p.name.replace("--", "/", 1): p for p in sorted(HF_CONFIG_DIR.iterdir()) if (p / "config.json").is_file()}


def _hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME")
    return Path(home) / "hub" if home else Path.home() / ".cache" / "huggingface" / "hub"


def _find_architecture(model_id: str, extra_dir: str | os.PathLike | None = None) -> Path | None:
    """The folder holding ``config.json`` for ``model_id`` (``org/name``), or None."""
    org_name = model_id.replace("/", "--", 1)
    candidates = []
    if extra_dir:
        candidates += [Path(extra_dir) / org_name, Path(extra_dir) / model_id]
    candidates.append(HF_CONFIG_DIR / org_name)
    snapshots = _hub_cache() / f"models--{org_name}" / "snapshots"
    if snapshots.is_dir():
        candidates += sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    return next((c for c in candidates if (c / "config.json").is_file()), None)


def _check_config_file(path: Path) -> None:
    """transformers reads a malformed config.json four times and then blames the network."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UsageError("architecture file", str(path), f"a readable JSON file ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})", "unreadable") from None
    if not isinstance(data, dict):
        raise UsageError("architecture file", str(path), "a JSON object (a Hugging Face config.json)", "invalid")


@contextlib.contextmanager
def offline_architectures(extra_dir: str | os.PathLike | None = None) -> Iterator[None]:
    global _depth
    if _depth and extra_dir is None:  # the enclosing context already answers, with its own folder
        yield
        return
    from megatron.bridge import AutoBridge

    if extra_dir is not None and not Path(extra_dir).is_dir():
        problem = ("not a folder" if Path(extra_dir).exists() else
                   "a symbolic-link loop or unreachable" if Path(extra_dir).is_symlink() else "nonexistent")
        raise UsageError("--hf-config-dir", str(extra_dir), "an existing folder of <org>--<model>/config.json files",
                         problem)
    original = AutoBridge.__dict__["from_hf_pretrained"]

    def from_hf_pretrained(cls, path, **kwargs):
        key = str(path)
        if Path(key).is_dir():
            if Path(key, "config.json").exists():
                _check_config_file(Path(key, "config.json"))
            return original.__func__(cls, key, **kwargs)
        folder = _find_architecture(key, extra_dir)
        if folder is None:
            raise UsageError("Hugging Face model (offline build)", key,
                             f"a config.json for it in --hf-config-dir, the shipped architectures "
                             f"({', '.join(sorted(shipped_models()))}) or the local hub cache ({_hub_cache()})")
        kwargs.pop("revision", None)  # a local folder has no revisions
        _check_config_file(folder / "config.json")
        return original.__func__(cls, str(folder), **kwargs)

    AutoBridge.from_hf_pretrained = classmethod(from_hf_pretrained)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        AutoBridge.from_hf_pretrained = original


def builds_offline(recipe: Callable[..., Any]) -> Callable[..., Any]:
    """``recipe`` called inside ``offline_architectures()`` (module docstring); ``__wrapped__`` is it."""

    @functools.wraps(recipe)
    def offline_recipe(*args: Any, **kwargs: Any) -> Any:
        with offline_architectures():
            return recipe(*args, **kwargs)

    return offline_recipe
