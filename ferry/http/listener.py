"""HTTP listeners: uvicorn serving one API's ASGI app on a socket bound before serving.

``ferry.server`` builds one listener per API with the factories below, binds them all, and
only then serves; so a port in use stops start-up before a key file is written or a worker
started. Token checks (``ferry.http.auth``) are put in front of the apps here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import ssl
import stat
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ferry.apis import Apis
from ferry.config.settings import Address, ServerSettings
from ferry.errors import ConfigError
from ferry.grpc.tls import security_level_refusal
from ferry.http.auth import TokenAuth
from ferry.http.connections import closing, torchserve_connections
from ferry.http.inference import inference_app
from ferry.http.management import management_app
from ferry.http.metrics import metrics_app
from ferry.http.protocol import HttpLimits, LimitedConfig
from ferry.security import ApiKeys

DRAIN_SECONDS = 10.0
"""On stop, how long requests in flight may take to finish before they are cancelled."""


class QuietUvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: ``ferry.server`` owns shutdown."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind(address: Address) -> socket.socket:
    """A listening, non-blocking socket; raises ``OSError`` (e.g. address in use)."""
    if address.scheme == "unix":
        return _bind_unix(address.path)
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address.host, address.port))
        sock.listen(2048)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _bind_unix(path: str) -> socket.socket:
    """A Unix socket at ``path``. A socket file left by a server that is gone is replaced;
    one a live server answers on is "address already in use", and any other file is kept."""
    if os.path.exists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # stale: nobody listens on it
            else:
                raise OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(2048)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _uvicorn_config(app: ASGIApp, address: Address, settings: ServerSettings) -> uvicorn.Config:
    tls: dict[str, Any] = {}
    if address.scheme == "https":
        if settings.certificate_file is None or settings.private_key_file is None:
            raise ConfigError(f"{address.url()}: https needs certificate_file and private_key_file")
        tls = {
            "ssl_certfile": str(settings.certificate_file),
            "ssl_keyfile": str(settings.private_key_file),
        }
    limits = HttpLimits(
        max_header_size=settings.max_header_size,
        max_headers=settings.max_headers,
        header_timeout=settings.header_timeout,
        body_read_timeout=settings.body_read_timeout,
    )
    config = LimitedConfig(  # httptools, within the limits above (ferry.http.protocol)
        app,
        limits=limits,
        log_level="warning",
        access_log=False,
        lifespan="off",
        # uvicorn would rewrite each request's client address and scheme from the
        # X-Forwarded-* headers of a proxy on loopback: Ferry reads neither, and it cost
        # about 2% of the frontend's time per prediction.
        proxy_headers=False,
        server_header=False,  # "server: uvicorn" on every answer: TorchServe names no server
        timeout_keep_alive=75,
        timeout_graceful_shutdown=int(DRAIN_SECONDS),
        **tls,
    )
    try:
        config.load()  # fail now, with a clear error, on an unreadable certificate or key
    except (OSError, ssl.SSLError) as error:
        refusal = None
        if isinstance(error, ssl.SSLError) and tls:  # e.g. TorchServe's 1024-bit test key
            refusal = security_level_refusal(
                error, Path(tls["ssl_certfile"]), Path(tls["ssl_keyfile"])
            )
        reason = refusal or f"cannot load the TLS certificate or key: {error}"
        raise ConfigError(f"{address.url()}: {reason}") from error
    return config


def without_trailing_slash(app: ASGIApp) -> ASGIApp:
    """Serve ``/models/NAME/`` as ``/models/NAME``, as TorchServe does. Starlette would
    answer 307 to the slash-less URL instead: a DELETE a client did not follow unregistered
    nothing, and the redirect names the Host the client sent, wrong behind a proxy."""

    async def strip(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path.rstrip("/") or "/"}
            raw = scope.get("raw_path")
            if raw:
                scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await app(scope, receive, send)

    return strip


def with_cors(app: ASGIApp, settings: ServerSettings) -> ASGIApp:
    """TorchServe's CORS settings, outside the token check: a browser's preflight
    (``OPTIONS`` with ``Access-Control-Request-Method``) carries no key. Without
    ``cors_allowed_origin`` the app is unchanged and answers no CORS headers."""
    if not settings.cors_allowed_origin:
        return app
    return CORSMiddleware(
        app,
        allow_origins=settings.cors_allowed_origin,
        allow_methods=settings.cors_allowed_methods,
        allow_headers=settings.cors_allowed_headers,
        expose_headers=["x-request-id"],
    )


def closing_connections(app: ASGIApp, draining: Callable[[], bool]) -> ASGIApp:
    """While the server drains, every response closes its connection: a load balancer
    holding idle keep-alive connections to this replica loses them one answer at a time,
    instead of all at once when the listener closes (when one might be carrying a
    request)."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not draining():  # the usual case costs one call
            await app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            await send(closing(message) if message["type"] == "http.response.start" else message)

        await app(scope, receive, send_closing)

    return serve


