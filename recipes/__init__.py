"""Runnable EP-overlap recipes (installed as ``mbridge_ep_overlap_recipes``).

Each recipe is a plain zero-argument function returning a Megatron-Bridge ``ConfigContainer``
(the MB base recipe plus the changes its docstring lists). ``REGISTRY`` is the explicit list of
them, read from ``registry.tsv`` beside this file: the cluster each is written for and the
EP-overlap choices ``build`` applies. It is published to the library through the entry-point group
``mbridge_ep_overlap.recipes`` (pyproject.toml), so the library never imports this package by name
and a user's own package can publish recipes the same way. Importing this module imports no recipe
module (no Megatron).
"""

from pathlib import Path

from mbridge_ep_overlap.spec import RecipeEntry


def _read_registry(path: Path) -> dict[str, RecipeEntry]:
    """The rows of ``registry.tsv`` (name, module:function, GPU, GPUs, dispatcher, summary)."""
    entries = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, function, gpu, gpus, dispatcher, summary = line.split("\t")
        entries[name] = RecipeEntry(function=f"{__name__}.{function}", gpu=gpu, num_gpus=int(gpus),
                                    dispatcher=dispatcher, summary=summary)
    return entries


REGISTRY = _read_registry(Path(__file__).with_name("registry.tsv"))
