"""Runnable EP-overlap recipes (installed as ``mbridge_ep_overlap_recipes``).

Each module defines zero-argument recipe functions decorated with
``mbridge_ep_overlap.recipe.with_ep_overlap``; importing this package registers them all.
"""

from . import deepseek, proxy, qwen3  # noqa: F401
