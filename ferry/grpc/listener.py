"""gRPC listeners: a ``grpc.aio`` server per API, bound in ``bind()`` as the HTTP ones are,
so that a port in use stops start-up before a key file is written or a worker started.

An API's server carries the services listed for it: ``INFERENCE_SERVICES`` and
``MANAGEMENT_SERVICES``. The inference server carries TorchServe's API and the Open
Inference Protocol's ``inference.GRPCInferenceService`` (as TorchServe does, on one port,
behind one auth and TLS); another protocol is one more ``ServiceInstaller`` in the tuple.
Every server answers a request that is not a valid message INVALID_ARGUMENT
(``malformed``), and a ``grpcs`` one checks its certificate and key first (``tls``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from collections.abc import Callable, Sequence

from grpc import aio

from ferry.apis import Apis
from ferry.config.settings import Address, ServerSettings
from ferry.grpc import open_inference, torchserve_inference, torchserve_management
from ferry.grpc.auth import TokenAuth
from ferry.grpc.malformed import MalformedRequests
from ferry.grpc.tls import server_credentials
from ferry.security import ApiKeys

STOP_GRACE_SECONDS = 10.0
"""On stop, how long calls in flight may take to finish before they are cancelled."""

ServiceInstaller = Callable[[aio.Server, Apis], None]
"""Adds one gRPC service (a servicer over ``apis``) to a server."""

INFERENCE_SERVICES: tuple[ServiceInstaller, ...] = (
    torchserve_inference.add_to_server,
    open_inference.add_to_server,
)
MANAGEMENT_SERVICES: tuple[ServiceInstaller, ...] = (torchserve_management.add_to_server,)


def _probe(address: Address) -> None:
    """Bind the address with a plain socket and let go: raises the ``OSError`` (address in
    use, permission denied, no such address) that gRPC would only report as a failure."""
    if address.port == 0:
        return
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((address.host, address.port))


class GrpcListener:
    """One gRPC server on one address: ``bind()``, then ``serve()`` until ``stop()``."""

    def __init__(
        self,
        address: Address,
        apis: Apis,
        settings: ServerSettings,
        services: Sequence[ServiceInstaller],
        interceptors: Sequence[aio.ServerInterceptor] = (),
    ) -> None:
        self.address = address
        self._credentials = None
        if address.scheme == "grpcs":
            self._credentials = server_credentials(
                settings.certificate_file, settings.private_key_file
            )
        self._server = aio.server(
            # Innermost last: the key is checked before the request's bytes are.
            interceptors=[*interceptors, MalformedRequests()],
            options=[
                ("grpc.so_reuseport", 0),  # a second server on the same port must fail
                ("grpc.max_receive_message_length", settings.max_request_size),
            ],
        )
        for install in services:
            install(self._server, apis)
        self._stop_requested = False
        self._stopping: asyncio.Task[None] | None = None

    def bind(self) -> str:
        """Bind the address now and return its URL (with the port chosen for port 0)."""
        _probe(self.address)
        host = f"[{self.address.host}]" if ":" in self.address.host else self.address.host
        target = f"{host}:{self.address.port}"
        try:
            if self._credentials is not None:
                port = self._server.add_secure_port(target, self._credentials)
            else:
                port = self._server.add_insecure_port(target)
        except RuntimeError:  # gRPC says only that it failed
            port = 0
        if port == 0:  # the probe and the TLS pair passed: another process took the port since
            raise OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))
        return Address(self.address.host, port, self.address.scheme).url()

    async def serve(self) -> None:
        if self._stop_requested:
            return
        await self._server.start()
        await self._server.wait_for_termination()

    def stop(self) -> None:
        """Stop accepting; ``serve()`` returns once calls in flight finished (or after
        ``STOP_GRACE_SECONDS``, when they are cancelled)."""
        self._stop_requested = True
        if self._stopping is None:
            with contextlib.suppress(RuntimeError):  # no event loop: nothing ever served
                self._stopping = asyncio.get_running_loop().create_task(
                    self._server.stop(STOP_GRACE_SECONDS)
                )


def inference_listener(
    address: Address, apis: Apis, settings: ServerSettings, keys: ApiKeys | None
) -> GrpcListener:
    """TorchServe's gRPC inference API and the Open Inference Protocol's. With keys on,
    the inference key only beyond loopback, and never for ``Ping`` (the HTTP API's rule);
    the model repository calls, which load and unload models, the management key wherever
    the port listens, as registering over the management API does."""
    interceptors = []
    if keys is not None:
        by_method: dict[str, str | None] = {torchserve_inference.PING: None}
        by_method.update(dict.fromkeys(open_inference.REPOSITORY_METHODS, keys.management))
        inference = None if address.is_loopback else keys.inference
        interceptors.append(TokenAuth(inference, by_method))
    return GrpcListener(address, apis, settings, INFERENCE_SERVICES, interceptors)


def management_listener(
    address: Address, apis: Apis, settings: ServerSettings, keys: ApiKeys | None
) -> GrpcListener:
    """TorchServe's gRPC management API; the management key whenever keys are on."""
    interceptors = [TokenAuth(keys.management)] if keys is not None else []
    return GrpcListener(address, apis, settings, MANAGEMENT_SERVICES, interceptors)


__all__ = [
    "INFERENCE_SERVICES",
    "MANAGEMENT_SERVICES",
    "GrpcListener",
    "ServiceInstaller",
    "inference_listener",
    "management_listener",
]
