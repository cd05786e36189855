"""Keyed tags on cache entries: a shared cache whose answers only the key's holders can change.

A cache entry's sidecar records the BLAKE3 digest of its bytes. That catches a truncated or
damaged file, not a forged one: whoever can write the cache directory can replace an artifact
(or re-point an entry at another model's) and write the matching digest beside it, and every
process that reads the cache then serves that file's answers.

With ``$EMBEDL_DYNAMO_CACHE_KEY_FILE`` naming a file that holds a 32-byte secret key as 64 hex
characters, every entry the store writes carries a *tag* in its sidecar: BLAKE3 in its keyed
mode (a MAC) over the entry's place in the cache (namespace and file name, which hold its
content key) and its whole sidecar record (digest, size, companion, metadata). A process with
the key refuses an entry whose tag is missing or wrong, as it refuses a corrupt one: it is
rebuilt and replaced, or, in a read-only cache, built without storing; one warning per cache.

The key is read from a file, not from the variable itself: a secret in the environment shows
in ``ps e``, ``docker inspect`` and CI logs, where a mounted secret file does not.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import blake3

from embedl_dynamo.errors import ConfigurationError

__all__ = [
    "ENV_CACHE_KEY_FILE",
    "TAG",
    "UNTAGGED",
    "cache_key",
    "entry_tag",
    "tag_problem",
    "tell_untagged",
]

logger = logging.getLogger(__name__)

ENV_CACHE_KEY_FILE = "EMBEDL_DYNAMO_CACHE_KEY_FILE"
#: the sidecar field that holds an entry's tag
TAG = "tag"
#: how every tag problem begins (the store warns of these once per cache)
UNTAGGED = "no valid tag"
_KEY_BYTES = 32
_DOMAIN = b"embedl_dynamo cache entry 1\0"
_KEYS: dict[tuple[str, int, int, int], bytes] = {}  # (path, inode, size, mtime) -> key
_TOLD: set[str] = set()  # cache roots whose refused entries were told of


def cache_key(env: Mapping[str, str] | None = None) -> bytes | None:
    """The key that tags cache entries, from the file ``$EMBEDL_DYNAMO_CACHE_KEY_FILE`` names
    (in ``env``, ``os.environ`` when None); None when the variable is unset or empty.

    Raises:
        ConfigurationError: the file cannot be read or does not hold 64 hex characters.
    """
    value = (os.environ if env is None else env).get(ENV_CACHE_KEY_FILE, "")
    if not value.strip():
        return None
    path = Path(value).expanduser()
    try:
        stat = path.stat()
        identity = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if identity in _KEYS:
            return _KEYS[identity]
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigurationError(
            f"invalid {ENV_CACHE_KEY_FILE}={value!r}: cannot read the cache key there "
            f"({cause}); write a 32-byte key as 64 hex characters to it (e.g. `openssl rand "
            "-hex 32`), or unset the variable to use the cache without tags"
        ) from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != _KEY_BYTES:
        raise ConfigurationError(
            f"invalid {ENV_CACHE_KEY_FILE}={value!r}: the file holds {len(text)} characters, "
            "not a 32-byte key as 64 hex characters; write one with `openssl rand -hex 32`"
        )
    _KEYS[identity] = key
    return key


def _message(path: Path, record: Mapping[str, Any]) -> bytes:
    """What a tag covers: the entry's namespace and file name, and its record but the tag."""
    place = f"{path.parent.parent.name}/{path.name}"
    fields = {k: v for k, v in record.items() if k != TAG}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return _DOMAIN + place.encode("utf-8") + b"\0" + text.encode("ascii")


def entry_tag(key: bytes, path: Path, record: Mapping[str, Any]) -> str:
    """The hex tag of the entry at ``path`` whose sidecar holds ``record`` (the JSON document
    as read back: a tag is checked against what a reader parses)."""
    return blake3.blake3(_message(path, record), key=key).hexdigest()


def tag_problem(path: Path, record: Mapping[str, Any], key: bytes | None) -> str | None:
    """Why the entry at ``path`` with the sidecar ``record`` is refused under ``key`` (None:
    no key, or its tag is right). Every problem begins with :data:`UNTAGGED`."""
    if key is None:
        return None
    tag = record.get(TAG)
    if not isinstance(tag, str):
        return f"{UNTAGGED}: written without {ENV_CACHE_KEY_FILE}'s key"
    if not hmac.compare_digest(tag, entry_tag(key, path, record)):
        return f"{UNTAGGED}: changed, or tagged with another key"
    return None


def tell_untagged(root: Path, path: Path, problem: str, read_only: bool) -> None:
    """Say once per cache root, as a warning, that its entries without a valid tag are
    refused (the first one named); later ones at debug level. A cache built without the key
    would otherwise warn once per entry."""
    then = "each is built without storing it (read-only cache)" if read_only else "rebuilt"
    if str(root) in _TOLD:
        logger.debug("cache entry %s refused (%s); %s", path, problem, then)
        return
    _TOLD.add(str(root))
    logger.warning(
        "cache %s: entry %s is refused (%s), as is every entry without a valid tag for the key "
        "in %s; %s. Build the cache with the same key file, or unset the variable",
        *(root, path, problem, ENV_CACHE_KEY_FILE, then),
    )
