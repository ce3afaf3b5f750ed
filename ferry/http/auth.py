"""Token authorization on the HTTP APIs: ``Authorization: Bearer <key>``, compared in
constant time.

On by default for the management API, and for the inference API whenever it listens
beyond loopback; ``--disable-token-auth`` turns it off. The metrics API and ``/ping`` stay
open so monitors and load balancers need no key.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from ferry.http.errors import error_body

OPEN_PATHS = frozenset({"/ping", "/v2/health/live", "/v2/health/ready"})
"""Health checks (TorchServe's and the Open Inference Protocol's): probes carry no key."""


class TokenAuth:
    """ASGI middleware: 401 with TorchServe's error body unless the bearer key matches."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = error_body(
                    401,
                    "InvalidKeyException",
                    "Token authorization failed: send 'Authorization: Bearer <key>' with the "
                    "key from the key file",
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
