"""OpenAPI 3 descriptions of the three APIs (``/api-description``, ``OPTIONS /``) and a
self-contained interactive page (``/docs``) that needs nothing from the internet."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ferry import __version__
from ferry.batching.registry import BATCH_POLICIES

_ERROR = {
    "type": "object",
    "properties": {
        "code": {"type": "integer"},
        "type": {"type": "string"},
        "message": {"type": "string"},
    },
}
_STATUS = {"type": "object", "properties": {"status": {"type": "string"}}}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    meaning = {
        400: "Invalid input or parameters",
        401: "Missing or wrong API key",
        404: "Unknown model, version, workflow or path",
        405: "Method not allowed, or model API disabled",
        409: "Model version or workflow already registered",
        413: "Request body over max_request_size",
        500: "Handler or worker failure",
        501: "The handler cannot explain (or captum is not installed)",
        503: "Queue full or no worker available",
        504: "Worker did not answer within responseTimeout",
    }
    return {str(code): _json(_ERROR, meaning[code]) for code in codes}


def _inference_errors(*codes: int) -> dict[str, Any]:
    """``_errors`` plus the 401 the inference API answers where token authorization
    applies to it: when it listens beyond loopback (``/ping`` stays open)."""
    unauthorized = _json(_ERROR, "Missing or wrong API key (inference beyond loopback only)")
    return dict(sorted({**_errors(*codes), "401": unauthorized}.items()))


def _param(
    name: str, where: str, schema: dict[str, Any], description: str, required: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": required or where == "path",
        "description": description,
        "schema": schema,
    }


_MODEL = _param("model_name", "path", {"type": "string"}, "Model name")
_VERSION = _param("model_version", "path", {"type": "string"}, "Model version")
_WORKFLOW = _param("workflow_name", "path", {"type": "string"}, "Workflow name")
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}


def inference_description() -> dict[str, Any]:
    predict = {
        "summary": "Run inference on the default or given version of a model",
        "requestBody": {
            "content": {
                "*/*": {"schema": {"type": "string", "format": "binary"}},
                "multipart/form-data": {"schema": {"type": "object"}},
            }
        },
        "responses": {
            "200": {"description": "The handler's output (JSON, text or bytes)"},
            **_inference_errors(400, 404, 413, 500, 503, 504),
        },
    }
    explain = {
        **predict,
        "summary": "Explain a prediction: the handler's explain_handle (501 without one)",
        "responses": {
            "200": {
                "description": "The handler's explanation (Integrated Gradients for the "
                "built-in vision handlers)"
            },
            **_inference_errors(400, 404, 413, 500, 501, 503, 504),
        },
    }
    return {
        "openapi": "3.0.1",
        "info": {"title": "Ferry inference API", "version": __version__},
        "paths": {
            "/ping": {
                "get": {
                    "summary": "Health: Healthy when every model has its minimum workers ready",
                    "responses": {
                        "200": _json(_STATUS, "Healthy"),
                        "500": _json(_STATUS, "Unhealthy"),
                    },
                }
            },
            "/ping/{model_name}": {
                "parameters": [_MODEL],
                "get": {
                    "summary": "Readiness of one model: 200 once a worker can take requests",
                    "responses": {
                        "200": {"description": "Ready"},
                        "503": {"description": "NotReady, with the reason"},
                        **_inference_errors(404),
                    },
                },
            },
            "/predictions/{model_name}": {"parameters": [_MODEL], "post": predict, "put": predict},
            "/predictions/{model_name}/{model_version}": {
                "parameters": [_MODEL, _VERSION],
                "post": predict,
                "put": predict,
            },
            "/explanations/{model_name}": {"parameters": [_MODEL], "post": explain, "put": explain},
            "/explanations/{model_name}/{model_version}": {
                "parameters": [_MODEL, _VERSION],
                "post": explain,
                "put": explain,
            },
            "/wfpredict/{workflow_name}": {
                "parameters": [_WORKFLOW],
                "post": {
                    "summary": "Run a request through a workflow's DAG",
                    "requestBody": predict["requestBody"],
                    "responses": {
                        "200": {"description": "The last node's output (JSON)"},
                        **_inference_errors(404, 413, 500),
                    },
                },
            },
            "/api-description": {
                "get": {
                    "summary": "This description",
                    "responses": {"200": {"description": "OpenAPI"}, **_inference_errors()},
                }
            },
        },
    }


def _batch_policy_params() -> list[dict[str, Any]]:
    """``batch_policy`` (one of the registered policies) and every policy's options."""
    names = BATCH_POLICIES.names()
    described = "; ".join(f"{n}: {BATCH_POLICIES.kind(n).description}" for n in names)
    policy = _param("batch_policy", "query", {"type": "string", "enum": list(names)}, described)
    options = [
        _param(option.param, "query", {"type": "number"}, f"{option.key}: {option.description}")
        for option in BATCH_POLICIES.options()
    ]
    return [policy, *options]


