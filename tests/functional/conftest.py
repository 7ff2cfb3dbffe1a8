"""Functional GPU suite: skip with the reason when the hardware or a package is missing.

The runs are declared and launched by ``functional_suite.Suite`` (session fixture ``suite``) as soon
as the session starts, only those the selected tests use (marker ``runs``). The dispatcher smoke
check runs first, in parallel with the non-flex runs, or its verdicts are reused from this node's
cache when ``doctor --smoke`` ran within ``EP_OVERLAP_SMOKE_MAX_AGE`` seconds (default 3600;
``EP_OVERLAP_SMOKE=fresh`` forces a new check). A flex run whose backend is not usable is not
launched and its tests skip with the verdict, while ``test_dispatcher_health`` fails on a crash,
hang or wrong result. ``te`` test ids skip with the reason when Transformer Engine does not import;
``EP_OVERLAP_STACKS=local`` (or ``te``) deselects the other stack's tests.
The terminal summary lists every run's wall time and step times.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from functional_suite import STACKS, NotRun, Suite, gpu_count, te_problem


def pytest_configure(config):
    config.addinivalue_line("markers", "runs(*names): the suite runs a test uses ('{stack}': its parameter)")
    config.addinivalue_line("markers", "stack(name): the layer stack a test runs on when it has no stack parameter")


def selected_stacks() -> set[str]:
    """``EP_OVERLAP_STACKS`` (comma list of ``local``, ``te``; default both): the layer stacks to test."""
    raw = os.environ.get("EP_OVERLAP_STACKS", "").strip()
    chosen = {s.strip() for s in raw.split(",") if s.strip()} if raw else set(STACKS)
    if chosen - set(STACKS):
        raise pytest.UsageError(f"EP_OVERLAP_STACKS={raw!r}: unknown stack(s) {sorted(chosen - set(STACKS))}; "
                                f"allowed: {', '.join(STACKS)}")
    return chosen


def _stacks_of(item) -> set[str]:
    """The layer stacks a test exercises: its ``stack`` parameter and the stacks of the runs it uses."""
    named = {_stack_of(item)} | {name.split("-", 1)[0] for name in runs_of(item)}
    named |= {stack for mark in item.iter_markers("stack") for stack in mark.args}
    return named & set(STACKS)


def pytest_collection_modifyitems(config, items):
    wanted = selected_stacks()
    dropped = [item for item in items if _stacks_of(item) and not _stacks_of(item) & wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]
    need = int(os.environ.get("EP_OVERLAP_TEST_GPUS", "2"))
    have = gpu_count()
    if have < need:
        reason = f"needs {need} CUDA GPUs (EP_OVERLAP_TEST_GPUS), found {have}"
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))
        return
    for item in items:
        if "gpu" in item.keywords and _stack_of(item) == "te" and te_problem():
            item.add_marker(pytest.mark.skip(reason=te_problem()))


def _stack_of(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("stack") if callspec else None


def runs_of(item) -> list[str]:
    """The run names a collected test uses, from its ``runs`` marker ('{stack}-{dispatcher}' is filled
    in from the test's parameters)."""
    callspec = getattr(item, "callspec", None)
    params = dict(callspec.params) if callspec else {}
    return [name.format(**params) for mark in item.iter_markers("runs") for name in mark.args]


_suite: list[Suite] = []


@pytest.fixture(scope="session")
def suite(request) -> Suite:
    from mbridge_ep_overlap.lab.launch import LOG_ROOT

    names = [n for item in request.session.items for n in runs_of(item)
             if not item.get_closest_marker("skip")]
    s = Suite(names, Path(LOG_ROOT))
    _suite.append(s)
    yield s
    s.close()


def pytest_terminal_summary(terminalreporter):
    if not _suite:
        return
    rows = [r for r in _suite[0].finished() if not isinstance(r, NotRun)]
    if not rows:
        return
    terminalreporter.section("functional runs")
    if _suite[0].smoke_source:
        terminalreporter.write_line(f"dispatcher smoke check: {_suite[0].smoke_source}")
    for r in sorted(rows, key=lambda r: r.name):
        steps = [round(s["step_time_s"], 3) for s in (r.summary or {}).get("steps", [])]
        state = "timed out" if r.timed_out else f"exit {r.returncode}"
        terminalreporter.write_line(f"{r.name:32s} {r.seconds:5.0f} s wall  {state:9s} step times {steps}")
