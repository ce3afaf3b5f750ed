"""SageMaker's multi-model endpoint contract on the inference port (SageMaker sends
everything to one port), served by ``ferry sagemaker-serve`` with
``SAGEMAKER_MULTI_MODEL=true``:

- ``POST /models`` with ``{"model_name": NAME, "url": PATH}``: load the model at ``PATH``
  (a folder or ``.tar.gz`` in SageMaker's layout, inside the model store); 409 if ``NAME``
  is loaded, 404 if ``PATH`` is missing, 507 if it does not fit the memory budget
  (``ferry.service.multi_model``), so that SageMaker unloads another and retries;
- ``GET /models``: ``{"models": [{"modelName", "modelUrl"}], "nextPageToken"}``
  (``limit``, ``next_page_token``, as TorchServe's list, which SageMaker read before);
- ``GET /models/NAME``: ``{"modelName", "modelUrl"}``; 404 if not loaded;
- ``DELETE /models/NAME``: unload; 404 if not loaded;
- ``POST /models/NAME/invoke``: answered as ``/invocations`` (``ferry.http.sagemaker``);
  ``X-Amzn-SageMaker-Target-Model`` reaches the handler with the other headers.

Answers and errors have TorchServe's bodies, as SageMaker's PyTorch containers gave them.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ferry.http.errors import StatusRecorder, guarded
from ferry.http.management import MAX_PARAMS_BODY, list_models
from ferry.http.params import Params
from ferry.http.sagemaker import AccessLog, invocation_endpoint
from ferry.service import FerryService, multi_model


def _json(document: Any) -> Response:
    return Response(json.dumps(document), media_type="application/json")


def multi_model_routes(
    service: FerryService, record: StatusRecorder, limit: int, log_access: AccessLog
) -> list[Route]:
    """Load, list, describe, unload and invoke, every status reported to ``record``."""

    async def list_or_load(request: Request) -> Response:
        params = await Params.read(request, MAX_PARAMS_BODY)
        if request.method == "GET":
            return await list_models(service, params)
        name = params.text("model_name", required=True) or ""
        url = params.text("url", required=True) or ""
        loaded = await multi_model.load(service, name, url)
        ref = loaded.model
        return _json(
            {
                "status": f'Model "{ref.name}" Version: {ref.version} registered with '
                f"{loaded.workers} initial workers"
            }
        )

    async def one_model(request: Request) -> Response:
        name = request.path_params["name"]
        if request.method == "DELETE":
            await service.unregister(name, None)
            return _json({"status": f'Model "{name}" unregistered'})
        status = service.describe(name, None)[0]
        return _json({"modelName": status.name, "modelUrl": status.url})

    invoke = invocation_endpoint(
        service, record, limit, log_access, lambda request: request.path_params["name"]
    )
    return [
        Route("/models", guarded(list_or_load, record), methods=["GET", "POST"]),
        Route("/models/{name}", guarded(one_model, record), methods=["GET", "DELETE"]),
        Route("/models/{name}/invoke", invoke, methods=["POST"]),
    ]
