"""A progress watchdog for one training rank: a stall becomes evidence in seconds, not after NCCL's timeout.

Contract
--------
``ProgressWatchdog`` is told each completed training iteration (``progress(iteration)``). A daemon
thread (``start()``) checks every ``poll_s``; when no iteration has completed for longer than
``threshold_s()`` it records the stall **once** (until the next progress):

* every thread's Python stack (``faulthandler.dump_traceback``) appended to the rank's faulthandler
  file, under a ``Watchdog: ...`` header line,
* one ``stall`` event (``base.run_files.WATCHDOG_KEYS``) appended to the rank's watchdog file,
* a call of ``dump_flight_recorder`` (the caller's: PyTorch's on-demand flight-recorder dump); the
  event carries where the dump went and, from the caller's ``position``, where in the schedule the
  rank was (``moe_position``).

When iterations complete again after a stall, one ``progress`` event says so (slow, not hung).

A stall that holds the GIL (a native call that never releases it) would keep the thread from
running; ``native_backup`` covers it: faulthandler's own C timer (``dump_traceback_later``,
re-armed at each progress at twice the threshold) writes every thread's stack to the same file
under faulthandler's ``Timeout (h:mm:ss)!`` header without needing the GIL.

The threshold: before the first completed iteration ``first_s`` (start-up, compilation, the first
step's allocations); afterwards ``fixed_s`` when given, else ``max(floor_s, factor x median step
time so far)``. ``check(now)`` is the whole decision and is what the thread calls, so it is tested
without threads or sleeping. Nothing here imports torch or Megatron; every failure to write evidence
is reported on stderr once and never stops training.
"""

from __future__ import annotations

import faulthandler
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable

FIRST_S = 600.0
"""Default threshold before the first iteration completes (start-up is slow and varies)."""
FLOOR_S = 60.0
"""Default smallest threshold once step times are known."""
FACTOR = 10.0
"""Default multiple of the median step time that counts as a stall."""
PG_TIMEOUT_FRACTION = 0.5
"""The steady threshold's cap as a fraction of the process group's timeout: half leaves the other half for
the stacks, the flight-recorder dump and the event to be written while the ranks still wait."""


class ProgressWatchdog:
    def __init__(self, rank: int, faulthandler_path: Path, events_path: Path, *,
                 dump_flight_recorder: Callable[[], str | None] | None = None,
                 first_s: float = FIRST_S, floor_s: float = FLOOR_S, factor: float = FACTOR,
                 fixed_s: float | None = None, cap_s: float | None = None, poll_s: float = 1.0,
                 position: Callable[[], dict | None] | None = None, native_backup: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rank = rank
        self.faulthandler_path = Path(faulthandler_path)
        self.events_path = Path(events_path)
        self.dump_flight_recorder = dump_flight_recorder
        self.first_s, self.floor_s, self.factor, self.fixed_s = first_s, floor_s, factor, fixed_s
        self.cap_s = cap_s
        self.poll_s = poll_s
        self.position = position
        self.native_backup = native_backup
        self._native_file = None
        self.clock = clock
        self.iteration: int | None = None
        self.step_times: list[float] = []
        self.last_progress = clock()
        self.stalls = 0
        self._stalled = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reported: set[str] = set()

    # ---- what the training loop calls ----------------------------------------------------------
    def restart_clock(self) -> None:
        """Training starts now: the start-up threshold counts from here."""
        with self._lock:
            self.last_progress = self.clock()

    def progress(self, iteration: int) -> None:
        """Iteration ``iteration`` completed (cheap: a clock read and an append)."""
        now = self.clock()
        with self._lock:
            if self.iteration is not None:
                self.step_times.append(now - self.last_progress)
            resumed = self._stalled
            self.iteration = iteration
            self.last_progress = now
            self._stalled = False
        self._arm_native()
        if resumed:  # a stall that ended by itself: slow, not hung
            self._event({"event": "progress", "rank": self.rank, "iteration": iteration,
                         "seconds_since_progress": round(self.step_times[-1], 3) if self.step_times else None,
                         "threshold_s": round(self.threshold_s(), 3), "time": time.time(), "flight_recorder": None,
                         "moe_position": None})

    # ---- the decision ------------------------------------------------------------------------------
    def threshold_s(self) -> float:
        if self.iteration is None:
            return self.first_s
        if self.fixed_s is not None:
            return self.fixed_s
        if not self.step_times:
            steady = max(self.floor_s, self.first_s)  # one iteration done: its time includes start-up
        else:
            steady = max(self.floor_s, self.factor * statistics.median(self.step_times))
        return steady if self.cap_s is None else min(steady, self.cap_s)

    def check(self, now: float | None = None) -> bool:
        """Record a stall if there is a new one at ``now``; True when one was recorded."""
        now = self.clock() if now is None else now
        with self._lock:
            waited = now - self.last_progress
            threshold = self.threshold_s()
            if self._stalled or waited <= threshold:
                return False
            self._stalled = True
            self.stalls += 1
            iteration = self.iteration
        self._record(iteration, waited, threshold)
        return True

    # ---- the thread ----------------------------------------------------------------------------------
    def start(self) -> "ProgressWatchdog":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ep-overlap-watchdog", daemon=True)
            self._thread.start()
        self._arm_native()
        return self

    def _arm_native(self) -> None:
        if not self.native_backup:
            return
        try:
            if self._native_file is None:
                self.faulthandler_path.parent.mkdir(parents=True, exist_ok=True)
                self._native_file = open(self.faulthandler_path, "a")  # held open: the C timer writes to its fd
            faulthandler.dump_traceback_later(2 * self.threshold_s(), repeat=False, file=self._native_file)
        except (OSError, ValueError) as e:
            self._warn("native stacks", e)

    def stop(self) -> None:
        if self._native_file is not None:
            faulthandler.cancel_dump_traceback_later()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.poll_s + 1)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception as e:  # noqa: BLE001 - the watchdog must never take a rank down
                self._warn("check", e)

    # ---- writing the evidence --------------------------------------------------------------------
    def _record(self, iteration: int | None, waited: float, threshold: float) -> None:
        header = (f"Watchdog: rank {self.rank}: no training iteration completed for {waited:.0f} s "
                  f"(threshold {threshold:.0f} s; last completed iteration: {iteration}); "
                  f"Python stacks of every thread follow\n")
        try:
            self.faulthandler_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.faulthandler_path, "a") as f:
                f.write(header)
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
        except OSError as e:
            self._warn("stacks", e)
        fr = None
        if self.dump_flight_recorder is not None:
            try:
                fr = self.dump_flight_recorder()
            except Exception as e:  # noqa: BLE001 - a dump that fails is reported, the stall still recorded
                fr = f"failed: {type(e).__name__}: {e}"
        event = {"event": "stall", "rank": self.rank, "iteration": iteration,
                 "seconds_since_progress": round(waited, 3), "threshold_s": round(threshold, 3),
                 "time": time.time(), "flight_recorder": fr,
                 "moe_position": self.position() if self.position is not None else None}
        self._event(event)
        print(f"[ep-overlap watchdog] {header.strip()} -> {self.faulthandler_path}", file=sys.stderr, flush=True)

    def _event(self, event: dict) -> None:
        try:
            self.events_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.events_path, "a") as f:
                f.write(json.dumps(event) + "\n")
        except OSError as e:
            self._warn("events", e)

    def _warn(self, what: str, error: BaseException) -> None:
        if what not in self._reported:
            self._reported.add(what)
            print(f"[ep-overlap watchdog] rank {self.rank}: could not write {what}: {type(error).__name__}: {error}",
                  file=sys.stderr, flush=True)
