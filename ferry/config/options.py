"""Every server setting, declared once: its config.properties key, flag, environment
variable, value kind, meaning and default.

``ferry serve --help`` (``ferry.cli.settings_flags``), the settings tables of
docs/configuration.md (``python -m ferry.config.docs``) and the readers in
``ferry.config.sources`` all come from ``GROUPS``; the value itself lands in the
``ServerSettings`` field the option names, whose default is the one shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ferry.config import values as v
from ferry.config.settings import Address, ModelMetric, ServerSettings


@dataclass(frozen=True)
class Option:
    key: str
    """config.properties key; the flag is ``--key-with-dashes`` unless ``flag`` says otherwise,
    the variable ``FERRY_KEY`` (TorchServe's ``TS_KEY`` with ``enable_envvars_config``)."""
    field: str
    """The ``ServerSettings`` field it fills."""
    kind: v.Kind
    meaning: str
    """What it does, in a sentence or two (Markdown's ``code`` marks allowed)."""
    flag: str | None = None
    default_note: str = ""
    """What the default means when its value does not say (``0``: derived from the devices)."""
    see: tuple[str, str] | None = None
    """A docs/ page that says more: (title, link relative to docs/)."""

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.key.replace("_", "-")

    @property
    def env_name(self) -> str:
        return "FERRY_" + self.key.upper()

    @property
    def parse(self) -> v.Parser:
        return self.kind.parse


@dataclass(frozen=True)
class Group:
    title: str
    options: tuple[Option, ...]


@cache
def _defaults() -> ServerSettings:
    return ServerSettings()


def default_text(option: Option) -> str:
    """The default as the help and the docs show it: the value ``ServerSettings`` starts
    with, its unit, and the note saying what it means; "" when there is none to show."""
    value = _show(getattr(_defaults(), option.field))
    if value and option.kind.unit:
        value = f"{value} {option.kind.unit}"
    if value and option.default_note:
        return f"{value} ({option.default_note})"
    return value or option.default_note


def _show(value: Any) -> str:
    if value is None or value == "" or value == {}:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Address):
        return value.url()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        if any(isinstance(item, ModelMetric) for item in value):
            return ", ".join(item.name for item in value)
        return ",".join(value) if value else "none"
    if isinstance(value, Path):
        return str(value)
    return str(value)


_LISTENER = (
    "`http(s)://HOST:PORT` or `unix:/PATH`; port 0 picks a free one; `https://` needs "
    "`certificate_file` and `private_key_file`."
)
_SECURITY = ("Security", "security.md")
_LIMITS = ("HTTP limits", "security.md#http-limits")
_RESOURCE_LIMITS = ("Resource limits", "security.md#resource-limits")
_PACKAGES = ("Per-model packages", "configuration.md#per-model-packages")
_MANY = ("Many models on one machine", "many-models.md")
_ON_DEMAND = ("Load on demand", "many-models.md#load-on-demand-evict-under-a-budget")
_RAY = ("Ferry on a Ray cluster", "ray.md")
_RAY_PATH = ("Ferry on a Ray cluster", "ray.md#the-path-of-a-request")
_BACKGROUND = (
    "Running in the background",
    "configuration.md#running-in-the-background-torchserves---start----stop",
)

