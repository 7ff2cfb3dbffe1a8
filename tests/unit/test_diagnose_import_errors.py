"""An ImportError / ModuleNotFoundError (diagnose.import_errors), read against what is installed here: the texts
Python really prints are triggered in a subprocess (a name megatron-core's module lacks, a submodule it lacks, a module
that is not a package, a namespace package, a circular import in a temp package, a package not installed, importlib's
own frames) and kept as input; lines of the same shapes name other packages (Megatron-Bridge importing from
Megatron-Core, Megatron-Core importing from Transformer Engine and DeepEP) with their installed file:line; DeepEP's own
row still names a missing deep_ep; no input text makes diagnose raise."""

from __future__ import annotations

import importlib.util
import inspect
import io
import random
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from mbridge_ep_overlap.diagnose import diagnose, import_errors, installed_modules
from mbridge_ep_overlap.diagnose.signatures.base import FOUND_BY
from mbridge_ep_overlap.diagnose.signatures.install import (CIRCULAR_IMPORT, IMPORT_NAME_MISSING, PACKAGE_NOT_INSTALLED,
                                                            SUBMODULE_MISSING)

MCORE = f"megatron-core {metadata.version('megatron-core')}"
MB = f"megatron-bridge {metadata.version('megatron-bridge')}"
UTILS = importlib.util.find_spec("megatron.core.utils").origin
SITE = "/usr/local/lib/python3.12/dist-packages/"


def run(text: str):
    return diagnose(["-"], stdin=io.BytesIO(text.encode()))


def top(text: str):
    return run(text).findings[0]


def triggered(tmp_path: Path, code: str, files: dict[str, str] | None = None) -> str:
    """What Python prints for ``code`` run as a script in a folder of its own (with ``files`` beside it)."""
    for name, body in (files or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "script.py").write_text(code)
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    return done.stderr[done.stderr.index("Traceback (most recent call last):"):]


SNIPPETS = {"name": "import os\nfrom megatron.core.utils import no_such_name\n",
            "suggested": "from megatron.core.utils import get_model_confi\n",
            "submodule": "import megatron.core.zz_no_such_mod\n",
            "not_package": "import megatron.core.utils.sub\n",
            "importlib": "import importlib\nimportlib.import_module('megatron.core.zz_no_such_mod')\n",
            "from_package": "from megatron.core import zz_sub\n"}
DRIVER = """import os, runpy, sys
for name in sys.argv[1:]:
    try:
        runpy.run_path(os.path.abspath(name + ".py"), run_name="__main__")
    except ImportError:
        print("=====" + name, file=sys.stderr)
        sys.excepthook(*sys.exc_info())  # what the interpreter prints for an uncaught error
"""


