"""An AttributeError on a Megatron class or module (diagnose.attribute_errors, class_source, method_events,
init_order), read against the installed source: the real initialisation-order bug of megatron-core's
TransformerLayer with local CUDA graphs of the mlp (triggered on CPU) is named with its chain of calls, their
file:line and the if tests that take it, from the traceback or from the message alone; an attribute no class
sets is not in the installed version; a module's missing name and a class's missing member are told apart;
the class index follows Python's own MRO; no input text makes diagnose raise."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import io
import random
import re
import traceback
from importlib import metadata

import pytest

from mbridge_ep_overlap.diagnose import (attribute_errors, class_source, diagnose, foreign_attributes, init_order,
                                         installed_modules, method_events, upstream_source)
from mbridge_ep_overlap.diagnose.signatures.base import FOUND_BY
from mbridge_ep_overlap.diagnose.signatures.config_error import ATTRIBUTE_ERROR

LAYER = "megatron/core/transformer/transformer_layer.py"
FUSED = "megatron/core/transformer/moe/fused_a2a.py"


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


def relative(path: str) -> str:
    return "megatron/" + path.split("/megatron/", 1)[1]


def caught(fn) -> BaseException:
    with pytest.raises(AttributeError) as info:
        fn()
    return info.value


@pytest.fixture(scope="module")
def cuda_graph_layer() -> tuple[str, list[traceback.FrameSummary]]:
    """The AttributeError MCore raises building a TransformerLayer with local CUDA graphs of the mlp (on CPU)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer

    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, cuda_graph_impl="local",
                               cuda_graph_modules=["mlp"])
    err = caught(lambda: TransformerLayer(config, get_gpt_layer_local_spec().submodules))
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "/megatron/" in f.filename]
    return "".join(traceback.format_exception(err)), frames


def _assignment_line(rel: str, needle: str) -> int:
    (line,) = [i for i, text in enumerate(class_source.text(rel).splitlines(), 1) if needle in text]
    return line


def _check_chain(finding, frames) -> None:
    sig = finding.signature
    assert sig.id == "attribute-error:TransformerLayer.is_moe_layer"
    assert sig.confidence == attribute_errors.CHAIN_CONFIDENCE
    assert sig.cause.startswith(f"An initialisation-order bug in the installed megatron-core {metadata.version('megatron-core')}: ")
    # every Megatron frame of the real traceback is a step of the chain, in the order Python ran them
    places = [f"{relative(f.filename)}:{f.lineno}" for f in frames]
    assert len(places) == 3
    at = [sig.cause.index(f"({p})") for p in places]
    assert at == sorted(at), sig.cause
    set_at = _assignment_line(LAYER, "self.is_moe_layer = isinstance(")
    assert f"before TransformerLayer.__init__ sets it at {LAYER}:{set_at}" in sig.cause
    assert set_at > frames[0].lineno  # the assignment comes after the super().__init__ the chain starts from
    # the if tests that take the path, as the source writes them
    assert 'config.cuda_graph_impl == "local"' in sig.cause
    assert "CudaGraphModule.mlp in self.config.cuda_graph_modules" in sig.cause
    assert "cuda_graph_impl" in sig.fix and "cuda_graph_modules" in sig.fix
    steps = [d for d in finding.detail if d.startswith("step ")]
    assert [s.split(" in ", 1)[0].split(": ", 1)[1] for s in steps] == places


def test_the_real_init_order_error_is_named_with_its_chain(cuda_graph_layer):
    text, frames = cuda_graph_layer
    d = run(text)
    top = d.findings[0]
    _check_chain(top, frames)
    assert "the run's traceback reads it at the same line" in top.detail
    assert not [f for f in d.findings if f.signature.id.startswith("upstream-check")]


def test_the_message_alone_is_enough(cuda_graph_layer):
    text, frames = cuda_graph_layer
    (message,) = [r for r in text.splitlines() if r.startswith("AttributeError: ")]
    d = run(f"[rank3]: {message}\n")
    _check_chain(d.findings[0], frames)


