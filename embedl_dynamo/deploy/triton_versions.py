"""The versions of a Triton model on disk: the newest one found, and a new one written whole.

Triton serves ``<repo>/<model>/<n>/`` for the highest ``n`` (its default version policy), so a
re-export is written as the next number beside the versions before it (kept to roll back to).
:func:`write_version` stages the files in a hidden folder and renames it to its number once
complete, so Triton never loads half a version, and keeps a newest version that already holds
the same bytes instead of repeating it.
"""

from __future__ import annotations

import errno
import filecmp
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from embedl_dynamo.cache.files import file_mode

__all__ = ["latest_version", "write_version"]


def _copy_into(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` under a temporary name, then rename it into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        shutil.copyfile(source, tmp)
        os.chmod(tmp, file_mode())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def latest_version(model_dir: str | os.PathLike[str]) -> int | None:
    """The newest version of the Triton model at ``model_dir``: of its folders named by a
    positive integer without a leading zero, as Triton reads them, the highest (None: none)."""
    try:
        names = [p.name for p in Path(model_dir).iterdir() if p.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        return None
    return max((int(n) for n in names if n.isdigit() and not n.startswith("0")), default=None)


def _same_files(version: Path, files: dict[str, Path]) -> bool:
    held = {p.name for p in version.iterdir() if p.is_file()}
    return held == set(files) and all(
        filecmp.cmp(source, version / name, shallow=False) for name, source in files.items()
    )


def write_version(model_dir: Path, files: dict[str, Path]) -> int:
    """Write ``files`` (name in the version: source) as a new version of the Triton model at
    ``model_dir``; its number. Triton serves the newest version (its default version policy,
    ``latest { num_versions: 1 }``), so a re-export is what it serves once it polls or loads,
    and the version before stays beside it to roll back to. The files are written into a
    hidden folder first, renamed to the number once complete, so Triton never loads half a
    version. A newest version that holds the same bytes already is kept, not repeated."""
    model_dir.mkdir(parents=True, exist_ok=True)
    newest = latest_version(model_dir)
    if newest is not None and _same_files(model_dir / str(newest), files):
        return newest
    staging = model_dir / f".embedl-staging-{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir()  # the umask's mode: the user Triton runs as reads it
    try:
        for name, source in files.items():
            _copy_into(source, staging / name)
        version = (newest or 0) + 1
        while True:
            try:
                os.rename(staging, model_dir / str(version))
                return version
            except OSError as exc:  # another writer took the number meanwhile
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                version += 1
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
