"""``ferry serve --ray``'s management API: Ferry's own management adapter over the
application's deployments (``RayModels``), with Ray's controller faked. Its answers,
status codes and error bodies are those of single-machine Ferry."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from ferry.config.model_config import parse_model_config
from ferry.config.settings import ServerSettings
from ferry.ray_serve.app import management_app
from ferry.ray_serve.deployer import Deployer
from ferry.ray_serve.plan import DeploymentPlan, PoolPlan, plan_for


class FakeDeployer(Deployer):
    """The plans, with replica counts and scale calls recorded instead of sent to Ray."""

    def __init__(self, plans: dict[str, DeploymentPlan]) -> None:
        defaults = {plan.name: plan.version for plan in plans.values()}
        super().__init__(ServerSettings(), None, plans, defaults)
        self.scaled: list[tuple[str, int, int | None]] = []

    def replicas(self, plan: DeploymentPlan | PoolPlan) -> dict[str, int]:
        return {"RUNNING": plan.num_replicas or 0}

    async def scale(self, key: str, low: int, high: int | None) -> None:
        self.scaled.append((key, low, high))
        self.plans[key] = self.plans[key].scaled(low, high)


def _plan(name: str, **config: Any) -> DeploymentPlan:
    document = parse_model_config(config, source="test")
    return plan_for(
        f"{name}={name}.mar",
        name,
        "1.0",
        document,
        queue_size=100,
        default_batch_size=1,
        default_max_batch_delay_ms=100.0,
    )


def _call(deployer: Deployer, method: str, path: str, **params: Any) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=management_app(deployer))
        async with httpx.AsyncClient(transport=transport, base_url="http://ray") as client:
            return await client.request(method, path, params=params)

    return asyncio.run(call())


def test_list_and_describe_answer_ferrys_documents_with_rays_view() -> None:
    deployer = FakeDeployer(
        {"digest/1.0": _plan("digest", minWorkers=2, batchSize=4), "b/1.0": _plan("b")}
    )
    listed = _call(deployer, "GET", "/models", limit=1)
    assert listed.json() == {
        "models": [{"modelName": "b", "modelUrl": "b.mar"}],
        "nextPageToken": "1",
    }
    (described,) = _call(deployer, "GET", "/models/digest").json()
    assert (described["modelName"], described["minWorkers"], described["batchSize"]) == (
        "digest",
        2,
        4,
    )
    assert described["ray"]["replicas"] == {"RUNNING": 2}
    assert described["ray"]["application"] == "ferry_digest_v1_0"
    assert described["ray"]["route"] == "/predictions/digest"  # Ray's proxy, no router
    assert described["ready"] is True and "jobQueueStatus" not in described  # not in sight
    missing = _call(deployer, "GET", "/models/nope")
    assert missing.status_code == 404
    assert missing.json()["type"] == "ModelNotFoundException"


def test_scale_sets_the_replicas_and_refuses_what_ferry_refuses() -> None:
    deployer = FakeDeployer({"digest/1.0": _plan("digest", minWorkers=2)})
    scaled = _call(deployer, "PUT", "/models/digest", min_worker=3, synchronous="true")
    assert scaled.status_code == 200
    assert scaled.json() == {"status": "Workers scaled to 3 for model: digest"}
    assert deployer.scaled == [("digest/1.0", 3, 3)]
    assert deployer.plans["digest/1.0"].num_replicas == 3
    later = _call(deployer, "PUT", "/models/digest/1.0", min_worker=1, max_worker=4)
    assert later.status_code == 202
    assert later.json() == {"status": "Processing worker updates..."}
    assert _call(deployer, "PUT", "/models/nope", min_worker=1).status_code == 404
    bad = _call(deployer, "PUT", "/models/digest", min_worker="many")
    assert bad.status_code == 400 and bad.json()["type"] == "BadRequestException"
    upside_down = _call(deployer, "PUT", "/models/digest", min_worker=3, max_worker=2)
    assert upside_down.status_code == 400
    assert _call(deployer, "DELETE", "/models/digest").status_code == 405


def test_describe_all_lists_every_version_and_a_gpu_model_says_so() -> None:
    old, new = _plan("digest", deviceType="gpu"), _plan("digest", startupTimeout=30)
    new = DeploymentPlan(**{**new.__dict__, "version": "2.0", "entry": "digest=digest2.mar"})
    deployer = FakeDeployer({"digest/1.0": old, "digest/2.0": new})
    deployer.defaults["digest"] = "1.0"
    described = _call(deployer, "GET", "/models/digest/all").json()
    assert [(d["modelVersion"], d["deviceType"], d["startupTimeout"]) for d in described] == [
        ("1.0", "gpu", 120),
        ("2.0", "cpu", 30),
    ]
    assert _call(deployer, "PUT", "/models/digest/all", min_worker=1).status_code == 404
    assert _call(deployer, "GET", "/models/digest/3.0").status_code == 404
    refused = _call(deployer, "PUT", "/models/digest", batch_policy="immediate")
    assert refused.status_code == 400 and deployer.scaled == []
