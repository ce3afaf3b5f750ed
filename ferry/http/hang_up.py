"""Telling a waiting request that its client went away.

An endpoint that waits for a worker registers callbacks in its ASGI scope under
``HANG_UP``; the HTTP protocol (``ferry.http.protocol``) calls them when the connection is
lost before the response was sent, so the request is dropped before it reaches a worker.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

HANG_UP = "ferry.hang_up"


def on_hang_up(scope: MutableMapping[str, Any]) -> Callable[[Callable[[], None]], None]:
    """The registrar an endpoint hands to the service for this request."""
    callbacks: list[Callable[[], None]] = scope.setdefault(HANG_UP, [])
    return callbacks.append


def notify_hang_up(scope: MutableMapping[str, Any]) -> None:
    """Run (once) the callbacks registered for this request's scope."""
    for callback in scope.pop(HANG_UP, []):
        callback()
