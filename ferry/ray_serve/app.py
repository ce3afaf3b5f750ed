"""``ferry serve --ray [ADDRESS]``: the start-up models of the usual settings, deployed as
one Ray Serve application named ``ferry``.

- Ray: ``ray.init(ADDRESS)``: a running cluster (``auto``, ``ray://HOST:10001``, or the
  ``RAY_ADDRESS`` variable), else a local Ray started for the purpose.
- Inference: Ray Serve's HTTP proxy on ``inference_address`` serves Ferry's inference API
  (``router``); one deployment per model version (``replica``, sized by ``plan``).
- Management: this process serves ``GET /models``, ``GET /models/M[/V]`` and ``PUT
  /models/M[/V]?min_worker=N[&max_worker=M][&synchronous=true]`` on
  ``management_address``: the scale call sets the deployment's replicas.
- Stop: SIGINT or SIGTERM deletes the application (and shuts down a Ray this process
  started); the cluster itself is left as it was.

Every node must see the model store at the same path (a shared volume, or the same image
with the archives baked in).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from ferry.config.settings import ServerSettings
from ferry.errors import ConfigError
from ferry.http.auth import TokenAuth
from ferry.http.errors import error_body
from ferry.http.listener import QuietUvicorn, bind
from ferry.ray_serve import INSTALL_HINT, available
from ferry.ray_serve.plan import DeploymentPlan, plan_for
from ferry.ray_serve.replica import ModelReplica
from ferry.ray_serve.router import Router
from ferry.security import plan_keys
from ferry.server import write_ready_file
from ferry.service import FerryService

log = logging.getLogger("ferry")

APPLICATION = "ferry"
HEAD_NODE = "node:__internal_head__"
"""The resource only Ray's head node has."""
QUIET = {"enable_access_log": False, "log_level": "WARNING"}
"""Ray Serve's logging for Ferry's deployments: a log line per request (sent on to this
process) costs more than the request on a small machine; Ferry's own warnings still
show."""
ROUTER_ONGOING = 10_000
"""Requests the router deployment takes at once: it only forwards, each replica's own
``max_ongoing_requests`` bounds the work."""


