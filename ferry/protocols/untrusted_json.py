"""JSON from a client, parsed so that every way it can fail is one ``ValueError``.

``json.loads`` raises ``RecursionError`` for ``[[[[...]]]]`` a hundred thousand deep (a
100 KB body) and ``MemoryError`` for what does not fit: neither is a ``ValueError``, so code
that caught the usual decode errors let them through, and in a worker process one such
body ended the process. Every parse of a body, in the frontend and in the worker, goes
through ``loads``.
"""

from __future__ import annotations

import json
from typing import Any


class UndecodableJson(ValueError):
    """A body that is no JSON this process can hold: nested too deeply, or too large."""


def loads(data: bytes | bytearray | str) -> Any:
    """``json.loads``, raising only ``ValueError`` (``UnicodeDecodeError``,
    ``json.JSONDecodeError`` or ``UndecodableJson``).

    >>> loads(b"[" * 100_000 + b"]" * 100_000)
    Traceback (most recent call last):
    ...
    ferry.protocols.untrusted_json.UndecodableJson: JSON nested too deeply
    """
    try:
        return json.loads(data)
    except RecursionError:
        raise UndecodableJson("JSON nested too deeply") from None
    except MemoryError:
        raise UndecodableJson("JSON too large to decode") from None


__all__ = ["UndecodableJson", "loads"]
