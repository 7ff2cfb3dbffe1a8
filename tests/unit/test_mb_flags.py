"""run_script.py takes Megatron-Bridge's performance-script spellings of the flags it shares with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from mbridge_ep_overlap.base.errors import UsageError
from mbridge_ep_overlap.tools import mb_flags
from mbridge_ep_overlap.tools.run import main

REPO = Path(__file__).resolve().parents[2]

TRANSLATED = [  # MB's argv -> ours
    (["--expert_model_parallel_size", "8"], ["--ep", "8"]),
    (["-ep", "8", "-tp", "2", "-pp", "2", "-vp", "4"], ["--ep", "8", "--tp", "2", "--pp", "2", "--vpp", "4"]),
    (["--global_batch_size=64", "-mb", "1", "-sl", "2048"],
     ["--global-batch-size", "64", "--micro-batch-size", "1", "--seq-length", "2048"]),
    (["-ng", "8", "-g", "h100", "-d"], ["--num-gpus", "8", "--gpu", "h100", "--dryrun"]),
    (["--moe_flex_dispatcher_backend", "hybridep"], ["--dispatcher", "hybridep"]),
    (["--moe_flex_dispatcher_backend", "None"], ["--dispatcher", "alltoall"]),
    (["--moe_a2a_overlap", "true"], ["--ep-overlap", "on", "--delay-wgrad", "on"]),
    (["--moe_a2a_overlap", "1", "--delay-wgrad", "off"], ["--delay-wgrad", "off", "--ep-overlap", "on"]),
    (["--moe_a2a_overlap", "false"], ["--ep-overlap", "off"]),
    (["--moe_a2a_overlap=No"], ["--ep-overlap", "off"]),
    (["--recipe", "x", "model.seq_length=3", "-ep", "2"], ["--recipe", "x", "model.seq_length=3", "--ep", "2"]),
]


@pytest.mark.parametrize("mb,ours", TRANSLATED, ids=[" ".join(m) for m, _ in TRANSLATED])
def test_mb_spellings_become_ours(mb, ours):
    assert mb_flags.translate(mb) == ours


REFUSED = [  # MB's argv, what the one line names
    (["--lr", "1e-4"], "unsupported flag of Megatron-Bridge's performance scripts '--lr'"),
    (["--cuda_graph_impl", "local"], "'--cuda_graph_impl'"),
    (["-a", "acct"], "'-a'"),
    (["--time_limit", "01:00:00"], "'--time_limit'"),
    (["--moe_a2a_overlap", "maybe"], "invalid --moe_a2a_overlap 'maybe'"),
    (["--moe_a2a_overlap"], "missing --moe_a2a_overlap"),
    (["--moe_flex_dispatcher_backend", "ncclep"], "invalid --moe_flex_dispatcher_backend 'ncclep'"),
    (["--moe_a2a_overlap", "true", "--ep-overlap", "on"], "conflicting --moe_a2a_overlap"),
    (["--moe_flex_dispatcher_backend", "deepep", "--dispatcher", "alltoall"], "conflicting --moe_flex_dispatcher_backend"),
]


@pytest.mark.parametrize("argv,needle", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_mb_flags_we_do_not_take_are_refused_by_name(argv, needle, capsys):
    with pytest.raises(UsageError, match="."):
        mb_flags.translate(argv)
    with pytest.raises(SystemExit) as e:
        main(["--recipe", "qwen3_moe_proxy", "--dryrun", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def _fields(out: str) -> dict[str, str]:
    return {k: v.split("  (", 1)[0] for k, v in  # the value, without its source word
            (line.split(": ", 1) for line in out.splitlines() if ": " in line and not line.startswith((" ", "#")))}


DRY = [  # MB's flags, ours: the same report
    (["-ep", "4", "-ng", "4", "-gb", "32"], ["--ep", "4", "--num-gpus", "4", "--global-batch-size", "32"]),
    (["--moe_flex_dispatcher_backend", "hybridep"], ["--dispatcher", "hybridep"]),
    (["--moe_a2a_overlap", "false"], ["--ep-overlap", "off"]),
    (["--moe_a2a_overlap", "true"], ["--ep-overlap", "on", "--delay-wgrad", "on"]),
]


@pytest.mark.parametrize("mb,ours", DRY, ids=[" ".join(m) for m, _ in DRY])
def test_mb_spellings_give_the_report_ours_give(mb, ours, capsys, tmp_path):
    """The same exit code and report (the proxy's local layers refuse delayed wgrad either way)."""
    expected = main(["--recipe", "qwen3_moe_proxy", *ours, "--dryrun", "--output-dir", str(tmp_path / "a")])
    want = _report(capsys.readouterr().out)
    got = main(["--recipe", "qwen3_moe_proxy", *mb, "-d", "--output-dir", str(tmp_path / "b")])
    assert got == expected and _report(capsys.readouterr().out) == want


def _report(out: str) -> list[str]:
    return [line for line in out.splitlines() if not line.startswith(("INFO:", "config: "))]


def test_moe_a2a_overlap_false_really_turns_a_recipes_overlap_off(capsys, tmp_path):
    """In MB ``--moe_a2a_overlap false`` changes nothing: a recipe that has overlap on keeps it."""
    from mbridge_ep_overlap import RunSpec, build

    assert build(RunSpec(recipe="qwen3_235b_a22b")).cfg.comm_overlap.overlap_moe_expert_parallel_comm is True
    argv = ["--recipe", "qwen3_235b_a22b"]
    assert main([*argv, "--moe_a2a_overlap", "false", "-d", "--output-dir", str(tmp_path)]) == 0
    fields = _fields(capsys.readouterr().out)
    assert fields["overlap_moe_expert_parallel_comm"] == "False" and fields["delay_wgrad_compute"] == "False"


def test_the_table_in_the_docs_is_the_table_in_the_code():
    text = (REPO / "docs/run_script.md").read_text()
    for mb, ours, how in mb_flags.TABLE:
        assert f"| `{mb}` | `{ours}` | {how} |" in text, mb


def test_every_mb_flag_is_either_translated_or_refused():
    known = {f for mb in mb_flags.SAME for f in mb} | set(mb_flags.DRYRUN) | {mb_flags.A2A_OVERLAP, mb_flags.FLEX_BACKEND}
    assert not known & set(mb_flags.UNSUPPORTED)
    assert {"--gpu", "--dryrun"} - known - set(mb_flags.UNSUPPORTED) == {"--gpu", "--dryrun"}  # ours already
