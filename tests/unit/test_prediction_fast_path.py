"""The inference API's fast path for predictions: the same answers as Starlette's routes,
without going through them, and the same error bodies when the endpoint fails."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ferry.http.errors import exception_handlers
from ferry.http.inference import prediction_params, with_prediction_fast_path


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/predictions/resnet", {"model": "resnet"}),
        ("/predictions/resnet/2.0", {"model": "resnet", "version": "2.0"}),
        ("/predictions/", None),
        ("/predictions", None),
        ("/predictions//2.0", None),
        ("/predictions/resnet/", None),  # the listener strips a trailing slash before
        ("/predictions/resnet/2.0/x", None),
        ("/predictionsX/resnet", None),
        ("/explanations/resnet", None),
        ("/ping", None),
    ],
)
def test_prediction_params_match_the_routes_paths(path: str, params: dict[str, str] | None) -> None:
    assert prediction_params(path) == params


async def echo(request: Request) -> Response:
    """What the endpoint saw, and whether Starlette's router brought it there."""
    document = {"params": request.path_params, "routed": "router" in request.scope}
    return Response(json.dumps(document), media_type="application/json")


def routes_app() -> Starlette:
    routes = [
        Route("/predictions/{model}", echo, methods=["POST", "PUT"]),
        Route("/predictions/{model}/{version}", echo, methods=["POST", "PUT"]),
        Route("/ping", echo, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers=exception_handlers())


def call(app: ASGIApp, method: str, path: str) -> httpx.Response:
    async def scenario() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.request(method, path, content=b"x")

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/predictions/resnet"),
        ("PUT", "/predictions/resnet/2.0"),
        ("GET", "/predictions/resnet"),
        ("DELETE", "/predictions/resnet/2.0"),
        ("POST", "/predictions//2.0"),
        ("POST", "/predictions/resnet/2.0/x"),
        ("GET", "/ping"),
        ("GET", "/nowhere"),
    ],
)
def test_answers_as_the_routes_do(method: str, path: str) -> None:
    fast = with_prediction_fast_path(routes_app(), echo, exception_handlers())
    through_fast, through_routes = call(fast, method, path), call(routes_app(), method, path)
    assert through_fast.status_code == through_routes.status_code
    assert through_fast.headers.get("allow") == through_routes.headers.get("allow")
    if through_routes.status_code == 200:
        fast_seen, routed_seen = through_fast.json(), through_routes.json()
        assert fast_seen["params"] == routed_seen["params"]
    else:
        assert through_fast.json() == through_routes.json()


def test_predictions_skip_the_router_and_the_rest_take_it() -> None:
    fast = with_prediction_fast_path(routes_app(), echo, exception_handlers())
    assert call(fast, "POST", "/predictions/resnet").json()["routed"] is False
    assert call(fast, "GET", "/ping").json()["routed"] is True


def test_a_mounted_app_takes_the_routes() -> None:
    """Under a ``root_path`` the routes match the path without it; the fast path steps aside."""
    fast = with_prediction_fast_path(routes_app(), echo, exception_handlers())

    async def mounted(scope: Scope, receive: Receive, send: Send) -> None:
        await fast({**scope, "root_path": "/api"}, receive, send)

    answer = call(mounted, "POST", "/api/predictions/resnet")
    assert answer.status_code == 200 and answer.json()["routed"] is True


def test_an_endpoint_bug_is_a_logged_500_with_torchserve_body(
    caplog: pytest.LogCaptureFixture,
) -> None:
    statuses: list[int] = []

    async def broken(request: Request) -> Response:
        raise RuntimeError("boom")

    handlers = exception_handlers(statuses.append)
    fast = with_prediction_fast_path(routes_app(), broken, handlers)
    with caplog.at_level(logging.ERROR, logger="ferry.http"):
        answer = call(fast, "POST", "/predictions/resnet")
    assert answer.status_code == 500
    assert answer.json() == {
        "code": 500,
        "type": "InternalServerException",
        "message": "RuntimeError: boom",
    }
    assert statuses == [500]
    assert "unhandled error on /predictions/resnet" in caplog.text


def test_a_client_gone_mid_body_is_499() -> None:
    statuses: list[int] = []

    async def reads_a_gone_body(request: Request) -> Response:
        raise ClientDisconnect()

    fast = with_prediction_fast_path(
        routes_app(), reads_a_gone_body, exception_handlers(statuses.append)
    )
    answer = call(fast, "POST", "/predictions/resnet")
    assert answer.status_code == 499
    assert answer.json()["type"] == "ClientClosedRequestException"
    assert statuses == [499]
