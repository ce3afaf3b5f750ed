"""KServe's protocols on the inference port, beside TorchServe's paths: the Open Inference
Protocol V2 (``/v2/...``, with the binary tensor data extension) and KServe V1
(``/v1/models/...``). Each request becomes one ``service.predict`` call, so it queues and
batches with every other protocol's requests for the model (``ferry.protocols.v2`` says
what the handler receives; TorchServe's handlers, the built-in ones included, read each
protocol through its request envelope unless ``service_envelope`` names one for every
request: docs/protocols.md). ``POST /v2/models/NAME[/versions/V]/explain``, which TorchServe
serves beside ``/infer``, is an infer request sent to the handler as an explanation
(TorchServe's ``explain: True``, the ``/explanations`` API's) and answered as one. Errors
are ``{"error": message}`` with the HTTP status of ``ferry.error_table``, or the one the
handler chose (``PredictionException``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ferry import __version__
from ferry.echo import capped_message
from ferry.errors import FerryError, HandlerFailed, InvalidInput
from ferry.http.errors import StatusRecorder, lookup
from ferry.http.hang_up import on_hang_up
from ferry.http.request_body import read_limited
from ferry.protocols import untrusted_json, v2
from ferry.service import FerryService
from ferry.service.types import Admission, InputPart, Prediction, PredictionRequest, TensorSpec

Endpoint = Callable[[Request], Awaitable[Response]]

V1_ENVELOPE = "kserve"
V2_ENVELOPE = "kservev2"
"""TorchServe's request envelopes each protocol's requests are read with, where
``service_envelope`` is unset and the handler is TorchServe's kind (``RequestItem.envelope``)."""


def _json(document: Any, status: int = 200) -> Response:
    return Response(json.dumps(document), status_code=status, media_type="application/json")


def _error(error: FerryError) -> Response:
    status, _ = lookup(error)
    if isinstance(error, HandlerFailed) and error.status is not None:
        status = error.status  # the handler asked for this code (PredictionException)
    body = v2.error_document(capped_message(error.message))
    return Response(body, status, media_type="application/json")


def _guarded(endpoint: Endpoint, record: StatusRecorder) -> Endpoint:
    """KServe's error body for the domain errors an endpoint raises."""

    async def call(request: Request) -> Response:
        try:
            response = await endpoint(request)
        except FerryError as error:
            response = _error(error)
        record(response.status_code)
        return response

    return call


def _version(request: Request) -> str | None:
    version: str | None = request.path_params.get("version")
    return version


def _spec(tensor: TensorSpec) -> dict[str, Any]:
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}


def kserve_routes(service: FerryService, record: StatusRecorder, limit: int) -> list[Route]:
    """The V2 and V1 routes, each endpoint's domain errors answered with KServe's error
    body and every status reported to ``record``; request bodies up to ``limit`` bytes."""
    open_inference = _OpenInferenceV2(service, limit)
    v1 = _KServeV1(service, limit)

    def guarded(endpoint: Endpoint) -> Endpoint:
        return _guarded(endpoint, record)

    def model_paths(suffix: str, endpoint: Endpoint, methods: list[str]) -> list[Route]:
        return [
            Route(f"/v2/models/{{model}}{suffix}", guarded(endpoint), methods=methods),
            Route(
                f"/v2/models/{{model}}/versions/{{version}}{suffix}",
                guarded(endpoint),
                methods=methods,
            ),
        ]

    return [
        Route("/v2", guarded(open_inference.server_metadata), methods=["GET"]),
        Route("/v2/health/live", guarded(open_inference.live), methods=["GET"]),
        Route("/v2/health/ready", guarded(open_inference.ready), methods=["GET"]),
        *model_paths("", open_inference.model_metadata, ["GET"]),
        *model_paths("/ready", open_inference.model_ready, ["GET"]),
        *model_paths("/infer", open_inference.infer, ["POST"]),
        *model_paths("/explain", open_inference.explain, ["POST"]),
        Route("/v1/models", guarded(v1.models), methods=["GET"]),
        Route("/v1/models/{model}", guarded(v1.model), methods=["GET"]),
        Route("/v1/models/{target}", guarded(v1.verb), methods=["POST"]),
    ]


