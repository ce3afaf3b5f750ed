"""One replica of one model version on Ray: a Ferry service holding that model with one
worker (Ray's replicas stand for Ferry's workers), answering Ferry's inference API in
process. Its queue, batch policy, worker pipeline and handler are single-machine Ferry's.

It is the ingress of its model version's application, so it answers two callers: Ray's
ingress, with the HTTP request itself (TorchServe's prediction path, no router between),
and the router, with an ``HttpCall`` (every other path)."""

from __future__ import annotations

import dataclasses
import logging

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from ferry.apis import Apis
from ferry.config.settings import ServerSettings
from ferry.http.auth import TokenAuth
from ferry.http.inference import inference_app
from ferry.ray_serve.http_call import HttpAnswer, HttpCall, answer_ingress, call_asgi

log = logging.getLogger("ferry")
NODE_HEADER = b"x-ferry-ray-node"


def replica_settings(settings: ServerSettings, entry: str, name: str) -> ServerSettings:
    """The server's settings for a replica of ``entry``: that model only, one worker, no
    snapshots (the driver owns the configuration) and no key file of its own (the driver
    hands it the inference key)."""
    overrides = {
        version: {**values, "minWorkers": 1, "maxWorkers": 1}
        for version, values in settings.model_overrides.get(name, {}).items()
    }
    return dataclasses.replace(
        settings,
        models=(entry,),
        model_overrides={name: overrides} if overrides else {},
        default_workers_per_model=1,
        config_snapshots=False,
        disable_token_authorization=True,
        ready_file=None,
    )


class ModelReplica:
    """Ray Serve builds it with the settings and the ``load_models`` entry; it answers
    ``HttpCall``s the router forwards."""

    # Ray Serve awaits an async constructor (type checkers insist __init__ returns None).
    async def __init__(  # type: ignore[misc]
        self, settings: ServerSettings, entry: str, name: str, inference_key: str | None
    ) -> None:
        import ray

        context = ray.get_runtime_context()
        self._node = context.get_node_id().encode()
        # The worker's torch threads: the CPUs Ray gave this replica, not the machine's.
        cpus = context.get_assigned_resources().get("CPU", 0)
        self._apis = Apis.local(
            replica_settings(settings, entry, name),
            cores=max(1, round(cpus)) if cpus else None,
            in_process=settings.ray_handler_in_replica,
        )
        await self._apis.service.load_startup_models()
        app: ASGIApp = inference_app(self._apis.service, self._apis.workflows)
        self._app = app if inference_key is None else TokenAuth(app, inference_key)
        self._limit = settings.max_request_size
        log.info("replica of %s ready", entry)

    async def __call__(self, call: HttpCall | Request) -> HttpAnswer | Response:
        """The answer, with the Ray node that computed it (``x-ferry-ray-node``): as an
        ``HttpAnswer`` to the router, as the HTTP response to Ray's ingress."""
        if isinstance(call, Request):
            return await answer_ingress(call, self._limit, self._from_ingress)
        return await self._answer(call, "ray-router")

    async def _from_ingress(self, call: HttpCall) -> HttpAnswer:
        return await self._answer(call, "ray-ingress")

    async def _answer(self, call: HttpCall, client: str) -> HttpAnswer:
        answer = await call_asgi(self._app, call, (client, 0))
        return dataclasses.replace(answer, headers=(*answer.headers, (NODE_HEADER, self._node)))

    async def check_health(self) -> None:
        """Ray Serve's health check: a replica whose worker cannot run is replaced."""
        health = self._apis.service.health()
        if not health.ok:
            raise RuntimeError(f"ferry replica unhealthy: {health.status}")

    async def __del__(self) -> None:  # Ray Serve calls it when the replica stops
        await self._apis.close()
