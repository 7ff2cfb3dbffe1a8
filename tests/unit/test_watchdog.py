"""The progress watchdog (runtime.watchdog): thresholds from step times, one record per stall, the files."""

from __future__ import annotations

import json
import threading
import time

from mbridge_ep_overlap.base import run_files
from mbridge_ep_overlap.runtime.watchdog import ProgressWatchdog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watchdog(tmp_path, clock, **kw):
    dumps = []
    wd = ProgressWatchdog(1, run_files.faulthandler_file(tmp_path, 1), run_files.watchdog_file(tmp_path, 1),
                          dump_flight_recorder=lambda: dumps.append(1) or "fr-path", clock=clock,
                          position=lambda: {"layer": 2, "op": "combine", "phase": "forward", "microbatch": 1,
                                            "done": False}, **kw)
    return wd, dumps


def _events(tmp_path):
    path = run_files.watchdog_file(tmp_path, 1)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_threshold_first_then_median_with_floor(tmp_path):
    clock = Clock()
    wd, _ = _watchdog(tmp_path, clock, first_s=300, floor_s=30, factor=10)
    assert wd.threshold_s() == 300  # nothing completed yet: start-up
    clock.now += 50
    wd.progress(1)
    assert wd.threshold_s() == 300  # one iteration: its time includes start-up
    for step in range(2, 6):
        clock.now += 1.0
        wd.progress(step)
    assert wd.threshold_s() == 30  # 10 x 1 s median is under the floor
    for step in range(6, 30):
        clock.now += 5.0
        wd.progress(step)
    assert wd.threshold_s() == 50  # 10 x the median (5 s)


def test_fixed_threshold_wins_after_the_first_iteration(tmp_path):
    clock = Clock()
    wd, _ = _watchdog(tmp_path, clock, first_s=300, fixed_s=20)
    assert wd.threshold_s() == 300
    wd.progress(1)
    assert wd.threshold_s() == 20


def test_cap_bounds_the_steady_threshold_below_the_floor_but_not_start_up(tmp_path):
    # the recorded NCCL-timeout case: a 60 s process-group timeout, the 60 s floor; capped at half of it
    clock = Clock()
    wd, _ = _watchdog(tmp_path, clock, first_s=600, floor_s=60, factor=10, cap_s=30)
    assert wd.threshold_s() == 600  # start-up is not one collective: not capped
    clock.now += 50
    wd.progress(1)
    assert wd.threshold_s() == 30
    for step in range(2, 6):
        clock.now += 1.0
        wd.progress(step)
    assert wd.threshold_s() == 30  # the cap wins over the 60 s floor
    clock.now += 31
    assert wd.check()  # recorded while the process group (60 s) still waits


def test_cap_leaves_a_lower_threshold_alone(tmp_path):
    clock = Clock()
    wd, _ = _watchdog(tmp_path, clock, first_s=300, floor_s=30, factor=10, cap_s=300)
    wd.progress(1)
    for step in range(2, 6):
        clock.now += 1.0
        wd.progress(step)
    assert wd.threshold_s() == 30


def test_stall_recorded_once_with_stacks_event_and_dump(tmp_path):
    clock = Clock()
    wd, dumps = _watchdog(tmp_path, clock, first_s=100, fixed_s=20)
    wd.progress(1)
    clock.now += 2
    wd.progress(2)
    clock.now += 19
    assert not wd.check() and not _events(tmp_path)
    clock.now += 2
    assert wd.check()
    clock.now += 60
    assert not wd.check()  # once per stall
    events = _events(tmp_path)
    assert len(events) == 1 and dumps == [1]
    event = events[0]
    assert set(event) == set(run_files.WATCHDOG_KEYS)
    assert event["event"] == "stall" and event["rank"] == 1 and event["iteration"] == 2
    assert event["seconds_since_progress"] == 21 and event["threshold_s"] == 20
    assert event["flight_recorder"] == "fr-path" and event["moe_position"]["layer"] == 2
    stacks = run_files.faulthandler_file(tmp_path, 1).read_text()
    assert "Watchdog: rank 1: no training iteration completed for 21 s" in stacks
    assert "test_stall_recorded_once_with_stacks_event_and_dump" in stacks  # this thread's frame


def test_progress_after_a_stall_is_recorded_and_rearms(tmp_path):
    clock = Clock()
    wd, dumps = _watchdog(tmp_path, clock, fixed_s=10)
    wd.progress(1)
    clock.now += 11
    assert wd.check()
    clock.now += 5
    wd.progress(2)
    clock.now += 11
    assert wd.check()
    assert [e["event"] for e in _events(tmp_path)] == ["stall", "progress", "stall"]
    assert dumps == [1, 1]


def test_a_failing_dump_is_recorded_not_raised(tmp_path):
    clock = Clock()

    def broken():
        raise RuntimeError("no NCCL here")

    wd = ProgressWatchdog(0, run_files.faulthandler_file(tmp_path, 0), run_files.watchdog_file(tmp_path, 0),
                          dump_flight_recorder=broken, clock=clock, first_s=5)
    clock.now += 6
    assert wd.check()
    event = json.loads(run_files.watchdog_file(tmp_path, 0).read_text())
    assert event["flight_recorder"] == "failed: RuntimeError: no NCCL here" and event["iteration"] is None


def test_the_thread_sees_a_real_stall_and_stops(tmp_path):
    wd = ProgressWatchdog(0, run_files.faulthandler_file(tmp_path, 0), run_files.watchdog_file(tmp_path, 0),
                          first_s=0.2, poll_s=0.05).start()
    deadline = time.monotonic() + 10
    while wd.stalls == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    wd.stop()
    assert wd.stalls == 1
    assert not any(t.name == "ep-overlap-watchdog" for t in threading.enumerate())
    stacks = run_files.faulthandler_file(tmp_path, 0).read_text()
    assert "(most recent call first)" in stacks and "test_the_thread_sees_a_real_stall_and_stops" in stacks


def test_native_backup_writes_stacks_without_the_python_thread(tmp_path):
    """faulthandler's C timer (re-armed at each progress) dumps the stacks even if the watchdog
    thread never runs (here: it is never started)."""
    wd = ProgressWatchdog(0, run_files.faulthandler_file(tmp_path, 0), run_files.watchdog_file(tmp_path, 0),
                          first_s=0.1, fixed_s=0.1, native_backup=True)
    try:
        wd.progress(1)  # armed at 2 x 0.1 s
        deadline = time.monotonic() + 10
        path = run_files.faulthandler_file(tmp_path, 0)
        while "Timeout" not in (path.read_text() if path.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "Timeout (0:00:00" in path.read_text() and "most recent call first" in path.read_text()
    finally:
        wd.stop()
