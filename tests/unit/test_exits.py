"""The exit-code contract's plumbing (runtime/exits.py): bad usage is one line on the whole of stderr,
what the libraries wrote while a command prepared is replayed unchanged on any other outcome, a
logging handler made during the hold keeps working, and faulthandler still reaches the real stderr.
Real file descriptors (capfd), no Megatron."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from mbridge_ep_overlap.base.errors import EPOverlapError, UsageError
from mbridge_ep_overlap.runtime import exits


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("EP_OVERLAP_VERBOSE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


def noisy(then):
    def action():
        os.write(2, b"library noise on fd 2\n")
        return then()
    return action


def _raise(error):
    raise error


@pytest.mark.parametrize("then,code,kept", [
    (lambda: 0, 0, True),
    (lambda: _raise(EPOverlapError([], "test")), 1, True),
    (lambda: _raise(UsageError("flag", "x", "y")), 2, False),
    (lambda: _raise(FileNotFoundError(2, "No such file", "/no/file")), 2, False),
    (lambda: 2, 2, False),  # an action's own exit 2 has printed its one line
])
def test_held_noise_is_replayed_unless_the_answer_is_bad_usage(then, code, kept, capfd):
    assert exits.run_reporting_errors("prog", noisy(then), hold_stderr=True) == code
    err = capfd.readouterr().err
    assert ("library noise on fd 2" in err) == kept, err
    if code == 2 and not kept:
        assert len(err.strip().splitlines()) <= 1, err
    assert exits._Hold.current is None


def test_without_hold_nothing_is_held(capfd):
    assert exits.run_reporting_errors("prog", noisy(lambda: _raise(UsageError("flag", "x", "y")))) == 2
    assert "library noise" in capfd.readouterr().err


@pytest.mark.parametrize("env", ["EP_OVERLAP_VERBOSE", "LOCAL_RANK"])
def test_verbose_and_torchrun_ranks_never_hold(env, monkeypatch, capfd):
    monkeypatch.setenv(env, "1" if env == "EP_OVERLAP_VERBOSE" else "0")
    exits.run_reporting_errors("prog", noisy(lambda: _raise(UsageError("flag", "x", "y"))), hold_stderr=True)
    assert "library noise" in capfd.readouterr().err


def test_release_streams_from_then_on_and_an_unexpected_error_replays(capfd):
    def action():
        os.write(2, b"before\n")
        exits.release_stderr()
        assert exits._Hold.current is None
        os.write(2, b"after\n")
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError):
        exits.run_reporting_errors("prog", action, hold_stderr=True)
    err = capfd.readouterr().err
    assert err.index("before") < err.index("after")


def test_a_handler_made_during_the_hold_works_after_it(capfd):
    logger = logging.getLogger("ep_overlap_test_handler")
    logger.propagate = False

    def action():
        logger.addHandler(logging.StreamHandler())  # binds to sys.stderr as it is now
        exits.release_stderr()
        logger.warning("a warning after the hold")
        return 0
    try:
        exits.run_reporting_errors("prog", action, hold_stderr=True)
    finally:
        logger.handlers.clear()
    assert "a warning after the hold" in capfd.readouterr().err


def test_nested_holds_leave_the_outer_one_in_charge(capfd):
    def inner():
        os.write(2, b"inner noise\n")
        raise UsageError("inner", "x", "y")

    def outer():
        assert exits.run_reporting_errors("inner", inner, hold_stderr=True) == 2
        raise UsageError("outer", "x", "y")
    assert exits.run_reporting_errors("outer", outer, hold_stderr=True) == 2
    err = capfd.readouterr().err
    assert "inner noise" not in err and err.strip().splitlines()[-1].startswith("outer: error:")


SCRIPT = textwrap.dedent("""
    import faulthandler, os, sys
    from mbridge_ep_overlap.runtime import exits
    {setup}
    def action():
        os.write(2, b"noise\\n")
        {body}
    sys.exit(exits.run_reporting_errors("prog", action, hold_stderr=True))
""")


@pytest.mark.parametrize("setup,body,expect,code", [
    ("faulthandler.enable()", "faulthandler._sigsegv()", "Fatal Python error", -11),
    ("", "faulthandler.enable(file=exits.crash_stream()); faulthandler._sigsegv()", "Fatal Python error", -11),
    ("sys.stderr = None", "raise exits.UsageError('flag', 'x', 'y')", "", 2),
], ids=["enabled-before", "enabled-during", "no-stderr"])
def test_real_process_edges(setup, body, expect, code):
    """A native crash while stderr is held still prints its report; a process without stderr
    (``2>&-`` or ``sys.stderr = None``) still answers with its exit code."""
    result = subprocess.run([sys.executable, "-c", SCRIPT.format(setup=setup, body=body)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == code, result.stderr
    assert expect in result.stderr


def test_closed_stderr_is_no_traceback():
    result = subprocess.run([sys.executable, "-m", "mbridge_ep_overlap", "verify-log", "/no/such.log"],
                            stderr=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, timeout=60,
                            preexec_fn=lambda: os.close(2))
    assert result.returncode == 2


def test_an_interrupt_is_130_in_one_line(capfd):
    assert exits.run_reporting_errors("prog", noisy(lambda: _raise(KeyboardInterrupt())), hold_stderr=True) == 130
    err = capfd.readouterr().err
    assert err.strip() == "prog: interrupted"


def test_unwritable_stderr_keeps_the_exit_code():
    """`2>/dev/full`: the one line cannot be written, the code is still 2 (not 1, a refusal)."""
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "mbridge_ep_overlap", "verify-log", "/no/such.log"],
                                stderr=full, stdout=subprocess.DEVNULL, timeout=60)
    assert result.returncode == 2


def test_a_closed_stdout_pipe_is_141_not_bad_usage(monkeypatch):
    silenced = []
    monkeypatch.setattr(exits, "_silence_stdout", lambda: silenced.append(True))  # keep this test's stdout

    def action():
        raise BrokenPipeError(32, "Broken pipe")
    assert exits.run_reporting_errors("prog", action) == 141 and silenced


@pytest.mark.parametrize("then,code,kept", [
    (lambda: 0, 0, True),
    (lambda: _raise(EPOverlapError([], "test")), 1, True),
    (lambda: _raise(UsageError("flag", "x", "y")), 2, False),
    (lambda: 2, 2, False),
], ids=["ok", "refused", "usage", "own-exit-2"])
def test_stdout_is_held_too_and_empty_on_bad_usage(then, code, kept, capfd):
    """What a library logs to stdout while a command prepares (megatron.training's root handler does)
    is held like stderr: gone on bad usage, written out unchanged on any other answer."""
    def action():
        os.write(1, b"library log line on fd 1\n")
        return then()
    assert exits.run_reporting_errors("prog", action, hold_stderr=True) == code
    out = capfd.readouterr().out
    assert ("library log line on fd 1" in out) == kept and (kept or out == ""), out
    assert exits._Hold.current is None


def test_a_closed_stdout_pipe_while_replaying_is_141(monkeypatch):
    """The held stdout written out to a reader that went away: 141, as while printing, never a traceback."""
    monkeypatch.setattr(exits, "_silence_stdout", lambda: None)

    class Gone:
        buffer = None

        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    def action():
        os.write(1, b"held\n")
        monkeypatch.setattr(sys, "stdout", Gone())
        return 0
    assert exits.run_reporting_errors("prog", action, hold_stderr=True) == 141
