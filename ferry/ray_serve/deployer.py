"""The Ray Serve application ``ferry serve --ray`` deploys: a deployment per model version
(replicas of ``ModelReplica``) behind the ``Router`` ingress, (re)deployed as plans change."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ferry.config.settings import ServerSettings
from ferry.ray_serve.plan import DeploymentPlan, PoolPlan
from ferry.ray_serve.pool import pool_replica
from ferry.ray_serve.replica import ModelReplica
from ferry.ray_serve.router import Router

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
    pool: PoolPlan | None = None
    """The models loaded on demand, multiplexed over one pool of replicas."""
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
        pool = None
        if self.pool is not None:
            pool = (
                _deployment(pool_replica(self.pool.models_per_replica))
                .options(**self.pool.options(), logging_config=QUIET)
                .bind(self.settings, self.pool.entries, self.inference_key)
            )
        return router.bind(handles, self.defaults, pool, self.pool.keys if self.pool else ())

    def deploy(self) -> None:
        """Deploy, and wait until every deployment runs (Ray Serve's ``serve.run``)."""
        from ray import serve

        serve.run(self.application(), name=APPLICATION, route_prefix="/")

    def replicas(self, plan: DeploymentPlan | PoolPlan) -> dict[str, int]:
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