def test_an_attribute_error_on_an_assert_line_is_not_a_failed_check(cuda_graph_layer):
    """Without torch's __getattr__ frame (a class that is no nn.Module) the innermost frame is the `assert` line
    that read the attribute: the assert did not fail, the read did."""
    text, frames = cuda_graph_layer
    rows = text.splitlines()
    cut = next(i for i, r in enumerate(rows) if "/torch/" in r and r.lstrip().startswith("File "))
    d = run("\n".join(rows[:cut] + [r for r in rows[cut:] if r.startswith("AttributeError: ")]) + "\n")
    assert d.findings[0].signature.id == "attribute-error:TransformerLayer.is_moe_layer"
    assert not [f for f in d.findings if f.signature.id.startswith("upstream-check")]


def test_an_attribute_no_class_sets_is_not_in_the_installed_version():
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4)
    err = caught(lambda: config.zz_option_of_another_release)
    d = run("".join(traceback.format_exception(err)))
    top = d.findings[0]
    assert top.signature.id == "attribute-error:TransformerConfig.zz_option_of_another_release"
    assert top.signature.confidence == attribute_errors.PLAIN_CONFIDENCE
    assert (f"TransformerConfig has no attribute zz_option_of_another_release in the installed megatron-core "
            f"{metadata.version('megatron-core')} (renamed or removed): code written for another version reads it"
            in top.signature.cause)
    assert "test_diagnose_attribute_errors.py" in top.signature.cause  # the code reading it, from the frame


def test_a_made_up_name_on_the_layer_says_not_in_the_installed_version():
    d = run("AttributeError: 'TransformerLayer' object has no attribute 'zz_made_up_flag'\n")
    top = d.findings[0]
    assert top.signature.confidence == attribute_errors.PLAIN_CONFIDENCE
    assert "has no attribute zz_made_up_flag in the installed megatron-core" in top.signature.cause
    assert "initialisation-order" not in top.signature.cause


def test_a_member_missing_on_the_class_gives_the_nearest_names():
    from megatron.core.transformer.enums import CudaGraphModule

    err = caught(lambda: CudaGraphModule.mlpp)
    d = run(f"AttributeError: {err}\n")
    top = d.findings[0]
    assert top.signature.id == "attribute-error:CudaGraphModule.mlpp"
    assert any(line.startswith("nearest names CudaGraphModule has: ") and "mlp" in line for line in top.detail)


def test_set_before_super_init_is_no_init_order_bug():
    """MoETransformerLayer sets is_moe_layer before calling TransformerLayer.__init__: nothing reads it first."""
    (cls,) = class_source.classes("MoETransformerLayer")
    assert init_order.early_reads(cls, "is_moe_layer") == []
    d = run("AttributeError: 'MoETransformerLayer' object has no attribute 'is_moe_layer'\n")
    assert d.findings[0].signature.confidence == attribute_errors.PLAIN_CONFIDENCE
    assert "initialisation-order" not in d.findings[0].signature.cause


@pytest.mark.parametrize("name, attr", [
    ("SequentialMLP", "config"),  # super().__init__ in an if and in its else: both set it
    ("DotProductAttention", "softmax_offset"),  # register_parameter sets it
    ("GPTModel", "embedding"),  # read under assert hasattr(self, 'embedding')
    ("TransformerLayer", "layer_number"),  # set in an if and in its else
])
def test_no_chain_where_the_source_sets_it_first(name, attr):
    cls = class_source.classes(name)[0]
    assert init_order.assignments(cls, attr), f"{name} sets {attr}"
    assert init_order.early_reads(cls, attr) == []


