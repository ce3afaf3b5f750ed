"""TorchServe's inference API: ``/ping``, ``/predictions/{model}[/{version}]`` and
``/explanations/{model}[/{version}]``."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable
from typing import Protocol

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ferry.echo import capped
from ferry.errors import FerryError
from ferry.http.errors import (
    Endpoint,
    ExceptionHandler,
    StatusRecorder,
    error_response,
    exception_handlers,
)
from ferry.http.hang_up import on_hang_up
from ferry.http.kserve import kserve_routes
from ferry.http.openapi import description_routes, inference_description
from ferry.http.request_body import read_parts
from ferry.http.sagemaker import sagemaker_routes
from ferry.http.sagemaker_models import multi_model_routes
from ferry.http.streaming import prediction_response
from ferry.http.workflows import workflow_inference_routes
from ferry.log_escape import escape_control
from ferry.logs import access_lines
from ferry.service import FerryService
from ferry.service.types import Prediction, PredictionRequest
from ferry.workflows.manager import WorkflowManager

access = logging.getLogger("ferry.access")


def log_access(
    request: Request,
    status: int,
    model: str,
    version: str | None,
    start: float,
    answer: Prediction | None,
) -> None:
    """One line per request: model, version, status, latency, queue time, batch size.

    On every request of a busy server: method and path come straight from the ASGI scope
    (``request.url`` would build a URL object only to take its path back out). Path, model
    and version are the client's, each cut to ``ECHO_LIMIT`` characters (``ferry.echo``)."""
    if not access.isEnabledFor(logging.INFO):
        return
    fields = {
        "method": request.scope["method"],
        "path": capped(request.scope["path"]),
        "status": status,
        "model": capped(model),
        "version": capped(version) if version is not None else None,
        "latency_ms": round((time.perf_counter() - start) * 1000, 3),
        "queue_ms": round(answer.queued_seconds * 1000, 3) if answer else None,
        "batch_size": answer.batch_size if answer else None,
    }
    if answer is not None and answer.trace_ids is not None:
        fields["trace_id"], fields["span_id"] = answer.trace_ids
    # Path, model and version are the client's: a newline in them would forge a line.
    text = escape_control(
        " ".join(f"{key}={value}" for key, value in fields.items() if value is not None)
    )
    lines = access_lines()
    if lines is not None:
        lines.write(text)  # the line the record would make, without logging's machinery
    else:
        access.info(text, extra={"fields": fields})


def inference_app(
    service: FerryService, workflows: WorkflowManager, *, multi_model: bool = False
) -> ASGIApp:
    """TorchServe's inference API, with the workflow, KServe, SageMaker and API-description
    routes beside it; predictions skip Starlette's layers (``with_prediction_fast_path``).
    ``multi_model``: SageMaker's multi-model routes too (``/models``, ``ferry sagemaker-serve``
    with ``SAGEMAKER_MULTI_MODEL=true``)."""
    limit = service.settings.max_request_size
    record = service.metrics.response_recorder("inference")
    predict, explain = _prediction_endpoints(service, record, limit)
    model_ready = _model_ready_endpoint(service)
    routes = [
        Route("/predictions/{model}", predict, methods=["POST", "PUT"]),
        Route("/predictions/{model}/{version}", predict, methods=["POST", "PUT"]),
        Route("/ping", _ping_endpoint(service), methods=["GET"]),
        Route("/ping/{model}", model_ready, methods=["GET"]),
        Route("/ping/{model}/{version}", model_ready, methods=["GET"]),
        Route("/explanations/{model}", explain, methods=["POST", "PUT"]),
        Route("/explanations/{model}/{version}", explain, methods=["POST", "PUT"]),
        *workflow_inference_routes(workflows, record, limit),
        *kserve_routes(service, record, limit),
        *sagemaker_routes(service, record, limit, log_access),
        *(multi_model_routes(service, record, limit, log_access) if multi_model else ()),
        *description_routes(inference_description()),
    ]
    handlers = exception_handlers(record)
    app = Starlette(routes=routes, exception_handlers=handlers)
    return with_prediction_fast_path(app, predict, handlers)


def _ping_endpoint(service: FerryService) -> Endpoint:
    """``GET /ping``: the server's health, TorchServe's way."""

    async def ping(request: Request) -> Response:
        health = service.health()
        body = json.dumps({"status": health.status})
        status = 200 if health.ok else 503 if health.status == "Draining" else 500
        return Response(body, status_code=status, media_type="application/json")

    return ping


