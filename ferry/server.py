"""The composition root of ``ferry serve``: settings → service → listeners → keys → ready
file, and back down again on SIGINT or SIGTERM.

Start-up, in this order:

1. SIGINT/SIGTERM handlers, first thing in the event loop, so that a signal at any later
   moment (models loading, serving, shutting down) stops the server by the same path.
2. The service (no workers yet), the API keys (``ferry.security``; nothing written yet),
   and one listener per enabled row of ``LISTENERS``, bound before anything serves. If
   one cannot listen, start-up stops here: no key file is written and no worker started.
3. The listeners serve; the start-up models load; once they are ready, generated keys
   are written to the key file (a start that fails, a model-config.yaml that is invalid
   included, never writes it), with ``log_location`` set TorchServe's system metrics
   lines go to ``ts_metrics.log`` (then every ``metric_time_interval``), and the ready
   file gets the bound addresses.

Shutdown: start-up model loading is cancelled; once serving, readiness turns 503
``Draining`` and the listeners go on serving for ``drain_delay`` seconds (for a load
balancer to take the replica out); then listeners stop accepting (HTTP requests in flight
get ``ferry.http.listener.DRAIN_SECONDS`` to finish), a server whose start-up had completed
writes its ``-shutdown.cfg`` model snapshot (as TorchServe does on stop;
``ferry.service.snapshots``), ``service.close()`` stops the workers (bounded by
``CLOSE_SECONDS``), and any child process still alive is killed. A signal while shutting
down (the drain delay included) exits at once.

Exit codes:

- 0: stopped by SIGINT or SIGTERM once start-up had completed.
- 1: start-up failed (a model could not load), or a signal interrupted it
  ("start-up interrupted"; also before this module runs, see ``ferry.cli.serve``).
- 2: the configuration cannot work: a listener cannot bind (``cannot listen on URL
  (inference_address): address already in use``), TLS files are missing, the key file is
  malformed, a start-up model is missing from the model store
  (``ferry.service.startup.refuse_missing``). ``run_server`` raises ``ConfigError``; the
  CLI prints it as one line.
- 128 + N: signal N arrived while shutting down; the process exited at once.

A transport is one row of ``LISTENERS`` and a factory in its own package: the HTTP APIs'
in ``ferry/http/``, TorchServe's gRPC APIs' in ``ferry/grpc/``. The gRPC rows start when
grpcio is installed (the ``grpc`` extra) unless ``enable_grpc`` is false; a grpc setting
given without grpcio stops start-up (exit 2) naming the extra. ``ferry.grpc`` is imported
only then, so a server without the extra never imports grpcio.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import logging
import os
import select
import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ferry import grpc as ferry_grpc
from ferry.apis import Apis
from ferry.config.settings import Address, ServerSettings
from ferry.errors import ConfigError, FerryError
from ferry.http.listener import inference_listener, management_listener, metrics_listener
from ferry.logs import SystemMetricsLines
from ferry.metrics.gpu import read_gpus
from ferry.security import ApiKeys, KeyPlan, plan_keys
from ferry.service import FerryService
from ferry.service.status import ModelStatus

log = logging.getLogger("ferry")

CLOSE_SECONDS = 30.0
"""How long ``service.close()`` may take before the workers are killed outright."""
LISTENER_STOP_SECONDS = 30.0
"""How long the listeners may take to stop (they drain requests in flight first)."""


class Listener(Protocol):
    """One API on one address, as the composition root drives it."""

    def bind(self) -> str:
        """Bind now (raising ``OSError``, e.g. address in use); returns the URL bound."""

    async def serve(self) -> None:
        """Serve on the bound address until ``stop()``."""

    def stop(self) -> None:
        """Stop accepting; ``serve()`` returns once requests in flight are done."""


ListenerFactory = Callable[[Address, Apis, ServerSettings, ApiKeys | None], Listener]


@dataclass(frozen=True)
class ListenerSpec:
    name: str
    """Names the API in logs and in the ready file."""
    address_field: str
    """The ``ServerSettings`` field holding its address (its config.properties key)."""
    enabled: Callable[[ServerSettings], bool]
    build: ListenerFactory
    keys: str = ""
    """The settings that choose the address, for messages (``address_field`` when empty)."""

    def address(self, settings: ServerSettings) -> Address:
        address: Address = getattr(settings, self.address_field)
        return address


def _always(settings: ServerSettings) -> bool:
    return True


def _metrics_enabled(settings: ServerSettings) -> bool:
    return settings.enable_metrics_api


def _grpc_enabled(settings: ServerSettings) -> bool:
    """On when grpcio is installed, unless ``enable_grpc`` is false; ``ConfigError`` when a
    grpc setting asks for it and grpcio is missing."""
    if settings.enable_grpc is False:
        return False
    if ferry_grpc.available():
        return True
    if settings.grpc_requested:
        raise ConfigError(
            "the gRPC APIs need grpcio, which is not installed: "
            f"{ferry_grpc.INSTALL_HINT} (or remove the grpc settings)"
        )
    return False


def _grpc_off_note(settings: ServerSettings) -> str | None:
    """Why the gRPC APIs are off though nothing switched them off (grpcio is missing): a
    log line, so a user who expected ports 7070/7071 learns why they are closed."""
    asked = settings.enable_grpc is not None or settings.grpc_requested  # then it says
    if not asked and not ferry_grpc.available():
        return f"gRPC APIs off: grpcio is not installed ({ferry_grpc.INSTALL_HINT})"
    return None


def _grpc_inference(
    address: Address, apis: Apis, settings: ServerSettings, keys: ApiKeys | None
) -> Listener:
    from ferry.grpc.listener import inference_listener as grpc_inference_listener

    return grpc_inference_listener(address, apis, settings, keys)


def _grpc_management(
    address: Address, apis: Apis, settings: ServerSettings, keys: ApiKeys | None
) -> Listener:
    from ferry.grpc.listener import management_listener as grpc_management_listener

    return grpc_management_listener(address, apis, settings, keys)


LISTENERS: tuple[ListenerSpec, ...] = (
    ListenerSpec("inference", "inference_address", _always, inference_listener),
    ListenerSpec("management", "management_address", _always, management_listener),
    ListenerSpec("metrics", "metrics_address", _metrics_enabled, metrics_listener),
    ListenerSpec(
        "grpc_inference",
        "grpc_inference_endpoint",
        _grpc_enabled,
        _grpc_inference,
        keys="grpc_inference_address, grpc_inference_port",
    ),
    ListenerSpec(
        "grpc_management",
        "grpc_management_endpoint",
        _grpc_enabled,
        _grpc_management,
        keys="grpc_management_address, grpc_management_port",
    ),
)


class _StopSignals:
    """SIGINT and SIGTERM. The first asks the server to stop; one that arrives once
    stopping has begun kills the workers and exits at once."""

    def __init__(self) -> None:
        self.requested = asyncio.Event()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.on_signal, signum)

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.requested.is_set():
            log.warning("%s while stopping: exiting now", name)
            _kill_children()
            os._exit(128 + signum)
        log.info("%s: stopping", name)
        self.requested.set()


def listeners_with(name: str, build: ListenerFactory) -> tuple[ListenerSpec, ...]:
    """``LISTENERS`` with the row ``name`` built by ``build`` (``ferry sagemaker-serve``'s
    inference API, with SageMaker's multi-model routes)."""
    if name not in {spec.name for spec in LISTENERS}:
        raise ValueError(f"no listener {name!r}")
    return tuple(
        dataclasses.replace(spec, build=build) if spec.name == name else spec for spec in LISTENERS
    )


async def run_server(
    settings: ServerSettings, listener_specs: Sequence[ListenerSpec] = LISTENERS
) -> int:
    """Serve until SIGINT or SIGTERM; returns the exit code (see the module docstring).
    Raises ``ConfigError`` for the exit-2 cases, after cleaning up. ``listener_specs``:
    the APIs to serve (``LISTENERS``, or ``listeners_with``'s)."""
    stop = _StopSignals()
    stop.install(asyncio.get_running_loop())
    apis = Apis.local(settings)
    service = apis.service
    listeners: list[Listener] = []
    serving: list[asyncio.Task[None]] = []
    code = 1
    try:
        if stop.requested.is_set():
            log.warning("start-up interrupted")
            return 1
        keys = _plan_keys(settings)
        if (note := _grpc_off_note(settings)) is not None:
            log.info("%s", note)
        built = [
            (spec, spec.build(spec.address(settings), apis, settings, _keys(keys)))
            for spec in listener_specs
            if spec.enabled(settings)
        ]
        listeners = [listener for _, listener in built]
        urls = _bind_all(built, settings)
        serving = [asyncio.create_task(listener.serve()) for listener in listeners]
        code = await _start_up_then_serve(service, settings, urls, stop, keys)
        return code
    finally:
        stop.requested.set()  # from here on, a signal exits at once
        await _shut_down(apis, listeners, serving, started=code == 0)


def _plan_keys(settings: ServerSettings) -> KeyPlan | None:
    if settings.disable_token_authorization:
        log.warning("token authorization is disabled")
        return None
    return plan_keys(settings.key_file, settings.management_key, settings.inference_key)


def _keys(plan: KeyPlan | None) -> ApiKeys | None:
    return plan.keys if plan is not None else None


def _log_keys(keys: KeyPlan) -> None:
    where = {
        "settings": "from settings",
        "key file": f"from {keys.path.resolve()}",
        "generated": f"new, written to {keys.path.resolve()}",
    }[keys.origin]
    log.info("token authorization on; keys %s", where)


def _bind_all(
    built: Sequence[tuple[ListenerSpec, Listener]], settings: ServerSettings
) -> dict[str, str]:
    """Bind every listener (the first that cannot stops start-up); the bound URL of each,
    by API name."""
    urls = {}
    for spec, listener in built:
        try:
            urls[spec.name] = listener.bind()
        except OSError as error:
            reason = (error.strerror or str(error)).lower()
            address = spec.address(settings).url()
            raise ConfigError(
                f"cannot listen on {address} ({spec.keys or spec.address_field}): {reason}"
            ) from None
    return urls


async def _start_up_then_serve(
    service: FerryService,
    settings: ServerSettings,
    urls: dict[str, str],
    stop: _StopSignals,
    keys: KeyPlan | None,
) -> int:
    if not await _load_models(service, stop):
        return 1
    if keys is not None:  # only a start that succeeded writes new keys to the key file
        keys.save()
        _log_keys(keys)
    for name, url in urls.items():
        log.info("%s API listening on %s", name, url)
    _log_models(service)
    _log_writes(service, settings, keys)
    settle_garbage_collector()
    system_metrics = await _log_system_metrics(service, settings)
    try:
        if settings.ready_file is not None:
            write_ready_file(settings.ready_file, urls)
        await stop.requested.wait()
        await _drain(service, settings.drain_delay)
    finally:
        if system_metrics is not None:
            system_metrics.cancel()
    return 0


async def _log_system_metrics(
    service: FerryService, settings: ServerSettings
) -> asyncio.Task[None] | None:
    """With ``log_location`` (and metrics on): TorchServe's system metrics lines in
    ``ts_metrics.log`` now, then every ``metric_time_interval`` from the task returned; none
    with ``disable_system_metrics``."""
    if settings.log_location is None or not settings.enable_metrics_api:
        return None
    if settings.disable_system_metrics:
        return None
    lines = SystemMetricsLines(service.metrics.hostname)
    gpus = service.models.machine.gpus

    def log_lines() -> None:  # in a thread: NVML and /proc reads block
        try:  # GPUs as TorchServe's collector counts them: number_of_gpu, from 0
            lines.log([gpu for gpu in read_gpus() if gpu.index < gpus] if gpus else [])
        except Exception as error:  # a reading must never stop the server
            log.warning("cannot log system metrics: %s", error)

    async def every_interval() -> None:
        while True:
            await asyncio.sleep(settings.metric_time_interval)  # the interval itself
            await asyncio.to_thread(log_lines)

    await asyncio.to_thread(log_lines)
    return asyncio.create_task(every_interval())


YOUNG_COLLECTION_THRESHOLD = 20_000
"""Allocations between collections of the youngest generation (CPython's default: 700)."""


def settle_garbage_collector() -> None:
    """Once the models are loaded: move everything start-up allocated out of the
    collector's sight (``gc.freeze``) and collect the young generation less often. Each
    young collection walks every object the requests in flight hold; at CPython's default
    it ran every two or three requests and took 26 of the ~170 us the server spent per
    request on a no-op model at concurrency 16 (timed with ``gc.callbacks``; at most 9
    us with these settings, start-up's collections included). Cycles are still
    collected, only in larger, rarer sweeps; memory is reclaimed by reference counting
    as before."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, oldest)


async def _drain(service: FerryService, seconds: float) -> None:
    """Readiness answers 503 ``Draining`` from now on; for ``seconds`` the listeners still
    serve every request (each answer closing its connection), so that a load balancer's
    health checks take this replica out before it stops accepting."""
    service.draining = True
    if seconds > 0:
        log.info("draining: readiness is 503 for %.1f s, then the listeners close", seconds)
        await asyncio.sleep(seconds)  # the drain delay itself: nothing to wait on but time


async def _load_models(service: FerryService, stop: _StopSignals) -> bool:
    """Load the start-up models unless a signal comes first; True when they loaded."""
    loading = asyncio.create_task(service.load_startup_models())
    stopping = asyncio.create_task(stop.requested.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not loading.done():
        loading.cancel()
        await asyncio.wait({loading})
        log.warning("start-up interrupted")
        return False
    error = loading.exception()
    if isinstance(error, ConfigError):  # an invalid model-config.yaml: exit 2 naming the key
        raise error
    if isinstance(error, FerryError):
        log.error("start-up failed: %s", error.message)
        return False
    if error is not None:
        raise error
    return True


def _log_models(service: FerryService) -> None:
    for model in service.all_statuses():
        log.info("model %s v%s: %s", model.name, model.version, workers_summary(model))


def workers_summary(model: ModelStatus) -> str:
    """``2 workers ready on cpu``; a model short of workers says how many are ready and,
    if one failed, why (not "1 workers on none")."""
    ready = [worker for worker in model.workers if worker.status == "READY"]
    devices = ", ".join(sorted({worker.device for worker in ready if worker.device}))
    noun = "worker" if model.min_workers == 1 else "workers"
    if len(ready) == model.min_workers:
        where = f" on {devices}" if devices else ""
        return f"{model.min_workers} {noun} ready{where}"
    summary = f"{len(ready)} of {model.min_workers} {noun} ready"
    if model.last_error:
        summary += f"; last failure: {model.last_error}"
    return summary


def _log_writes(service: FerryService, settings: ServerSettings, keys: KeyPlan | None) -> None:
    """Every place the server writes to, so an operator can mount those writable and the
    rest read-only (``readOnlyRootFilesystem``)."""
    work_dir = service.models.work_dir
    places = [f"unpacked archives, per-model packages and compile caches in {work_dir}"]
    if keys is not None:
        places.append(f"API keys in {keys.path.resolve()}")
    logs = "logs to standard output only"
    if settings.log_location is not None:
        logs = f"logs and model snapshots in {settings.log_location.resolve()}"
    places.append(logs)
    if settings.ready_file is not None:
        places.append(f"the ready file {settings.ready_file}")
    log.info("writes only: %s", "; ".join(places))


def write_ready_file(path: Path, addresses: dict[str, str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(addresses))
    tmp.replace(path)  # atomic: a reader never sees half a file


async def _shut_down(
    apis: Apis, listeners: Iterable[Listener], serving: list[asyncio.Task[None]], started: bool
) -> None:
    """Stop the listeners, then (``started``: start-up had completed) write the shutdown
    snapshot while the registry still holds every model, then stop the workers."""
    if serving:
        log.info("shutting down")
    for listener in listeners:
        listener.stop()
    await _bounded("listeners", serving, LISTENER_STOP_SECONDS)
    if started:  # an interrupted start-up's models are not the ones to come back
        apis.service.models.snapshot_changed("shutdown")
    closing = asyncio.create_task(apis.close())
    if not await _bounded("workers", [closing], CLOSE_SECONDS):
        log.error("workers did not stop within %.0f s; killing them", CLOSE_SECONDS)
    _kill_children()


async def _bounded(what: str, tasks: list[asyncio.Task[None]], timeout: float) -> bool:
    """Wait for ``tasks``; cancel those still running after ``timeout``. Logs their errors."""
    if not tasks:
        return True
    done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.error("stopping %s failed", what, exc_info=task.exception())
    return not pending


def _kill_children() -> None:
    """Kill every child process still alive and wait (briefly) until each has died.

    The last line of defence against orphans: ``service.close()`` normally stops every
    worker first, and workers also die with this process (``ferry.worker.lifetime``).
    Linux only (``/proc``); elsewhere it does nothing.
    """
    for pid in _child_pids(os.getpid()):
        try:
            handle = os.pidfd_open(pid)
        except (AttributeError, OSError):
            handle = None
        try:
            os.kill(pid, signal.SIGKILL)
            if handle is not None:
                select.select([handle], [], [], 5.0)  # readable once the process has exited
        except ProcessLookupError:
            pass
        finally:
            if handle is not None:
                os.close(handle)


def _child_pids(parent: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        if int(fields[1]) == parent and fields[0] != "Z":
            children.append(int(stat.parent.name))
    return children


__all__ = ["LISTENERS", "Listener", "ListenerSpec", "run_server"]
