"""The probe reads GPU facts without initialising CUDA in the calling process.

CUDA_DEVICE_MAX_CONNECTIONS from ``cfg.env_vars`` takes effect only if it is set before the CUDA context
exists; MB applies ``cfg.env_vars`` in ``pretrain()``, after ``scripts/run_script.py`` probed the
machine. Only the hardware is faked here: a ``torch`` whose CUDA reports a GPU and records what would
initialise it.
"""

from __future__ import annotations

import json
import subprocess
import types

import pytest

from mbridge_ep_overlap.target import probe


class FakeCuda:
    def __init__(self, initialized: bool):
        self.initialized = initialized
        self.properties_read = 0

    def is_available(self):
        return True

    def is_initialized(self):
        return self.initialized

    def device_count(self):
        return 8

    def get_device_properties(self, index):
        self.properties_read += 1
        self.initialized = True  # what torch does: reading properties initialises CUDA
        return types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0)


def test_facts_come_from_a_child_while_cuda_is_not_initialised(monkeypatch):
    cuda = FakeCuda(initialized=False)
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps(["NVIDIA H200", 9, 0, 8]) + "\n", stderr="")

    monkeypatch.setattr(probe.subprocess, "run", run)
    assert probe.gpu_facts(types.SimpleNamespace(cuda=cuda)) == ("NVIDIA H200", (9, 0), 8)
    assert cuda.properties_read == 0 and not cuda.initialized
    assert len(calls) == 1 and "get_device_properties" in calls[0][-1]


def test_an_initialised_process_reads_its_own_properties(monkeypatch):
    cuda = FakeCuda(initialized=True)
    monkeypatch.setattr(probe.subprocess, "run", lambda *a, **k: pytest.fail("no child needed"))
    assert probe.gpu_facts(types.SimpleNamespace(cuda=cuda)) == ("NVIDIA H200", (9, 0), 8)
    assert cuda.properties_read == 1


def test_a_failing_child_is_an_error_that_says_why(monkeypatch):
    cuda = FakeCuda(initialized=False)

    def run(cmd, **kw):
        raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(probe.subprocess, "run", run)
    with pytest.raises(RuntimeError, match="child process failed"):
        probe.gpu_facts(types.SimpleNamespace(cuda=cuda))
    assert not cuda.initialized


def test_no_gpu_no_child(monkeypatch):
    monkeypatch.setattr(probe.subprocess, "run", lambda *a, **k: pytest.fail("no child without a GPU"))
    cuda = types.SimpleNamespace(is_available=lambda: False)
    assert probe.gpu_facts(types.SimpleNamespace(cuda=cuda)) == (None, None, None)