GROUPS = (
    Group(
        "Addresses and TLS",
        (
            Option(
                "inference_address",
                "inference_address",
                v.ADDRESS,
                "Where the inference API listens: " + _LISTENER,
            ),
            Option(
                "management_address",
                "management_address",
                v.ADDRESS,
                "Where the management API listens (written as `inference_address`).",
            ),
            Option(
                "metrics_address",
                "metrics_address",
                v.ADDRESS,
                "Where the Prometheus metrics are served (written as `inference_address`).",
            ),
            Option(
                "certificate_file",
                "certificate_file",
                v.PATH,
                "TLS certificate (PEM) for `https://` addresses and gRPC over TLS.",
                default_note="none",
            ),
            Option(
                "private_key_file",
                "private_key_file",
                v.PATH,
                "TLS private key (PEM) for `https://` addresses and gRPC over TLS.",
                default_note="none",
            ),
        ),
    ),
    Group(
        "gRPC",
        (
            Option(
                "enable_grpc",
                "enable_grpc",
                v.BOOLEAN,
                "TorchServe's gRPC inference and management APIs: true requires them, false "
                "turns them off. Any other `grpc_*` setting asks for them too.",
                default_note="on when grpcio (the `grpc` extra) is installed",
            ),
            Option(
                "grpc_inference_address",
                "grpc_inference_address",
                v.HOST,
                "Host the gRPC inference API binds (the port is `grpc_inference_port`).",
                default_note="127.0.0.1",
            ),
            Option(
                "grpc_inference_port",
                "grpc_inference_port",
                v.PORT,
                "Port of the gRPC inference API; 0 picks a free one.",
                default_note="7070",
            ),
            Option(
                "grpc_management_address",
                "grpc_management_address",
                v.HOST,
                "Host the gRPC management API binds (the port is `grpc_management_port`).",
                default_note="127.0.0.1",
            ),
            Option(
                "grpc_management_port",
                "grpc_management_port",
                v.PORT,
                "Port of the gRPC management API; 0 picks a free one.",
                default_note="7071",
            ),
            Option(
                "enable_grpc_ssl",
                "enable_grpc_ssl",
                v.BOOLEAN,
                "Serve both gRPC APIs over TLS with `certificate_file` and `private_key_file`.",
            ),
        ),
    ),
    Group(
        "Security",
        (
            Option(
                "disable_token_authorization",
                "disable_token_authorization",
                v.BOOLEAN,
                "Turn token authorization off (it is on for management, and for inference "
                "beyond loopback).",
                flag="--disable-token-auth",
                see=_SECURITY,
            ),
            Option(
                "key_file",
                "key_file",
                v.PATH,
                "Where the API keys are kept, readable by the owner only: reused when it "
                "exists, written once every listener is bound when it does not.",
                see=_SECURITY,
            ),
            Option(
                "management_key",
                "management_key",
                v.API_KEY,
                "A stable management API key (visible ASCII, no spaces).",
                default_note="the key file's, or a new one written there",
                see=_SECURITY,
            ),
            Option(
                "inference_key",
                "inference_key",
                v.API_KEY,
                "A stable inference API key (visible ASCII, no spaces).",
                default_note="the key file's, or a new one written there",
                see=_SECURITY,
            ),
            Option(
                "enable_model_api",
                "enable_model_api",
                v.BOOLEAN,
                "Allow registering and unregistering models through the management API "
                "(405 otherwise).",
            ),
            Option(
                "allowed_urls",
                "allowed_urls",
                v.LIST,
                "Regular expressions a remote archive URL must match in full.",
            ),
            Option(
                "cors_allowed_origin",
                "cors_allowed_origin",
                v.LIST,
                "Origins (`*` for any) whose browser pages may call every API; none turns "
                "CORS off.",
            ),
            Option(
                "cors_allowed_methods",
                "cors_allowed_methods",
                v.LIST,
                "Methods a CORS preflight may ask for (TorchServe: `GET, POST, PUT, OPTIONS`); "
                "none refuses every preflight.",
            ),
            Option(
                "cors_allowed_headers",
                "cors_allowed_headers",
                v.LIST,
                "Request headers a CORS preflight may ask for (`*` for any).",
            ),
            Option(
                "enable_envvars_config",
                "enable_envvars_config",
                v.BOOLEAN,
                "Also read TorchServe's `TS_*` environment variables (below `FERRY_*` ones).",
            ),
        ),
    ),
    Group(
        "Models and stores",
        (
            Option(
                "model_store",
                "model_store",
                v.PATH,
                "Folder of model archives (symbolic links in it are followed; `..` is refused).",
                default_note="none",
            ),
            Option(
                "load_models",
                "models",
                v.LIST,
                "Models to load at start-up: `all`, or `NAME=ARCHIVE` / `ARCHIVE` entries; "
                "one missing from the store stops start-up (exit 2) naming it, where "
                "TorchServe logs it and starts without it.",
                flag="--models",
                default_note="the latest snapshot's, when no config file is given",
            ),
            Option(
                "models",
                "model_overrides",
                v.MODELS_JSON,
                "TorchServe's per-version JSON (`minWorkers`, `maxWorkers`, `batchSize`, "
                "`maxBatchDelay`, `responseTimeout`, `defaultVersion`, `marName`); it wins "
                "over model-config.yaml, except an archive's own `minWorkers`/`maxWorkers`.",
                flag="--models-config",
                default_note="none",
            ),
            Option(
                "workflow_store",
                "workflow_store",
                v.PATH,
                "Where `.war` workflow archives are found.",
                default_note="the model store",
                see=("Workflows", "workflows.md"),
            ),
            Option(
                "service_envelope",
                "service_envelope",
                v.ENVELOPE,
                "TorchServe's request envelope for every model, applied in the workers "
                "around each handler.",
                default_note="none",
            ),
            Option(
                "install_py_dep_per_model",
                "install_py_dep_per_model",
                v.BOOLEAN,
                "pip-install each archive's requirements file for its workers (pip runs the "
                "code it downloads).",
                see=_PACKAGES,
            ),
            Option(
                "pip_index_url",
                "pip_index_url",
                v.INDEX_URL,
                "The only package index pip may use for archives' requirements "
                "(`--index-url`); requirements files naming other sources are refused.",
                default_note="no restriction",
                see=_PACKAGES,
            ),
            Option(
                "pip_find_links",
                "pip_find_links",
                v.PATH,
                "A folder of wheels pip may install archives' requirements from "
                "(`--find-links`; alone, with `--no-index`).",
                default_note="no restriction",
                see=_PACKAGES,
            ),
            Option(
                "config_snapshots",
                "config_snapshots",
                v.BOOLEAN,
                "Keep model snapshots in `<log_location>/config/` and restore the latest at "
                "a start without `--models` or a config file (`--ncs` turns them off).",
                see=("Model snapshots", "management.md#model-snapshots"),
            ),
        ),
    ),
    Group(
        "Workers and batching",
        (
            Option(
                "default_workers_per_model",
                "default_workers_per_model",
                v.integer(0),
                "Workers per model when the model does not say.",
                default_note="one per GPU the model runs on, else one",
            ),
            Option(
                "default_batch_size",
                "default_batch_size",
                v.integer(1),
                "Batch size when the model's `batchSize` does not say.",
            ),
            Option(
                "default_max_batch_delay",
                "default_max_batch_delay_ms",
                v.MILLISECONDS,
                "Longest wait to fill a batch when the model's `maxBatchDelay` does not say.",
            ),
            Option(
                "job_queue_size",
                "job_queue_size",
                v.integer(1),
                "Requests a model version may hold waiting; beyond it requests get 503 at "
                "once (a model-config.yaml `jobQueueSize` wins).",
            ),
            Option(
                "default_response_timeout",
                "default_response_timeout",
                v.SECONDS,
                "Time a worker may take for one batch before it is replaced (504).",
            ),
            Option(
                "stream_timeout",
                "stream_timeout",
                v.SECONDS_OR_ZERO,
                "Time a streamed answer may take in all before its worker is replaced; 0: no "
                "bound.",
                see=("Streaming", "handlers.md#streaming"),
            ),
            Option(
                "cancel_grace",
                "cancel_grace",
                v.SECONDS,
                "Time a worker has to stop streaming once all its clients hung up, before it "
                "is replaced.",
                see=("Streaming", "handlers.md#streaming"),
            ),
            Option(
                "number_of_gpu",
                "number_of_gpu",
                v.integer(0),
                "Use at most this many GPUs; each GPU worker sees only its own. A model whose "
                "weights do not fit its GPU's free memory (NVML) is refused.",
                default_note="all visible",
            ),
            Option(
                "cpu_pinning",
                "cpu_pinning",
                v.BOOLEAN,
                "Bind each worker's torch threads to cores no other worker of this server "
                "holds (off: two servers on one machine would pin to the same cores).",
                see=(
                    "Lone requests on CPU",
                    "architecture.md#lone-requests-on-cpu-torchs-helper-threads",
                ),
            ),
            Option(
                "spare_worker_for_compiled_models",
                "spare_worker_for_compiled_models",
                v.BOOLEAN,
                "While a model that compiles as it loads (`optimization: compile`, `pt2`) is "
                "served, keep one worker process waiting with torch's compiler imported "
                "(about 340 MB; one per GPU and one for the CPU), so its next worker starts "
                "sooner.",
                see=("Model formats", "handlers.md#model-formats-compiled-once"),
            ),
        ),
    ),
    Group(
        "Many models and memory",
        (
            Option(
                "max_workers_total",
                "max_workers_total",
                v.integer(0),
                "Worker processes of all models together; more is refused at start-up, "
                "registration and scaling.",
                default_note="twice the cores, at least 8",
                see=_RESOURCE_LIMITS,
            ),
            Option(
                "share_worker_processes",
                "share_worker_processes",
                v.choice("auto", "always", "never"),
                "Which models without a `processGroup` share worker processes: `auto`, those "
                "past `max_workers_total`; `always`, every one; `never`, none.",
                see=_MANY,
            ),
            Option(
                "load_models_on_demand",
                "load_models_on_demand",
                v.BOOLEAN,
                "Models without `loadOnDemand` in their model-config.yaml load on their first "
                "request, and may be evicted under the memory budgets.",
                see=_ON_DEMAND,
            ),
            Option(
                "model_memory_budget_mb",
                "model_memory_budget_mb",
                v.MEGABYTES,
                "Host memory the resident models may take together; past it, idle on-demand "
                "models are evicted, least recently used first.",
                default_note="no budget",
                see=_ON_DEMAND,
            ),
            Option(
                "gpu_memory_budget_mb",
                "gpu_memory_budget_mb",
                v.MEGABYTES,
                "The same, per GPU (GPU memory torch holds for the models).",
                default_note="no budget",
                see=_ON_DEMAND,
            ),
        ),
    ),
    Group(
        "Limits",
        (
            Option(
                "max_request_size",
                "max_request_size",
                v.BYTES,
                "Largest request body accepted (413 beyond).",
            ),
            Option(
                "max_response_size",
                "max_response_size",
                v.BYTES,
                "Largest response body a handler may return (500 beyond).",
            ),
            Option(
                "max_tensor_elements",
                "max_tensor_elements",
                v.integer(1),
                "Most elements the tensors of one Open Inference Protocol request (REST or "
                "gRPC) may hold together, judged from their shapes before any is decoded "
                "(413, gRPC `RESOURCE_EXHAUSTED`, beyond).",
                default_note="`max_request_size`",
            ),
            Option(
                "max_header_size",
                "max_header_size",
                v.integer(1024, "BYTES", "bytes"),
                "Largest request head, and separately the largest chunked trailer (431 beyond).",
                see=_LIMITS,
            ),
            Option(
                "max_headers",
                "max_headers",
                v.integer(1),
                "Most header fields in one request (431 beyond).",
                see=_LIMITS,
            ),
            Option(
                "header_timeout",
                "header_timeout",
                v.SECONDS,
                "Time a request head may take from its first byte to its end (408 beyond).",
                see=_LIMITS,
            ),
            Option(
                "body_read_timeout",
                "body_read_timeout",
                v.SECONDS,
                "Time a pending request body may go without a byte arriving (408 beyond).",
                see=_LIMITS,
            ),
            Option(
                "max_unpacked_size",
                "max_unpacked_size",
                v.BYTES,
                "Largest size an archive may unpack to; a larger one is refused.",
                default_note="4 GiB",
                see=_RESOURCE_LIMITS,
            ),
            Option(
                "limit_max_image_pixels",
                "limit_max_image_pixels",
                v.PIXEL_LIMIT,
                "Largest width x height the built-in vision handlers decode, judged from the "
                "image header (400 beyond); `true`: the default, `false`: only PIL's own limit.",
                see=_RESOURCE_LIMITS,
            ),
            Option(
                "allowed_image_formats",
                "allowed_image_formats",
                v.IMAGE_FORMATS,
                "Image formats (PIL's names) the built-in vision handlers decode; others get 400.",
                see=_RESOURCE_LIMITS,
            ),
        ),
    ),
    Group(
        "Metrics, logs and traces",
        (
            Option(
                "enable_metrics_api",
                "enable_metrics_api",
                v.BOOLEAN,
                "Collect metrics and serve them on `metrics_address`.",
                see=("Observe", "metrics.md"),
            ),
            Option(
                "metrics_config",
                "model_metrics",
                v.METRICS_CONFIG,
                "TorchServe's metrics.yaml: its `model_metrics` are declared for handlers' "
                "`context.metrics.get_metric(name, type)`; its `ts_metrics` are not read.",
                default_note="TorchServe's default",
                see=("Handler metrics", "metrics.md#handler-metrics-and-metrics_config"),
            ),
            Option(
                "max_handler_metric_series",
                "max_handler_metric_series",
                v.integer(1),
                "Series one handler metric may have, all models together; values with new "
                "dimension values beyond it are dropped and counted.",
                see=("Observe", "metrics.md"),
            ),
            Option(
                "metric_time_interval",
                "metric_time_interval",
                v.SECONDS,
                "Time between two sets of system metrics lines in `ts_metrics.log`.",
                see=_BACKGROUND,
            ),
            Option(
                "disable_system_metrics",
                "disable_system_metrics",
                v.BOOLEAN,
                "No system metrics lines in `ts_metrics.log`.",
            ),
            Option(
                "log_level",
                "log_level",
                v.choice("DEBUG", "INFO", "WARNING", "ERROR"),
                "Least severe log lines written.",
            ),
            Option(
                "log_format",
                "log_format",
                v.choice("plain", "json"),
                "`plain` lines, or `json`: one object per line.",
            ),
            Option(
                "log_location",
                "log_location",
                v.PATH,
                "Folder for TorchServe's log files (`ts_log.log`, `access_log.log`, "
                "`model_log.log`, ...) instead of stderr.",
                default_note="stderr; `logs` with `--start`",
                see=_BACKGROUND,
            ),
            Option(
                "access_log",
                "access_log",
                v.BOOLEAN,
                "One log line per inference request (logger `ferry.access`).",
            ),
            Option(
                "enable_tracing",
                "enable_tracing",
                v.BOOLEAN,
                "OpenTelemetry spans of every request and batch, exported as the `OTEL_*` "
                "variables say (the `otel` extra).",
                see=("Traces", "metrics.md#traces"),
            ),
        ),
    ),
    Group(
        "Start-up and shut-down",
        (
            Option(
                "ready_file",
                "ready_file",
                v.PATH,
                "A JSON file with the bound addresses, written once the models are loaded.",
                default_note="none",
            ),
            Option(
                "drain_delay",
                "drain_delay",
                v.SECONDS_OR_ZERO,
                "Time a stopping server keeps serving, readiness answering 503, before its "
                "listeners close: what a load balancer needs to take it out.",
                see=(
                    "Behind a load balancer",
                    "management.md#behind-a-load-balancer-or-on-kubernetes",
                ),
            ),
        ),
    ),
    Group(
        "Ray (--ray)",
        (
            Option(
                "ray_pool_replicas",
                "ray_pool_replicas",
                v.integer(1),
                "Replicas of the pool that multiplexes the models loaded on demand.",
                see=_RAY,
            ),
            Option(
                "ray_models_per_replica",
                "ray_models_per_replica",
                v.integer(1),
                "Models one pool replica holds at most; past it, its least recently used one "
                "is evicted.",
                see=_RAY,
            ),
            Option(
                "ray_direct_routes",
                "ray_direct_routes",
                v.BOOLEAN,
                "TorchServe's prediction paths go from Ray's proxy straight to the model's "
                "replicas (a request a lost replica held gets Ray's 500); false: every request "
                "passes Ferry's router, which retries it.",
                see=_RAY_PATH,
            ),
            Option(
                "ray_handler_in_replica",
                "ray_handler_in_replica",
                v.BOOLEAN,
                "Each replica runs its model's handler on a thread of its own process instead "
                "of in a worker process (one hop less; a crash takes the replica down).",
                see=_RAY_PATH,
            ),
        ),
    ),
)
OPTIONS = tuple(option for group in GROUPS for option in group.options)
OPTIONS_BY_KEY = {option.key: option for option in OPTIONS}
