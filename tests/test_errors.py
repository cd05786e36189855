"""The package's exceptions: one base, exported at the root, builtin bases kept; one error line."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import embedl_dynamo
from embedl_dynamo import errors
from embedl_dynamo.errors import (
    CalibrationDataError,
    CliError,
    CorruptEntryError,
    EmbedlDynamoError,
    EngineUnavailableError,
    ExportArgumentError,
    ExportError,
    NonFiniteError,
    OutputMismatchError,
    RuntimeUnavailableError,
    VerificationError,
    error_line,
)

EXCEPTIONS = [
    obj
    for _, obj in inspect.getmembers(errors, inspect.isclass)
    if issubclass(obj, BaseException) and obj.__module__ == errors.__name__
]


def test_every_exception_has_the_base_and_is_exported_at_the_root():
    assert len(EXCEPTIONS) == 20
    for cls in EXCEPTIONS:
        assert issubclass(cls, EmbedlDynamoError), cls
        assert cls.__name__ in errors.__all__, cls
        assert cls.__name__ in embedl_dynamo.__all__, cls
        assert getattr(embedl_dynamo, cls.__name__) is cls


def test_no_public_exception_class_is_defined_outside_errors():
    package = Path(embedl_dynamo.__file__).resolve().parent
    elsewhere = []
    for path in package.rglob("*.py"):
        if path.name == "errors.py" and path.parent == package:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            bases = [ast.unparse(b) for b in getattr(node, "bases", [])]
            if (
                isinstance(node, ast.ClassDef)
                and not node.name.startswith("_")
                and any(b.endswith(("Error", "Exception")) for b in bases)
            ):
                elsewhere.append(f"{path.relative_to(package)}: {node.name}")
    assert not elsewhere, f"public exceptions outside embedl_dynamo.errors: {elsewhere}"


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (ExportArgumentError, ValueError),
        (CalibrationDataError, ValueError),
        (NonFiniteError, ValueError),
        (ExportError, RuntimeError),
        (VerificationError, RuntimeError),
        (EngineUnavailableError, RuntimeError),
        (RuntimeUnavailableError, RuntimeError),
        (OutputMismatchError, RuntimeError),
        (CorruptEntryError, RuntimeError),
    ],
)
def test_builtin_bases_are_kept(cls, builtin):
    assert issubclass(cls, builtin)


def test_export_errors_share_export_error():
    for cls in (ExportArgumentError, VerificationError, EngineUnavailableError):
        assert issubclass(cls, ExportError)
    assert issubclass(NonFiniteError, CalibrationDataError)


def test_cli_error_carries_its_exit_code():
    from embedl_dynamo.cli import EXIT_UNAVAILABLE, EXIT_USAGE

    assert CliError("bad").code == EXIT_USAGE
    assert CliError("no TensorRT", EXIT_UNAVAILABLE).code == EXIT_UNAVAILABLE


def test_error_line_names_the_type_and_the_first_line():
    assert error_line(ValueError("  \nbad shape\ntraceback...")) == "ValueError: bad shape"
    assert error_line(KeyError()) == "KeyError"
    assert error_line(ValueError("")) == "ValueError"


def test_error_line_without_type_falls_back_to_the_type_name():
    assert error_line(RuntimeError("op x fails\nmore"), with_type=False) == "op x fails"
    assert error_line(RuntimeError(), with_type=False) == "RuntimeError"


def test_error_line_skips_lines_that_name_no_cause():
    exc = RuntimeError("Exception from src/a.cpp:1:\nException from src/b.cpp:2:\nthe cause\n")
    assert error_line(exc, with_type=False, skip=("Exception from ",)) == "the cause"
    only = RuntimeError("Exception from src/a.cpp:1:")
    assert error_line(only, with_type=False, skip=("Exception from ",)) == (
        "Exception from src/a.cpp:1:"
    )