@pytest.mark.parametrize("dotted", [
    "megatron.core.transformer.transformer_layer.TransformerLayer",
    "megatron.core.transformer.transformer_layer.MoETransformerLayer",
    "megatron.core.transformer.transformer_block.TransformerBlock",
    "megatron.core.transformer.moe.moe_layer.MoELayer",
    "megatron.core.models.gpt.gpt_model.GPTModel",
    "megatron.bridge.models.transformer_config.TransformerConfig",
])
def test_the_class_index_follows_pythons_mro(dotted):
    module, name = dotted.rsplit(".", 1)
    real = getattr(importlib.import_module(module), name)
    (cls,) = [c for c in class_source.classes(name) if c.file == module.replace(".", "/") + ".py"]
    ours = [(k.file, k.name) for k in class_source.mro(cls)]
    theirs = [(k.__module__.replace(".", "/") + ".py", k.__name__) for k in real.__mro__ if k.__module__.startswith("megatron.")]
    assert ours == theirs


def test_a_missing_module_name_is_not_in_the_installed_version():
    import megatron.core.transformer as package

    err = caught(lambda: package.zz_not_a_name)
    d = run(f"AttributeError: {err}\n")
    top = d.findings[0]
    assert top.signature.id == "attribute-error:megatron.core.transformer.zz_not_a_name"
    assert "has no attribute zz_not_a_name in the installed megatron-core" in top.signature.cause


def test_a_submodule_its_package_does_not_import_is_named():
    import megatron.core.transformer as package

    imported = set(attribute_errors._top_level("megatron/core/transformer/__init__.py"))
    sub = next(rel.split("/")[-1].removesuffix(".py") for rel, _ in upstream_source.sources()
               if rel.startswith("megatron/core/transformer/") and rel.count("/") == 3 and rel.endswith(".py")
               and not rel.endswith("__init__.py") and rel.split("/")[-1].removesuffix(".py") not in imported)
    message = str(caught(lambda: package.zz_not_a_name)).replace("zz_not_a_name", sub)
    top = run(f"AttributeError: {message}\n").findings[0]
    assert f"{sub} is a submodule of megatron.core.transformer" in top.signature.cause
    assert top.signature.fix == f"import megatron.core.transformer.{sub} explicitly"


def test_a_name_the_module_defines_is_a_circular_import_or_another_copy():
    d = run("AttributeError: partially initialized module 'megatron.core.parallel_state' has no attribute "
            "'get_tensor_model_parallel_group' (most likely due to a circular import)\n")
    top = d.findings[0]
    assert "partially initialised (a circular import)" in top.signature.cause
    assert "megatron/core/parallel_state.py:" in top.signature.cause


@pytest.mark.parametrize("text", [
    "AttributeError: 'NoneType' object has no attribute 'shape'",
    "AttributeError: 'Tensor' object has no attribute 'main_grad'",  # no frame: who read it is not known
    "AttributeError: 'Buffer' object has no attribute 'group'",
    '  File "/opt/bench/run.py", line 7, in main\n    buf.group\nAttributeError: \'Buffer\' object has no attribute \'group\'',
    f'  File "/x/{FUSED}", line 60, in get_buffer\n    or _buffer.group != group\n'
    "AttributeError: 'NoneType' object has no attribute 'group'",  # a None, not another package's class
])
def test_other_packages_classes_are_not_named_without_a_megatron_reader(text):
    assert not [f for f in run(text + "\n").findings if f.signature.id.startswith("attribute-error")]


# ---- across a package boundary --------------------------------------------------------------------------

MCORE = f"Megatron-Core {metadata.version('megatron-core')}"


def line_of(rel: str, needle: str) -> int:
    """The one line of an installed file that holds ``needle``."""
    (line,) = [i for i, text in enumerate(class_source.text(rel).splitlines(), 1) if needle in text]
    return line


def megatron_traceback(frames: list[tuple[str, int, str, str]], message: str, rank: int = 3) -> str:
    rows = ["Traceback (most recent call last):"]
    for path, line, fn, code in frames:
        rows += [f'  File "{path}", line {line}, in {fn}', f"    {code}"]
    return "".join(f"[rank{rank}]: {r}\n" for r in rows + [message])