def _model_ready_endpoint(service: FerryService) -> Endpoint:
    """``GET /ping/{model}[/{version}]``."""

    async def model_ready(request: Request) -> Response:
        """Per-model readiness for orchestrators: 200 once a worker can take requests."""
        try:
            readiness = service.readiness(
                request.path_params["model"], request.path_params.get("version")
            )
        except FerryError as error:
            return error_response(error)
        document = {
            "model": readiness.model.name,
            "version": readiness.model.version,
            "status": "Ready" if readiness.ready else "NotReady",
        }
        if readiness.reason:
            document["reason"] = readiness.reason
        status = 200 if readiness.ready else 503
        return Response(json.dumps(document), status_code=status, media_type="application/json")

    return model_ready


class _Answer(Protocol):
    """``answer(request, explain=...)``: a prediction or explanation request's response."""

    def __call__(self, request: Request, *, explain: bool) -> Awaitable[Response]: ...


def _prediction_endpoints(
    service: FerryService, record: StatusRecorder, limit: int
) -> tuple[Endpoint, Endpoint]:
    """``predict`` and ``explain``, the endpoints of ``/predictions`` and ``/explanations``."""
    answer = _prediction_answer(service, record, limit)

    async def predict(request: Request) -> Response:
        return await answer(request, explain=False)

    async def explain(request: Request) -> Response:
        """TorchServe's explanations API: the handler's ``explain_handle``."""
        return await answer(request, explain=True)

    return predict, explain


def _prediction_answer(service: FerryService, record: StatusRecorder, limit: int) -> _Answer:
    """The answer to a prediction or explanation request, from admission to access log."""
    access_log = service.settings.access_log

    async def answer(request: Request, *, explain: bool) -> Response:
        start = time.perf_counter()
        model = request.path_params["model"]
        version = request.path_params.get("version")
        answer: Prediction | None = None
        try:
            # 404 and 503 before reading the body: refusing a flood must stay cheap.
            admission = service.admit(model, version)
            version = admission.version
            parts = await read_parts(request, limit)
            headers = dict(request.headers.items())  # ASGI header names are lower case
            hang_up = on_hang_up(request.scope)
            response, events = await prediction_response(
                lambda on_part: service.submit(
                    admission, PredictionRequest(parts, headers, hang_up, on_part, explain)
                ),
                service.settings.max_response_size,
            )
            answer = events.answer
        except FerryError as error:
            response = error_response(error)
        record(response.status_code)
        if access_log:
            log_access(request, response.status_code, model, version, start, answer)
        return response

    return answer


PREDICTIONS = "/predictions/"
PREDICTION_METHODS = frozenset({"POST", "PUT"})


def prediction_params(path: str) -> dict[str, str] | None:
    """``model`` and ``version`` of ``/predictions/{model}[/{version}]``, as the routes
    above match them (no segment empty); None for any other path."""
    if not path.startswith(PREDICTIONS):
        return None
    segments = path[len(PREDICTIONS) :].split("/")
    if len(segments) > 2 or "" in segments:
        return None
    return dict(zip(("model", "version"), segments, strict=False))


def _fast_path_params(scope: Scope) -> dict[str, str] | None:
    if scope["type"] != "http" or scope["method"] not in PREDICTION_METHODS:
        return None
    if scope.get("root_path"):
        return None
    return prediction_params(scope["path"])


def with_prediction_fast_path(
    app: ASGIApp, predict: Endpoint, handlers: dict[object, ExceptionHandler]
) -> ASGIApp:
    """Predictions straight to their endpoint; everything else to ``app``.

    On the hot path Starlette's layers (two error middlewares, the router's route-by-route
    regex, the endpoint's own error wrapper, each wrapping ``send`` once more) cost about
    3% of the no-op handler's requests/s (``benchmarks/results/revision_ab.md``). The endpoint
    answers domain errors itself; what Starlette would add, its error handlers, is kept
    here: a client gone mid-body is 499 and a bug is TorchServe's 500 body, logged.
    Other methods on these paths (405) and mounted apps (``root_path``) take the routes."""
    client_gone = handlers[ClientDisconnect]
    internal_error = handlers[500]

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        params = _fast_path_params(scope)
        if params is None:
            await app(scope, receive, send)
            return
        scope["path_params"] = params
        request = Request(scope, receive, send)
        try:
            response = await predict(request)
        except ClientDisconnect as error:
            response = await client_gone(request, error)
        except Exception as error:  # answered and logged, as Starlette would
            response = await internal_error(request, error)
        await response(scope, receive, send)

    return dispatch
