"""Ray's router choosing the replicas for SageMaker's ``/invocations`` and
``/execution-parameters``: the model ``?model_name=`` names, else the only one (over
fake deployment handles: no Ray cluster)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request

from ferry.ray_serve.http_call import HttpAnswer, HttpCall
from ferry.ray_serve.router import Router


class FakeHandle:
    """A deployment's handle: answers with its name and the query the replica got."""

    def __init__(self, name: str) -> None:
        self.name = name

    def options(self, multiplexed_model_id: str) -> FakeHandle:
        return FakeHandle(f"{self.name}:{multiplexed_model_id}")

    async def remote(self, call: HttpCall) -> HttpAnswer:
        body = {"replica": self.name, "query": call.query.decode(), "body": call.body.decode()}
        return HttpAnswer(200, ((b"content-type", b"application/json"),), json.dumps(body).encode())


def _router(models: dict[str, str], pooled: tuple[str, ...] = ()) -> Router:
    targets = {f"{m}/{v}": (f"{m}_{v}", "app") for m, v in models.items() if m not in pooled}
    keys = tuple(f"{m}/{models[m]}" for m in pooled)
    return Router(
        targets,
        models,
        pool=FakeHandle("pool"),
        pooled=keys,
        handle_of=lambda deployment, application: FakeHandle(deployment),
    )


def _call(router: Router, path: str, query: str = "") -> tuple[int, Any]:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"[1]", "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": query.encode(),
        "headers": [(b"content-length", b"3")],
    }
    response = asyncio.run(router(Request(scope, receive)))
    return response.status_code, json.loads(bytes(response.body))


def test_invocations_go_to_the_only_model_or_the_one_named() -> None:
    alone = _router({"digest": "1.0"})
    assert _call(alone, "/invocations") == (
        200,
        {"replica": "digest_1.0", "query": "model_name=digest", "body": "[1]"},
    )
    several = _router({"a": "1.0", "b": "2.0"}, pooled=("b",))
    status, answer = _call(several, "/invocations", "model_name=b&x=1")
    assert (status, answer["replica"]) == (200, "pool:b/2.0")
    assert answer["query"] == "x=1&model_name=b"
    assert _call(several, "/execution-parameters", "model_name=a")[1]["replica"] == "a_1.0"


def test_invocations_without_a_model_chosen_are_a_404_naming_the_models() -> None:
    status, answer = _call(_router({"a": "1.0", "b": "2.0"}), "/invocations")
    assert status == 404
    assert answer["type"] == "ModelNotFoundException"
    assert "models loaded: a, b" in answer["message"]
    # A model not deployed: a replica answers it (its own 404), as for other paths.
    status, answer = _call(_router({"a": "1.0", "b": "2.0"}), "/invocations", "model_name=c")
    assert (status, answer["query"]) == (200, "model_name=c")
