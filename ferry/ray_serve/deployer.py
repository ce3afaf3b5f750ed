"""The Ray Serve applications ``ferry serve --ray`` deploys, (re)deployed as plans change.

- One application per model version: its deployment (replicas of ``ModelReplica``) is
  the ingress, on the route prefix of TorchServe's prediction path for the model
  (``DeploymentPlan.direct_route``), so Ray's ingress sends those requests straight to the
  model's replicas. With ``ray_direct_routes`` off it has no route: only the router
  reaches it.
- The application ``ferry`` on ``/``: the ``Router`` ingress, for every other path (the
  Open Inference Protocol, KServe V1, explanations, server-wide paths), and the pool of
  the models loaded on demand.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

from ferry.config.settings import ServerSettings
from ferry.ray_serve.plan import (
    HANDLER_IN_REPLICA_ENVIRONMENT,
    THROUGHPUT_ENVIRONMENT,
    DeploymentPlan,
    PoolPlan,
    with_replica_environment,
)
from ferry.ray_serve.pool import pool_replica
from ferry.ray_serve.replica import ModelReplica
from ferry.ray_serve.router import Router

APPLICATION = "ferry"
"""The router's application (and the pool's)."""
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
    """The applications' plans, and (re)deploying them: a scale call redeploys the one
    model's application, and Ray Serve adds or removes replicas without touching the
    others."""

    settings: ServerSettings
    inference_key: str | None
    """Checked by the replicas, as single-machine Ferry checks it beyond loopback."""
    plans: dict[str, DeploymentPlan]
    """By ``model/version``."""
    defaults: dict[str, str]
    """Each model's default version."""
    pool: PoolPlan | None = None
    """The models loaded on demand, multiplexed over one pool of replicas."""
    direct_routes: bool = True
    """Whether TorchServe's prediction paths reach the models' replicas with no router."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def route_of(self, plan: DeploymentPlan) -> str | None:
        """The model version's route prefix on Ray's ingress; None: the router only."""
        return plan.direct_route(self.defaults.get(plan.name)) if self.direct_routes else None

    def model_application(self, plan: DeploymentPlan) -> Any:
        """Ray Serve's run target for the application of one model version."""
        from ray import serve

        replicas = (
            _deployment(ModelReplica)
            .options(**plan.options(self._environment()), logging_config=QUIET)
            .bind(self.settings, plan.entry, plan.name, self.inference_key)
        )
        return serve.RunTarget(replicas, name=plan.application, route_prefix=self.route_of(plan))

    def _environment(self) -> dict[str, str]:
        """Ray's settings in the model replicas, and the tracing settings."""
        if self.settings.ray_handler_in_replica:
            return {**HANDLER_IN_REPLICA_ENVIRONMENT, **self._tracing()}
        return {**THROUGHPUT_ENVIRONMENT, **self._tracing()}

    def _tracing(self) -> dict[str, str]:
        """OpenTelemetry's variables (``OTEL_*``) of this process when tracing is on: each
        replica traces its requests and exports them itself, and a replica on another
        machine does not inherit this process's environment."""
        if not self.settings.enable_tracing:
            return {}
        return {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}

    def router_application(self) -> Any:
        """Ray Serve's run target for ``ferry``: the router, and the pool if any."""
        from ray import serve

        router = _deployment(Router).options(
            name="router",
            max_ongoing_requests=ROUTER_ONGOING,
            # On the head, beside Ray Serve's proxy: the router holds every request in
            # flight, so it must not live on a node that may go away.
            ray_actor_options=with_replica_environment(
                {"num_cpus": 0, "resources": {HEAD_NODE: 0.001}}
            ),
            logging_config=QUIET,
        )
        pool = None
        if self.pool is not None:
            pool = (
                _deployment(pool_replica(self.pool.models_per_replica))
                .options(
                    **self.pool.options({**THROUGHPUT_ENVIRONMENT, **self._tracing()}),
                    logging_config=QUIET,
                )
                .bind(self.settings, self.pool.entries, self.inference_key)
            )
        targets = {key: (plan.deployment, plan.application) for key, plan in self.plans.items()}
        pooled = self.pool.keys if self.pool else ()
        application = router.bind(
            targets, self.defaults, pool, pooled, max_request_size=self.settings.max_request_size
        )
        return serve.RunTarget(application, name=APPLICATION, route_prefix="/")

    def deploy(self) -> None:
        """Deploy every application, and wait until all run (Ray Serve's ``run_many``)."""
        from ray import serve

        models = [self.model_application(plan) for plan in self.plans.values()]
        serve.run_many([*models, self.router_application()])

    def applications(self) -> list[str]:
        """The names of every application deployed."""
        return [*(plan.application for plan in self.plans.values()), APPLICATION]

    def delete(self) -> None:
        """Remove every application (Ray Serve stops their replicas)."""
        from ray import serve

        for name in self.applications():
            serve.delete(name)

    def replicas(self, plan: DeploymentPlan | PoolPlan) -> dict[str, int]:
        """Replica counts by state (``RUNNING``, ``STARTING``, ...) as Ray Serve reports."""
        from ray import serve

        name = plan.application if isinstance(plan, DeploymentPlan) else APPLICATION
        application = serve.status().applications.get(name)
        if application is None or plan.deployment not in application.deployments:
            return {}
        states = application.deployments[plan.deployment].replica_states
        return {str(state): int(count) for state, count in states.items()}

    async def scale(self, key: str, low: int, high: int | None) -> None:
        from ray import serve

        async with self.lock:
            self.plans[key] = self.plans[key].scaled(low, high)
            target = self.model_application(self.plans[key])
            await asyncio.to_thread(serve.run_many, [target])


def _deployment(cls: type) -> Any:
    """Ray Serve's ``serve.deployment`` on a class (its stubs type only the decorator)."""
    from ray import serve

    deployment: Any = serve.deployment
    return deployment(cls)
