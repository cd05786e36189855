"""Content keys change with the library's own code, not only with its version number."""

from __future__ import annotations

from pathlib import Path

from embedl_dynamo.cache.keys import library_versions, source_digest


def _package(root: Path, body: str) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True, exist_ok=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "export.py").write_text(body)
    return root / "pkg"


def test_an_edited_source_file_changes_the_digest(tmp_path):
    package = _package(tmp_path, "SHAPE = 'computed'\n")
    before = source_digest(package)
    assert source_digest(package) == before  # the same sources, the same digest
    _package(tmp_path, "SHAPE = 'constant'\n")
    assert source_digest(package) != before


def test_a_renamed_source_file_changes_the_digest(tmp_path):
    package = _package(tmp_path, "X = 1\n")
    before = source_digest(package)
    (package / "sub" / "export.py").rename(package / "sub" / "exporter.py")
    assert source_digest(package) != before


def test_library_versions_hold_the_digest_of_this_package():
    import embedl_dynamo

    package = Path(embedl_dynamo.__file__).resolve().parent
    assert library_versions()["embedl_dynamo_sources"] == source_digest(package)
