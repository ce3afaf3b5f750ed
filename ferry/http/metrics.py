"""``GET /metrics`` in Prometheus text format, and the middleware counting responses."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ferry.http.errors import STARLETTE_HANDLERS
from ferry.metrics.definitions import FerryMetrics
from ferry.service import FerryService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics_app(service: FerryService) -> Starlette:
    async def metrics(request: Request) -> Response:
        return Response(service.metrics_exposition(), media_type=CONTENT_TYPE)

    routes = [Route("/metrics", metrics, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers=STARLETTE_HANDLERS)


class ResponseCounter:
    """ASGI middleware: count every response of an API by status class."""

    def __init__(self, app: ASGIApp, metrics: FerryMetrics, api: str) -> None:
        self.app, self.metrics, self.api = app, metrics, api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.metrics.enabled:
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.record_response(self.api, int(message["status"]))
            await send(message)

        await self.app(scope, receive, counting_send)


def counted(app: Any, service: FerryService, api: str) -> ResponseCounter:
    return ResponseCounter(app, service.metrics, api)
