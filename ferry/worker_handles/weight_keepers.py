"""The frontend's side of weights keepers (``ferry.worker.weights_keeper``): one per
(model version, GPU) whose workers take their weights from one copy
(``optimization: weights_keeper``), started before the first of them and stopped after
the last.

``keeping_weights`` wraps the factory of workers of their own processes: a worker that
should share gets its keeper's address in its spec (``WorkerSpec.weights_keeper``) and is
counted on that keeper while it is starting or alive. Its lifetime rules:

- a worker's exit (a crash, a sticky CUDA error, recycling) releases its count only: while
  the version has other workers on the GPU the keeper stays, and a replacement imports the
  same copy; once none is left (scaled to zero, unregistered, or the one worker died) the
  keeper is stopped, and the next worker starts a new one;
- a keeper's exit (killed, out of memory, or a worker reported writing into its copy)
  kills every worker on it: their weights dangle (CUDA frees an exporter's memory when it
  exits). The pool answers or retries what they held, as for any worker killed from
  outside, and their replacements start a new keeper;
- a model's new version has its own work folder, so its own keeper.

A model whose format cannot share its weights (``ModelFormat.shares_weights``: ONNX,
AOTInductor) gets no keeper even when asked: it would hold nothing, and on a GPU its CUDA
context alone takes hundreds of MiB. That is logged once per model version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from ferry.config.sections import keeps_weights
from ferry.handlers.builtin.formats import MODEL_FORMATS, ModelSource
from ferry.wire.spec import HandlerSpec, WorkerSpec
from ferry.worker_handles.handle import StartFailure, WorkerFactory, WorkerHandle, WorkerStartFailed
from ferry.worker_handles.output_relay import relay_output
from ferry.worker_handles.spawning import spawn_module

log = logging.getLogger("ferry.workers")

KEEPER_STARTS_WITHIN = 120.0
"""Seconds a keeper has to listen (it imports torch; it loads nothing until asked)."""
LISTENING = b"L"
"""``ferry.worker.weights_keeper.LISTENING`` (the frontend does not import the keeper's torch)."""

KeeperKey = tuple[str, int | None]
"""The model version's shared folder and the GPU (None: the CPU stand-in)."""


class KeeperProcess(Protocol):
    """A started keeper, as ``WeightKeepers`` needs it."""

    @property
    def address(self) -> str: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def exited(self) -> asyncio.Future[Any]: ...

    def stop(self) -> None:
        """Stop it now; safe to call more than once."""
        ...


KeeperSpawner = Callable[[WorkerSpec], Awaitable[KeeperProcess]]


@dataclass(eq=False)
class _Keeper:
    key: KeeperKey
    starting: asyncio.Task[KeeperProcess]
    holders: int = 0
    """Workers starting or alive on it."""
    workers: set[WorkerHandle] = field(default_factory=set)


class WeightKeepers:
    """The keepers of this server, each counted by the workers on it."""

    def __init__(self, spawn: KeeperSpawner | None = None) -> None:
        self._spawn = spawn or spawn_keeper
        self._keepers: dict[KeeperKey, _Keeper] = {}
        self._passed_over: set[str] = set()
        """The versions (work folders) asked for a keeper whose format shares no weights."""

    def keeps(self, spec: WorkerSpec) -> bool:
        """Whether a worker of ``spec`` starts on a keeper: its model-config.yaml asks for
        one on its device, and its model's format shares its weights."""
        model = spec.model
        if not model.compile_cache or not keeps_weights(model.model_yaml_config, spec.gpu_id):
            return False
        if MODEL_FORMATS.shares_weights(_source(model)):
            return True
        if model.compile_cache not in self._passed_over:
            self._passed_over.add(model.compile_cache)
            log.warning(
                "%s: weights_keeper ignored: its format does not share weights (only eager "
                "models, TorchScript and torch.export programs do); each worker loads its own",
                model.model_name,
            )
        return False

    async def start(
        self, spec: WorkerSpec, start_worker: WorkerFactory, timeout: float
    ) -> WorkerHandle:
        """Start a worker of ``spec`` on its keeper (started first if it has none)."""
        keeper = self._hold(spec)
        try:
            process = await asyncio.shield(keeper.starting)
        except Exception as exc:
            self._release(keeper)
            raise WorkerStartFailed(
                StartFailure.SPAWN, f"cannot start the weights keeper: {exc}"
            ) from exc
        except BaseException:
            self._release(keeper)
            raise
        try:
            worker = await start_worker(replace(spec, weights_keeper=process.address), timeout)
        except BaseException:
            self._release(keeper)
            raise
        keeper.workers.add(worker)
        worker.exited.add_done_callback(lambda _: self._release(keeper, worker))
        if process.exited.done():  # it went while the worker loaded: its weights dangle
            worker.kill()
        return worker

    def _hold(self, spec: WorkerSpec) -> _Keeper:
        key = (spec.model.compile_cache, spec.gpu_id)
        keeper = self._keepers.get(key)
        if keeper is None:
            keeper = _Keeper(key, asyncio.ensure_future(self._started(key, spec)))
            self._keepers[key] = keeper
        keeper.holders += 1
        return keeper

    async def _started(self, key: KeeperKey, spec: WorkerSpec) -> KeeperProcess:
        process = await self._spawn(spec)
        process.exited.add_done_callback(lambda _: self._keeper_exited(key, process))
        return process

    def _release(self, keeper: _Keeper, worker: WorkerHandle | None = None) -> None:
        if worker is not None:
            keeper.workers.discard(worker)
        keeper.holders -= 1
        if keeper.holders > 0:
            return
        if self._keepers.get(keeper.key) is keeper:
            del self._keepers[keeper.key]
        _stop(keeper)

    def _keeper_exited(self, key: KeeperKey, process: KeeperProcess) -> None:
        keeper = self._keepers.get(key)
        if keeper is None or not keeper.starting.done() or keeper.starting.result() is not process:
            return  # stopped after its last worker went
        del self._keepers[key]
        if keeper.workers:
            log.error(
                "the weights keeper pid %s of %s exited holding the weights of %d workers: "
                "they are replaced",
                process.pid,
                key,
                len(keeper.workers),
            )
        for worker in list(keeper.workers):
            worker.kill()

    async def close(self) -> None:
        """Stop every keeper (their workers are stopped first, by the service)."""
        keepers = list(self._keepers.values())
        self._keepers.clear()
        for keeper in keepers:
            _stop(keeper)
        for keeper in keepers:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield((await keeper.starting).exited), 10)


