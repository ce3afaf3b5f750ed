"""``ferry serve --ray``'s pure parts: each model version's deployment from its
model-config.yaml, the scale call as replicas, the route that reaches a model with no
router, which model a path names, and a request run through an ASGI app in process (and
converted from and to what Ray's ingress hands a deployment). No Ray needed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ferry.config.model_config import parse_model_config
from ferry.config.settings import ServerSettings
from ferry.errors import ModelConfigError
from ferry.ray_serve.deployer import Deployer
from ferry.ray_serve.http_call import (
    HttpAnswer,
    HttpCall,
    answer_ingress,
    call_asgi,
    call_of,
    response_of,
)
from ferry.ray_serve.plan import THROUGHPUT_ENVIRONMENT, DeploymentPlan, plan_for
from ferry.ray_serve.routes import model_of

TUNED = {"runtime_env": {"env_vars": THROUGHPUT_ENVIRONMENT}}
"""Every replica runs with Ferry's Ray settings."""


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
        "ray_actor_options": {"num_cpus": 1, "num_gpus": 0, **TUNED},
        "max_ongoing_requests": 108,  # Ferry's queue, plus a batch
        "num_replicas": 2,
    }
    assert (plan.batch_size, plan.max_batch_delay_ms) == (8, 20)


def test_a_gpu_model_asks_ray_for_a_gpu_per_replica() -> None:
    plan = _plan({"deviceType": "gpu"})
    assert plan.options()["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 1, **TUNED}
    assert plan.options()["num_replicas"] == 1


def test_a_models_own_runtime_env_keeps_its_variables_over_ferrys_ray_settings() -> None:
    own = {"runtime_env": {"pip": ["x"], "env_vars": {"RAY_SERVE_USE_GRPC_BY_DEFAULT": "0"}}}
    plan = _plan({"ray": {"ray_actor_options": own}})
    runtime_env = plan.options()["ray_actor_options"]["runtime_env"]
    assert runtime_env["pip"] == ["x"]
    assert runtime_env["env_vars"] == {
        **THROUGHPUT_ENVIRONMENT,
        "RAY_SERVE_USE_GRPC_BY_DEFAULT": "0",
    }


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
        "ray_actor_options": {
            "num_cpus": 0.5,
            "num_gpus": 0,
            "resources": {"node2": 0.1},
            **TUNED,
        },
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


def _versioned(name: str, version: str) -> DeploymentPlan:
    config = parse_model_config({}, source="test")
    return plan_for(
        f"{name}={name}.mar",
        name,
        version,
        config,
        queue_size=100,
        default_batch_size=1,
        default_max_batch_delay_ms=100.0,
    )


def test_torchserves_prediction_path_is_a_models_route_of_its_own() -> None:
    """The default version takes ``/predictions/NAME`` (its other versions' paths fall
    under it unless they have a route: Ray's longest prefix wins), another version
    ``/predictions/NAME/VERSION``; a name that is not plain path text has no route."""
    default, other = _versioned("resnet-18", "1.0"), _versioned("resnet-18", "2.0")
    assert default.direct_route("1.0") == "/predictions/resnet-18"
    assert other.direct_route("1.0") == "/predictions/resnet-18/2.0"
    assert default.application == "ferry_resnet-18_v1_0"
    assert _versioned("a b", "1.0").direct_route("1.0") is None
    assert _versioned("..", "1.0").direct_route("1.0") is None
    assert _versioned("m", "1/0").direct_route("1.0") is None


def test_without_direct_routes_only_the_router_reaches_a_model() -> None:
    plans = {"m/1.0": _versioned("m", "1.0"), "m/2.0": _versioned("m", "2.0")}
    direct = Deployer(ServerSettings(), None, plans, {"m": "2.0"})
    assert [direct.route_of(p) for p in plans.values()] == ["/predictions/m/1.0", "/predictions/m"]
    routed = Deployer(ServerSettings(), None, plans, {"m": "2.0"}, direct_routes=False)
    assert [routed.route_of(p) for p in plans.values()] == [None, None]
    assert routed.applications() == ["ferry_m_v1_0", "ferry_m_v2_0", "ferry"]


def test_what_rays_ingress_hands_over_becomes_a_call_and_the_answer_a_response() -> None:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/predictions/m",
        "query_string": b"a=1",
        "headers": [(b"X-Mine", b"yes")],
    }

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"payload", "more_body": False}

    call = asyncio.run(call_of(Request(scope, receive), limit=7))
    assert call == HttpCall("POST", "/predictions/m", b"a=1", ((b"x-mine", b"yes"),), b"payload")
    answer = HttpAnswer(201, ((b"content-length", b"99"), (b"x-seen", b"yes")), b"done")
    response = response_of(answer)
    assert response.status_code == 201 and response.body == b"done"
    assert response.headers["x-seen"] == "yes" and response.headers["content-length"] == "4"


def _chunked_request(
    chunks: list[bytes], headers: list[tuple[bytes, bytes]]
) -> tuple[Request, list[bytes]]:
    """A request whose body arrives in ``chunks``; the list records those read."""
    scope = {"type": "http", "method": "POST", "path": "/predictions/m", "headers": headers}
    read: list[bytes] = []

    async def receive() -> dict[str, object]:
        chunk = chunks[len(read)]
        read.append(chunk)
        return {"type": "http.request", "body": chunk, "more_body": len(read) < len(chunks)}

    return Request(scope, receive), read


def _never_answers(call: HttpCall) -> Awaitable[HttpAnswer]:
    raise AssertionError(f"a body over the limit reached the replica: {len(call.body)} bytes")


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_over_max_request_size_gets_413_without_reaching_the_model(declared: bool) -> None:
    chunks = [b"x" * 4, b"x" * 4, b"x" * 4, b"x" * 4]
    headers = [(b"content-length", b"16")] if declared else []
    request, read = _chunked_request(chunks, headers)
    response = asyncio.run(answer_ingress(request, 6, _never_answers))
    assert response.status_code == 413
    body = json.loads(bytes(response.body))
    assert body["type"] == "RequestEntityTooLargeException" and "6" in body["message"]
    # Declared too long: nothing read; streamed: read only until it passed the limit.
    assert len(read) == (0 if declared else 2)


def test_a_body_within_max_request_size_is_answered_whole() -> None:
    request, _ = _chunked_request([b"ab", b"cd"], [])

    async def echo(call: HttpCall) -> HttpAnswer:
        return HttpAnswer(200, (), call.body)

    response = asyncio.run(answer_ingress(request, 4, echo))
    assert response.status_code == 200 and response.body == b"abcd"


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