class _OpenInferenceV2:
    """The Open Inference Protocol V2's endpoints: the server's, then each model's."""

    def __init__(self, service: FerryService, limit: int) -> None:
        self.service = service
        self.limit = limit
        """Bytes a request body may hold (``max_request_size``)."""

    @staticmethod
    async def server_metadata(request: Request) -> Response:
        return _json(
            {"name": "ferry", "version": __version__, "extensions": ["binary_tensor_data"]}
        )

    @staticmethod
    async def live(request: Request) -> Response:
        return _json({"live": True})

    async def ready(self, request: Request) -> Response:
        ready = self.service.ready()
        return _json({"ready": ready}, 200 if ready else 503)

    async def model_metadata(self, request: Request) -> Response:
        metadata = self.service.metadata(request.path_params["model"], _version(request))
        return _json(
            {
                "name": metadata.name,
                "versions": metadata.versions,
                "platform": metadata.platform,
                "inputs": [_spec(t) for t in metadata.inputs],
                "outputs": [_spec(t) for t in metadata.outputs],
            }
        )

    async def model_ready(self, request: Request) -> Response:
        readiness = self.service.readiness(request.path_params["model"], _version(request))
        document: dict[str, Any] = {"name": readiness.model.name, "ready": readiness.ready}
        if readiness.reason:
            document["reason"] = readiness.reason
        return _json(document, 200 if readiness.ready else 503)

    async def infer(self, request: Request) -> Response:
        return await self._answer(request, explain=False)

    async def explain(self, request: Request) -> Response:
        """TorchServe's V2 explain: the infer request, to the handler's ``explain_handle``
        (a handler that cannot explain answers 501)."""
        return await self._answer(request, explain=True)

    async def _answer(self, request: Request, *, explain: bool) -> Response:
        service = self.service
        model = request.path_params["model"]
        admission = service.admit(model, _version(request))  # 404 / 503 before the body
        body = await read_limited(request, self.limit, "max_request_size")
        parsed = v2.parse_request(
            body, request.headers.get(v2.BINARY_HEADER), service.settings.tensor_element_limit
        )
        answer = await self._predict(request, admission, *parsed.worker_payload(), explain=explain)
        try:
            outputs, answer_id = v2.outputs_from_answer(answer.body, answer.content_type)
        except ValueError as exc:
            raise InvalidInput(f"the handler's answer is not a V2 response: {exc}") from exc
        outputs = v2.select_outputs(outputs, parsed.outputs)
        ref = admission.model
        content, header_length = v2.encode_response(
            ref.name, ref.version, parsed, outputs, answer_id
        )
        headers = {"x-request-id": answer.request_id}
        if header_length is None:
            return Response(content, headers=headers, media_type="application/json")
        headers[v2.BINARY_HEADER] = str(header_length)
        return Response(content, headers=headers, media_type="application/octet-stream")

    async def _predict(
        self,
        request: Request,
        admission: Admission,
        body: bytes,
        body_type: str,
        *,
        explain: bool,
    ) -> Prediction:
        headers = {k.lower(): v for k, v in request.headers.items()}
        headers["content-type"] = "application/json"  # what the handler's document is
        part = InputPart("body", body_type, body)
        hang_up = on_hang_up(request.scope)
        prediction = PredictionRequest(
            [part], headers, hang_up, explain=explain, envelope=V2_ENVELOPE
        )
        return await self.service.predict(admission, prediction)


class _KServeV1:
    """KServe V1's endpoints (``/v1/models/...``)."""

    def __init__(self, service: FerryService, limit: int) -> None:
        self.service = service
        self.limit = limit
        """Bytes a request body may hold (``max_request_size``)."""

    async def models(self, request: Request) -> Response:
        return _json({"models": self.service.model_names()})

    async def model(self, request: Request) -> Response:
        readiness = self.service.readiness(request.path_params["model"])
        if not readiness.ready:
            message = f"Model with name {readiness.model.name} is not ready."
            return Response(v2.error_document(message), 503, media_type="application/json")
        return _json({"name": readiness.model.name, "ready": True})

    async def verb(self, request: Request) -> Response:
        """``POST /v1/models/NAME:predict`` and ``:explain`` (one route: a model name may
        itself hold a colon-free suffix, so the verb is split off the last colon)."""
        model, _, verb = request.path_params["target"].rpartition(":")
        if verb not in ("predict", "explain") or not model:
            return Response(v2.error_document("expected :predict or :explain"), 404)
        service = self.service
        admission = service.admit(model)
        body = await read_limited(request, self.limit, "max_request_size")
        _check_instances(body)
        headers = {k.lower(): v for k, v in request.headers.items()}
        part = InputPart("body", "application/json", body)
        hang_up, explain = on_hang_up(request.scope), verb == "explain"
        prediction = PredictionRequest(
            [part], headers, hang_up, explain=explain, envelope=V1_ENVELOPE
        )
        answer = await service.predict(admission, prediction)
        return Response(
            _v1_answer(answer, "explanations" if verb == "explain" else "predictions"),
            status_code=answer.status,
            headers={"x-request-id": answer.request_id},
            media_type="application/json",
        )


def _check_instances(body: bytes) -> None:
    try:
        document = untrusted_json.loads(body)
    except ValueError as exc:
        raise InvalidInput(f"Unrecognized request format: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("instances"), list):
        raise InvalidInput('Expected "instances" to be a list')


def _v1_answer(answer: Prediction, key: str) -> bytes:
    """The handler's answer as KServe V1: a document that is already one (the ``kserve``
    envelope's) as it is, anything else under ``predictions`` / ``explanations``."""
    try:
        value = untrusted_json.loads(answer.body)
    except ValueError:
        value = answer.body.decode(errors="replace")
    if isinstance(value, dict) and ("predictions" in value or "explanations" in value):
        return answer.body
    return json.dumps({key: value}).encode()