@pytest.fixture(scope="module")
def megatron_texts(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """What Python prints for each of SNIPPETS, run as its own script, in one process (megatron.core imports once)."""
    folder = tmp_path_factory.mktemp("snippets")
    for name, code in SNIPPETS.items():
        (folder / f"{name}.py").write_text(code)
    (folder / "driver.py").write_text(DRIVER)
    done = subprocess.run([sys.executable, "driver.py", *SNIPPETS], cwd=folder, capture_output=True, text=True, timeout=300)
    parts = done.stderr.split("=====")[1:]
    texts = {p.split("\n", 1)[0]: p[p.index("Traceback (most recent call last):"):] for p in parts}
    assert set(texts) == set(SNIPPETS), done.stderr
    return folder, texts


def last(text: str) -> str:
    return text.strip().splitlines()[-1]


def line_of(rel: str, needle: str) -> int:
    """The first line of an installed file that holds ``needle``."""
    path = installed_modules.locate("megatron.core").locations[0].rsplit("/megatron/", 1)[0] + "/" + rel
    return next(i for i, text in enumerate(Path(path).read_text().splitlines(), 1) if needle in text)


def traceback_text(frames: list[tuple[str, int, str]], message: str, rank: int = 2) -> str:
    rows = ["Traceback (most recent call last):"]
    for path, line, code in frames:
        rows += [f'  File "{path}", line {line}, in <module>', f"    {code}"]
    return "".join(f"[rank{rank}]: {r}\n" for r in rows + [message])


# ---- what Python prints, triggered ------------------------------------------------------------------------------

def test_a_name_the_run_s_megatron_core_lacks(megatron_texts, tmp_path):
    folder, texts = megatron_texts
    text = texts["name"]
    assert last(text) == f"ImportError: cannot import name 'no_such_name' from 'megatron.core.utils' ({UTILS})"
    f = top(text)
    sig = f.signature
    assert sig.id == "import-name-missing:megatron.core.utils.no_such_name"
    assert sig.confidence == import_errors.FRAME_CONFIDENCE == 0.5
    script = folder / "name.py"
    assert sig.cause == (f"the importing code ({script}:2: `from megatron.core.utils import no_such_name`) was written for "
                         "a megatron-core whose megatron.core.utils has no_such_name; the run's megatron-core (at "
                         f"{UTILS}) does not: the two packages' versions are not a pair")
    assert f"the copy installed here ({MCORE}, megatron/core/utils.py) has no no_such_name either" in f.detail
    assert sig.fix.startswith("install the megatron-core release the importing code was written for")
    assert sig.source == "installed:megatron/core/utils.py" and sig.symptom == "install"


def test_pythons_suggestion_and_the_nearest_names(megatron_texts):
    text = megatron_texts[1]["suggested"]
    assert last(text).endswith(". Did you mean: 'get_model_config'?")
    f = top(text)
    assert "Python suggests get_model_config: a name the run's megatron.core.utils has (renamed?)" in f.detail
    assert any(d.startswith(f"the copy installed here ({MCORE}, megatron/core/utils.py) has no get_model_confi either "
                            "(nearest: get_model_config") for d in f.detail)
    assert "(nearest names: get_model_config" in f.signature.fix


def test_the_installed_copy_having_the_name_is_said(tmp_path):
    import packaging.version

    text = triggered(tmp_path, "from packaging.version import LegacyVersion\n")
    f = top(text)
    here = f"packaging {metadata.version('packaging')}"
    assert f"the copy installed here ({here}, packaging/version.py) has no LegacyVersion either (nearest: Version)" in f.detail
    f = top(text.replace("LegacyVersion", "Version"))
    line = inspect.getsourcelines(packaging.version.Version)[1]
    assert f"the copy installed here ({here}) defines Version at packaging/version.py:{line}" in f.detail
    assert "; the packaging installed here has Version: run with it" in f.signature.fix


def test_a_submodule_the_run_s_package_lacks(megatron_texts):
    folder, texts = megatron_texts
    text = texts["submodule"]
    assert last(text) == "ModuleNotFoundError: No module named 'megatron.core.zz_no_such_mod'"
    f = top("".join(f"[rank5]: {r}\n" for r in text.splitlines()))
    assert f.signature.id == "submodule-missing:megatron.core.zz_no_such_mod"
    assert f.signature.confidence == import_errors.FRAME_CONFIDENCE
    assert f.signature.cause.startswith("the run's megatron-core has megatron.core but no module megatron.core.zz_no_such_mod: "
                                        f"the importing code ({folder / 'submodule.py'}:1: `import megatron.core.zz_no_such_mod`)")
    assert f"the copy installed here ({MCORE}) has no megatron.core.zz_no_such_mod either" in f.detail


def test_a_moved_module_says_where_the_installed_copy_has_it():
    moved = [rel for rel in installed_modules.elsewhere("megatron.core.fused_a2a")]
    assert moved == ["megatron.core.transformer.moe.fused_a2a"]
    f = top("ModuleNotFoundError: No module named 'megatron.core.fused_a2a'\n")
    assert f.signature.confidence == import_errors.PLAIN_CONFIDENCE  # no frame
    assert "the importing frame is not in the log" in f.detail
    assert f"the copy installed here ({MCORE}) has no megatron.core.fused_a2a either; it has " \
           "megatron.core.transformer.moe.fused_a2a (moved or renamed?)" in f.detail
    assert "has it as megatron.core.transformer.moe.fused_a2a" in f.signature.fix


def test_a_module_that_is_not_a_package(megatron_texts):
    text = megatron_texts[1]["not_package"]
    assert last(text) == "ModuleNotFoundError: No module named 'megatron.core.utils.sub'; 'megatron.core.utils' is not a package"
    f = top(text)
    assert f.signature.id == "submodule-missing:megatron.core.utils.sub"
    assert f.signature.cause.startswith("the run's megatron.core.utils is a module, not a package")


def test_importlibs_own_frames_are_not_the_importer(megatron_texts):
    folder, texts = megatron_texts
    text = texts["importlib"]
    assert "<frozen importlib._bootstrap>" in text and "/importlib/__init__.py" in text
    f = top(text)
    assert f"imported at {folder / 'importlib.py'}:2: `importlib.import_module('megatron.core.zz_no_such_mod')`" in f.detail


def test_a_namespace_package_without_the_name(tmp_path):
    (tmp_path / "zz_ns_pkg").mkdir()
    text = triggered(tmp_path, "from zz_ns_pkg import thing\n")
    assert last(text) == "ImportError: cannot import name 'thing' from 'zz_ns_pkg' (unknown location)"
    f = top(text)
    assert f.signature.id == "import-name-missing:zz_ns_pkg.thing"
    assert "(unknown location: a namespace package without that module's file)" in f.signature.cause


def test_a_circular_import_is_no_version_mismatch(tmp_path):
    files = {"zz_circ/__init__.py": "from zz_circ.a import A\n", "zz_circ/a.py": "import os\nfrom zz_circ.b import B\nA = 1\n",
             "zz_circ/b.py": "from zz_circ.a import A\nB = 2\n"}
    text = triggered(tmp_path, "import zz_circ\n", files)
    assert last(text) == ("ImportError: cannot import name 'A' from partially initialized module 'zz_circ.a' (most likely due "
                          f"to a circular import) ({tmp_path / 'zz_circ' / 'a.py'})")
    f = top(text)
    sig = f.signature
    assert sig.id == "circular-import:zz_circ.a.A" and sig.confidence == import_errors.FRAME_CONFIDENCE
    assert sig.cause.startswith("a circular import, not a version mismatch: zz_circ.a was still being initialised when "
                                f"{tmp_path / 'zz_circ' / 'b.py'}:1: `from zz_circ.a import A` imported A from it")
    assert f"the import cycle: {tmp_path / 'zz_circ' / 'a.py'}:2: `from zz_circ.b import B` -> " \
           f"{tmp_path / 'zz_circ' / 'b.py'}:1: `from zz_circ.a import A`" in f.detail
    assert sig.fix.startswith("break the cycle: import A inside the function that uses it")
    assert not [x for x in run(text).findings if x.signature.id.startswith("import-name-missing")]


def test_a_package_not_installed_at_all(tmp_path):
    text = triggered(tmp_path, "import zz_not_installed_pkg\n")
    f = top(text)
    assert f.signature.id == "package-not-installed:zz_not_installed_pkg"
    assert "zz_not_installed_pkg is not installed here either" in f.detail
    assert f.signature.fix.startswith("install zz-not-installed-pkg in the job's environment")


# ---- the same shapes, naming other packages ------------------------------------------------------------------

def test_megatron_bridge_importing_a_name_the_run_s_megatron_core_lacks():
    rel = "megatron/bridge/models/gpt_full_te_layer_autocast_spec.py"
    code = "from megatron.core.transformer.module import MegatronModule"
    line = line_of(rel, code)
    text = traceback_text([(SITE + rel, line, code)], "ImportError: cannot import name 'MegatronModule' from "
                          f"'megatron.core.transformer.module' ({SITE}megatron/core/transformer/module.py)")
    f = top(text)
    sig = f.signature
    assert sig.id == "import-name-missing:megatron.core.transformer.module.MegatronModule"
    assert sig.cause == (f"the importing code ({rel}:{line}: `{code}`) was written for a megatron-core whose "
                         "megatron.core.transformer.module has MegatronModule; the run's megatron-core (at "
                         f"{SITE}megatron/core/transformer/module.py) does not: the two packages' versions are not a pair")
    assert f"imported at {rel}:{line}: `{code}` ({MB})" in f.detail
    from megatron.core.transformer.module import MegatronModule

    defined = inspect.getsourcelines(MegatronModule)[1]
    assert f"the copy installed here ({MCORE}) defines MegatronModule at megatron/core/transformer/module.py:{defined}" in f.detail
    assert any(d.startswith(f"the installed {MB} references megatron.core.transformer.module.MegatronModule at ")
               for d in f.detail)
    pins = [r for r in metadata.requires("megatron-bridge") if re.match(r"megatron-core\b", r)]
    assert pins and f"({MB} requires {installed_modules.pin_words(pins[0])}" in sig.fix
    assert sig.fix.startswith("install the megatron-core version megatron-bridge pins")
    assert sig.fix.endswith("; the megatron-core installed here has MegatronModule: run with it") or "run with it" in sig.fix


def test_megatron_core_importing_a_name_transformer_engine_lacks():
    rel = "megatron/core/extensions/transformer_engine.py"
    code = "from transformer_engine.pytorch.cpp_extensions import general_gemm"
    line = line_of(rel, code)
    path = SITE + "transformer_engine/pytorch/cpp_extensions/__init__.py"
    text = traceback_text([(SITE + rel, line, code)],
                          f"ImportError: cannot import name 'general_gemm' from 'transformer_engine.pytorch.cpp_extensions' ({path})")
    f = top(text)
    assert f.signature.cause.startswith(f"the importing code ({rel}:{line}: `{code}`) was written for a ")
    assert f"the run's {f.signature.cause.split('the run')[1].split(' (at ')[0][3:]} (at {path}) does not" in f.signature.cause
    assert any(d.startswith(f"the installed {MCORE} references transformer_engine.pytorch.cpp_extensions.general_gemm at ")
               and f"{rel}:{line}: `{code}`" in d for d in f.detail)
    assert f"imported at {rel}:{line}: `{code}` ({MCORE})" in f.detail
    if importlib.util.find_spec("transformer_engine") is None:
        assert "transformer_engine is not installed here: whether a transformer_engine release has " \
               "transformer_engine.pytorch.cpp_extensions.general_gemm is not known from here" in f.detail
    wants = [r for r in metadata.requires("megatron-core") if re.match(r"transformer[-_]engine\b", r)]
    assert all(installed_modules.pin_words(r) in f.signature.fix for r in wants)


def test_megatron_core_importing_a_name_deep_ep_lacks():
    rel = "megatron/core/transformer/moe/fused_a2a.py"
    code = "from deep_ep import HybridEPBuffer"
    line = line_of(rel, code)
    text = traceback_text([(SITE + rel, line, code)],
                          f"ImportError: cannot import name 'HybridEPBuffer' from 'deep_ep' ({SITE}deep_ep/__init__.py)")
    f = top(text)
    assert f.signature.id == "import-name-missing:deep_ep.HybridEPBuffer"
    assert any(f"{rel}:{line}: `{code}`" in d and d.startswith(f"the installed {MCORE} references deep_ep.HybridEPBuffer")
               for d in f.detail)


def test_megatron_bridge_importing_a_package_not_installed():
    """The real chain `import megatron.bridge` takes when Transformer Engine is missing: MB's lora_layers imports it."""
    rel = "megatron/bridge/peft/lora_layers.py"
    code = "import transformer_engine.pytorch as te"
    line = line_of(rel, code)
    f = top(traceback_text([("<string>", 1, ""), (SITE + rel, line, code)],
                           "ModuleNotFoundError: No module named 'transformer_engine'"))
    sig = f.signature
    assert sig.id == "package-not-installed:transformer_engine" and sig.confidence == import_errors.FRAME_CONFIDENCE
    assert sig.cause == ("transformer_engine is not installed in the run's environment (Python found no module "
                         f"transformer_engine at all), yet the code imports it ({rel}:{line}: `{code}`, megatron-bridge's)")
    wants = [r for r in metadata.requires("megatron-bridge") if re.match(r"transformer[-_]engine\b", r)]
    assert wants and f"{MB} requires {installed_modules.pin_words(wants[0])}" in sig.fix
    assert sig.source == f"installed:{rel}"


def test_files_of_one_distribution_disagreeing_are_a_mixed_install():
    rel = "megatron/core/transformer/moe/moe_layer.py"
    code = "from megatron.core.transformer.module import zz_renamed_function"
    f = top(traceback_text([(SITE + rel, 3, code)], "ImportError: cannot import name 'zz_renamed_function' from "
                           f"'megatron.core.transformer.module' ({SITE}megatron/core/transformer/module.py)"))
    assert "are both megatron-core's" in f.signature.cause and "mixes files of two versions" in f.signature.cause
    assert f.signature.fix.startswith("reinstall one megatron-core release whole")


def test_deepeps_own_row_still_names_a_missing_deep_ep():
    for text in ("ModuleNotFoundError: No module named 'deep_ep'", "ModuleNotFoundError: No module named 'deep_ep_cpp'"):
        d = run(text + "\n")
        assert d.findings[0].signature.id == "deepep-not-installed"
        assert not [f for f in d.findings if f.signature.id.startswith("package-not-installed")]
    d = run(traceback_text([(SITE + "megatron/core/transformer/moe/fused_a2a.py", 11, "import deep_ep.zz_buffer")],
                           "ModuleNotFoundError: No module named 'deep_ep.zz_buffer'"))
    assert d.findings[0].signature.id == "submodule-missing:deep_ep.zz_buffer"
    assert "deepep-not-installed" not in [f.signature.id for f in d.findings]


def test_a_traceback_of_another_exception_gives_no_importing_frame():
    other = traceback_text([(SITE + "megatron/core/utils.py", 7, "raise RuntimeError('x')")], "RuntimeError: x")
    f = top(other + "ModuleNotFoundError: No module named 'zz_later_pkg'\n")
    assert f.signature.id == "package-not-installed:zz_later_pkg"
    assert "the importing frame is not in the log" in f.detail and f.signature.confidence == import_errors.PLAIN_CONFIDENCE


@pytest.mark.parametrize("module", ["_zz_private", "__", "_"])
def test_a_top_level_name_with_leading_underscores_is_named(tmp_path, module):
    text = triggered(tmp_path, f"import {module}\n") if module != "_" else "ModuleNotFoundError: No module named '_'\n"
    assert last(text) == f"ModuleNotFoundError: No module named '{module}'"
    f = top(text)
    assert f.signature.id == f"package-not-installed:{module}"
    assert f.signature.fix.startswith("install ") and f"{module} is not installed here either" in f.detail


def test_a_requirement_under_a_marker_is_said_in_words():
    assert installed_modules.pin_words("megatron-core==0.19.2") == "megatron-core==0.19.2"
    assert installed_modules.pin_words('te[pytorch]; extra == "te"') == 'te[pytorch] (no version pinned) when extra == "te"'
    assert installed_modules.pin_words('te>=2.1; extra == "te"') == 'te>=2.1 when extra == "te"'
    assert installed_modules.pinned('te>=2.1; extra == "te"') and not installed_modules.pinned('te; extra == "te"')


# ---- parity, the rows, and never raising ------------------------------------------------------------------------

def test_the_patterns_read_every_form_python_prints(megatron_texts, tmp_path):
    messages = [(last(text), "module" if "No module named" in text else "name") for text in megatron_texts[1].values()]
    (tmp_path / "zz_ns").mkdir()
    for i, code in enumerate(["import zz_nowhere\n", "from zz_ns import thing\n"]):
        (tmp_path / str(i)).mkdir()
        text = triggered(tmp_path / str(i), code)
        messages.append((last(text), "module" if "No module named" in text else "name"))
    assert {kind for _, kind in messages} == {"name", "module"}
    for message, kind in messages:
        pattern = import_errors.NAME_MESSAGE if kind == "name" else import_errors.MODULE_MESSAGE
        m = pattern.search(message)
        assert m and m.start() == 0 and m.end() == len(message), message


def test_the_rows_are_declared():
    assert "import-error" in FOUND_BY
    for row in (IMPORT_NAME_MISSING, CIRCULAR_IMPORT, SUBMODULE_MISSING, PACKAGE_NOT_INSTALLED):
        assert row.found_by == "import-error" and row.symptom == "install" and not row.patterns
        assert row.confidence == import_errors.FRAME_CONFIDENCE
    assert import_errors.PLAIN_CONFIDENCE == 0.4


def test_the_reader_names_no_package_of_its_own():
    for module, words in ((import_errors, r"|megatron[._/-](core|bridge)|['\"]megatron"), (installed_modules, "")):
        code = inspect.getsource(module).split('"""', 2)[2]  # the code, after the module's docstring
        assert not re.search(r"deep_?ep|HybridEP|transformer_engine|torch\b" + words, code, re.IGNORECASE), module.__name__


GARBAGE = [
    "ImportError:", "ImportError: cannot import name '' from ''", "ImportError: cannot import name 'x' from '.'",
    "ImportError: cannot import name 'x' from 'a..b' (/x)", "ModuleNotFoundError: No module named ''",
    "ModuleNotFoundError: No module named '.'", "ModuleNotFoundError: No module named 'a.'",
    "ModuleNotFoundError: No module named '9x.y'", "ModuleNotFoundError: No module named 'megatron'",
    "ModuleNotFoundError: No module named 'megatron.core.utils.x'; 'megatron.core.utils' is not a package" * 30,
    "ImportError: cannot import name '" + "x" * 5000 + "' from 'megatron.core.utils' (/x.py)",
    "ModuleNotFoundError: No module named 'packaging." + "x" * 300 + "'",  # longer than a file name may be
    "ImportError: cannot import name 'A' from partially initialized module 'a.b' (most likely due to a circular import)",
    "ImportError: cannot import name 'A' from partially initialized module 'a.b' (most likely due to a circular import) ()",
    '  File "", line 0, in \nImportError: cannot import name \'ü\' from \'ä\' (unknown location)',
    '  File "/x/site-packages/", line 1, in f\n    ((((\nModuleNotFoundError: No module named \'zz.q\'',
    '  File "/x/dist-packages/../../etc/passwd", line 1, in f\nModuleNotFoundError: No module named \'zz\'',
    '  File "<frozen importlib._bootstrap>", line 1, in f\nImportError: cannot import name \'x\' from \'os\' (/usr/lib/os.py)',
    "ImportError: cannot import name 'x' from 'torch' (" + "(" * 200 + ")",
]


@pytest.mark.parametrize("text", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_never_raises(text):
    d = run(text + "\n")
    assert d.exit_code in (0, 1)
    d.lines()


def test_random_bytes_around_the_message_never_raise():
    rng = random.Random(11)
    words = ["ImportError: cannot import name ", "ModuleNotFoundError: No module named ", "'", " from ", "megatron.core.",
             "utils", "zz", " (unknown location)", " (/a/site-packages/megatron/core/utils.py)", "partially initialized module ",
             " (most likely due to a circular import)", "; 'x' is not a package", "\n", "[rank0]: ", "Traceback (most recent call last):\n",
             '  File "/a/site-packages/megatron/bridge/x.py", line 3, in <module>\n', "    from megatron.core import x\n",
             "packaging.version", "deep_ep", ". Did you mean: 'y'?", "_", "__init__", "RuntimeError: x\n"]
    for _ in range(40):
        text = "".join(rng.choice(words) if rng.random() < 0.8 else chr(rng.randrange(1, 0x3000)) for _ in range(60))
        run(text).lines()