def management_description() -> dict[str, Any]:
    scale = {
        "summary": "Scale workers, or with batch_policy switch the batch policy",
        "parameters": [
            _param("min_worker", "query", _INT, "Workers to run (default 1)"),
            _param("max_worker", "query", _INT, "Maximum workers (default min_worker)"),
            _param("synchronous", "query", _BOOL, "Wait until scaled (200) or not (202)"),
            *_batch_policy_params(),
        ],
        "responses": {
            "200": _json(_STATUS, "Scaled"),
            "202": _json(_STATUS, "Accepted"),
            **_errors(400, 401, 404),
        },
    }
    describe = {
        "summary": "Describe a model version ('all' for every version)",
        "parameters": [
            _param("customized", "query", _BOOL, "Add the handler's describe_handle output"),
        ],
        "responses": {"200": {"description": "Model status list"}, **_errors(401, 404, 503)},
    }
    unregister = {
        "summary": "Unregister a model version (needs --enable-model-api)",
        "responses": {"200": _json(_STATUS, "Unregistered"), **_errors(400, 401, 404, 405)},
    }
    register_params = [
        _param(
            "url",
            "query",
            {"type": "string"},
            "Archive in the model store, or an allowed URL",
            required=True,
        ),
        _param("model_name", "query", {"type": "string"}, "Overrides the manifest's name"),
        _param("handler", "query", {"type": "string"}, "Overrides the manifest's handler"),
        _param("runtime", "query", {"type": "string"}, "python"),
        _param("batch_size", "query", _INT, "Largest batch"),
        _param("max_batch_delay", "query", _INT, "Milliseconds the oldest request may wait"),
        _param("initial_workers", "query", _INT, "Workers to start (default 0)"),
        _param("synchronous", "query", _BOOL, "Wait for the workers (200, default) or not (202)"),
        _param("response_timeout", "query", _INT, "Seconds per batch before a worker is replaced"),
        _param("startup_timeout", "query", _INT, "Seconds a worker may take to load"),
    ]
    return {
        "openapi": "3.0.1",
        "info": {"title": "Ferry management API", "version": __version__},
        "paths": {
            "/models": {
                "get": {
                    "summary": "List models",
                    "parameters": [
                        _param("limit", "query", _INT, "Page size (default 100)"),
                        _param("next_page_token", "query", _INT, "Offset from a previous page"),
                    ],
                    "responses": {
                        "200": {"description": "models and nextPageToken"},
                        **_errors(400, 401),
                    },
                },
                "post": {
                    "summary": "Register a model (needs --enable-model-api); parameters "
                    "in the query string or a JSON body",
                    "parameters": register_params,
                    "responses": {
                        "200": _json(_STATUS, "Registered"),
                        "202": _json(_STATUS, "Accepted"),
                        **_errors(400, 401, 405, 409, 500),
                    },
                },
            },
            "/models/{model_name}": {
                "parameters": [_MODEL],
                "get": describe,
                "put": scale,
                "delete": unregister,
            },
            "/models/{model_name}/{model_version}": {
                "parameters": [_MODEL, _VERSION],
                "get": describe,
                "put": scale,
                "delete": unregister,
            },
            "/models/{model_name}/{model_version}/set-default": {
                "parameters": [_MODEL, _VERSION],
                "put": {
                    "summary": "Make this version the default",
                    "responses": {"200": _json(_STATUS, "Updated"), **_errors(401, 404)},
                },
            },
            "/workflows": {
                "get": {
                    "summary": "List workflows",
                    "parameters": [
                        _param("limit", "query", _INT, "Page size (default 100)"),
                        _param("next_page_token", "query", _INT, "Offset from a previous page"),
                    ],
                    "responses": {"200": {"description": "workflows"}, **_errors(400, 401)},
                },
                "post": {
                    "summary": "Register a .war workflow (needs --enable-model-api)",
                    "parameters": [
                        _param(
                            "url",
                            "query",
                            {"type": "string"},
                            ".war in the workflow store, or an allowed URL",
                            required=True,
                        ),
                        _param("workflow_name", "query", {"type": "string"}, "Overrides the name"),
                        _param("response_timeout", "query", _INT, "Seconds per node batch"),
                        _param("startup_timeout", "query", _INT, "Seconds a node may take to load"),
                    ],
                    "responses": {
                        "200": _json(_STATUS, "Registered"),
                        **_errors(400, 401, 404, 405, 409, 500),
                    },
                },
            },
            "/workflows/{workflow_name}": {
                "parameters": [_WORKFLOW],
                "get": {
                    "summary": "Describe a workflow",
                    "responses": {"200": {"description": "Workflow"}, **_errors(401, 404)},
                },
                "delete": {
                    "summary": "Unregister a workflow and its node models",
                    "responses": {
                        "200": _json(_STATUS, "Unregistered"),
                        **_errors(401, 404, 405),
                    },
                },
            },
            "/api-description": {
                "get": {
                    "summary": "This description",
                    "responses": {"200": {"description": "OpenAPI"}, **_errors(401)},
                }
            },
        },
    }


