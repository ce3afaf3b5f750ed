"""What ``ferry bench load`` sends requests to: a URL, over HTTP or gRPC.

    http(s)://HOST:PORT/ANY/PATH                       a POST of the payload (any REST API)
    grpc://HOST:PORT/predictions/MODEL[/VERSION]       TorchServe's ``Predictions``
    grpc://HOST:PORT/v2/models/MODEL[/versions/V]/infer  the Open Inference Protocol's
                                                       ``ModelInfer``

Every target answers ``Answer``: an HTTP status (for gRPC, the status REST would have given
for the call's code, ``GRPC_TO_HTTP``, with the code's name kept) and the body. A request
that got no answer at all raises ``NoAnswer``. The gRPC targets live in ``grpc_targets``
(grpcio is the ``grpc`` extra's).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

import ferry.grpc

REQUEST_TIMEOUT_S = 600.0
"""No request waits longer than this: far beyond any server's response timeout."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    code: str | None = None
    """The gRPC status code's name, for gRPC targets."""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class NoAnswer(Exception):
    """The request got no answer (connection refused or reset, a timeout); ``kind`` names it."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


class Unreachable(Exception):
    """Nothing listens at the target's address; the message says where and why."""


class UnsupportedTarget(ValueError):
    """A URL no target speaks, or payloads its protocol cannot carry."""


class Target(Protocol):
    protocol: str
    """``http``, ``grpc-torchserve`` or ``grpc-v2``: what load reports name."""

    async def send(self, index: int) -> Answer:
        """Send request ``index`` (payload ``index % len(payloads)``); raises ``NoAnswer``."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class TargetSpec:
    url: str
    payloads: Sequence[bytes]
    content_type: str = "application/octet-stream"
    token: str | None = None
    """Sent as ``Authorization: Bearer`` (gRPC: ``authorization`` metadata)."""
    connections: int = 100
    """HTTP connections kept open at most (gRPC multiplexes one channel)."""


class HttpTarget:
    protocol = "http"

    def __init__(self, spec: TargetSpec) -> None:
        self._url = spec.url
        self._payloads = spec.payloads
        self._headers = {"Content-Type": spec.content_type}
        if spec.token:
            self._headers["Authorization"] = f"Bearer {spec.token}"
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=spec.connections, ssl=False),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        )

    async def send(self, index: int) -> Answer:
        payload = self._payloads[index % len(self._payloads)]
        try:
            async with self._session.post(
                self._url, data=payload, headers=self._headers
            ) as response:
                return Answer(response.status, await response.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise NoAnswer(type(exc).__name__, str(exc)) from exc

    async def close(self) -> None:
        await self._session.close()


_PREDICTIONS = re.compile(r"^/predictions/(?P<model>[^/]+)(?:/(?P<version>[^/]+))?/?$")
_V2_INFER = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")


@dataclass(frozen=True)
class GrpcCall:
    """What a ``grpc://`` URL names."""

    address: str
    service: str
    """``torchserve`` (``Predictions``) or ``v2`` (``ModelInfer``)."""
    model: str
    version: str


def grpc_call(url: str) -> GrpcCall:
    """The call a ``grpc://`` URL names; ``UnsupportedTarget`` says what is wrong with it."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        raise UnsupportedTarget(f"{url!r}: {exc}") from None
    if not parts.hostname or port is None:
        raise UnsupportedTarget(f"{url!r}: a gRPC URL needs a host and port, e.g. grpc://HOST:7070")
    for service, pattern in (("torchserve", _PREDICTIONS), ("v2", _V2_INFER)):
        if match := pattern.match(parts.path):
            return GrpcCall(parts.netloc, service, match["model"], match["version"] or "")
    raise UnsupportedTarget(
        f"{url!r}: a gRPC URL's path is /predictions/MODEL[/VERSION] (TorchServe's "
        "Predictions) or /v2/models/MODEL[/versions/V]/infer (Open Inference ModelInfer)"
    )


def check_url(url: str) -> None:
    """Raise ``UnsupportedTarget`` for a URL no target speaks."""
    scheme = urlsplit(url).scheme
    if scheme == "grpc":
        grpc_call(url)
    elif scheme not in ("http", "https"):
        raise UnsupportedTarget(f"{url!r}: the URL must start with http://, https:// or grpc://")


def open_target(spec: TargetSpec) -> Target:
    """The target for ``spec.url``; ``UnsupportedTarget`` names what is wrong with it (a
    gRPC URL without the ``grpc`` extra included)."""
    check_url(spec.url)
    if not spec.payloads:
        raise UnsupportedTarget("no payloads to send")
    if urlsplit(spec.url).scheme == "grpc":
        if not ferry.grpc.available():
            hint = ferry.grpc.INSTALL_HINT
            raise UnsupportedTarget(f"gRPC targets need the 'grpc' extra: {hint}")
        from ferry.bench.grpc_targets import grpc_target

        return grpc_target(spec, grpc_call(spec.url))
    return HttpTarget(spec)


async def check_reachable(url: str, timeout_s: float = 5.0) -> None:
    """Raise ``Unreachable`` unless a TCP connection to the URL's host and port opens."""
    check_url(url)
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise Unreachable(f"{url}: {exc}") from None
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError) as exc:
        reason = str(exc) or type(exc).__name__
        message = f"cannot reach {host}:{port} ({reason}); is the server running?"
        raise Unreachable(message) from None
    writer.close()
    await writer.wait_closed()