@dataclass
class Deployer:
    """The application's plans, and (re)deploying them: Ray Serve updates only what
    changed, so a scale call adds or removes replicas without touching the others."""

    settings: ServerSettings
    inference_key: str | None
    """Checked by the replicas, as single-machine Ferry checks it beyond loopback."""
    plans: dict[str, DeploymentPlan]
    """By ``model/version``."""
    defaults: dict[str, str]
    """Each model's default version."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def application(self) -> Any:

        handles = {
            key: _deployment(ModelReplica)
            .options(**plan.options(), logging_config=QUIET)
            .bind(self.settings, plan.entry, plan.name, self.inference_key)
            for key, plan in self.plans.items()
        }
        router = _deployment(Router).options(
            name="router",
            max_ongoing_requests=ROUTER_ONGOING,
            # On the head, beside Ray Serve's proxy: the router holds every request in
            # flight, so it must not live on a node that may go away.
            ray_actor_options={"num_cpus": 0, "resources": {HEAD_NODE: 0.001}},
            logging_config=QUIET,
        )
        return router.bind(handles, self.defaults)

    def deploy(self) -> None:
        """Deploy, and wait until every deployment runs (Ray Serve's ``serve.run``)."""
        from ray import serve

        serve.run(self.application(), name=APPLICATION, route_prefix="/")

    def replicas(self, plan: DeploymentPlan) -> dict[str, int]:
        """Replica counts by state (``RUNNING``, ``STARTING``, ...) as Ray Serve reports."""
        from ray import serve

        application = serve.status().applications.get(APPLICATION)
        if application is None or plan.deployment not in application.deployments:
            return {}
        states = application.deployments[plan.deployment].replica_states
        return {str(state): int(count) for state, count in states.items()}

    async def scale(self, key: str, low: int, high: int | None) -> None:
        async with self.lock:
            self.plans[key] = self.plans[key].scaled(low, high)
            await asyncio.to_thread(self.deploy)


def _deployment(cls: type) -> Any:
    """Ray Serve's ``serve.deployment`` on a class (its stubs type only the decorator)."""
    from ray import serve

    deployment: Any = serve.deployment
    return deployment(cls)


def plans_for(settings: ServerSettings) -> tuple[dict[str, DeploymentPlan], dict[str, str]]:
    """The start-up models' deployments and default versions; ``ConfigError`` if none."""
    service = FerryService(settings)  # opens archives only: no worker starts here
    opened = service.startup_archives()
    if not opened:
        raise ConfigError("--ray: no model to deploy: name them with --models (load_models)")
    plans: dict[str, DeploymentPlan] = {}
    defaults: dict[str, str] = {}
    for entry, archive in opened:
        plan = plan_for(
            entry,
            archive.name,
            archive.version,
            archive.config,
            queue_size=settings.job_queue_size,
            default_batch_size=settings.default_batch_size,
            default_max_batch_delay_ms=settings.default_max_batch_delay_ms,
        )
        archive.free()
        plans[f"{archive.name}/{archive.version}"] = plan
        chosen = settings.model_overrides.get(archive.name, {}).get(archive.version, {})
        if archive.name not in defaults or chosen.get("defaultVersion") is True:
            defaults[archive.name] = archive.version
    return plans, defaults


def management_app(deployer: Deployer) -> Starlette:
    def plan_of(request: Request) -> tuple[str, DeploymentPlan] | Response:
        model = request.path_params["model"]
        version = request.path_params.get("version") or deployer.defaults.get(model, "")
        key = f"{model}/{version}"
        if key not in deployer.plans:
            return error_body(404, "ModelNotFoundException", f"Model not found: {model}")
        return key, deployer.plans[key]

    async def list_models(request: Request) -> Response:
        models = [
            {"modelName": name, "modelUrl": deployer.plans[f"{name}/{v}"].entry.split("=", 1)[1]}
            for name, v in sorted(deployer.defaults.items())
        ]
        return _json({"models": models})

    async def describe(request: Request) -> Response:
        found = plan_of(request)
        if isinstance(found, Response):
            return found
        _, plan = found
        replicas = await asyncio.to_thread(deployer.replicas, plan)
        auto = plan.autoscaling or {}
        document = {
            "modelName": plan.name,
            "modelVersion": plan.version,
            "minWorkers": plan.num_replicas or auto.get("min_replicas", 0),
            "maxWorkers": plan.num_replicas or auto.get("max_replicas", 0),
            "batchSize": plan.batch_size,
            "maxBatchDelay": plan.max_batch_delay_ms,
            "ray": {
                "deployment": plan.deployment,
                "replicas": replicas,
                "autoscalingConfig": plan.autoscaling,
                "rayActorOptions": plan.actor_options,
            },
        }
        return _json([document])

    async def scale(request: Request) -> Response:
        found = plan_of(request)
        if isinstance(found, Response):
            return found
        key, plan = found
        try:
            low = int(request.query_params.get("min_worker", plan.num_replicas or 1))
            high_text = request.query_params.get("max_worker")
            high = int(high_text) if high_text is not None else None
        except ValueError:
            return error_body(400, "BadRequestException", "min_worker and max_worker: integers")
        if low < 0 or (high is not None and high < low):
            return error_body(400, "BadRequestException", "need 0 <= min_worker <= max_worker")
        synchronous = request.query_params.get("synchronous", "false").lower() == "true"
        task = asyncio.create_task(deployer.scale(key, low, high))
        if synchronous:
            await task
            return _json({"status": f"Workers scaled to {low} for model: {plan.name}"})
        return _json({"status": "Processing worker updates..."}, 202)

    routes = [
        Route("/models", list_models, methods=["GET"]),
        Route("/models/{model}", describe, methods=["GET"]),
        Route("/models/{model}/{version}", describe, methods=["GET"]),
        Route("/models/{model}", scale, methods=["PUT"]),
        Route("/models/{model}/{version}", scale, methods=["PUT"]),
    ]
    return Starlette(routes=routes)


async def _serve_until_signal(server: Any, listening: Any) -> None:
    """Serve the management API until SIGINT or SIGTERM (handled here: Ray's handlers,
    and uvicorn's, which raise the signal again once stopped, would end the process
    before the application is removed)."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: setattr(server, "should_exit", True))
    await server.serve(sockets=[listening])


def _json(document: object, status: int = 200) -> Response:
    return Response(json.dumps(document), status_code=status, media_type="application/json")


def run_on_ray(settings: ServerSettings, address: str | None) -> int:
    """Deploy, serve the management API until SIGINT or SIGTERM, then remove the
    application. Exit codes as ``ferry serve``'s (``ConfigError``: 2)."""
    if not available():
        raise ConfigError(f"--ray needs Ray Serve, which is not installed: {INSTALL_HINT}")
    import ray
    import uvicorn
    from ray import serve

    plans, defaults = plans_for(settings)
    inference = settings.inference_address
    management = settings.management_address
    keys = None
    if not settings.disable_token_authorization:
        keys = plan_keys(settings.key_file, settings.management_key, settings.inference_key)
    inference_key = keys.keys.inference if keys and not inference.is_loopback else None
    # A Ray this process starts is shut down with it; a cluster it joins is left running.
    started_here = address is None and not os.environ.get("RAY_ADDRESS")
    ray.init(address=address or None, namespace="ferry", logging_level=logging.WARNING)
    try:
        # One proxy, on the head node: every node's would take the same port.
        serve.start(
            proxy_location="HeadOnly",
            http_options={"host": inference.host, "port": inference.port},
        )
        deployer = Deployer(settings, inference_key, plans, defaults)
        deployer.deploy()
        log.info(
            "on Ray: %s; inference API on http://%s:%d (Ray Serve's proxy)",
            ", ".join(
                f"{p.deployment} ({p.options().get('num_replicas', 'autoscaling')})"
                for p in plans.values()
            ),
            inference.host,
            inference.port,
        )
        app: ASGIApp = management_app(deployer)
        if keys is not None:
            app = TokenAuth(app, keys.keys.management)
        server = QuietUvicorn(uvicorn.Config(app, log_level="warning", lifespan="off"))
        listening = bind(management)
        if keys is not None:
            keys.save()
        urls = {
            "inference": f"http://{inference.host}:{inference.port}",
            "management": "http://{}:{}".format(*listening.getsockname()[:2]),
        }
        log.info("management API on %s", urls["management"])
        if settings.ready_file is not None:
            write_ready_file(settings.ready_file, urls)
        asyncio.run(_serve_until_signal(server, listening))
        log.info("stopping: deleting the Ray Serve application %r", APPLICATION)
        serve.delete(APPLICATION)
        if started_here or not serve.status().applications:
            # Nothing else on Ray Serve: stop it too, so that the next start's proxy
            # settings (its port) apply.
            serve.shutdown()
    finally:
        ray.shutdown()
    return 0