def metrics_description() -> dict[str, Any]:
    return {
        "openapi": "3.0.1",
        "info": {"title": "Ferry metrics API", "version": __version__},
        "paths": {
            "/metrics": {
                "get": {
                    "summary": "Prometheus text exposition",
                    "responses": {"200": {"description": "Metrics", "content": {"text/plain": {}}}},
                }
            }
        },
    }


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}
section{{border:1px solid #ccc;border-radius:6px;padding:.5em 1em;margin:.8em 0}}
code{{background:#f3f3f3}} input{{margin:.2em}} pre{{background:#f6f6f6;padding:.5em;
white-space:pre-wrap}}</style></head>
<body><h1>{title}</h1><p>OpenAPI description: <a href="api-description">api-description</a>.
Send a request from any operation below (add an <code>Authorization</code> header value if
token authorization is on).</p>
<p>Authorization: <input id="auth" size="50" placeholder="Bearer ..."></p>
<div id="ops"></div>
<script>
const spec = {spec};
const ops = document.getElementById("ops");
for (const [path, item] of Object.entries(spec.paths)) {{
  for (const [method, op] of Object.entries(item)) {{
    if (method === "parameters") continue;
    const params = [...(item.parameters || []), ...(op.parameters || [])];
    const section = document.createElement("section");
    const title = document.createElement("h3");
    title.textContent = `${{method.toUpperCase()}} ${{path}}`;
    const summary = document.createElement("p");
    summary.textContent = op.summary || "";
    section.appendChild(title); section.appendChild(summary);
    const inputs = {{}};
    for (const p of params) {{
      const label = document.createElement("label");
      label.textContent = `${{p.name}} (${{p.in}})`;
      const input = document.createElement("input");
      inputs[p.name] = [p, input];
      label.appendChild(input); section.appendChild(label);
      section.appendChild(document.createElement("br"));
    }}
    const body = document.createElement("input");
    if (method === "post" || method === "put") {{ body.type = "file"; section.appendChild(body); }}
    const button = document.createElement("button"); button.textContent = "Send";
    const out = document.createElement("pre");
    button.onclick = async () => {{
      let url = path; const query = new URLSearchParams();
      for (const [name, [p, input]] of Object.entries(inputs)) {{
        if (!input.value) continue;
        if (p.in === "path") url = url.replace(`{{${{name}}}}`, encodeURIComponent(input.value));
        else query.append(name, input.value);
      }}
      const headers = {{}}; const auth = document.getElementById("auth").value;
      if (auth) headers["Authorization"] = auth;
      const init = {{method: method.toUpperCase(), headers}};
      if (body.files && body.files[0]) init.body = body.files[0];
      const response = await fetch(url + (query.toString() ? "?" + query : ""), init);
      out.textContent = response.status + "\\n" + await response.text();
    }};
    section.appendChild(button); section.appendChild(out); ops.appendChild(section);
  }}
}}
</script></body></html>
"""


def description_routes(description: dict[str, Any]) -> list[Route]:
    """``GET /api-description``, ``OPTIONS /`` (TorchServe's way) and ``GET /docs``."""

    async def describe(request: Request) -> Response:
        return JSONResponse(description)

    async def docs(request: Request) -> Response:
        spec = json.dumps(description).replace("</", "<\\\\/")
        return HTMLResponse(_PAGE.format(title=description["info"]["title"], spec=spec))

    return [
        Route("/api-description", describe, methods=["GET"]),
        Route("/", describe, methods=["OPTIONS"]),
        Route("/docs", docs, methods=["GET"]),
    ]
