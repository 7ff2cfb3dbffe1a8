"""Wide EP without the GPUs: the suite's launch commands and configs for N = 2, 4, 8 on CPU."""

from pathlib import Path

import pytest

from mbridge_ep_overlap.lab.launch import launch_command, proxy_args
from mbridge_ep_overlap.tools.run import main


@pytest.mark.parametrize("nproc", [2, 4, 8])
def test_launch_command_and_finalized_config(nproc, tmp_path, capsys):
    args = proxy_args(nproc)
    cmd = launch_command("overlap_alltoall", nproc, [*args, "--ep-overlap", "on"], tmp_path)
    assert cmd[cmd.index("--nproc_per_node") + 1] == str(nproc)
    assert cmd[cmd.index("--ep") + 1] == str(nproc) and cmd[-2:] == ["--summary-json", str(tmp_path / "summary.json")]
    assert Path(cmd[cmd.index("--tee") + 2]).name == "run_script.py"

    code = main([*args, "--dryrun", "--gpu", "h200", "--num-gpus", str(nproc), "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    for line in (f"expert_model_parallel_size: {nproc}", f"data_parallel_size: {nproc}", "num_microbatches: 4",
                 "overlap_moe_expert_parallel_comm: True"):
        assert line in out


def test_proxy_has_experts_for_ep16():
    from mbridge_ep_overlap.spec import resolve_recipe

    assert resolve_recipe("qwen3_moe_proxy").config().model.num_moe_experts == 16