SITE = "/usr/local/lib/python3.12/dist-packages/"
GET_BUFFER = [("/opt/run/pretrain_gpt.py", 12, "<module>", "main()"),
              (SITE + FUSED, 88, "forward", "buffer = get_buffer(group, get_hidden_bytes(x))"),
              (SITE + FUSED, 60, "get_buffer", "or _buffer.group != group")]


def test_megatron_reading_another_packages_object_is_an_api_mismatch():
    d = run(megatron_traceback(GET_BUFFER, "AttributeError: 'Buffer' object has no attribute 'group'"))
    top = d.findings[0]
    sig = top.signature
    assert sig.id == "attribute-error:Buffer.group"
    assert sig.confidence == foreign_attributes.FRAME_CONFIDENCE == 0.5
    assert sig.cause == (f"{MCORE} reads Buffer.group at {FUSED}:60 (get_buffer); the run's deep_ep Buffer has no such "
                         "attribute: the installed deep_ep is a version this Megatron-Core was not written against (API mismatch)")
    # the installed source's line that reads .group, and where the file takes Buffer from
    assert f"the installed megatron-core {metadata.version('megatron-core')} reads it at {FUSED}:" \
           f"{line_of(FUSED, '_buffer.group')} in get_buffer: `or _buffer.group != group`" in top.detail
    assert (f"Buffer: most likely deep_ep's ({FUSED}:{line_of(FUSED, 'from deep_ep import Buffer')}: "
            "`from deep_ep import Buffer`)") in top.detail
    assert f"read in the run at {FUSED}:60 in get_buffer: `or _buffer.group != group`" in top.detail
    assert sig.fix.startswith("pair the versions: the deep_ep ") and sig.fix.endswith(
        "or a Megatron-Core that matches the run's deep_ep")
    if importlib.util.find_spec("deep_ep") is None:
        assert "deep_ep: not installed here" in top.detail
    assert sig.source == f"installed:{FUSED}"


def test_the_package_comes_from_the_files_imports_and_the_fix_from_megatrons_requirements():
    """ProcessGroup is named through `torch.distributed.ProcessGroup` in the file; megatron-core's requirement on
    torch is what the fix pairs with."""
    line = line_of(FUSED, "Buffer.get_dispatch_config(group.size())")
    frames = [(SITE + FUSED, line, "get_buffer", "Buffer.get_dispatch_config(group.size()),")]
    top = run(megatron_traceback(frames, "AttributeError: 'ProcessGroup' object has no attribute 'size'")).findings[0]
    assert top.signature.id == "attribute-error:ProcessGroup.size"
    assert "the run's torch ProcessGroup has no such attribute: the installed torch is a version" in top.signature.cause
    assert any(d.startswith("ProcessGroup: most likely torch's (") and "torch.distributed.ProcessGroup" in d for d in top.detail)
    wanted = [r for r in metadata.requires("megatron-core") if re.match(r"torch\b(?!-)", r) and "extra" not in r]
    assert wanted and all(r in top.signature.fix for r in wanted)
    # a class read on the class itself is the same mismatch
    top = run(megatron_traceback(frames, "AttributeError: type object 'Buffer' has no attribute 'get_dispatch_config'")).findings[0]
    assert "reads Buffer.get_dispatch_config at" in top.signature.cause and "deep_ep" in top.signature.cause


