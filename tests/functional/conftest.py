"""Functional GPU suite: skip with the reason when the hardware or a package is missing."""

from __future__ import annotations

import os

import pytest


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def pytest_collection_modifyitems(config, items):
    need = int(os.environ.get("EP_OVERLAP_TEST_GPUS", "2"))
    have = gpu_count()
    if have >= need:
        return
    reason = f"needs {need} CUDA GPUs (EP_OVERLAP_TEST_GPUS), found {have}"
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))
