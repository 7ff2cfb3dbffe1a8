"""An AttributeError on a Megatron class or module (diagnose.attribute_errors, class_source, method_events,
init_order), read against the installed source: the real initialisation-order bug of megatron-core's
TransformerLayer with local CUDA graphs of the mlp (triggered on CPU) is named with its chain of calls, their
file:line and the if tests that take it, from the traceback or from the message alone; an attribute no class
sets is not in the installed version; a module's missing name and a class's missing member are told apart;
the class index follows Python's own MRO; no input text makes diagnose raise."""

from __future__ import annotations

import importlib
import io
import random
import traceback
from importlib import metadata

import pytest

from mbridge_ep_overlap.diagnose import (attribute_errors, class_source, diagnose, init_order, method_events,
                                         upstream_source)
from mbridge_ep_overlap.diagnose.signatures.base import FOUND_BY
from mbridge_ep_overlap.diagnose.signatures.config_error import ATTRIBUTE_ERROR

LAYER = "megatron/core/transformer/transformer_layer.py"


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


@pytest.mark.parametrize("line", [
    "AttributeError: 'NoneType' object has no attribute 'shape'",
    "AttributeError: 'Tensor' object has no attribute 'main_grad'",
    "AttributeError: module 'torch' has no attribute 'float8_e4m3fn'",
])
def test_other_packages_classes_are_not_named(line):
    assert not [f for f in run(line + "\n").findings if f.signature.id.startswith("attribute-error")]


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
]


@pytest.mark.parametrize("text", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_never_raises(text):
    d = run(text + "\n")
    assert d.exit_code in (0, 1)
    d.lines()


def test_random_bytes_around_the_message_never_raise():
    rng = random.Random(7)
    words = ["AttributeError: ", "'", " object has no attribute ", "module ", "type object ", "megatron.core.",
             "TransformerLayer", "is_moe_layer", "\n", "  File \"/a/megatron/core/x.py\", line 3, in f\n", "[rank0]: "]
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
