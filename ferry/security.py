"""API keys for token authorization, and the key file that holds them.

Each key (management, inference) comes from the first of these that has it:

1. the ``management_key`` / ``inference_key`` settings (flag, ``FERRY_*`` environment
   variable or config.properties): stable keys supplied by containers and automation;
2. the key file (``key_file``), when it exists: reused as it is and never rewritten, so a
   restart, or a second server started beside a running one, keeps the keys clients hold;
3. fresh random keys, written to the key file (owner-only, atomically) by ``KeyPlan.save``,
   which ``ferry.server`` calls only once every listener is bound and the start-up models
   are loaded: a start that fails (a port in use, an invalid model-config.yaml) never
   touches the file.

A key file that exists but cannot be read, or is not a Ferry key file, stops start-up
with a ``ConfigError`` naming it; Ferry never overwrites it. Keys are never logged.
``ferry.http.auth`` checks them on every request.

    >>> plan = plan_keys(Path("key_file.json"), management="from-settings")
    >>> plan.save()  # writes the file only if a key had to be generated
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ferry.errors import ConfigError

log = logging.getLogger("ferry.security")


@dataclass(frozen=True)
class ApiKeys:
    management: str = field(repr=False)
    inference: str = field(repr=False)


@dataclass(frozen=True)
class KeyPlan:
    """The keys to serve with, and whether the key file still has to be written."""

    keys: ApiKeys
    path: Path
    origin: str
    """``settings``, ``key file`` (reused; a setting may override one key) or ``generated``."""

    def save(self) -> None:
        """Write generated keys to the key file; a no-op for keys from settings or the file."""
        if self.origin == "generated":
            write_key_file(self.path, self.keys)


def plan_keys(path: Path, management: str | None = None, inference: str | None = None) -> KeyPlan:
    """The keys to use (see the module docstring); reads the key file at most, never writes."""
    if management and inference:
        return KeyPlan(ApiKeys(management, inference), path, "settings")
    stored = read_key_file(path)
    if stored is not None:
        keys = ApiKeys(management or stored.management, inference or stored.inference)
        return KeyPlan(keys, path, "key file")
    fresh = ApiKeys(management or _new_key(), inference or _new_key())
    return KeyPlan(fresh, path, "generated")


def _new_key() -> str:
    return secrets.token_urlsafe(24)


def is_valid_key(value: object) -> bool:
    """Non-empty visible ASCII without spaces: what fits ``Authorization: Bearer <key>``."""
    return isinstance(value, str) and value != "" and all(33 <= ord(c) <= 126 for c in value)


def read_key_file(path: Path) -> ApiKeys | None:
    """The keys in an existing key file; None when there is none. Raises ``ConfigError``
    for a file that cannot be read or is not a Ferry key file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ConfigError(f"cannot read key file {path}: {error.strerror}") from None
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    keys = {api: _key_in(document, api) for api in ("management", "inference")}
    if keys["management"] is None or keys["inference"] is None:
        raise ConfigError(
            f"key file {path} is not a Ferry key file (expected "
            '{"management": {"key": ...}, "inference": {"key": ...}}); '
            "fix it, or remove it to have new keys generated"
        )
    if os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("key file %s is readable by other users; chmod 600 it", path)
    return ApiKeys(keys["management"], keys["inference"])


def _key_in(document: Any, api: str) -> str | None:
    entry = document.get(api) if isinstance(document, dict) else None
    key = entry.get("key") if isinstance(entry, dict) else None
    return key if is_valid_key(key) else None


def write_key_file(path: Path, keys: ApiKeys) -> None:
    """Create the key file, readable by its owner only (mode 0600). Atomic, and never
    replaces a file: if one appeared meanwhile (another server starting), ``ConfigError``."""
    document = {"management": {"key": keys.management}, "inference": {"key": keys.inference}}
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w") as handle:  # mkstemp creates it 0600
            json.dump(document, handle, indent=2)
        _link_unless_exists(Path(temporary), path)
    finally:
        Path(temporary).unlink(missing_ok=True)


def _link_unless_exists(source: Path, target: Path) -> None:
    try:
        os.link(source, target)  # fails, rather than replaces, if target exists
    except FileExistsError:
        raise ConfigError(
            f"key file {target} was created by another process while Ferry started; "
            "start again to use its keys"
        ) from None
    except OSError:  # a file system without hard links: check, then rename
        if target.exists():
            raise ConfigError(f"key file {target} appeared while Ferry started") from None
        os.replace(source, target)
