"""A TypeError where two packages meet: real tracebacks of two packages made here (one patching the other's function,
the other's new version passing another layout; one calling the other's function with an old signature; a plugin
patching an installed Megatron-Core function), read with both packages installed in a site folder of the test, and
the traceback formats torchrun and Python print."""

from __future__ import annotations

import inspect
import io
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mbridge_ep_overlap.diagnose import call_signatures, installed_modules, type_errors
from mbridge_ep_overlap.diagnose.engine import diagnose
from mbridge_ep_overlap.diagnose.signatures import all_signatures
from mbridge_ep_overlap.diagnose.signatures.base import FOUND_BY
from mbridge_ep_overlap.diagnose.signatures.install import TYPE_ERROR_ACROSS_PACKAGES

B_CORE = '''
"""pkg_b 2.0: _dispatch's second argument is now one flag (in 1.x: a list of masks, then a capacity)."""


def _dispatch(tokens, drop):
    return [t for t in tokens if not drop]


def build(n, *, layout="new"):
    return [0] * n
'''
B_ENGINE = '''
from pkg_b import core


def run():
    return core._dispatch([1, 2, 3], True)


def broken():
    return core.build(1, 2, 3)
'''
A_PATCHES = '''
"""pkg_a 1.0, written for pkg_b 1.x: replaces pkg_b's _dispatch."""
import pkg_b.core
from pkg_b.core import _dispatch as _original


def patched_dispatch(tokens, masks):
    n = len(masks)
    return tokens[:n]


def forwarding_dispatch(tokens, masks):
    return _original(tokens, masks, 8)


def install(which):
    pkg_b.core._dispatch = patched_dispatch if which == "len" else forwarding_dispatch
'''
A_CLIENT = '''
from pkg_b.core import build


def make():
    return build(4, legacy_layout=True)
'''
PLUGIN = '''
"""A plugin written for a Megatron-Core whose get_capacity took pad_multiple."""
from megatron.core.transformer.moe import moe_utils

_original = moe_utils.get_capacity


def get_capacity(num_tokens, num_experts, capacity_factor, min_capacity=None):
    return _original(num_tokens=num_tokens, num_experts=num_experts, capacity_factor=capacity_factor,
                     min_capacity=min_capacity, pad_multiple=16)


def install():
    moe_utils.get_capacity = get_capacity
'''
SCRIPTS = {
    "len": "import pkg_a.patches, pkg_b.engine\npkg_a.patches.install('len')\npkg_b.engine.run()\n",
    "count": "import pkg_a.patches, pkg_b.engine\npkg_a.patches.install('forward')\npkg_b.engine.run()\n",
    "keyword": "import pkg_a.client\npkg_a.client.make()\n",
    "inside": "import pkg_b.engine\npkg_b.engine.broken()\n",
    "megatron": ("import torch, mcore_plugin.capacity\nfrom megatron.core.transformer.moe import moe_utils\n"
                 "mcore_plugin.capacity.install()\n"
                 "moe_utils.apply_router_token_dropping(torch.rand(8, 4), torch.ones(8, 4, dtype=torch.bool), 2, 1.0)\n"),
}


def _dist(site: Path, name: str, version: str, top: str, requires: list[str]) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"] + [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    (info / "top_level.txt").write_text(top + "\n")
    files = sorted(p.relative_to(site).as_posix() for p in (site / top).rglob("*.py"))
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files + [f"{info.name}/METADATA"]))


