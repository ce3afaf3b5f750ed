"""``GET /metrics`` in Prometheus text format."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ferry.http.errors import exception_handlers
from ferry.http.openapi import description_routes, metrics_description
from ferry.service import FerryService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics_app(service: FerryService) -> Starlette:
    async def metrics(request: Request) -> Response:
        return Response(service.metrics_exposition(), media_type=CONTENT_TYPE)

    routes = [
        Route("/metrics", metrics, methods=["GET"]),
        *description_routes(metrics_description()),
    ]
    return Starlette(routes=routes, exception_handlers=exception_handlers())