def _stop(keeper: _Keeper) -> None:
    if keeper.starting.done():
        _stop_when_started(keeper.starting)
    else:
        keeper.starting.add_done_callback(_stop_when_started)


def _stop_when_started(task: asyncio.Task[KeeperProcess]) -> None:
    if not task.cancelled() and task.exception() is None:
        task.result().stop()


def keeping_weights(start_worker: WorkerFactory, keepers: WeightKeepers) -> WorkerFactory:
    """``start_worker``, whose workers of models with a weights keeper start on theirs."""

    async def start(spec: WorkerSpec, timeout: float) -> WorkerHandle:
        if not keepers.keeps(spec):
            return await start_worker(spec, timeout)
        return await keepers.start(spec, start_worker, timeout)

    return start


def _source(model: HandlerSpec) -> ModelSource:
    """The files the model's manifest names, as the formats tell them."""
    named = model.manifest.get("model")
    files: dict[str, Any] = named if isinstance(named, dict) else {}
    return ModelSource(
        Path(model.model_dir),
        files.get("serializedFile") or None,
        files.get("modelFile") or None,
        model.model_yaml_config,
    )


# --- the keeper's process ----------------------------------------------------------------


class SpawnedKeeper:
    """A keeper process of this frontend: its socket's folder is removed when it is stopped."""

    def __init__(self, process: asyncio.subprocess.Process, control: socket.socket, folder: Path):
        self.process = process
        self.address = str(folder / "keeper.sock")
        self._control = control
        self._folder = folder
        self.exited: asyncio.Future[Any] = asyncio.ensure_future(process.wait())
        self.exited.add_done_callback(lambda _: self._clean_up())
        assert process.stdout is not None
        self._output = asyncio.ensure_future(
            relay_output(process.stdout, f"[weights keeper pid {process.pid}]")
        )

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self._clean_up()

    def _clean_up(self) -> None:
        self._control.close()
        shutil.rmtree(self._folder, ignore_errors=True)


async def spawn_keeper(spec: WorkerSpec) -> KeeperProcess:
    """A keeper for ``spec``'s model version on its GPU, once it listens."""
    from ferry.worker_handles.process import process_environment

    folder = Path(tempfile.mkdtemp(prefix="ferry-keeper-"))  # short: a socket path's limit
    root = str(Path(spec.model.compile_cache).parent)  # the server's work folder
    args = ["--socket", str(folder / "keeper.sock"), "--root", root]
    if spec.gpu_id is not None:
        args += ["--gpu", str(spec.gpu_id)]
    parent, child = socket.socketpair()
    try:
        process = await spawn_module(
            "ferry.worker.weights_keeper", child, process_environment(spec.gpu_id), *args
        )
    except BaseException:
        parent.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        child.close()
    keeper = SpawnedKeeper(process, parent, folder)
    try:
        await asyncio.wait_for(_listening(parent), KEEPER_STARTS_WITHIN)
    except BaseException:
        keeper.stop()
        raise
    log.info("%s: weights keeper pid %s started", spec.model.model_name, process.pid)
    return keeper


async def _listening(control: socket.socket) -> None:
    control.setblocking(False)
    answer = await asyncio.get_running_loop().sock_recv(control, 1)
    if answer != LISTENING:
        raise OSError("the weights keeper exited before it listened")
