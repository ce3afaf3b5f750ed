"""TorchServe's inference API: ``/ping`` and ``/predictions/{model}[/{version}]``."""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ferry.http.errors import exception_handlers, guarded
from ferry.http.request_body import read_parts
from ferry.service import FerryService


def inference_app(service: FerryService) -> Starlette:
    limit = service.settings.max_request_size
    record = service.metrics.response_recorder("inference")

    async def ping(request: Request) -> Response:
        healthy = service.is_healthy()
        body = json.dumps({"status": "Healthy" if healthy else "Unhealthy"})
        return Response(body, status_code=200 if healthy else 500, media_type="application/json")

    async def predict(request: Request) -> Response:
        model = request.path_params["model"]
        version = request.path_params.get("version")
        service.runner(model, version)  # 404 before reading a body we would discard
        parts = await read_parts(request, limit)
        headers = {k.lower(): v for k, v in request.headers.items()}
        answer = await service.predict(model, version, parts, headers)
        return Response(
            answer.body,
            status_code=answer.status,
            headers=answer.headers,
            media_type=answer.content_type,
        )

    routes = [
        Route("/ping", ping, methods=["GET"]),
        Route("/predictions/{model}", guarded(predict, record), methods=["POST", "PUT"]),
        Route("/predictions/{model}/{version}", guarded(predict, record), methods=["POST", "PUT"]),
    ]
    return Starlette(routes=routes, exception_handlers=exception_handlers(record))