def _clear() -> None:
    for value in vars(installed_modules).values():
        if hasattr(value, "cache_clear"):
            value.cache_clear()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The packages in a site folder, each script run there in a subprocess: (site, {case: its stderr})."""
    root = tmp_path_factory.mktemp("type_errors")
    site = root / "lib" / "python3.12" / "site-packages"
    for rel, text in {"pkg_b/__init__.py": "", "pkg_b/core.py": B_CORE, "pkg_b/engine.py": B_ENGINE,
                      "pkg_a/__init__.py": "", "pkg_a/patches.py": A_PATCHES, "pkg_a/client.py": A_CLIENT,
                      "mcore_plugin/__init__.py": "", "mcore_plugin/capacity.py": PLUGIN}.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text))
    _dist(site, "pkg-b", "2.0", "pkg_b", [])
    _dist(site, "pkg-a", "1.0", "pkg_a", ["pkg-b<2,>=1.4"])
    _dist(site, "mcore-plugin", "0.3", "mcore_plugin", ["megatron-core<0.15,>=0.13"])
    texts = {}
    for case, script in SCRIPTS.items():
        (root / f"case_{case}.py").write_text(script)
        done = subprocess.run([sys.executable, str(root / f"case_{case}.py")], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(site)}, cwd=root)
        assert done.returncode == 1 and "TypeError: " in done.stderr, (case, done.stderr)
        texts[case] = done.stderr
    return site, texts


@pytest.fixture
def installed(made, monkeypatch):
    """The two packages installed here (on this process's path), as a user's environment has them."""
    monkeypatch.syspath_prepend(str(made[0]))
    _clear()
    yield made[1]
    monkeypatch.undo()
    _clear()


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


def found(d):
    return [f for f in d.findings if f.signature.id.startswith("type-error:")]


def test_a_patch_written_for_another_layout(installed):
    text = installed["len"]
    assert text.rstrip().endswith("TypeError: object of type 'bool' has no len()")
    (f,) = found(run(text))
    sig = f.signature
    assert sig.id == "type-error:pkg_a:pkg_b:call" and sig.confidence == type_errors.CONFIDENCE == 0.45
    assert sig.symptom == "install"
    assert "pkg_a's frame (the innermost that chose the arguments): pkg_a/patches.py:8 in patched_dispatch: " \
           "`n = len(masks)`" in f.detail
    assert "pkg_b's frame (its caller): pkg_b/engine.py:6 in run: `return core._dispatch([1, 2, 3], True)`" in f.detail
    assert sig.cause.startswith("TypeError where pkg_b and pkg_a meet: pkg_b's code (pkg_b/engine.py:6 in run")
    assert "pkg_a's code (pkg_a/patches.py:8 in patched_dispatch: `n = len(masks)`) was written for a version of pkg_b " \
           "whose call into it had another signature or argument layout" in sig.cause
    assert sig.fix == ("use the versions of pkg_a and pkg_b that are released to work together (pkg-a 1.0 requires "
                       "pkg-b<2,>=1.4), or update pkg_a to a release written for the run's pkg_b")
    assert "pkg_b installed here: pkg-b 2.0" in f.detail


def test_a_patch_forwarding_the_old_argument_count(installed):
    text = installed["count"]
    assert "TypeError: _dispatch() takes 2 positional arguments but 3 were given" in text
    (f,) = found(run(text))
    assert f.signature.id == "type-error:pkg_a:pkg_b:_dispatch"
    assert "the installed pkg-b 2.0's _dispatch(tokens, drop) (pkg_b/core.py:5) takes 2 positional arguments: 3 do not " \
           "fit it either: the calling code was written for another version" in f.detail, f.detail
    assert f.signature.source == "installed:pkg_b/core.py"


def test_a_call_of_the_other_packages_function_with_a_removed_keyword(installed):
    text = installed["keyword"]
    assert "TypeError: build() got an unexpected keyword argument 'legacy_layout'" in text
    (f,) = found(run(text))
    assert f.signature.id == "type-error:pkg_a:pkg_b:build"
    assert f.signature.confidence == type_errors.NAMED_CONFIDENCE == 0.4  # pkg_b has no frame: it is the function's
    assert "pkg_b: the package of build() as pkg_a's line calls it (no frame of pkg_b in the traceback)" in f.detail
    assert "the installed pkg-b 2.0's build(n, *, layout='new') (pkg_b/core.py:9) has no parameter legacy_layout " \
           "either: the calling code was written for another version" in f.detail


def test_a_type_error_inside_one_package_is_not_named(installed):
    text = installed["inside"]
    assert "TypeError: build() takes 1 positional argument but 3 were given" in text
    assert found(run(text)) == []


def test_a_plugin_patching_an_installed_megatron_function(installed):
    text = installed["megatron"]
    assert "TypeError: get_capacity() got an unexpected keyword argument 'pad_multiple'" in text
    (f,) = found(run(text))
    sig = f.signature
    assert sig.id == "type-error:mcore_plugin:megatron:get_capacity" and sig.confidence == type_errors.CONFIDENCE
    from megatron.core.transformer.moe import moe_utils

    caller = next(i for i, row in enumerate(inspect.getsource(moe_utils).splitlines(), 1) if "= get_capacity(" in row)
    assert any(d.startswith(f"megatron's frame (its caller): megatron/core/transformer/moe/moe_utils.py:{caller} in "
                            "apply_router_token_dropping") for d in f.detail), f.detail
    line = inspect.getsourcelines(moe_utils.get_capacity)[1]
    assert any(d.startswith("the installed megatron-core ") and f"(megatron/core/transformer/moe/moe_utils.py:{line}) has "
               "no parameter pad_multiple either" in d for d in f.detail), f.detail
    assert "mcore_plugin's frame (the innermost that chose the arguments): mcore_plugin/capacity.py:9 in get_capacity: " \
           "`return _original(num_tokens=num_tokens, num_experts=num_experts, capacity_factor=capacity_factor,`" in f.detail
    assert "mcore-plugin 0.3 requires megatron-core<0.15,>=0.13" in sig.fix


# ---- the formats, as Python and torchrun print them --------------------------------------------------------------

SITE = "/usr/local/lib/python3.12/dist-packages/"


def tb(frames: list[tuple[str, int, str, str]], message: str, prefix: str = "") -> str:
    rows = [f"{prefix}Traceback (most recent call last):"]
    for path, line, fn, code in frames:
        rows += [f'{prefix}  File "{path}", line {line}, in {fn}', f"{prefix}    {code}"]
        rows.append(f"{prefix}    {'^' * len(code)}")
    return "\n".join(rows + [f"{prefix}TypeError: {message}"]) + "\n"


def test_torchrun_prefixes_and_a_forwarding_frame():
    frames = [(SITE + "megatron/core/transformer/transformer_layer.py", 400, "forward",
               "output = self.mlp(hidden_states, padding_mask=mask)"),
              (SITE + "torch/nn/modules/module.py", 1786, "_call_impl", "return forward_call(*args, **kwargs)"),
              (SITE + "moe_ext/layer.py", 88, "forward", "return self.router(x, mask.sum())")]
    text = tb(frames, "object of type 'int' has no len()", "[rank3]: ")
    (f,) = found(run(text))
    assert f.signature.id == "type-error:moe_ext:torch:call"  # the nearest caller of another package: torch's module call
    # torch's forwarder skipped: a TypeError in moe_ext's forward, megatron's frame above the forwarder
    frames[2] = (SITE + "megatron/core/x.py", 5, "f", "return forward_call(*args, **kwargs)")
    assert found(run(tb(frames, "forward() got an unexpected keyword argument 'padding_mask'"))) == []  # one package


def test_a_raise_of_the_package_itself_is_left_to_the_other_readers():
    frames = [(SITE + "pkg_x/a.py", 3, "f", "g(1)"), (SITE + "pkg_y/b.py", 9, "g", "raise TypeError(f'bad {x}')")]
    assert found(run(tb(frames, "bad 1"))) == []


def test_a_source_checkout_and_the_package_of_a_path():
    assert type_errors.package_of(SITE + "deep_ep/buffer.py") == "deep_ep"
    assert type_errors.package_of("/opt/conda/lib/python3.11/site-packages/six.py") == "six"
    assert type_errors.package_of("/workspace/Megatron-LM/megatron/core/utils.py") == "megatron"  # installed here
    assert type_errors.package_of("/work/x/plugin_a/patch.py", "/work/x/plugin_b/core.py") == "plugin_a"
    assert type_errors.package_of("/home/u/run/train.py", "/home/u/run/lib_x/y.py") == ""  # a script beside a package
    assert type_errors.package_of("/opt/run/train.py", SITE + "megatron/core/a.py") == "run"  # its folder, for A alone
    assert type_errors.package_of("/opt/run/train.py", SITE + "megatron/core/a.py", strong=True) == ""
    assert type_errors.package_of("/usr/lib/python3.12/functools.py") == ""
    assert type_errors.package_of("<frozen importlib._bootstrap>") == ""
    frames = [("/workspace/Megatron-LM/megatron/core/transformer/moe/router.py", 10, "routing",
               "probs = self.score_fn(logits, self.topk, True)"),
              ("/workspace/plugins/moe_plugin/score.py", 4, "score_fn", "return logits.topk(k)[0] / len(flags)")]
    (f,) = found(run(tb(frames, "object of type 'bool' has no len()")))
    assert f.signature.id == "type-error:moe_plugin:megatron:call"


def test_the_readers_name_no_package_of_their_own():
    for module in (type_errors, call_signatures):
        code = inspect.getsource(module).split('"""', 2)[2]
        assert not re.search(r"deep_?ep|HybridEP|transformer_engine|megatron|\btorch\b", code, re.IGNORECASE), module.__name__


def test_the_row_is_declared():
    assert TYPE_ERROR_ACROSS_PACKAGES in all_signatures() and "type-error" in FOUND_BY
    assert TYPE_ERROR_ACROSS_PACKAGES.confidence == type_errors.CONFIDENCE
    # a TypeError a hand-written signature names is left to it
    (sig,) = [s for s in all_signatures() if s.id == "te-calls-newer-torch-api"]
    frames = [(SITE + "megatron/core/a.py", 1, "f", "te_op(x)"),
              (SITE + "transformer_engine/pytorch/ops/_common.py", 135, "g", sig.emitted[0].strip())]
    d = run(tb(frames, sig.emitted[1].removeprefix("TypeError: ")))
    assert d.cause_ids[0] == "te-calls-newer-torch-api" and found(d) == []


def test_the_messages_python_prints():
    def caught(fn):
        try:
            fn()
        except TypeError as e:
            return str(e)
        raise AssertionError("no TypeError")

    def f(a, b=1, *, c=2):
        return a

    for message, kind in ((caught(lambda: f(1, 2, 3)), "count"), (caught(lambda: f(1, d=4)), "keyword"),
                          (caught(lambda: f()), "missing"), (caught(lambda: f(1, a=2)), "repeated"),
                          (caught(lambda: len(True)), None)):
        call = call_signatures.Call.parse(message)
        assert (call.kind if call else None) == kind, message
        if call:
            assert call.name == "f", message


GARBAGE = [
    "TypeError:", "TypeError: ", "TypeError: () got an unexpected keyword argument ''",
    '  File "", line 0, in \nTypeError: x() takes 1 positional argument but 2 were given',
    '  File "/a/site-packages/p/q.py", line 1, in f\n    g(*a, **k)\nTypeError: g() missing 1 required positional argument: ',
    '  File "/a/site-packages/p/q.py", line 1, in f\n  File "/b/site-packages/r/s.py", line 2, in g\nTypeError: ' + "x" * 5000,
    '  File "/a/site-packages/p/q.py", line 1, in f\n    os.' + "a." * 2000 + "b()\n  File \"/b/site-packages/r/s.py\", line 2, "
    "in g\n    b()\nTypeError: b() got an unexpected keyword argument 'z'",
    '  File "/a/site-packages/..", line 1, in f\n  File "/b/dist-packages/9x/s.py", line 2, in g\nTypeError: q() takes no '
    'arguments (1 given)',
    '  File "/a/site-packages/p/q.py", line 1, in f\n    x.y.z.A.__init__(1)\n  File "/b/site-packages/r/s.py", line 2, in g\n'
    "    A(1)\nTypeError: A.__init__() takes 1 positional argument but 2 were given",
]


@pytest.mark.parametrize("text", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_never_raises(text):
    run(text + "\n").lines()


def test_random_bytes_around_the_formats_never_raise():
    rng = random.Random(5)
    words = ["TypeError: ", "Traceback (most recent call last):\n", '  File "/x/site-packages/pkg_a/p.py", line 8, in f\n',
             '  File "/x/dist-packages/pkg_b/e.py", line 6, in run\n', "    return core._dispatch(x, True)\n", "\n",
             "object of type 'bool' has no len()", "f() takes 2 positional arguments but 3 were given", "[rank1]: ",
             "build() got an unexpected keyword argument 'k'", "(*args, **kwargs)", "raise ", "<frozen x>", "'"]
    for _ in range(50):
        text = "".join(rng.choice(words) if rng.random() < 0.85 else chr(rng.randrange(1, 0x3000)) for _ in range(60))
        run(text).lines()


def test_a_pasted_logs_elided_prefix_stands_for_the_installation():
    assert type_errors.package_of(".../zz_vendor_pkg/module/linear.py") == "zz_vendor_pkg"
    assert type_errors.package_of("\u2026/zz_vendor_pkg/linear.py") == "zz_vendor_pkg"
    lines = ('File ".../zz_host_pkg/module/linear.py", line 17, in forward\n'
             '    out = linear_fn(ctx, *tensors)\n'
             'File ".../zz_plugin_pkg/patches/host.py", line 9, in patched_linear_fn\n'
             '    n = len(args[3][0])\n'
             "TypeError: object of type 'bool' has no len()\n")
    d = diagnose(["-"], stdin=io.BytesIO(lines.encode()))
    assert d.findings[0].signature.id.startswith("type-error:zz_plugin_pkg:zz_host_pkg:")


def _found(source: str, method: bool = False) -> call_signatures.Found:
    import ast

    fn = ast.parse(source).body[0]
    return call_signatures.Found("pkg.mod", "pkg/mod.py", 1, f"{fn.name}({ast.unparse(fn.args)})", fn.args, method, "")


def test_a_repeated_argument_is_not_taken_for_another_version():
    call = call_signatures.Call.parse("braceexpand() got multiple values for argument 'escape'")
    fit, words = call_signatures.fits(_found("def braceexpand(pattern, escape=True): pass"), call)
    assert fit is None and "passed both by position and by name" in words and "pattern, escape" in words


def test_takes_no_arguments_fits_only_a_signature_that_takes_some():
    call = call_signatures.Call.parse("Widget.__init__() takes no arguments")
    takes, words = call_signatures.fits(_found("def __init__(self, a): pass", method=True), call)
    assert takes is True and "another version" in words
    none, words = call_signatures.fits(_found("def __init__(self): pass", method=True), call)
    assert none is False and "takes none either" in words


def test_a_keyword_one_package_passes_to_its_own_function_is_compared_with_the_installed_caller():
    # the run's Megatron-Core passed padding_mask to its own tensor_parallel.checkpoint(), which takes no such keyword;
    # the installed 0.19.2 binds it in functools.partial around the MLP instead (a bug of the run's release, fixed here)
    log = ('  File "/opt/megatron-lm/megatron/core/transformer/transformer_layer.py", line 674, in _forward_mlp\n'
           "[default0]:[rank0]:     mlp_output_with_bias = tensor_parallel.checkpoint(\n"
           "[default0]:[rank0]: TypeError: checkpoint() got an unexpected keyword argument 'padding_mask'\n")
    d = diagnose(["-"], stdin=io.BytesIO(log.encode()))
    assert d.cause_ids[0] == "type-error-within:megatron:checkpoint:padding_mask", d.cause_ids
    f = d.findings[0]
    assert "no longer passes it there" in f.signature.cause
    assert any("transformer_layer.py:896" in x and "binds padding_mask in functools.partial" in x for x in f.detail), f.detail
    assert any("megatron/core/tensor_parallel/random.py:" in x and "has no parameter padding_mask" in x for x in f.detail)
    # a keyword the installed caller does not pass and the callee takes: nothing within the package is named
    taken = log.replace("'padding_mask'", "'distribute_saved_activations'")
    assert not any(i.startswith("type-error-within") for i in diagnose(["-"], stdin=io.BytesIO(taken.encode())).cause_ids)


def test_the_within_package_row_is_registered():
    from mbridge_ep_overlap.diagnose.signatures.install import TYPE_ERROR_WITHIN_PACKAGE
    assert TYPE_ERROR_WITHIN_PACKAGE in all_signatures()
    assert TYPE_ERROR_WITHIN_PACKAGE.confidence == type_errors.WITHIN_FIXED_CONFIDENCE
