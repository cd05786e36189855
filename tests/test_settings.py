"""Settings: options > environment > defaults, validation messages, immutability."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from embedl_dynamo.precision import get_precision
from embedl_dynamo.runtimes.registry import runtime_settings
from embedl_dynamo.settings import Settings

pytestmark = pytest.mark.usefixtures("compile_isolation")


def test_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("EMBEDL_DYNAMO_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    s = Settings.from_options(None)
    assert (s.runtime, s.fallback, s.dynamic_batch, s.precision.name, s.observer) == (
        "auto",
        "eager",
        True,
        "fp32",
        None,  # the target's own range estimator
    )
    assert not s.precision.quantizes
    assert s.cache_dir == tmp_path / "embedl_dynamo"
    assert s.calibration_steps == 32 and s.calibration_cache is True


def test_env_overrides_defaults_and_options_override_env():
    env = {"EMBEDL_DYNAMO_RUNTIME": "eager", "EMBEDL_DYNAMO_CACHE_DIR": "/tmp/from_env"}
    s = Settings.from_options({}, env=env)
    assert s.runtime == "eager" and s.cache_dir == Path("/tmp/from_env")
    s = Settings.from_options({"runtime": "onnxruntime", "cache_dir": "/tmp/opt"}, env=env)
    assert s.runtime == "onnxruntime" and s.cache_dir == Path("/tmp/opt")


def test_unknown_option_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown embedl_dynamo option\(s\) \['runtim'\]") as e:
        Settings.from_options({"runtim": "eager"}, env={})
    assert "runtime, cache_dir, fallback" in str(e.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fallback": "ignore"}, "invalid fallback='ignore'; valid values: 'eager', 'raise'"),
        ({"quantize": "int4"}, "invalid quantize='int4'; valid values: None, 'int8'"),
        (
            {"observer": "max"},
            "valid values: None, 'minmax', 'mean_minmax', 'percentile', 'mse', 'entropy'",
        ),
        ({"min_subgraph_size": -1}, "expected an integer >= 0"),
        ({"min_subgraph_size": 2.5}, "expected an integer >= 0"),
        ({"calibration_steps": 0}, "expected an integer >= 1"),
        ({"num_threads": 0}, "expected an integer >= 1"),
        ({"dynamic_batch": "yes"}, "expected True or False"),
        ({"progress": 1}, "expected True, False or None"),
        ({"calibration_data": 3}, "expected an iterable"),
        ({"precision": "fp9"}, "invalid precision='fp9'; valid values: 'fp32', 'fp16', 'bf16'"),
        (
            {"precision": "fp16", "quantize": "int8"},
            "quantize='int8' conflicts with precision='fp16'; give one: precision='int8'",
        ),
    ],
)
def test_bad_values(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings.from_options(options, env={})


def test_precision_default_alias_and_environment():
    assert Settings.from_options({}, env={}).precision.name == "fp32"
    alias = Settings.from_options({"quantize": "int8"}, env={})
    assert alias.precision is get_precision("int8") and alias.precision.quantizes
    assert Settings.from_options({"quantize": None}, env={}).precision.name == "fp32"
    both = Settings.from_options({"quantize": "int8", "precision": "mixed"}, env={})
    assert both.precision.name == "mixed"  # the alias keeps a precision that quantizes
    mixed = Settings.from_options({"precision": "mixed"}, env={})
    assert mixed.precision.quantizes and mixed.precision.per_layer  # mixed quantizes, per layer
    env = {"EMBEDL_DYNAMO_PRECISION": "fp16"}
    assert Settings.from_options({}, env=env).precision.name == "fp16"
    wins = Settings.from_options({"quantize": "int8"}, env=env)
    assert wins.precision.name == "int8"  # option wins
    assert Settings.from_options({"precision": "fp32"}, env=env).precision.name == "fp32"
    with pytest.raises(ValueError, match="invalid EMBEDL_DYNAMO_PRECISION='half'"):
        Settings.from_options({}, env={"EMBEDL_DYNAMO_PRECISION": "half"})
    float_copy = mixed.float_copy()
    assert float_copy.precision.name == "fp32" and not float_copy.precision.quantizes
    assert alias.key_dict() == Settings.from_options({"precision": "int8"}, env={}).key_dict()
    assert "quantize" not in {f.name for f in dataclasses.fields(Settings)}  # an alias, not a field
    assert "quantize" in Settings.names()


def test_precision_is_typed_and_keys_keep_its_name():
    s = Settings.from_options({"precision": "bf16"}, env={})
    assert s.precision.half_dtype is torch.bfloat16 and s.precision.lower
    assert s.key_dict()["precision"] == "bf16" and s.to_dict()["precision"] == "bf16"
    assert Settings(**s.to_dict()) == dataclasses.replace(s, calibration_data=None)
    with pytest.raises(TypeError, match="ask its facts"):
        s.precision == "bf16"  # noqa: B015  # a string comparison is an error, not False


def test_unknown_runtime_lists_the_registered_ones():
    """The runtime registry checks the name (settings sit below it and keep no list)."""
    message = "invalid runtime='tvm'; valid values: 'auto', 'onnxruntime'"
    with pytest.raises(ValueError, match=message):
        runtime_settings({"runtime": "tvm"}, env={})
    with pytest.raises(ValueError, match="invalid runtime=3; expected a runtime name"):
        Settings.from_options({"runtime": 3}, env={})


def test_bad_env_value_names_the_variable():
    with pytest.raises(ValueError, match="invalid EMBEDL_DYNAMO_RUNTIME='gpu'; valid values: auto"):
        runtime_settings({}, env={"EMBEDL_DYNAMO_RUNTIME": "gpu"})
    # the option wins over the environment, and the error names what was given
    with pytest.raises(ValueError, match="invalid runtime='tvm'"):
        runtime_settings({"runtime": "tvm"}, env={"EMBEDL_DYNAMO_RUNTIME": "eager"})
    assert runtime_settings({}, env={"EMBEDL_DYNAMO_RUNTIME": "eager"}).runtime == "eager"


def test_removed_option_says_why_and_what_to_do():
    with pytest.raises(
        ValueError, match="option 'transformer_fusion' no longer exists: .*not faster"
    ):
        Settings.from_options({"transformer_fusion": True}, env={})
    assert "transformer_fusion" not in Settings.names()


def test_frozen():
    s = Settings.from_options({}, env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.runtime = "eager"  # type: ignore[misc]
    assert dataclasses.replace(s, runtime="eager").runtime == "eager"


def test_to_dict_is_json_and_skips_calibration_data():
    data = [1, 2, 3]
    s = Settings.from_options({"calibration_data": data, "quantize": "int8"}, env={})
    d = s.to_dict()
    json.dumps(d)
    assert d["calibration_data"] == "list" and d["precision"] == "int8" and "quantize" not in d
    assert "calibration_data" not in s.key_dict() and "cache_dir" not in s.key_dict()
