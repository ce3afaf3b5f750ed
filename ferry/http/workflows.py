"""TorchServe's workflow API: ``/workflows`` on the management port, ``/wfpredict/{name}``
on the inference port (``ferry.workflows.manager`` does the work)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ferry.http.errors import StatusRecorder, guarded
from ferry.http.params import Params
from ferry.http.request_body import read_parts
from ferry.workflows.manager import WorkflowManager, WorkflowRequest, workflow_dag_text

MAX_PARAMS_BODY = 1 << 20


def _json(document: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(document, indent=2), status_code=status, media_type="application/json"
    )


def workflow_management_routes(workflows: WorkflowManager, record: StatusRecorder) -> list[Route]:
    async def list_or_register(request: Request) -> Response:
        params = await Params.read(request, MAX_PARAMS_BODY)
        if request.method == "GET":
            limit = params.integer("limit")
            page = workflows.page(
                100 if limit is None else limit, params.integer("next_page_token") or 0
            )
            document: dict[str, Any] = {
                "workflows": [
                    {"workflowName": name, "workflowUrl": url} for name, url in page.workflows
                ]
            }
            if page.next_page_token is not None:
                document["nextPageToken"] = page.next_page_token
            return _json(document)
        name = await workflows.register(
            WorkflowRequest(
                url=params.text("url", required=True) or "",
                workflow_name=params.text("workflow_name"),
                response_timeout=params.number("response_timeout", minimum=1),
                startup_timeout=params.number("startup_timeout", minimum=0),
            )
        )
        return _json({"status": f"Workflow {name} has been registered and scaled successfully."})

    async def one_workflow(request: Request) -> Response:
        name = request.path_params["name"]
        if request.method == "DELETE":
            await workflows.unregister(name)
            return _json({"status": f'Workflow "{name}" unregistered'})
        workflow = workflows.describe(name)
        limits = workflow.spec.globals
        return _json(
            [
                {
                    "workflowName": workflow.name,
                    "workflowUrl": workflow.url,
                    "minWorkers": limits.min_workers,
                    "maxWorkers": limits.max_workers,
                    "batchSize": limits.batch_size,
                    "maxBatchDelay": limits.max_batch_delay_ms,
                    "workflowDag": workflow_dag_text(workflow.spec),
                }
            ]
        )

    return [
        Route("/workflows", guarded(list_or_register, record), methods=["GET", "POST"]),
        Route("/workflows/{name}", guarded(one_workflow, record), methods=["GET", "DELETE"]),
    ]


def workflow_inference_routes(
    workflows: WorkflowManager, record: StatusRecorder, limit: int
) -> list[Route]:
    async def predict(request: Request) -> Response:
        # As TorchServe: the body's parts (or form fields) and headers, no query parameters.
        parts = await read_parts(request, limit)
        headers = {k.lower(): v for k, v in request.headers.items()}
        answer = await workflows.predict(request.path_params["name"], parts, headers)
        return Response(answer.body, media_type=answer.content_type)

    return [Route("/wfpredict/{name}", guarded(predict, record), methods=["POST", "PUT"])]
