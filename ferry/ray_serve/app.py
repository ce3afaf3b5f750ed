"""``ferry serve --ray [ADDRESS]``: the start-up models of the usual settings, deployed as
one Ray Serve application named ``ferry``.

- Ray: ``ray.init(ADDRESS)``: a running cluster (``auto``, ``ray://HOST:10001``, or the
  ``RAY_ADDRESS`` variable), else a local Ray started for the purpose.
- Inference: Ray Serve's ingress on ``inference_address`` serves Ferry's inference API:
  one application per model version (``replica``, sized by ``plan``) takes TorchServe's
  prediction path of its model, the application ``ferry`` (``router``) every other path.
- Management: this process serves ``GET /models``, ``GET /models/M[/V]`` and ``PUT
  /models/M[/V]?min_worker=N[&max_worker=M][&synchronous=true]`` on
  ``management_address``: the scale call sets the deployment's replicas.
- Stop: SIGINT or SIGTERM deletes the applications (and shuts down a Ray this process
  started); the cluster itself is left as it was.

Every node must see the model store at the same path (a shared volume, or the same image
with the archives baked in).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.types import ASGIApp

from ferry.config.settings import ServerSettings
from ferry.errors import ConfigError
from ferry.http.auth import TokenAuth
from ferry.http.errors import exception_handlers
from ferry.http.listener import QuietUvicorn, bind
from ferry.http.management import operations_routes
from ferry.ray_serve import INSTALL_HINT, available
from ferry.ray_serve.deployer import Deployer
from ferry.ray_serve.models import RayModels
from ferry.ray_serve.plan import (
    THROUGHPUT_ENVIRONMENT,
    DeploymentPlan,
    PoolPlan,
    plan_for,
    pool_plan,
)
from ferry.security import plan_keys
from ferry.server import write_ready_file
from ferry.service.startup import is_default, startup_archives
from ferry.store.archive import ModelArchive
from ferry.store.workdir import open_work_dir

log = logging.getLogger("ferry")
RAY_PLAIN_LOG_VARIABLES = ("RAY_COLOR_PREFIX", "RAY_DEDUP_LOGS")
"""Ray's switches for colour codes around relayed worker lines and for deduplicating
them (whose note is always coloured): ``0`` turns each off."""

CONTROLLER_ENVIRONMENT = {
    "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
    **THROUGHPUT_ENVIRONMENT,
}
"""Ray Serve's settings for its controller and the proxy it starts (only when this
process starts Serve on the cluster): the proxy balances each model's requests over all
its replicas by their queues (power of two choices) instead of sending every one to the
replica on its own node until that one holds ``max_ongoing_requests``, which, with a
replica's ``max_ongoing_requests`` as deep as Ferry's queue, would leave the others idle;
and the throughput settings Ferry's deployments run with (``THROUGHPUT_ENVIRONMENT``)."""


def plans_for(
    settings: ServerSettings,
) -> tuple[dict[str, DeploymentPlan], PoolPlan | None, dict[str, str]]:
    """The start-up models' deployments, the pool of those loaded on demand, and every
    model's default version; ``ConfigError`` if there is no model."""
    work_dir = open_work_dir()  # each replica unpacks its own: the driver only reads them
    try:
        opened = startup_archives(settings, Path(work_dir.name))
        if not opened:
            raise ConfigError("--ray: no model to deploy: name them with --models (load_models)")
        return _plans(settings, opened)
    finally:
        work_dir.cleanup()


def _plans(
    settings: ServerSettings, opened: list[tuple[str, ModelArchive]]
) -> tuple[dict[str, DeploymentPlan], PoolPlan | None, dict[str, str]]:
    plans: dict[str, DeploymentPlan] = {}
    pooled: list[DeploymentPlan] = []
    defaults: dict[str, str] = {}
    for entry, archive in opened:
        if archive.name not in defaults or is_default(settings, archive):
            defaults[archive.name] = archive.version
        plan = plan_for(
            entry,
            archive.name,
            archive.version,
            archive.config,
            queue_size=settings.job_queue_size,
            default_batch_size=settings.default_batch_size,
            default_max_batch_delay_ms=settings.default_max_batch_delay_ms,
            default_response_timeout=settings.default_response_timeout,
        )
        archive.free()
        on_demand = archive.config.load_on_demand
        if on_demand if on_demand is not None else settings.load_models_on_demand:
            pooled.append(plan)
        else:
            plans[f"{archive.name}/{archive.version}"] = plan
    pool = pool_plan(
        pooled,
        replicas=settings.ray_pool_replicas,
        models_per_replica=settings.ray_models_per_replica,
        queue_size=settings.job_queue_size,
    )
    return plans, pool, defaults


def management_app(deployer: Deployer) -> Starlette:
    """List, describe and scale, by Ferry's management adapter over the deployments."""
    routes = operations_routes(RayModels(deployer), _unrecorded)
    return Starlette(routes=routes, exception_handlers=exception_handlers())


def _unrecorded(status: int) -> None:
    """The driver keeps no metrics: its management calls are not counted."""


async def _serve_until_signal(server: Any, listening: Any) -> None:
    """Serve the management API until SIGINT or SIGTERM (handled here: Ray's handlers,
    and uvicorn's, which raise the signal again once stopped, would end the process
    before the application is removed)."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: setattr(server, "should_exit", True))
    await server.serve(sockets=[listening])


def run_on_ray(settings: ServerSettings, address: str | None) -> int:
    """Deploy, serve the management API until SIGINT or SIGTERM, then remove the
    application. Exit codes as ``ferry serve``'s (``ConfigError``: 2)."""
    # Set before Ray is imported, which reads them once: before ``available()`` too, whose
    # look for ``ray.serve`` imports ``ray``. Ray colours the prefix of the lines it
    # relays from its workers, and always the note it adds to a line it deduplicates
    # ("[repeated 2x across cluster]"); in Ferry's log (a file, JSON lines) escape codes
    # are noise. So no colour and no deduplication (each line kept, with its pid) unless
    # the operator sets either variable.
    for variable in RAY_PLAIN_LOG_VARIABLES:
        os.environ.setdefault(variable, "0")
    if not available():
        raise ConfigError(f"--ray needs Ray Serve, which is not installed: {INSTALL_HINT}")
    import ray
    import uvicorn
    from ray import serve

    plans, pool, defaults = plans_for(settings)
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
            controller_options={"runtime_env": {"env_vars": dict(CONTROLLER_ENVIRONMENT)}},
        )
        deployer = Deployer(
            settings, inference_key, plans, defaults, pool, settings.ray_direct_routes
        )
        deployer.deploy()
        deployments = [
            f"{p.deployment} ({p.options().get('num_replicas', 'autoscaling')}"
            f"{'; ' + route if (route := deployer.route_of(p)) else ''})"
            for p in plans.values()
        ]
        if pool is not None:
            deployments.append(
                f"{pool.deployment} ({pool.num_replicas}; {len(pool.keys)} models on demand, "
                f"at most {pool.models_per_replica} per replica)"
            )
        log.info(
            "on Ray: %s; inference API on http://%s:%d (Ray Serve's proxy)",
            ", ".join(deployments),
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
        log.info("stopping: deleting the Ray Serve applications %s", deployer.applications())
        deployer.delete()
        if started_here or not serve.status().applications:
            # Nothing else on Ray Serve: stop it too, so that the next start's proxy
            # settings (its port) apply.
            serve.shutdown()
    finally:
        ray.shutdown()
    return 0
