"""SageMaker's inference path on the inference port: ``POST /invocations`` (``GET /ping``
is TorchServe's, which SageMaker's health check reads the same way), and batch
transform's ``GET /execution-parameters``.

A request goes to ``?model_name=NAME`` when given (TorchServe's rule), else to the one
registered model; with none or several, it is a 404 naming the models. Its body reaches
the handler undecoded, as the toolkit configures TorchServe (``decode_input_request=false``):
``Content-Type``, ``Accept`` and ``X-Amzn-SageMaker-Custom-Attributes`` travel in the
request's headers (``context.get_request_header``). From there it takes the same path as
``/predictions``: ``service.submit``, the model's queue and batches, the same error
bodies and access log.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ferry.errors import FerryError, ModelNotFound
from ferry.http.errors import Endpoint, StatusRecorder, error_response, guarded
from ferry.http.hang_up import on_hang_up
from ferry.http.request_body import read_limited
from ferry.http.streaming import prediction_response
from ferry.service import FerryService
from ferry.service.status import ModelStatus
from ferry.service.types import InputPart, Prediction, PredictionRequest

SAGEMAKER_PATHS = ("/invocations", "/execution-parameters")
"""The paths whose model is ``invoked_model``'s choice, not named in the path."""
UNDECODED = "application/octet-stream"
"""The type the body is handed over as, so the worker passes its bytes unparsed."""
TRANSFORM_LIMIT_MB = 100
"""SageMaker's bound on a batch transform's ``MaxConcurrentTransforms`` times
``MaxPayloadInMB``."""


def invocation_model(service: FerryService, request: Request) -> str:
    """The model ``/invocations`` serves: ``?model_name=``, else the only one."""
    return invoked_model(request.query_params.get("model_name"), service.model_names())


def invoked_model(named: str | None, names: Iterable[str]) -> str:
    """``named`` when given, else the only one of ``names`` (``ModelNotFound`` naming them
    when there are none or several); Ray's router chooses so too."""
    if named:
        return named
    loaded = sorted(names)
    if len(loaded) == 1:
        return loaded[0]
    raise ModelNotFound(
        f"/invocations serves the one model loaded, or the one ?model_name= names; "
        f"models loaded: {', '.join(loaded) if loaded else 'none'}"
    )


AccessLog = Callable[[Request, int, str, "str | None", float, "Prediction | None"], None]
"""``ferry.http.inference.log_access``: the access line, as ``/predictions`` writes it."""


ChooseModel = Callable[[Request], str]
"""The model a request is for (``invocation_model``, or a path parameter's)."""


def sagemaker_routes(
    service: FerryService, record: StatusRecorder, limit: int, log_access: AccessLog
) -> list[Route]:
    """``POST /invocations`` and ``GET /execution-parameters``; every status reported to
    ``record``, bodies up to ``limit``."""
    invocations = invocation_endpoint(
        service, record, limit, log_access, lambda request: invocation_model(service, request)
    )

    async def parameters(request: Request) -> Response:
        status = service.describe(invocation_model(service, request), None)[0]
        document = execution_parameters(status, service.settings.max_request_size)
        return Response(json.dumps(document), media_type="application/json")

    return [
        Route("/invocations", invocations, methods=["POST"]),
        Route("/execution-parameters", guarded(parameters, record), methods=["GET"]),
    ]


def execution_parameters(status: ModelStatus, max_request_size: int) -> dict[str, Any]:
    """What a batch transform job that leaves them unset should use with this model:
    payloads as large as Ferry accepts (``max_request_size``, in whole MB, 1 to 100);
    single records, which Ferry batches itself; and as many requests at once as its
    workers take in batches (most workers times ``batchSize``), within SageMaker's
    100 MB for the two multiplied.

        >>> status = ModelStatus("m", "1.0", "", 1, 2, 4, 100, 60, True, [], 100, 0, True, "")
        >>> execution_parameters(status, 6_553_500)
        {'MaxConcurrentTransforms': 8, 'BatchStrategy': 'SINGLE_RECORD', 'MaxPayloadInMB': 6}
    """
    payload_mb = min(max(max_request_size >> 20, 1), TRANSFORM_LIMIT_MB)
    taken = max(status.max_workers, status.min_workers, 1) * max(status.batch_size, 1)
    return {
        "MaxConcurrentTransforms": min(taken, TRANSFORM_LIMIT_MB // payload_mb),
        "BatchStrategy": "SINGLE_RECORD",
        "MaxPayloadInMB": payload_mb,
    }


def invocation_endpoint(
    service: FerryService,
    record: StatusRecorder,
    limit: int,
    log_access: AccessLog,
    choose: ChooseModel,
) -> Endpoint:
    """An invocation of the model ``choose`` names: the body undecoded, the headers to the
    handler's context (``/invocations``, and multi-model endpoints' ``/models/M/invoke``)."""
    access_log = service.settings.access_log

    async def invoke(request: Request) -> Response:
        start = time.perf_counter()
        model, version = "", None
        answer: Prediction | None = None
        try:
            model = choose(request)
            admission = service.admit(model)  # 404 and 503 before reading the body
            version = admission.version
            parts = [InputPart("body", UNDECODED, await read_limited(request, limit))]
            headers = dict(request.headers.items())  # ASGI header names are lower case
            hang_up = on_hang_up(request.scope)
            response, events = await prediction_response(
                lambda on_part: service.submit(
                    admission, PredictionRequest(parts, headers, hang_up, on_part)
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

    return invoke
