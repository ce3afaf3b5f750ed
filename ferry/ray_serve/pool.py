"""Models loaded on demand, multiplexed over one pool of replicas: Ray Serve's model
multiplexing (``serve.multiplexed``), so a cluster serves more models than any one replica
holds.

Every replica of the pool deployment runs a Ferry service with all the pool's models
registered on demand (``ferry.scheduling.residency``): none is resident until asked for.
The router sends each request with its model as the multiplexed model id, so Ray routes
it to a replica that holds the model when one does. A replica loads a model it is asked
for (Ray's ``get_model``) and holds at most ``ray_models_per_replica``: past that, Ray
unloads its least recently used one, and the replica evicts that model from its Ferry
service (its workers finish what they hold first). The replica's memory budgets
(``model_memory_budget_mb``) apply as on one machine, beside Ray's count.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

from starlette.types import ASGIApp

from ferry.apis import Apis
from ferry.config.settings import ServerSettings
from ferry.errors import FerryError
from ferry.http.auth import TokenAuth
from ferry.http.inference import inference_app
from ferry.ray_serve.http_call import HttpAnswer, HttpCall, call_asgi

log = logging.getLogger("ferry")


def pool_settings(settings: ServerSettings, entries: tuple[str, ...]) -> ServerSettings:
    """The server's settings for a pool replica: the pool's models, each on demand with
    one worker, no snapshots, no key file of its own (the driver hands it the key)."""
    names = {entry.split("=", 1)[0] for entry in entries}
    overrides: dict[str, dict[str, dict[str, Any]]] = {}
    for name in names:
        for version, values in settings.model_overrides.get(name, {}).items():
            overrides.setdefault(name, {})[version] = {**values, "minWorkers": 1, "maxWorkers": 1}
    return dataclasses.replace(
        settings,
        models=entries,
        model_overrides=overrides,
        default_workers_per_model=1,
        load_models_on_demand=True,
        config_snapshots=False,
        disable_token_authorization=True,
        ready_file=None,
    )


class PooledModel:
    """A model Ray's multiplexing holds in a replica; Ray calls ``__del__`` when it unloads
    it (in a thread of its own), and the model is evicted from the replica's service."""

    def __init__(self, replica: PoolReplica, key: str) -> None:
        self.key = key
        self._replica = replica
        self._loop = asyncio.get_running_loop()
        self._released = False

    def __del__(self) -> None:
        if self._released:
            return
        self._released = True
        release = self._replica.release(self.key)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:  # collected in the loop's own thread: do not block it
            self._replica.keep(self._loop.create_task(release))
            return
        if self._loop.is_closed():
            release.close()
            return
        with contextlib.suppress(Exception):  # the replica may be stopping
            asyncio.run_coroutine_threadsafe(release, self._loop).result()


class PoolReplica:
    """One replica of the pool; ``pool_replica`` adds Ray's multiplexed ``get_model``."""

    # Ray Serve awaits an async constructor (type checkers insist __init__ returns None).
    async def __init__(  # type: ignore[misc]
        self, settings: ServerSettings, entries: tuple[str, ...], inference_key: str | None
    ) -> None:
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 0)
        self._apis = Apis.local(
            pool_settings(settings, entries), cores=max(1, round(cpus)) if cpus else None
        )
        await self._apis.service.load_startup_models()
        app: ASGIApp = inference_app(self._apis.service, self._apis.workflows)
        self._app = app if inference_key is None else TokenAuth(app, inference_key)
        self._releases: set[asyncio.Task[None]] = set()
        log.info("model pool replica ready: %d models on demand", len(entries))

    def keep(self, task: asyncio.Task[None]) -> None:
        """Hold a release task until it is done (the loop keeps only weak references)."""
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def get_model(self, key: str) -> PooledModel:  # replaced by pool_replica's
        return await self.load(key)

    async def load(self, key: str) -> PooledModel:
        """``key`` (``model/version``) resident in this replica's service."""
        name, _, version = key.partition("/")
        await self._apis.service.load_model(name, version or None)
        return PooledModel(self, key)

    async def release(self, key: str) -> None:
        name, _, version = key.partition("/")
        with contextlib.suppress(FerryError):
            await self._apis.service.release_model(name, version or None)

    async def __call__(self, call: HttpCall) -> HttpAnswer:
        from ray import serve

        key = serve.get_multiplexed_model_id()
        if key:
            with contextlib.suppress(FerryError):  # the service answers with the same error
                await self.get_model(key)
        return await call_asgi(self._app, call, ("ray-router", 0))

    async def check_health(self) -> None:
        health = self._apis.service.health()
        if not health.ok:
            raise RuntimeError(f"ferry model pool replica unhealthy: {health.status}")

    async def __del__(self) -> None:  # Ray Serve calls it when the replica stops
        await self._apis.close()


def pool_replica(models_per_replica: int) -> type[PoolReplica]:
    """The pool's deployment class, holding at most ``models_per_replica`` models."""
    from ray import serve

    class ModelPoolReplica(PoolReplica):
        @serve.multiplexed(max_num_models_per_replica=models_per_replica)  # type: ignore[untyped-decorator]
        async def get_model(self, key: str) -> PooledModel:
            return await self.load(key)

    return ModelPoolReplica