def test_a_function_the_installed_source_lacks_or_a_class_it_does_not_import_is_named_less_surely():
    frames = GET_BUFFER[:2] + [(SITE + FUSED, 60, "get_buffer_v2", "or _buffer.group != group")]
    top = run(megatron_traceback(frames, "AttributeError: 'Buffer' object has no attribute 'group'")).findings[0]
    assert top.signature.confidence == foreign_attributes.PLAIN_CONFIDENCE == 0.4
    assert "the run's deep_ep Buffer has no such attribute" in top.signature.cause
    assert any(f"{FUSED} of the installed source has no function get_buffer_v2" in d for d in top.detail)
    top = run(megatron_traceback(GET_BUFFER, "AttributeError: 'Widget' object has no attribute 'group'")).findings[0]
    assert top.signature.id == "attribute-error:Widget.group"
    assert "the run's Widget (its package not known) has no such attribute" in top.signature.cause
    assert f"Widget: package not known ({FUSED} of the installed source does not import it)" in top.detail
    gone = [(SITE + "megatron/core/zz_gone/module.py", 5, "f", "x.group")]
    top = run(megatron_traceback(gone, "AttributeError: 'Widget' object has no attribute 'group'")).findings[0]
    assert top.signature.confidence == foreign_attributes.PLAIN_CONFIDENCE
    assert top.signature.source == foreign_attributes.SOURCE  # that file is not installed


def test_an_attribute_megatron_sets_itself_is_no_version_mismatch():
    """Megatron-Core attaches main_grad to parameters itself: a parameter without one skipped that code."""
    rel = "megatron/core/distributed/finalize_model_grads.py"
    line = next(i for i, text in enumerate(class_source.text(rel).splitlines(), 1) if "grad = param.main_grad" in text)
    tree = ast.parse(class_source.text(rel))
    (fn,) = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.lineno <= line <= n.end_lineno]
    frames = [(SITE + rel, line, fn, "grad = param.main_grad")]
    top = run(megatron_traceback(frames, "AttributeError: 'Parameter' object has no attribute 'main_grad'")).findings[0]
    assert top.signature.cause.startswith(f"{MCORE} sets main_grad on such objects itself (")
    assert "API mismatch" not in top.signature.cause
    (sets,) = [d for d in top.detail if d.startswith("param.main_grad set at: ")]
    for where in sets.removeprefix("param.main_grad set at: ").split(", "):
        file, at = where.rsplit(":", 1)
        assert ".main_grad" in class_source.text(file).splitlines()[int(at) - 1]


def test_a_run_class_derived_from_a_megatron_class_that_skips_its_init():
    import torch

    from megatron.core.transformer.module import MegatronModule

    class RunOwnLayer(MegatronModule):
        def __init__(self):
            torch.nn.Module.__init__(self)  # MegatronModule.__init__, which sets self.config, never runs

    err = caught(lambda: RunOwnLayer().set_is_first_microbatch())
    top = run("".join(traceback.format_exception(err))).findings[0]
    assert top.signature.id == "attribute-error:RunOwnLayer.config"
    rel = "megatron/core/transformer/module.py"
    assert top.signature.cause.startswith(f"RunOwnLayer is no class of the installed megatron-core "
                                          f"{metadata.version('megatron-core')} but runs MegatronModule.set_is_first_microbatch")
    code, first = inspect.getsourcelines(MegatronModule.__init__)
    sets = first + next(i for i, row in enumerate(code) if "self.config = config" in row)
    assert f"({rel}:{sets} in MegatronModule.__init__)" in top.signature.cause
    assert top.signature.confidence == foreign_attributes.FRAME_CONFIDENCE


ELASTIC = ('Traceback (most recent call last):\n  File "/home/user/bench/run_elastic.py", line 41, in make_buffer\n'
           "    ep_buffer = deep_ep.ElasticBuffer(\nAttributeError: module 'deep_ep' has no attribute 'ElasticBuffer'\n")


