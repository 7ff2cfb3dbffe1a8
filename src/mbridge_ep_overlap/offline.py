"""Build Megatron-Bridge recipes without the Hugging Face hub.

Contract: MB's base recipes call ``AutoBridge.from_hf_pretrained("<org>/<model>")`` at call time,
which reads only the model's ``config.json`` from the hub. This package ships those architecture
files (``hf_configs/<org>--<model>/config.json``, the public configs). Inside
``offline_architectures()`` the hub ids we ship are answered from those local folders through
MB's real ``AutoBridge`` conversion (so the providers are exactly what MB builds); any other id
is refused with ``UsageError`` instead of touching the network. Nothing outside the context
is changed.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from .errors import UsageError

HF_CONFIG_DIR = Path(__file__).parent / "hf_configs"


def shipped_models() -> dict[str, Path]:
    return {p.name.replace("--", "/", 1): p for p in sorted(HF_CONFIG_DIR.iterdir()) if (p / "config.json").is_file()}


@contextlib.contextmanager
def offline_architectures() -> Iterator[dict[str, Path]]:
    from megatron.bridge import AutoBridge

    models = shipped_models()
    original = AutoBridge.__dict__["from_hf_pretrained"]

    def from_hf_pretrained(cls, path, **kwargs):
        key = str(path)
        if key in models:
            kwargs.pop("revision", None)  # a local folder has no revisions
            return original.__func__(cls, str(models[key]), **kwargs)
        if Path(key).is_dir():
            return original.__func__(cls, key, **kwargs)
        raise UsageError("Hugging Face model (offline build)", key, sorted(models))

    AutoBridge.from_hf_pretrained = classmethod(from_hf_pretrained)
    try:
        yield models
    finally:
        AutoBridge.from_hf_pretrained = original
