"""Token authorization on the HTTP APIs: ``Authorization: Bearer <key>``, compared in
constant time.

On by default for the management API, and for the inference API whenever it listens
beyond loopback; ``--disable-token-auth`` turns it off. The metrics API and ``/ping`` stay
open so monitors and load balancers need no key, and so does the interactive ``/docs``
page: a browser sends no key, the page holds no secret (the same description every Ferry
serves), and the calls it makes carry the key typed into it.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from ferry.http.errors import error_body

OPEN_PATHS = frozenset({"/ping", "/v2/health/live", "/v2/health/ready"})
"""Health checks (TorchServe's and the Open Inference Protocol's): probes carry no key."""
PAGE_PATHS = frozenset({"/docs"})
"""Pages a browser opens, which cannot send a key."""


class TokenAuth:
    """ASGI middleware: 401 with TorchServe's error body unless the bearer key matches."""

    def __init__(self, app: ASGIApp, key: str, where: str = "the key file") -> None:
        """``where``: where the key is to be found, for the 401's message."""
        self.app = app
        self.expected = f"Bearer {key}".encode()
        self.where = where

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS | PAGE_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = error_body(
                    401,
                    "InvalidKeyException",
                    "Token authorization failed: send 'Authorization: Bearer <key>' with "
                    f"{self.where}",
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