def test_another_packages_module_lacking_a_name_the_code_calls():
    top = run(ELASTIC).findings[0]
    sig = top.signature
    assert sig.id == "attribute-error:deep_ep.ElasticBuffer"
    assert sig.confidence == foreign_attributes.PLAIN_CONFIDENCE
    assert sig.cause == ("the run's deep_ep has no ElasticBuffer: code written for another deep_ep version calls it "
                         "(/home/user/bench/run_elastic.py:41 in make_buffer: `ep_buffer = deep_ep.ElasticBuffer(`)")
    refs = foreign_attributes.megatron_references("deep_ep", "ElasticBuffer")
    if not refs:  # the installed Megatron never uses it: the calling script expects it
        assert "the installed megatron-core / megatron-bridge do not reference deep_ep.ElasticBuffer: the calling code, not " \
               "this Megatron, expects it" in top.detail
    if importlib.util.find_spec("deep_ep") is None:
        assert "deep_ep is not installed here: whether a deep_ep release has ElasticBuffer is not known from here" in top.detail


def test_a_name_the_installed_megatron_references_says_where():
    top = run(ELASTIC.replace("ElasticBuffer", "HybridEPBuffer")).findings[0]
    line = line_of(FUSED, "from deep_ep import HybridEPBuffer")
    assert any(f"references deep_ep.HybridEPBuffer at {FUSED}:{line}: `from deep_ep import HybridEPBuffer`" in d
               and d.endswith("this Megatron-Core expects a deep_ep that has it") for d in top.detail), top.detail
    assert f"expects it too ({FUSED}:{line})" in top.signature.fix


def test_whether_the_installed_copy_has_the_name():
    import packaging
    import packaging.version

    assert not hasattr(packaging.version, "LegacyVersion")  # removed in packaging 22
    err = caught(lambda: packaging.version.LegacyVersion("1.0"))
    top = run("".join(traceback.format_exception(err))).findings[0]
    assert top.signature.id == "attribute-error:packaging.version.LegacyVersion"
    here = f"packaging {metadata.version('packaging')}"
    assert f"the copy installed here ({here}, packaging/version.py) has no LegacyVersion either (nearest: Version)" in top.detail
    assert "test_diagnose_attribute_errors.py" in top.signature.cause  # the calling frame
    # a name the installed copy has: the run imports another one
    top = run(f"AttributeError: {err}\n".replace("LegacyVersion", "Version")).findings[0]
    line = inspect.getsourcelines(packaging.version.Version)[1]
    assert f"the copy installed here ({here}) defines Version at packaging/version.py:{line}: the run imports another copy " \
           "or version" in top.detail
    # a submodule its package does not import
    assert "version" not in installed_modules.top_level(installed_modules.tree(installed_modules.locate("packaging")))
    message = str(caught(lambda: packaging.zz_not_a_name)).replace("zz_not_a_name", "version")
    top = run(f"AttributeError: {message}\n").findings[0]
    assert top.signature.cause.startswith("version is a submodule of packaging that the package does not import")
    assert top.signature.fix == "import packaging.version explicitly"


def test_a_module_making_names_at_run_time_or_of_python_itself():
    top = run("AttributeError: module 'torch' has no attribute 'float8_e4m3fn'\n").findings[0]
    assert top.signature.cause.startswith("the run's torch has no float8_e4m3fn: code written for another torch version")
    assert any("makes names at run time" in d and "whether it has float8_e4m3fn is not known from its source" in d
               for d in top.detail)
    top = run("AttributeError: module 'os' has no attribute 'sched_getaffinity'\n").findings[0]
    assert "code written for another Python version calls it" in top.signature.cause
    top = run("AttributeError: partially initialized module 'deep_ep' has no attribute 'Buffer' (most likely due to a "
              "circular import)\n").findings[0]
    assert top.signature.cause.startswith("the run's deep_ep was read while partially initialised (a circular import)")


def test_the_readers_name_no_package_of_their_own():
    for module in (foreign_attributes, installed_modules):
        code = inspect.getsource(module)
        assert not re.search(r"deep_?ep|Buffer|HybridEP|transformer_engine", code, re.IGNORECASE), module.__name__


