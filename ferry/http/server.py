"""Run the HTTP listeners and the service in one event loop, and shut both down cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
from collections.abc import Generator
from pathlib import Path
from typing import Any

import uvicorn

from ferry.config.settings import Address, ServerSettings
from ferry.errors import FerryError
from ferry.http.inference import inference_app
from ferry.http.management import management_app
from ferry.http.metrics import metrics_app
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


def _bound(sock: socket.socket) -> Address:
    host, port = sock.getsockname()[:2]
    return Address(host, port)


def _write_ready_file(path: Path, addresses: dict[str, str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(addresses))
    tmp.replace(path)  # atomic: a reader never sees half a file


def _listener(app: Any) -> _Listener:
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        http="httptools",
        timeout_keep_alive=75,
    )
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


async def run_server(settings: ServerSettings) -> int:
    """Serve until SIGINT/SIGTERM; returns the process exit code."""
    service = FerryService(settings)
    apps: dict[str, tuple[Address, Any]] = {
        "inference": (
            settings.inference_address,
            inference_app(service),
        ),
        "management": (
            settings.management_address,
            management_app(service),
        ),
    }
    if settings.enable_metrics_api:
        apps["metrics"] = (settings.metrics_address, metrics_app(service))
    sockets = {name: bind(address) for name, (address, _) in apps.items()}
    urls = {name: _bound(sock).url() for name, sock in sockets.items()}
    listeners = [_listener(app) for _, app in apps.values()]
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
