"""The ingress of the application ``ferry`` on ``/``: every request on Ray Serve's ingress
that no model's own route takes (``DeploymentPlan.direct_route``: TorchServe's prediction
paths go straight to the model's replicas) goes from here to the replicas of the model
version its path names (``routes.model_of``; for SageMaker's ``/invocations``, the one
``?model_name=`` names or the only one), through Ray's handles, which balance over
replicas on any node. Server-wide paths are answered here.

A replica lost while it held a request (its node died, it was killed) costs that request
one retry on another replica; a second loss answers 503 with the reason. Requests for a
model that is not deployed still go to a replica, which answers the protocol's own 404.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request
from starlette.responses import Response

from ferry import __version__
from ferry.config.settings import ServerSettings
from ferry.errors import ModelNotFound
from ferry.http.errors import error_response
from ferry.http.sagemaker import SAGEMAKER_PATHS, invoked_model
from ferry.ray_serve.http_call import HttpAnswer, HttpCall, answer_ingress
from ferry.ray_serve.routes import model_of

log = logging.getLogger("ferry")

RETRIES = 1
"""Times a request is sent again after the replica holding it was lost."""


def deployment_handle(deployment: str, application: str) -> Any:
    """Ray Serve's handle on a deployment of another application."""
    from ray import serve

    return serve.get_deployment_handle(deployment, application, _check_exists=False)


class Router:
    """Built with each ``model/version``'s deployment and application, and each model's
    default version."""

    def __init__(
        self,
        targets: dict[str, tuple[str, str]],
        defaults: dict[str, str],
        pool: Any = None,
        pooled: tuple[str, ...] = (),
        handle_of: Callable[[str, str], Any] = deployment_handle,
        max_request_size: int = ServerSettings.max_request_size,
    ) -> None:
        """``pool``: the handle of the pool that multiplexes ``pooled`` (``model/version``
        keys), the models loaded on demand. A body over ``max_request_size`` bytes is
        refused here, before it is read whole or sent on."""
        self._handles = {key: handle_of(*target) for key, target in targets.items()}
        self._defaults = defaults
        self._pool = pool
        self._pooled = set(pooled)
        self._limit = max_request_size

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        own = self._server_wide(path)
        if own is not None:
            return own
        try:
            key = self._key(path, request.query_params.get("model_name"))
        except ModelNotFound as error:  # SageMaker's /invocations with no model chosen
            return error_response(error)
        # SageMaker's choice named for the replica too: a pool's replicas hold several models.
        chosen = key.partition("/")[0] if path in SAGEMAKER_PATHS else ""

        def forward(call: HttpCall) -> Awaitable[HttpAnswer]:
            return self._forward(key, naming(call, chosen) if chosen else call)

        return await answer_ingress(request, self._limit, forward)

    def _key(self, path: str, model_name: str | None = None) -> str:
        """``model/version`` for the path (and SageMaker's ``?model_name=``); "" when no
        deployed model is named."""
        named = model_of(path)
        if path in SAGEMAKER_PATHS:
            named = invoked_model(model_name, self._defaults), None
        if named is not None:
            model, version = named
            key = f"{model}/{version or self._defaults.get(model, '')}"
            if key in self._handles or key in self._pooled:
                return key
        return ""  # any replica answers the protocol's own 404

    def _server_wide(self, path: str) -> Response | None:
        if path in ("/ping", "/v2/health/ready", "/v2/health/live"):
            body: dict[str, Any] = {"status": "Healthy"} if path == "/ping" else {}
            if path == "/v2/health/ready":
                body = {"ready": True}
            elif path == "/v2/health/live":
                body = {"live": True}
            return _json(body)
        if path == "/v1/models":
            return _json({"models": sorted(self._defaults)})
        if path == "/v2":
            return _json(
                {"name": "ferry", "version": __version__, "extensions": ["binary_tensor_data"]}
            )
        return None

    def _handle(self, key: str) -> Any:
        """The replicas for ``key``: its deployment's, or the pool's with ``key`` as the
        multiplexed model id (Ray prefers a replica that holds the model); for no model,
        any (it answers 404)."""
        if key in self._pooled:
            return self._pool.options(multiplexed_model_id=key)
        if key in self._handles:
            return self._handles[key]
        return next(iter(self._handles.values()), self._pool)

    async def _forward(self, key: str, call: HttpCall) -> HttpAnswer:
        handle = self._handle(key)
        for attempt in range(RETRIES + 1):
            try:
                answer: HttpAnswer = await handle.remote(call)
                return answer
            except _replica_lost() as error:
                log.warning("replica of %s lost (attempt %d): %s", key, attempt + 1, error)
                reason = _first_line(error)
            except Exception as error:  # a bug in the replica: never a raw traceback
                log.exception("replica of %s failed", key)
                return _error(500, "InternalServerException", _first_line(error))
        return _error(503, "ServiceUnavailableException", f"replicas of {key} lost: {reason}")


def naming(call: HttpCall, model: str) -> HttpCall:
    """``call`` with ``model_name=model`` as its only ``model_name`` query parameter."""
    query = [(k, v) for k, v in parse_qsl(call.query.decode("latin-1")) if k != "model_name"]
    query.append(("model_name", model))
    return dataclasses.replace(call, query=urlencode(query).encode("latin-1"))


def _replica_lost() -> tuple[type[BaseException], ...]:
    """Ray's errors for a replica (or its node, or its process) gone with the request."""
    from ray import exceptions
    from ray.serve.exceptions import ReplicaUnavailableError

    return (
        exceptions.RayActorError,  # died, or unavailable
        exceptions.NodeDiedError,
        exceptions.WorkerCrashedError,
        exceptions.ObjectLostError,
        ReplicaUnavailableError,
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _json(document: dict[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(document), status_code=status, media_type="application/json")


def _error(status: int, kind: str, message: str) -> HttpAnswer:
    body = json.dumps({"code": status, "type": kind, "message": message}).encode()
    return HttpAnswer(status, ((b"content-type", b"application/json"),), body)