GARBAGE = [
    "AttributeError:", "AttributeError: ", "AttributeError: '' object has no attribute ''",
    "AttributeError: 'TransformerLayer' object has no attribute ''", "AttributeError: module '' has no attribute 'x'",
    "AttributeError: module 'megatron' has no attribute 'core'", "AttributeError: module 'megatron.' has no attribute 'x'",
    "AttributeError: module 'megatron.core..x' has no attribute 'y'", "AttributeError: module 'megatron.core.nothere' has no attribute 'x'",
    "AttributeError: type object 'object' has no attribute 'x'", "AttributeError: 'ABC' object has no attribute '__init__'",
    "AttributeError: 'TransformerLayer' object has no attribute '" + "x" * 5000 + "'",
    "AttributeError: '" + "A" * 5000 + "' object has no attribute 'x'",
    "AttributeError: 'Tränsformer' object has no attribute 'ü'", "AttributeError: 'TransformerLayer' object has no attribute 'is_moe_layer'" * 40,
    '  File "/x/megatron/core/transformer/transformer_layer.py", line 99999999, in nowhere\n'
    "AttributeError: 'TransformerLayer' object has no attribute 'is_moe_layer'",
    "Traceback (most recent call last)\n  File \"\", line 0, in \nAttributeError: 'MegatronModule' object has no attribute 'x'",
    "AttributeError: module 'x..y' has no attribute 'z'", "AttributeError: module '9x' has no attribute 'z'",
    "AttributeError: module 'deep_ep' has no attribute '" + "E" * 5000 + "'", "AttributeError: module '.' has no attribute 'a'",
    f'  File "/x/{FUSED}", line 0, in <module>\n    .group\nAttributeError: \'Buffer\' object has no attribute \'group\'',
    f'  File "/x/{FUSED}", line -1, in get_buffer\nAttributeError: \'Buffer\' object has no attribute \'group\'',
    f'  File "/x/{FUSED}", line 60, in {"f" * 3000}\n    x\nAttributeError: type object \'B\' has no attribute \'c\'',
    '  File "/x/megatron/core/", line 1, in f\n    ((((\nAttributeError: \'Q\' object has no attribute \'r\'',
    '  File "/x/megatron/bridge/../../etc/passwd", line 1, in f\nAttributeError: \'Q\' object has no attribute \'r\'',
    "AttributeError: partially initialized module 'a.b' has no attribute 'c'",
    "AttributeError: module 'packaging' has no attribute '" + "x" * 300 + "'",  # longer than a file name may be
]


@pytest.mark.parametrize("text", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_never_raises(text):
    d = run(text + "\n")
    assert d.exit_code in (0, 1)
    d.lines()


def test_random_bytes_around_the_message_never_raise():
    rng = random.Random(7)
    words = ["AttributeError: ", "'", " object has no attribute ", "module ", "type object ", "megatron.core.",
             "TransformerLayer", "is_moe_layer", "\n", "  File \"/a/megatron/core/x.py\", line 3, in f\n", "[rank0]: ",
             f'  File "/a/{FUSED}", line 60, in get_buffer\n', "    or _buffer.group != group\n", "'Buffer'", "group",
             "deep_ep", "packaging.version", "torch", "partially initialized "]
    for _ in range(40):
        text = "".join(rng.choice(words) if rng.random() < 0.8 else chr(rng.randrange(1, 0x3000)) for _ in range(60))
        run(text).lines()


def test_the_reader_is_declared():
    assert ATTRIBUTE_ERROR.found_by == "attribute-error" and "attribute-error" in FOUND_BY
    assert ATTRIBUTE_ERROR.confidence == attribute_errors.CHAIN_CONFIDENCE
    # the events of one method come in source order, each with the tests that choose it
    (cls,) = class_source.classes("GraphableMegatronModule")
    calls = [e for e in method_events.events(cls, "__init__") if e.kind == "self"
             and e.name == "create_mcore_cudagraph_manager"]
    assert calls and 'config.cuda_graph_impl == "local"' in calls[0].conditions
