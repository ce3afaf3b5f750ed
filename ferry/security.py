"""API keys for token authorization, generated at start and written to an owner-only file.

``ferry.http.auth`` checks them on every request.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ApiKeys:
    management: str
    inference: str


def create_key_file(path: Path) -> ApiKeys:
    """Fresh keys, written so that only the owner can read them (mode 0600)."""
    keys = ApiKeys(secrets.token_urlsafe(24), secrets.token_urlsafe(24))
    document = {"management": {"key": keys.management}, "inference": {"key": keys.inference}}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(document, handle, indent=2)
    temporary.replace(path)
    return keys
