"""Run the HTTP listeners and the service in one event loop, and shut both down cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import ssl
from collections.abc import Generator
from pathlib import Path
from typing import Any

import uvicorn

from ferry.config.settings import Address, ServerSettings
from ferry.errors import ConfigError, FerryError
from ferry.http.auth import TokenAuth
from ferry.http.inference import inference_app
from ferry.http.management import management_app
from ferry.http.metrics import metrics_app
from ferry.security import create_key_file
from ferry.service import FerryService

log = logging.getLogger("ferry")


class _Listener(uvicorn.Server):
    """uvicorn without its own signal handling: Ferry owns shutdown."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind(address: Address) -> socket.socket:
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address.host, address.port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _bound(sock: socket.socket, scheme: str) -> Address:
    host, port = sock.getsockname()[:2]
    return Address(host, port, scheme)


def _write_ready_file(path: Path, addresses: dict[str, str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(addresses))
    tmp.replace(path)  # atomic: a reader never sees half a file


def _listener(app: Any, address: Address, settings: ServerSettings) -> _Listener:
    tls: dict[str, Any] = {}
    if address.scheme == "https":
        if settings.certificate_file is None or settings.private_key_file is None:
            raise ConfigError(f"{address.url()}: https needs certificate_file and private_key_file")
        tls = {
            "ssl_certfile": str(settings.certificate_file),
            "ssl_keyfile": str(settings.private_key_file),
        }
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        http="httptools",
        timeout_keep_alive=75,
        **tls,
    )
    config.load()  # fail now, with a clear error, on an unreadable certificate or key
    return _Listener(config)


def _log_models(service: FerryService) -> None:
    for entry in service.registry.all_versions():
        runner = entry.runner
        devices = sorted({s.worker.device for s in runner.slots if s.worker}) or ["none"]
        log.info(
            "model %s v%s: %d workers on %s",
            runner.name,
            runner.version,
            len(runner.slots),
            ", ".join(devices),
        )


def _build_apps(service: FerryService, settings: ServerSettings) -> dict[str, tuple[Address, Any]]:
    """The listeners to start: each API's address and ASGI app, token checks in front."""
    inference: Any = inference_app(service)
    management: Any = management_app(service)
    if settings.disable_token_authorization:
        log.warning("token authorization is disabled")
    else:
        keys = create_key_file(settings.key_file)
        management = TokenAuth(management, keys.management)
        if not settings.inference_address.is_loopback:
            inference = TokenAuth(inference, keys.inference)
        log.info("token authorization on; keys in %s", settings.key_file.resolve())
    apps = {
        "inference": (settings.inference_address, inference),
        "management": (settings.management_address, management),
    }
    if settings.enable_metrics_api:
        apps["metrics"] = (settings.metrics_address, metrics_app(service))
    return apps


async def run_server(settings: ServerSettings) -> int:
    """Serve until SIGINT/SIGTERM; returns the process exit code."""
    service = FerryService(settings)
    apps = _build_apps(service, settings)
    try:
        listeners = [_listener(app, address, settings) for address, app in apps.values()]
    except (ConfigError, OSError, ssl.SSLError) as error:
        log.error("start-up failed: %s", error)
        return 2
    sockets = {name: bind(address) for name, (address, _) in apps.items()}
    urls = {name: _bound(sock, apps[name][0].scheme).url() for name, sock in sockets.items()}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    serving = [
        asyncio.create_task(listener.serve(sockets=[sock]))
        for listener, sock in zip(listeners, sockets.values(), strict=True)
    ]
    exit_code = 0
    try:
        await service.load_startup_models()
    except FerryError as error:
        log.error("start-up failed: %s", error.message)
        stop.set()
        exit_code = 1
    else:
        for name, url in urls.items():
            log.info("%s API listening on %s", name, url)
        _log_models(service)
        if settings.ready_file is not None:
            _write_ready_file(settings.ready_file, urls)
    await stop.wait()
    log.info("shutting down")
    for listener in listeners:
        listener.should_exit = True
    await asyncio.gather(*serving)
    await service.close()
    return exit_code
