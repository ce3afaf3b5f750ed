"""What ``ferry bench load`` sends requests to: a URL, over HTTP or gRPC.

    http(s)://HOST:PORT/ANY/PATH                       a POST of the payload (any REST API)
    grpc://HOST:PORT/predictions/MODEL[/VERSION]       TorchServe's ``Predictions``
    grpc://HOST:PORT/v2/models/MODEL[/versions/V]/infer  the Open Inference Protocol's
                                                       ``ModelInfer``

This module reads the URL and opens the target that speaks it: ``http_target``'s, or one of
``grpc_targets``' (imported only then: grpcio is the ``grpc`` extra's). Every target answers
``Answer``: an HTTP status (for gRPC, the status REST would have given for the call's code,
``GRPC_TO_HTTP``, with the code's name kept) and the body. A request that got no answer at
all raises ``NoAnswer``. Those types live in ``target_types``, which every target imports.
"""

from __future__ import annotations

import asyncio
import re
from urllib.parse import urlsplit

import ferry.grpc
from ferry_bench.http_target import HttpTarget
from ferry_bench.target_types import GrpcCall, Target, TargetSpec, Unreachable, UnsupportedTarget

_PREDICTIONS = re.compile(r"^/predictions/(?P<model>[^/]+)(?:/(?P<version>[^/]+))?/?$")
_V2_INFER = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")


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
        from ferry_bench.grpc_targets import grpc_target

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
