"""What every ``ferry bench load`` target shares: the ``Target`` protocol, the ``TargetSpec``
it is opened from, the ``Answer`` it gives and the errors it raises.

The lowest layer of the targets: ``http_target`` and ``grpc_targets`` speak a protocol each,
``targets`` chooses one for a URL; all three import this module, and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

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


@dataclass(frozen=True)
class GrpcCall:
    """What a ``grpc://`` URL names (``targets.grpc_call`` reads it)."""

    address: str
    service: str
    """``torchserve`` (``Predictions``) or ``v2`` (``ModelInfer``)."""
    model: str
    version: str
