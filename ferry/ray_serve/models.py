"""The management calls (``ferry.service.types.ModelOperations``) over the Ray Serve
application: a model version is a deployment, its workers are the deployment's replicas.
``ferry serve --ray``'s management API is Ferry's own HTTP adapter over these
(``ferry.http.management.operations_routes``): the same parameters, answers and errors.
"""

from __future__ import annotations

import asyncio
import logging

from ferry.errors import InvalidRequest, ModelNotFound
from ferry.ray_serve.deployer import Deployer
from ferry.ray_serve.plan import DeploymentPlan, PoolPlan
from ferry.scheduling.registry import model_not_found
from ferry.service.status import ModelStatus
from ferry.service.types import ModelPage, ModelRef, Registration, page_of

log = logging.getLogger("ferry")


class RayModels:
    """The application's model versions, as the management API sees them."""

    def __init__(self, deployer: Deployer) -> None:
        self._deployer = deployer
        self._scaling: set[asyncio.Task[None]] = set()

    def _plan(self, name: str, version: str | None) -> DeploymentPlan:
        """The version's deployment (the default's when None), as the registry finds it."""
        if name not in self._deployer.defaults:
            raise model_not_found(name, self._deployer.defaults)
        plan = self._deployer.plans.get(f"{name}/{version or self._deployer.defaults[name]}")
        if plan is None:
            raise ModelNotFound(f"Model version not found: {name} version {version}")
        return plan

    def _pooled(self, name: str, version: str | None) -> str | None:
        """The version's ``model/version`` key when the pool holds it, else None."""
        pool = self._deployer.pool
        key = f"{name}/{version or self._deployer.defaults.get(name, '')}"
        return key if pool is not None and key in pool.keys else None

    def _archive(self, key: str) -> str:
        plan = self._deployer.plans.get(key)
        if plan is not None:
            return plan.entry.split("=", 1)[1]
        pool = self._deployer.pool
        assert pool is not None
        return pool.member(key).entry.split("=", 1)[1]

    def list_models(self, limit: int, page_token: int) -> ModelPage:
        defaults = self._deployer.defaults
        page, token = page_of(sorted(defaults), limit, page_token)
        models = [(name, self._archive(f"{name}/{defaults[name]}")) for name in page]
        return ModelPage(models, token)

    def describe(self, name: str, version: str | None) -> list[ModelStatus]:
        """Asks Ray Serve's controller: call it off the event loop."""
        if name not in self._deployer.defaults:
            raise model_not_found(name, self._deployer.defaults)
        pool = self._deployer.pool
        pooled = [k for k in (pool.keys if pool else ()) if k.split("/", 1)[0] == name]
        if version == "all":
            plans = [p for p in self._deployer.plans.values() if p.name == name]
            keys = pooled
        elif (key := self._pooled(name, version)) is not None:
            plans, keys = [], [key]
        else:
            plans, keys = [self._plan(name, version)], []
        statuses = [
            _status(plan, self._deployer.replicas(plan), self._deployer.route_of(plan))
            for plan in plans
        ]
        if keys and pool is not None:
            replicas = self._deployer.replicas(pool)
            statuses += [_pooled_status(pool, pool.member(key), replicas) for key in keys]
        return statuses

    async def scale(
        self, name: str, version: str | None, min_worker: int, max_worker: int, synchronous: bool
    ) -> Registration:
        """Set the deployment's replicas (autoscaling between the two when they differ)."""
        if min_worker < 0 or max_worker < min_worker:
            raise InvalidRequest("min_worker must be >= 0 and max_worker >= min_worker")
        if self._pooled(name, version) is not None:
            raise InvalidRequest(
                f"model {name} loads on demand in the model pool, whose replicas hold every "
                "such model: scale the pool (ray_pool_replicas) instead"
            )
        plan = self._plan(name, version)
        key = f"{plan.name}/{plan.version}"
        scaling = asyncio.create_task(self._deployer.scale(key, min_worker, max_worker))
        ref = ModelRef(plan.name, plan.version)
        if synchronous:
            await scaling
            return Registration(ref, min_worker, ready=True)
        self._scaling.add(scaling)
        scaling.add_done_callback(self._scaled)
        return Registration(ref, min_worker, ready=False)

    def _scaled(self, task: asyncio.Task[None]) -> None:
        self._scaling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("scaling failed: %s", task.exception())


def _pooled_status(pool: PoolPlan, plan: DeploymentPlan, replicas: dict[str, int]) -> ModelStatus:
    """A model of the pool: loaded on demand by whichever replica Ray sends it to; each
    replica holds at most ``models_per_replica`` of the pool's models."""
    return ModelStatus(
        name=plan.name,
        version=plan.version,
        url=plan.entry.split("=", 1)[1],
        min_workers=0,
        max_workers=pool.num_replicas,
        batch_size=plan.batch_size,
        max_batch_delay_ms=plan.max_batch_delay_ms,
        response_timeout=plan.response_timeout,
        startup_timeout=plan.startup_timeout,
        loaded_at_startup=True,
        workers=[],
        queue_capacity=pool.max_ongoing_requests,
        pending_requests=None,
        ready=replicas.get("RUNNING", 0) > 0,
        last_error="",
        extra={
            "loadOnDemand": True,
            "ray": {
                "deployment": pool.deployment,
                "replicas": replicas,
                "multiplexed": True,
                "modelsPerReplica": pool.models_per_replica,
            },
        },
    )


def _status(plan: DeploymentPlan, replicas: dict[str, int], route: str | None) -> ModelStatus:
    """A deployment as a describe entry: its replicas for workers, and Ray's own view
    under ``ray`` (``route``: the path prefix Ray's ingress sends straight to it, null when
    only the router reaches it). Each replica queues its own requests, out of the
    driver's sight."""
    auto = plan.autoscaling or {}
    low = plan.num_replicas if plan.num_replicas is not None else int(auto.get("min_replicas", 0))
    high = (
        plan.num_replicas if plan.num_replicas is not None else int(auto.get("max_replicas", low))
    )
    return ModelStatus(
        name=plan.name,
        version=plan.version,
        url=plan.entry.split("=", 1)[1],
        min_workers=low,
        max_workers=high,
        batch_size=plan.batch_size,
        max_batch_delay_ms=plan.max_batch_delay_ms,
        response_timeout=plan.response_timeout,
        loaded_at_startup=True,
        workers=[],
        queue_capacity=max(0, plan.max_ongoing_requests - plan.batch_size),
        pending_requests=None,
        ready=replicas.get("RUNNING", 0) > 0,
        last_error="",
        startup_timeout=plan.startup_timeout,
        client_timeout_ms=plan.client_timeout_ms,
        deadline_action=plan.deadline_action,
        batch_policy={"name": plan.batch_policy},
        extra={
            # A GPU per replica (ray_actor_options), none named: each replica sees its own.
            **({"deviceType": "gpu"} if plan.actor_options.get("num_gpus") else {}),
            "ray": {
                "deployment": plan.deployment,
                "application": plan.application,
                "route": route,
                "replicas": replicas,
                "autoscalingConfig": plan.autoscaling,
                "rayActorOptions": plan.actor_options,
            },
        },
    )
