"""DeepEP as this library sees it: the fetch script, the build record, and the doctor's verdicts.

The build itself needs nvcc and a CUDA torch (it ran on the GPU test machine, see the README); what
is checked here runs on CPU: the source export, how a build record is summarized, and what the
dispatcher verdict says about a build without NVSHMEM.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from mbridge_ep_overlap.core.dispatcher import problems
from mbridge_ep_overlap.target.cluster import describe
from mbridge_ep_overlap.target.probe import summarize_deep_ep_build

ROOT = Path(__file__).resolve().parents[2]

RECORD = {
    "source": {"repository": "https://github.com/deepseek-ai/DeepEP.git", "ref": "hybrid-ep",
               "commit": "94a9f8f6b146c07d97ec58f67cd6d303296d6098"},
    "torch_cuda_arch_list": "9.0",
    "nvshmem": False,
    "kernels": "intranode (NVLink, one node)",
    "hybrid_ep": True,
    "torch": "2.11.0+cu130",
}


def test_build_record_summary_names_source_arch_and_kernels():
    line = summarize_deep_ep_build(RECORD)
    assert line.startswith("hybrid-ep@94a9f8f6b")
    for part in ("TORCH_CUDA_ARCH_LIST=9.0", "NVSHMEM: no", "kernels: intranode", "HybridEP: yes", "torch 2.11.0+cu130"):
        assert part in line, line
    assert "NVSHMEM: yes" in summarize_deep_ep_build({**RECORD, "nvshmem": True})
    assert summarize_deep_ep_build({}).startswith("unknown source")


def test_deepep_without_nvshmem_is_not_usable_but_hybridep_is():
    # Seen on 2x H200: MCore 0.19's get_buffer() calls get_rdma_buffer_size_hint even at EP=2, and a
    # DeepEP built with DEEPEP_NVSHMEM=off asserts there; HybridEP in the same build ran.
    env = replace(describe("h200", 2, deep_ep_version="1.2.1"), deep_ep_nvshmem=False, hybrid_ep_available=True)
    why = " ".join(problems("deepep", env))
    assert "without NVSHMEM" in why and "DEEPEP_NVSHMEM=auto" in why
    assert problems("hybridep", env) == []
    assert problems("deepep", replace(env, deep_ep_nvshmem=True)) == []


@pytest.fixture()
def deepep_like_repo(tmp_path):
    """A throwaway git repository shaped like DeepEP's (setup.py, figures/ that must not be copied)."""
    repo = tmp_path / "DeepEP"
    (repo / "figures").mkdir(parents=True)
    (repo / "setup.py").write_text("print('setup')\n")
    (repo / "figures" / "big.png").write_bytes(b"\x89PNG")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", "-b", "hybrid-ep", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    return repo, commit


def test_fetch_script_exports_the_tree_and_records_its_origin(deepep_like_repo, tmp_path):
    repo, commit = deepep_like_repo
    dest = tmp_path / "src"
    run = subprocess.run(["bash", str(ROOT / "scripts/gpu/fetch_deepep.sh"), str(repo), "hybrid-ep"],
                         env={"PATH": "/usr/bin:/bin", "DEEPEP_SRC": str(dest)}, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (dest / "setup.py").exists() and not (dest / "figures").exists() and not (dest / ".git").exists()
    assert json.loads((dest / "EP_OVERLAP_SOURCE").read_text()) == {
        "repository": str(repo), "ref": "hybrid-ep", "commit": commit}


def test_fetch_script_refuses_an_unknown_ref(deepep_like_repo, tmp_path):
    repo, _ = deepep_like_repo
    run = subprocess.run(["bash", str(ROOT / "scripts/gpu/fetch_deepep.sh"), str(repo), "no-such-branch"],
                         env={"PATH": "/usr/bin:/bin", "DEEPEP_SRC": str(tmp_path / "src")}, capture_output=True, text=True)
    assert run.returncode == 2 and "no ref 'no-such-branch'" in run.stderr


def test_flex_buffer_evidence_reads_the_globals_megatron_core_really_has():
    """The functional suite proves DeepEP/HybridEP moved the tokens by reading MCore's buffer
    globals; if a megatron-core update renamed them, this evidence would silently read False."""
    from megatron.core.transformer.moe import fused_a2a

    from mbridge_ep_overlap.tools.evidence import flex_buffers

    assert hasattr(fused_a2a, "_buffer") and hasattr(fused_a2a, "_hybrid_ep_buffer")
    assert flex_buffers() == {"deepep": False, "hybridep": False}


def test_hybridep_needs_nvcc_under_cuda_home_on_the_gpu_node(proxy_cfg, tmp_path):
    from mbridge_ep_overlap import check_ep_overlap, enable_ep_overlap

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("#!/bin/sh\n")
    on_node = replace(describe("h200", 2, deep_ep_version="1.2.1"), source="probed", hybrid_ep_available=True)
    with_toolkit = replace(on_node, env_vars={"CUDA_HOME": str(tmp_path)})
    enable_ep_overlap(proxy_cfg, "hybridep", resolve="auto", environment=with_toolkit)
    ids = lambda env: {v.rule_id for v in check_ep_overlap(proxy_cfg, environment=env)}  # noqa: E731
    assert "hybridep-jit-nvcc" not in ids(with_toolkit)
    assert "hybridep-jit-nvcc" in ids(replace(on_node, env_vars={"CUDA_HOME": str(tmp_path / "missing")}))
    # Planning for another machine cannot know its toolkit: not checked there.
    assert "hybridep-jit-nvcc" not in ids(describe("h200", 2, deep_ep_version="1.2.1"))


@pytest.mark.parametrize("nvshmem,make_src,needle", [
    ("auto", False, "no DeepEP source in"),
    ("maybe", True, "DEEPEP_NVSHMEM must be auto or off"),
])
def test_build_script_refuses_bad_input_before_compiling(tmp_path, nvshmem, make_src, needle):
    src = tmp_path / "src"
    if make_src:
        src.mkdir()
        (src / "setup.py").write_text("raise SystemExit('must not run')\n")
    run = subprocess.run(["bash", str(ROOT / "scripts/gpu/build_deepep.sh"), str(src), str(tmp_path / "out")],
                         env={"PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path), "DEEPEP_NVSHMEM": nvshmem},
                         capture_output=True, text=True)
    assert run.returncode == 2 and needle in run.stderr, run.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
