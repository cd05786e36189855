"""Backend registry: discovery through real installed distribution metadata, selection, errors."""

from __future__ import annotations

import logging
import sys
import textwrap
from pathlib import Path

import pytest

from embedl_dynamo import backend as registry
from embedl_dynamo.backend import (
    ENV_VAR,
    Backend,
    discover_backends,
    get_backend,
    reset_backends,
    set_backend,
)
from embedl_dynamo.backends.tensorrt import BACKEND as TENSORRT
from embedl_dynamo.patterns.conv_bn import CONV_BN, CONV_BN_RELU, ConvBNActivation

BUILTIN = {"tensorrt", "onnxruntime", "lattice"}


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    reset_backends()
    yield
    reset_backends()


def _install(root: Path, dist: str, module: str, source: str, entry_points: dict[str, str]) -> None:
    """Write a module and a ``<dist>-0.1.dist-info`` (METADATA + entry_points.txt) into ``root``."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = [f"{name} = {value}" for name, value in entry_points.items()]
    (info / "entry_points.txt").write_text("[embedl_dynamo.backends]\n" + "\n".join(lines) + "\n")


_MYACCEL = """
    from embedl_dynamo.backend import Backend
    from embedl_dynamo.patterns.conv_bn import CONV_BN

    BACKEND = Backend(name="myaccel", fusion_patterns=(CONV_BN,), description="a vendor chip")

    def make_backend():
        return Backend(name="myaccel_factory")

    NOT_A_BACKEND = 42
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A third-party distribution ``myaccel-embedl`` on sys.path, registering ``myaccel``."""
    _install(
        tmp_path,
        "myaccel-embedl",
        "myaccel_embedl",
        _MYACCEL,
        {"myaccel": "myaccel_embedl:BACKEND"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_builtin_backends_are_discovered() -> None:
    assert BUILTIN <= set(discover_backends())


def test_third_party_backend_is_discovered(plugin: Path) -> None:
    backends = discover_backends()
    assert BUILTIN | {"myaccel"} <= set(backends)
    assert backends["myaccel"].fusion_patterns == (CONV_BN,)
    assert registry._registry.origins["myaccel"] == "myaccel_embedl:BACKEND (from myaccel-embedl)"
    assert set_backend("myaccel") is backends["myaccel"]
    assert get_backend().name == "myaccel"


def test_factory_entry_point_is_called(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install(
        tmp_path,
        "factory-embedl",
        "factory_embedl",
        _MYACCEL,
        {"myaccel_factory": "factory_embedl:make_backend"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert discover_backends()["myaccel_factory"].name == "myaccel_factory"


def test_entry_point_that_is_not_a_backend_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(tmp_path, "bad-embedl", "bad_embedl", _MYACCEL, {"bad": "bad_embedl:NOT_A_BACKEND"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        TypeError, match="entry point bad = bad_embedl:NOT_A_BACKEND is not a Backend"
    ):
        discover_backends()


def test_broken_plugin_is_reported_and_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _install(
        tmp_path,
        "broken-embedl",
        "broken_embedl",
        "raise ImportError('no driver')\n",
        {"broken": "broken_embedl:BACKEND"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="embedl_dynamo.backend"):
        backends = discover_backends()
    assert "broken" not in backends and BUILTIN <= set(backends)
    assert "could not load backend entry point broken = broken_embedl:BACKEND: no driver" in (
        caplog.text
    )


def test_duplicate_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = """
        from embedl_dynamo.backend import Backend
        BACKEND = Backend(name="tensorrt")
    """
    _install(
        tmp_path,
        "impostor-embedl",
        "impostor_embedl",
        source,
        {"tensorrt": "impostor_embedl:BACKEND"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RuntimeError) as info:
        discover_backends()
    message = str(info.value)
    assert "backend name 'tensorrt' is registered twice" in message
    assert "impostor_embedl:BACKEND (from impostor-embedl)" in message
    assert "embedl_dynamo.backends.tensorrt:BACKEND (from embedl-dynamo)" in message
    assert "Uninstall one of them." in message


def test_set_backend_unknown_name_lists_known_ones(plugin: Path) -> None:
    with pytest.raises(ValueError) as info:
        set_backend("tensorrtt")
    assert str(info.value) == (
        "unknown backend 'tensorrtt'; known backends: lattice, myaccel, onnxruntime, openvino, tensorrt"
    )


def test_environment_variable_selects_the_backend(
    plugin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, "myaccel")
    assert get_backend().name == "myaccel"
    set_backend("onnxruntime")  # an explicit choice wins over the environment
    assert get_backend().name == "onnxruntime"


def test_environment_variable_naming_nothing_is_an_error(
    plugin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, "nope")
    with pytest.raises(ValueError) as info:
        get_backend()
    assert str(info.value) == (
        f"{ENV_VAR}='nope' names no installed backend; known backends: "
        "lattice, myaccel, onnxruntime, openvino, tensorrt"
    )


def test_several_backends_and_no_choice_explains_how_to_choose(plugin: Path) -> None:
    with pytest.raises(RuntimeError) as info:
        get_backend()
    message = str(info.value)
    assert (
        "several backends are installed (lattice, myaccel, onnxruntime, openvino, tensorrt)"
        in message
    )
    assert "set_backend(name)" in message and f"{ENV_VAR}=name" in message
    assert "'embedl_<name>'" in message


def test_single_backend_is_chosen_without_asking(monkeypatch: pytest.MonkeyPatch) -> None:
    only = Backend(name="only")
    monkeypatch.setattr(registry, "discover_backends", lambda: {"only": only})
    assert get_backend() is only


def test_reset_backends_forgets_choice_and_rediscovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(
        tmp_path,
        "myaccel-embedl",
        "myaccel_embedl",
        _MYACCEL,
        {"myaccel": "myaccel_embedl:BACKEND"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    set_backend("myaccel")
    assert "myaccel" in discover_backends()
    sys.path.remove(str(tmp_path))  # "uninstall" the plug-in
    assert "myaccel" in discover_backends()  # cached until reset
    reset_backends()
    with pytest.raises(RuntimeError, match="none is selected"):  # the choice is forgotten
        get_backend()
    assert "myaccel" not in discover_backends()


def test_phase_mismatch_names_pattern_and_field() -> None:
    with pytest.raises(ValueError) as info:
        Backend(name="bad", conversion_patterns=(CONV_BN_RELU,))
    assert str(info.value) == (
        "Backend 'bad': pattern 'conv_bn_relu' has phase 'fusion' but is listed in "
        "conversion_patterns (phase 'conversion')"
    )


def test_pattern_class_instead_of_instance_is_refused() -> None:
    with pytest.raises(TypeError, match="did you pass the class instead of an instance"):
        Backend(name="bad", fusion_patterns=(ConvBNActivation,))


def test_repeated_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match=r"fusion_patterns repeats \['conv_bn'\]"):
        Backend(name="bad", fusion_patterns=(CONV_BN, CONV_BN))


def test_to_dict_from_dict_round_trip() -> None:
    data = TENSORRT.to_dict()
    assert data["fusion_patterns"][:3] == [
        "stem_conv_bn_relu_maxpool",
        "conv_bn_add_relu",
        "conv_bn_add",
    ]
    rebuilt = Backend.from_dict(data)
    assert rebuilt.to_dict() == data
    assert rebuilt.patterns == TENSORRT.patterns


def test_from_dict_unknown_pattern_lists_known_ones() -> None:
    with pytest.raises(
        ValueError, match=r"unknown fusion pattern 'conv_bn_foo'; known: \[.*'conv_bn'"
    ):
        Backend.from_dict({"name": "x", "fusion_patterns": ["conv_bn_foo"]}, TENSORRT.patterns)
