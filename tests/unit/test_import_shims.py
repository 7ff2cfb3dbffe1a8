"""The import shims: narrow, invisible to Megatron-Core, inactive when the real package exists."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mbridge_ep_overlap.target import shims as import_shims


def run_python(code: str, extra_path: str | None = None) -> subprocess.CompletedProcess:
    env_path = f"import sys; sys.path.insert(0, {extra_path!r})\n" if extra_path else ""
    return subprocess.run([sys.executable, "-c", env_path + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)


def test_bridge_imports_and_mcore_still_sees_no_te():
    import megatron.bridge  # noqa: F401
    from megatron.core import fp8_utils
    from megatron.core.extensions import transformer_engine as mcore_te
    from megatron.core.transformer import mlp

    assert import_shims.real_te_available() is False
    assert "transformer_engine" in import_shims.installed()
    assert (fp8_utils.HAVE_TE, mcore_te.HAVE_TE, mlp.HAVE_TE) == (False, False, False)


def test_placeholder_never_leaks_to_other_importers():
    import megatron.bridge.peft.lora_layers as lora  # an allowed importer got the placeholder

    assert getattr(lora.te, "__mbridge_ep_overlap_placeholder__", False)
    with pytest.raises(ImportError):
        import transformer_engine  # noqa: F401
    assert "transformer_engine" not in sys.modules


def test_placeholder_objects_refuse_to_run():
    import megatron.bridge.peft.lora_layers as lora

    with pytest.raises(import_shims.MissingOptionalPackage, match="not installed"):
        lora.te.Linear(4, 4)


def test_mb_pretrain_imports_without_nvidia_resiliency_ext():
    result = run_python(
        """
        from mbridge_ep_overlap.target import shims
        shims.install()
        from megatron.bridge.training.pretrain import pretrain
        import importlib.util, sys
        assert importlib.util.find_spec("nvidia_resiliency_ext") is None
        try:
            import nvidia_resiliency_ext
        except ImportError:
            print("OK")
        """
    )
    assert result.stdout.strip().endswith("OK"), result.stderr[-2000:]


def test_inactive_when_the_real_package_is_installed(tmp_path, monkeypatch):
    # A stand-in with the real import path: the shim must not be chosen for it.
    pkg = tmp_path / "transformer_engine" / "pytorch"
    pkg.mkdir(parents=True)
    (tmp_path / "transformer_engine" / "__init__.py").write_text("REAL = True\n")
    (pkg / "__init__.py").write_text("REAL = True\n")
    assert "transformer_engine" in [s.package for s in import_shims.missing_packages()]
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert "transformer_engine" not in [s.package for s in import_shims.missing_packages()]
        assert import_shims.real_te_available() is True
    finally:
        for name in ("transformer_engine.pytorch", "transformer_engine"):
            sys.modules.pop(name, None)


def test_importing_the_package_has_no_side_effects():
    """Public API only: no shims, no torch, no Megatron until a name that needs them is used."""
    result = run_python(
        """
        import sys
        import mbridge_ep_overlap
        from mbridge_ep_overlap.target import shims
        assert shims.installed() == (), shims.installed()
        assert not any(m == "torch" or m.startswith("megatron") for m in sys.modules), sorted(sys.modules)
        from mbridge_ep_overlap import enable_ep_overlap  # needs MB: installs the shims it needs
        assert "transformer_engine" in shims.installed()
        print("OK")
        """
    )
    assert result.stdout.strip().endswith("OK"), result.stderr[-2000:]