class HttpListener:
    """One API on one address: ``bind()``, then ``serve()`` until ``stop()``."""

    def __init__(
        self,
        app: ASGIApp,
        address: Address,
        settings: ServerSettings,
        draining: Callable[[], bool] = lambda: False,
    ) -> None:
        self.address = address
        app = with_cors(without_trailing_slash(closing_connections(app, draining)), settings)
        app = torchserve_connections(app, settings.max_request_size)
        self._server = QuietUvicorn(_uvicorn_config(app, address, settings))
        self._socket: socket.socket | None = None
        self._serving = False

    def bind(self) -> str:
        """Bind the address now and return the URL bound (with the port chosen for port 0)."""
        self._socket = bind(self.address)
        if self.address.scheme == "unix":
            return self.address.url()
        host, port = self._socket.getsockname()[:2]
        return Address(host, port, self.address.scheme).url()

    async def serve(self) -> None:
        if self._socket is None:
            raise RuntimeError("bind() the listener before serving")
        self._serving = True
        try:
            await self._server.serve(sockets=[self._socket])
        finally:
            self._remove_socket_file()

    def _remove_socket_file(self) -> None:
        if self.address.scheme == "unix":
            with contextlib.suppress(OSError):
                os.unlink(self.address.path)

    def stop(self) -> None:
        """Stop accepting; ``serve()`` returns once requests in flight finished (or after
        ``DRAIN_SECONDS``). A listener that never served just releases its socket."""
        self._server.should_exit = True
        if not self._serving and self._socket is not None:
            self._socket.close()
            self._remove_socket_file()


def key_hint(api: str, settings: ServerSettings) -> str:
    """Where a client finds the key: the key file's entry (by its absolute path, since
    it lies in the server's working folder), unless the configuration sets the key."""
    source = settings.management_key if api == "management" else settings.inference_key
    if source:
        return f"the {api} key set in the server's configuration"
    return f"the {api!r} key of the key file {settings.key_file.resolve()}"


def inference_listener(
    address: Address,
    apis: Apis,
    settings: ServerSettings,
    keys: ApiKeys | None,
    *,
    multi_model: bool = False,
) -> HttpListener:
    """TorchServe's inference API; it needs the inference key only beyond loopback.
    ``multi_model``: with SageMaker's multi-model routes (``inference_app``)."""
    app: ASGIApp = inference_app(apis.service, apis.workflows, multi_model=multi_model)
    if keys is not None and not address.is_loopback:
        app = TokenAuth(app, keys.inference, key_hint("inference", settings))
    return HttpListener(app, address, settings, lambda: apis.service.draining)


def multi_model_inference_listener(
    address: Address, apis: Apis, settings: ServerSettings, keys: ApiKeys | None
) -> HttpListener:
    """The inference API with SageMaker's multi-model routes (``ferry sagemaker-serve``)."""
    return inference_listener(address, apis, settings, keys, multi_model=True)


def management_listener(
    address: Address, apis: Apis, settings: ServerSettings, keys: ApiKeys | None
) -> HttpListener:
    app: ASGIApp = management_app(apis.service, apis.workflows)
    if keys is not None:
        app = TokenAuth(app, keys.management, key_hint("management", settings))
    return HttpListener(app, address, settings, lambda: apis.service.draining)


def metrics_listener(
    address: Address, apis: Apis, settings: ServerSettings, keys: ApiKeys | None
) -> HttpListener:
    """Prometheus scrapes need no key."""
    return HttpListener(metrics_app(apis.service), address, settings, lambda: apis.service.draining)
