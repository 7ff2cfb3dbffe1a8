"""A misspelt recipe name is refused by every front end before Megatron is imported.

Each front end runs in a fresh interpreter (this test process has Megatron loaded already): the refusal
is exit 2, one line naming the closest registered recipe, and ``megatron`` is not in ``sys.modules``
when it is printed. The timing bound is generous (a Megatron import takes 15 s; the refusal well under 1 s).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mbridge_ep_overlap.base.errors import UsageError
from mbridge_ep_overlap.spec import resolve_recipe

REPO = Path(__file__).resolve().parents[2]
SECONDS = 3.0

PROBE = """
import contextlib, io, json, sys, time
start = time.monotonic()
err = io.StringIO()
with contextlib.redirect_stderr(err):
    try:
        {call}
    except SystemExit as e:
        code = e.code
print(json.dumps({{"code": code, "seconds": time.monotonic() - start, "stderr": err.getvalue(),
                   "megatron": sorted(m for m in sys.modules if m == "megatron" or m.startswith("megatron."))}}))
"""

FRONT_ENDS = [
    ("plan", "from mbridge_ep_overlap.tools.cli import main; code = main(['plan', '--recipe', 'qwen3_30b_a3c'])"),
    ("plan --json", "from mbridge_ep_overlap.tools.cli import main; code = main(['plan', '--recipe', 'qwen3_30b_a3c', '--json'])"),
    ("bench", "from mbridge_ep_overlap.tools.cli import main; code = main(['bench', 'run', '--recipe', 'qwen3_30b_a3c'])"),
    ("run_script --dryrun", "from mbridge_ep_overlap.tools.run import main; "
                            "code = main(['--recipe', 'qwen3_30b_a3c', '--dryrun', '--output-dir', sys.argv[1]])"),
    ("run_script (training)", "from mbridge_ep_overlap.tools.run import main; "
                              "code = main(['--recipe', 'qwen3_30b_a3c', '--output-dir', sys.argv[1]])"),
    ("launch_slurm", "from mbridge_ep_overlap.tools.slurm import main; "
                     "code = main(['--recipe', 'qwen3_30b_a3c', '--nodes', '2', '--partition', 'batch', '--dryrun'])"),
]


@pytest.mark.parametrize("front_end,call", FRONT_ENDS, ids=[f for f, _ in FRONT_ENDS])
def test_misspelt_recipe_refused_before_megatron(front_end, call, tmp_path):
    proc = subprocess.run([sys.executable, "-c", PROBE.format(call=call), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    lines = result["stderr"].strip().splitlines()
    assert result["code"] == 2, result
    assert len(lines) == 1 and "unknown recipe 'qwen3_30b_a3c'" in lines[0], lines
    assert "qwen3_30b_a3b (closest to it)" in lines[0]
    assert result["megatron"] == [], f"{front_end} imported Megatron before refusing: {result['megatron'][:3]}"
    assert result["seconds"] < SECONDS, f"{front_end} took {result['seconds']:.1f} s to refuse"


@pytest.mark.parametrize("name,closest", [
    ("qwen3_30b_a3c", ["qwen3_30b_a3b"]),
    ("Qwen3_30B_A3B_hybridEP", ["qwen3_30b_a3b_hybridep"]),
    ("deepseekv3", ["deepseek_v3"]),
    ("qwen3_moe_proxi", ["qwen3_moe_proxy", "qwen3_moe_proxy_te", "qwen3_moe_proxy_packed"]),
    ("nope", []),
])
def test_unknown_recipe_names_its_closest_matches(name, closest):
    with pytest.raises(UsageError) as e:
        resolve_recipe(name)
    text = str(e.value)
    assert len(text.splitlines()) == 1 and "MODULE:FUNCTION" in text
    shown = text.split("; allowed: ", 1)[1].split(" (closest to it)")[0].split(", ") if closest else []
    assert shown == closest
    assert ("(closest to it)" in text) == bool(closest)
