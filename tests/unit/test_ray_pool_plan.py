"""``ferry serve --ray``'s pool of models loaded on demand, with Ray faked: the router
sends a pooled model's requests to the pool with the model as Ray's multiplexed model id,
management lists and describes pooled models and refuses to scale one alone, and a pool
replica's settings register every model on demand with one worker."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from ferry.config.model_config import parse_model_config
from ferry.config.settings import ServerSettings
from ferry.ray_serve.app import management_app
from ferry.ray_serve.deployer import Deployer
from ferry.ray_serve.plan import (
    THROUGHPUT_ENVIRONMENT,
    DeploymentPlan,
    PoolPlan,
    plan_for,
    pool_plan,
)
from ferry.ray_serve.pool import pool_settings
from ferry.ray_serve.router import Router


def _plan(name: str, **config: Any) -> DeploymentPlan:
    return plan_for(
        f"{name}={name}.mar",
        name,
        "1.0",
        parse_model_config(config, source="test"),
        queue_size=100,
        default_batch_size=1,
        default_max_batch_delay_ms=100.0,
    )


def _pool(*names: str) -> PoolPlan:
    pool = pool_plan(
        [_plan(n, batchSize=2) for n in names], replicas=2, models_per_replica=3, queue_size=50
    )
    assert pool is not None
    return pool


class FakeDeployer(Deployer):
    def __init__(self, plans: dict[str, DeploymentPlan], pool: PoolPlan | None) -> None:
        defaults = {plan.name: plan.version for plan in plans.values()}
        defaults.update({key.split("/")[0]: key.split("/")[1] for key in pool.keys} if pool else {})
        super().__init__(ServerSettings(), None, plans, defaults, pool)

    def replicas(self, plan: DeploymentPlan | PoolPlan) -> dict[str, int]:
        return {"RUNNING": plan.num_replicas or 0}


def _call(deployer: Deployer, method: str, path: str, **params: Any) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=management_app(deployer))
        async with httpx.AsyncClient(transport=transport, base_url="http://ray") as client:
            return await client.request(method, path, params=params)

    return asyncio.run(call())


def test_no_model_on_demand_makes_no_pool() -> None:
    assert pool_plan([], replicas=1, models_per_replica=8, queue_size=100) is None


def test_the_pool_is_one_deployment_of_its_replicas() -> None:
    pool = _pool("a", "b")
    assert pool.keys == ("a/1.0", "b/1.0") and pool.entries == ("a=a.mar", "b=b.mar")
    assert pool.options() == {
        "name": "ferry_model_pool",
        "num_replicas": 2,
        "ray_actor_options": {
            "num_cpus": 1,
            "num_gpus": 0,
            "runtime_env": {"env_vars": THROUGHPUT_ENVIRONMENT},
        },
        "max_ongoing_requests": 50,
    }


def test_a_pool_replica_asks_for_what_its_most_demanding_model_asks() -> None:
    members = [_plan("cpu"), _plan("gpu", deviceType="gpu")]
    pool = pool_plan(members, replicas=1, models_per_replica=2, queue_size=10)
    assert pool is not None and pool.actor_options == {"num_cpus": 1, "num_gpus": 1}


def test_management_lists_describes_and_refuses_to_scale_a_pooled_model() -> None:
    deployer = FakeDeployer({"own/1.0": _plan("own")}, _pool("a", "b"))
    listed = _call(deployer, "GET", "/models").json()["models"]
    assert [m["modelName"] for m in listed] == ["a", "b", "own"]
    assert listed[0]["modelUrl"] == "a.mar"
    (described,) = _call(deployer, "GET", "/models/a").json()
    assert described["loadOnDemand"] is True and described["batchSize"] == 2
    assert described["ray"] == {
        "deployment": "ferry_model_pool",
        "replicas": {"RUNNING": 2},
        "multiplexed": True,
        "modelsPerReplica": 3,
    }
    refused = _call(deployer, "PUT", "/models/a", min_worker=3)
    assert refused.status_code == 400 and "ray_pool_replicas" in refused.json()["message"]
    assert (
        _call(deployer, "PUT", "/models/own", min_worker=2, synchronous="false").status_code == 202
    )


class FakeHandle:
    def __init__(self, name: str) -> None:
        self.name = name
        self.model_id: str | None = None

    def options(self, multiplexed_model_id: str) -> FakeHandle:
        chosen = FakeHandle(self.name)
        chosen.model_id = multiplexed_model_id
        return chosen


def test_the_router_sends_a_pooled_model_to_the_pool_by_its_multiplexed_id() -> None:
    own, pool = FakeHandle("own"), FakeHandle("pool")
    router = Router(
        {"own/1.0": ("own_v1_0", "ferry_own_v1_0")},
        {"own": "1.0", "a": "1.0"},
        pool,
        ("a/1.0",),
        handle_of=lambda deployment, application: own,
    )
    chosen = router._handle(router._key("/predictions/a"))
    assert (chosen.name, chosen.model_id) == ("pool", "a/1.0")
    assert router._handle(router._key("/predictions/own")) is own
    assert router._handle(router._key("/predictions/nothing")) is own  # it answers 404
    only_pool = Router({}, {"a": "1.0"}, pool, ("a/1.0",))
    assert only_pool._handle(only_pool._key("/v2/models/zzz/infer")) is pool


def test_a_pool_replica_registers_every_model_on_demand_with_one_worker() -> None:
    settings = ServerSettings(
        model_overrides={"a": {"1.0": {"minWorkers": 4, "batchSize": 8}}, "other": {}}
    )
    replica = pool_settings(settings, ("a=a.mar", "b=b.mar"))
    assert replica.models == ("a=a.mar", "b=b.mar") and replica.load_models_on_demand
    assert replica.model_overrides == {
        "a": {"1.0": {"minWorkers": 1, "maxWorkers": 1, "batchSize": 8}}
    }
    assert replica.default_workers_per_model == 1 and not replica.config_snapshots
