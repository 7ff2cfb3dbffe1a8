"""Recipe support: ``@with_ep_overlap`` turns an MB recipe function into one with EP overlap on.

Contract
--------
A recipe is a zero-argument function returning a Megatron-Bridge ``ConfigContainer`` for a stated
cluster (GPU kind and count). Decorating it with ``@with_ep_overlap(name=..., gpu=..., num_gpus=...,
dispatcher=..., delay_wgrad=...)``:

* registers it under ``name`` in ``RECIPES`` (what ``plan --recipe`` and ``run_script.py`` look up);
* builds it offline (``offline.offline_architectures``): the hub ids MB's base recipes ask for are
  answered from the architecture files this package ships;
* calls ``enable_ep_overlap`` against the stated cluster, so calling the recipe returns a config
  with overlap on and finalize-time enforcement installed. ``build(ep_overlap=False)`` really turns
  it off (both comm-overlap flags, snapshot and model), unlike MB's ``--moe_a2a_overlap false``.

This is the one recipe design used everywhere in this project (see ``recipes/``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from .enable import disable_ep_overlap, enable_ep_overlap
from .environment import ClusterEnvironment, describe
from .errors import UsageError
from .offline import offline_architectures
from .plan import OverlapPlan


@dataclass(frozen=True)
class RecipeInfo:
    name: str
    gpu: str
    num_gpus: int
    dispatcher: str
    delay_wgrad: bool
    summary: str


class EPOverlapRecipe:
    def __init__(self, fn: Callable[[], Any], info: RecipeInfo) -> None:
        self.fn = fn
        self.info = info
        functools.update_wrapper(self, fn)

    def cluster(self, num_gpus: int | None = None, gpu: str | None = None) -> ClusterEnvironment:
        return describe(gpu or self.info.gpu, num_gpus or self.info.num_gpus)

    def base(self) -> Any:
        """The recipe's config before EP overlap is applied (built offline)."""
        with offline_architectures():
            return self.fn()

    def build(
        self,
        *,
        ep_overlap: bool = True,
        dispatcher: str | None = None,
        delay_wgrad: bool | None = None,
        resolve: str = "error",
        environment: ClusterEnvironment | None = None,
    ) -> tuple[Any, OverlapPlan | None]:
        cfg = self.base()
        if not ep_overlap:
            disable_ep_overlap(cfg)
            return cfg, None
        plan = enable_ep_overlap(
            cfg,
            dispatcher or self.info.dispatcher,
            delay_wgrad=self.info.delay_wgrad if delay_wgrad is None else delay_wgrad,
            resolve=resolve,
            environment=environment or self.cluster(),
        )
        return cfg, plan

    def __call__(self) -> Any:
        return self.build()[0]


RECIPES: dict[str, EPOverlapRecipe] = {}


def set_fields(obj: Any, **values: Any) -> None:
    """Recipe helper: set several attributes of one config section, refusing unknown names."""
    for name, value in values.items():
        if not hasattr(obj, name):
            raise AttributeError(f"{type(obj).__name__} has no field {name!r}")
        setattr(obj, name, value)


def with_ep_overlap(
    *,
    name: str,
    gpu: str,
    num_gpus: int,
    dispatcher: str = "alltoall",
    delay_wgrad: bool = False,
) -> Callable[[Callable[[], Any]], EPOverlapRecipe]:
    def wrap(fn: Callable[[], Any]) -> EPOverlapRecipe:
        summary = (fn.__doc__ or name).strip().splitlines()[0]
        recipe = EPOverlapRecipe(fn, RecipeInfo(name, gpu, num_gpus, dispatcher, delay_wgrad, summary))
        RECIPES[name] = recipe
        return recipe

    return wrap


def load_recipes() -> dict[str, EPOverlapRecipe]:
    """Import the shipped recipes package so that its recipes register."""
    import mbridge_ep_overlap_recipes  # noqa: F401

    return RECIPES


def get_recipe(name: str) -> EPOverlapRecipe:
    recipes = load_recipes()
    if name not in recipes:
        raise UsageError("recipe", name, sorted(recipes))
    return recipes[name]
