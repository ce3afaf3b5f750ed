"""``ferry serve --ray``'s pure parts: each model version's deployment from its
model-config.yaml, the scale call as replicas, which model a path names, and a request
run through an ASGI app in process. No Ray needed."""

from __future__ import annotations

import asyncio

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ferry.config.model_config import parse_model_config
from ferry.errors import ModelConfigError
from ferry.ray_serve.http_call import HttpCall, call_asgi
from ferry.ray_serve.plan import DeploymentPlan, plan_for
from ferry.ray_serve.routes import model_of


def _plan(document: dict[str, object]) -> DeploymentPlan:
    config = parse_model_config(document, source="test")
    return plan_for(
        "resnet-18=resnet.mar",
        "resnet-18",
        "1.0",
        config,
        queue_size=100,
        default_batch_size=1,
        default_max_batch_delay_ms=100.0,
    )


def test_workers_become_replicas_of_one_cpu_each() -> None:
    plan = _plan({"minWorkers": 2, "batchSize": 8, "maxBatchDelay": 20})
    assert plan.options() == {
        "name": "resnet-18_v1_0",
        "ray_actor_options": {"num_cpus": 1, "num_gpus": 0},
        "max_ongoing_requests": 108,  # Ferry's queue, plus a batch
        "num_replicas": 2,
    }
    assert (plan.batch_size, plan.max_batch_delay_ms) == (8, 20)


def test_a_gpu_model_asks_ray_for_a_gpu_per_replica() -> None:
    plan = _plan({"deviceType": "gpu"})
    assert plan.options()["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 1}
    assert plan.options()["num_replicas"] == 1


def test_max_workers_above_min_workers_autoscales_on_ongoing_requests() -> None:
    options = _plan({"minWorkers": 1, "maxWorkers": 4, "batchSize": 8}).options()
    assert "num_replicas" not in options
    assert options["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 4,
        "target_ongoing_requests": 8,  # one batch per replica
    }


def test_a_ray_section_overrides_with_ray_serves_own_keys() -> None:
    plan = _plan(
        {
            "minWorkers": 3,
            "ray": {
                "autoscaling_config": {"min_replicas": 0, "max_replicas": 9},
                "ray_actor_options": {"num_cpus": 0.5, "resources": {"node2": 0.1}},
                "max_ongoing_requests": 12,
            },
        }
    )
    assert plan.options() == {
        "name": "resnet-18_v1_0",
        "ray_actor_options": {"num_cpus": 0.5, "num_gpus": 0, "resources": {"node2": 0.1}},
        "max_ongoing_requests": 12,
        "autoscaling_config": {"min_replicas": 0, "max_replicas": 9},
    }
    assert _plan({"ray": {"num_replicas": 5}}).options()["num_replicas"] == 5


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"replicas": 2}, "unknown key 'replicas'; the keys are num_replicas, autoscaling_config"),
        ({"num_replicas": -1}, "ray.num_replicas: expected a whole number >= 0"),
        ({"ray_actor_options": 1}, "ray.ray_actor_options: expected a mapping"),
        ({"max_ongoing_requests": 0}, "ray.max_ongoing_requests: expected a whole number >= 1"),
        ([1, 2], "ray: expected a mapping of num_replicas"),
    ],
)
def test_a_bad_ray_section_is_refused_naming_the_key(section: object, message: str) -> None:
    with pytest.raises(ModelConfigError, match=r"model resnet-18: model-config\.yaml ") as error:
        _plan({"ray": section})
    assert message in str(error.value)


def test_scaling_sets_replicas_or_autoscaling_bounds() -> None:
    plan = _plan({"minWorkers": 1, "batchSize": 4})
    assert plan.scaled(3).options()["num_replicas"] == 3
    bounded = plan.scaled(2, 5).options()
    assert bounded["autoscaling_config"] == {
        "min_replicas": 2,
        "max_replicas": 5,
        "target_ongoing_requests": 4,
    }
    assert plan.scaled(2, 5).scaled(1).options()["num_replicas"] == 1


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/predictions/resnet", ("resnet", None)),
        ("/predictions/resnet/2.0", ("resnet", "2.0")),
        ("/explanations/resnet", ("resnet", None)),
        ("/ping/resnet/1.0", ("resnet", "1.0")),
        ("/v1/models/resnet:predict", ("resnet", None)),
        ("/v1/models/resnet", ("resnet", None)),
        ("/v2/models/resnet/infer", ("resnet", None)),
        ("/v2/models/resnet/versions/3/infer", ("resnet", "3")),
        ("/v2/models/resnet/ready", ("resnet", None)),
        ("/v2/models/resnet/explain", ("resnet", None)),
        ("/v2/models/resnet/versions/3/explain", ("resnet", "3")),
        ("/v2/models/resnet", ("resnet", None)),
        ("/ping", None),
        ("/v2/health/ready", None),
        ("/api-description", None),
    ],
)
def test_the_model_a_path_names(path: str, named: tuple[str, str | None] | None) -> None:
    assert model_of(path) == named


def test_a_request_runs_through_an_asgi_app_in_process() -> None:
    async def echo(request: Request) -> Response:
        body = await request.body()
        text = f"{request.method} {request.url.path}?{request.url.query} {body.decode()}"
        return Response(text, status_code=201, headers={"x-seen": request.headers["x-mine"]})

    app = Starlette(routes=[Route("/predictions/{model}", echo, methods=["POST"])])
    call = HttpCall("POST", "/predictions/m", b"a=1", ((b"x-mine", b"yes"),), b"payload")
    answer = asyncio.run(call_asgi(app, call, ("router", 0)))
    assert answer.status == 201
    assert answer.body == b"POST /predictions/m?a=1 payload"
    assert (b"x-seen", b"yes") in answer.headers


def test_without_ray_the_flag_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from ferry.config.settings import ServerSettings
    from ferry.errors import ConfigError
    from ferry.ray_serve import app

    monkeypatch.setattr(app, "available", lambda: False)
    with pytest.raises(ConfigError, match=r"--ray needs Ray Serve, which is not installed: "):
        app.run_on_ray(ServerSettings(), None)
    with pytest.raises(ConfigError, match=r"pip install 'ferry-serve\[ray\]'"):
        app.run_on_ray(ServerSettings(), None)


def test_ray_is_not_importable_when_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from ferry.ray_serve import available

    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    assert available() is False
