"""Server settings: the single source of truth for how Ferry runs.

``ferry.config.sources`` fills this model from flags, environment variables and
``config.properties``; nothing reads the environment at import time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ferry.config.image_limits import DEFAULT_IMAGE_FORMATS, DEFAULT_MAX_IMAGE_PIXELS
from ferry.errors import ConfigError

ENVELOPES = ("json", "body", "kserve", "kservev2")
"""TorchServe's request envelopes (``service_envelope``)."""

METRIC_TYPES = ("counter", "gauge", "histogram")
"""The metric types of a metrics_config file (TorchServe's ``MetricTypes`` values)."""


@dataclass(frozen=True)
class ModelMetric:
    """One model metric a metrics_config file declares (its ``model_metrics`` section):
    handlers get it with ``context.metrics.get_metric(name, metric_type)``, and its
    values take one value per dimension name, in this order."""

    name: str
    unit: str
    metric_type: str
    """``counter``, ``gauge`` or ``histogram``."""
    dimensions: tuple[str, ...] = ()


TORCHSERVE_MODEL_METRICS = (
    ModelMetric("HandlerTime", "ms", "gauge", ("ModelName", "Level")),
    ModelMetric("PredictionTime", "ms", "gauge", ("ModelName", "Level")),
)
"""The model metrics of TorchServe's default metrics.yaml: what handlers get without a
metrics_config."""


@dataclass(frozen=True)
class Address:
    """Where a listener binds: a host and port (port 0 asks the OS for a free one), or a
    Unix socket's path (``unix:/run/ferry.sock``, TorchServe's form)."""

    host: str
    port: int
    scheme: str = "http"
    """``http``, ``https`` or ``unix``."""
    path: str = ""
    """The socket file of a ``unix`` address."""

    @classmethod
    def parse(cls, text: str, *, key: str) -> Address:
        """Accept TorchServe's ``http(s)://host:port``, ``unix:/path`` or a bare
        ``host:port``."""
        if text.startswith("unix:"):
            path = text.removeprefix("unix:").removeprefix("//")
            if not path.startswith("/"):
                raise ConfigError(f"{key}: expected unix:/ABSOLUTE/PATH, got {text!r}")
            return cls("", 0, "unix", path)
        url = urlsplit(text if "://" in text else f"http://{text}")
        if url.scheme not in ("http", "https"):
            raise ConfigError(f"{key}: expected http://, https:// or unix:, got {text!r}")
        try:
            port = url.port
        except ValueError:
            port = None
        if url.hostname is None or port is None:
            raise ConfigError(f"{key}: expected http://HOST:PORT, got {text!r}")
        return cls(url.hostname, port, url.scheme)

    def url(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        """Reachable from this machine only (a Unix socket's file permissions decide who)."""
        return (
            self.scheme == "unix"
            or self.host in ("localhost", "::1")
            or self.host.startswith("127.")
        )


@dataclass(frozen=True)
class ServerSettings:
    """Everything the server needs to start. Each field's config.properties key, flag,
    environment variable and user-facing meaning are declared in ``ferry.config.options``."""

    inference_address: Address = field(default_factory=lambda: Address("127.0.0.1", 8080))
    """Inference API listener; loopback unless told otherwise."""
    management_address: Address = field(default_factory=lambda: Address("127.0.0.1", 8081))
    """Management API listener; loopback unless told otherwise."""
    metrics_address: Address = field(default_factory=lambda: Address("127.0.0.1", 8082))
    """Prometheus metrics listener; loopback unless told otherwise."""
    certificate_file: Path | None = None
    """TLS certificate (PEM) for https:// addresses."""
    private_key_file: Path | None = None
    """TLS private key (PEM) for https:// addresses."""

    enable_grpc: bool | None = None
    """TorchServe's gRPC APIs (``ferry.grpc``). Unset: on when grpcio is installed (the
    ``grpc`` extra), as TorchServe always starts them; false: off; true: required."""
    grpc_inference_address: str | None = None
    """Host the gRPC inference API binds (127.0.0.1 when unset); its port is
    ``grpc_inference_port``. Any grpc setting given asks for the gRPC APIs."""
    grpc_inference_port: int | None = None
    """Port of the gRPC inference API (7070 when unset; 0 picks a free one)."""
    grpc_management_address: str | None = None
    """Host the gRPC management API binds (127.0.0.1 when unset)."""
    grpc_management_port: int | None = None
    """Port of the gRPC management API (7071 when unset; 0 picks a free one)."""
    enable_grpc_ssl: bool = False
    """Serve both gRPC APIs over TLS with ``certificate_file`` and ``private_key_file``."""

    model_store: Path | None = None
    """Folder holding model archives."""
    models: tuple[str, ...] = ()
    """Models to load at start-up: ``all`` or ``NAME=FILE`` entries (TorchServe's load_models)."""
    model_overrides: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """TorchServe's ``models`` JSON: per model and version, minWorkers, batchSize, marName, ..."""

    default_workers_per_model: int = 0
    """Workers per model when the model does not say; 0 derives it from the devices."""
    job_queue_size: int = 100
    """Requests a model version may hold waiting; beyond it requests get 503 at once."""
    max_request_size: int = 6_553_500
    """Largest request body accepted, in bytes (413 beyond)."""
    max_tensor_elements: int | None = None
    """Most elements the tensors of one Open Inference Protocol request (REST or gRPC)
    may hold together, judged from their shapes before any is decoded (413 beyond, gRPC
    RESOURCE_EXHAUSTED). Each element becomes a Python object in the handler's lists, so
    this bounds what a request costs the worker once decoded. Unset: ``max_request_size``,
    one element per byte of the largest body, which binary BOOL or UINT8 data reaches."""
    max_response_size: int = 6_553_500
    """Largest response body a handler may return, in bytes (500 beyond)."""
    max_header_size: int = 65_536
    """Largest request head (request line and header fields), and separately the largest
    chunked trailer, in bytes (431 beyond)."""
    max_headers: int = 100
    """Most header fields in one request (431 beyond)."""
    header_timeout: float = 20.0
    """Seconds a request head may take from its first byte (or the connection's start)
    to its end (408 beyond; a connection that sent nothing is closed)."""
    body_read_timeout: float = 60.0
    """Seconds a pending request body may go without a byte arriving (408 beyond)."""
    default_response_timeout: float = 120.0
    """Seconds a worker may take for one batch before it is killed and replaced."""
    metric_time_interval: float = 60.0
    """Seconds between two sets of system metrics lines in ``ts_metrics.log`` (TorchServe's
    key and default)."""
    disable_system_metrics: bool = False
    """No system metrics lines in ``ts_metrics.log`` (TorchServe's key)."""
    drain_delay: float = 0.0
    """Seconds between a stop signal and the listeners closing. Meanwhile readiness
    (``/ping``, ``/ping/MODEL``, ``/v2/health/ready``) answers 503 ``Draining`` and every
    response closes its connection, while requests are still served: the time a load
    balancer's health checks need to take the replica out before it stops accepting."""
    stream_timeout: float = 600.0
    """Seconds a streamed answer (``send_intermediate_predict_response``) may take in
    all: each part restarts responseTimeout, so without it a handler that never stops
    streaming holds its worker forever. Past it the worker is replaced and the stream ends
    with a 504 error chunk. 0 turns the bound off."""
    cancel_grace: float = 5.0
    """Seconds a worker has to stop a batch whose clients all hung up while it streamed
    (its next part raises ``RequestCancelled`` in the handler); past it the worker is
    replaced."""
    number_of_gpu: int | None = None
    """Use at most this many GPUs (all visible ones when unset)."""
    default_batch_size: int = 1
    default_max_batch_delay_ms: float = 100.0

    max_workers_total: int = 0
    """Worker processes of all models together; more is refused at start-up (exit 2),
    registration and scaling (400). 0 derives it: ``default_max_workers_total``."""
    share_worker_processes: str = "auto"
    """Which models without a ``processGroup`` share worker processes (the group
    ``shared``): ``auto``, those that would take the server past ``max_workers_total``
    in processes of their own (at start-up, all of them then); ``always``, every one;
    ``never``, none (past the limit is refused)."""
    load_models_on_demand: bool = False
    """Models without ``loadOnDemand`` in their model-config.yaml load on their first
    request, and may be evicted under the memory budgets."""
    model_memory_budget_mb: int = 0
    """Host memory the resident models may take together (what each measured at its
    load); past it, idle on-demand models are evicted, least recently used first. 0: no
    budget."""
    gpu_memory_budget_mb: int = 0
    """The same, per GPU (GPU memory torch holds for the models). 0: no budget."""
    ray_pool_replicas: int = 1
    """``--ray``: replicas of the pool that multiplexes the models loaded on demand."""
    ray_models_per_replica: int = 8
    """``--ray``: models one pool replica holds at most (Ray's
    ``max_num_models_per_replica``); past it, its least recently used one is evicted."""
    ray_handler_in_replica: bool = False
    """``--ray``: each replica runs its model's handler on a thread of its own process
    instead of in a worker process of its own (one process hop less; a crash or a hung
    handler takes the replica down, and Ray starts another)."""
    ray_direct_routes: bool = True
    """``--ray``: TorchServe's prediction paths go from Ray's ingress straight to the
    model's replicas (one hop less; a request a lost replica held is answered 500 by Ray
    instead of retried). False: every request passes Ferry's router, which retries it."""
    max_unpacked_size: int = 4 << 30
    """Largest size, in bytes, an archive may unpack to; a larger one is refused."""
    limit_max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    """Largest width * height the built-in vision handlers decode, judged from the image
    header (400 beyond). TorchServe's ``true`` is the default; ``false`` (None) turns
    Ferry's check off, leaving PIL's own decompression-bomb limit."""
    allowed_image_formats: tuple[str, ...] = DEFAULT_IMAGE_FORMATS
    """Image formats (PIL's names) the built-in vision handlers decode; others get 400."""

    enable_metrics_api: bool = True
    """Collect metrics and serve them on ``metrics_address``."""
    model_metrics: tuple[ModelMetric, ...] = TORCHSERVE_MODEL_METRICS
    """The model metrics handlers find declared (``get_metric``), read from the
    ``model_metrics`` section of TorchServe's metrics.yaml named by ``metrics_config``;
    TorchServe's default ones (``HandlerTime``, ``PredictionTime``) without it."""
    max_handler_metric_series: int = 2000
    """Series one handler metric may have (all models together): a value with new
    dimension values beyond it is dropped, counted in
    ``ferry_handler_metric_values_dropped_total`` and warned about once per metric, so a
    handler that puts a request's data in a dimension cannot grow the scrape without end."""

    allowed_urls: tuple[str, ...] = ()
    """Regular expressions a remote archive URL must match in full; none by default."""
    enable_model_api: bool = False
    """Allow registering and unregistering models through the management API."""
    workflow_store: Path | None = None
    """Where ``.war`` workflow archives are found (the model store when None)."""
    service_envelope: str = ""
    """TorchServe's request envelope for every model (``json``, ``body``, ``kserve``,
    ``kservev2``), applied in the workers around each handler; empty: none."""
    install_py_dep_per_model: bool = False
    """pip-install each archive's requirements file for its workers (``ferry.store.packages``).
    ``allowed_urls`` does not restrict pip: the file can name any index, URL or repository
    unless ``pip_index_url`` or ``pip_find_links`` is set."""
    pip_index_url: str | None = None
    """The only package index pip may use for archives' requirements (``--index-url``). Set
    (or ``pip_find_links`` set), a requirements file that names its own index, links,
    trusted host, URL or VCS requirement is refused (400 ``ModelException``) before pip
    runs (``ferry.store.pip_sources``). Unset: no restriction, as in TorchServe."""
    pip_find_links: Path | None = None
    """A folder of wheels and sdists pip may install archives' requirements from
    (``--find-links``); without ``pip_index_url`` pip then uses no index at all
    (``--no-index``). Restricts requirements files as ``pip_index_url`` does."""
    disable_token_authorization: bool = False
    """Turn token authorization off (it is on for management, and for inference beyond loopback)."""
    key_file: Path = Path("key_file.json")
    """Where the API tokens are kept, readable by the owner only: reused when it exists,
    written (once every listener is bound) when it does not."""
    management_key: str | None = field(default=None, repr=False)
    """The management API key; when unset, the key file's (or a new one written there)."""
    inference_key: str | None = field(default=None, repr=False)
    """The inference API key; when unset, the key file's (or a new one written there)."""
    enable_envvars_config: bool = False
    """Also read TorchServe's ``TS_*`` environment variables."""

    cors_allowed_origin: tuple[str, ...] = ()
    """Origins (``*`` for any) whose browser pages may call every API; none turns CORS off."""
    cors_allowed_methods: tuple[str, ...] = ()
    """Methods a CORS preflight may ask for (TorchServe: ``GET, POST, PUT, OPTIONS``);
    none refuses every preflight."""
    cors_allowed_headers: tuple[str, ...] = ()
    """Request headers a CORS preflight may ask for (``*`` for any)."""

    access_log: bool = True
    """One log line per inference request (logger ``ferry.access``)."""
    cpu_pinning: bool = False
    """Bind each worker's torch threads to cores no other worker of this server holds
    (``ferry.worker_handles.core_allocation``); off because two servers on one machine would pin to
    the same cores."""
    spare_worker_for_compiled_models: bool = True
    """While a model that compiles as it loads (``optimization: compile``, TorchServe's
    ``pt2``) is served, keep one worker process started ahead, torch's compiler imported
    (``ferry.worker_handles.spares``): its next worker (a restart, a scale-up) starts in
    it. One per GPU (and one for the CPU), not per model; unpinned workers only."""
    log_format: str = "plain"
    """``plain`` or ``json`` log lines."""
    enable_tracing: bool = False
    """OpenTelemetry spans of every request and batch (``ferry.tracing``; the ``otel``
    extra), configured by the ``OTEL_*`` environment variables."""
    log_level: str = "INFO"
    log_location: Path | None = None
    """Folder for TorchServe's log files (``ts_log.log``, ``access_log.log``,
    ``model_log.log``, ``model_metrics.log``) instead of stderr; ``ferry serve --start``
    uses ``logs`` when unset."""
    config_snapshots: bool = True
    """Keep model snapshots in ``<log_location>/config/`` and restore the latest at a start
    without ``--models`` (``ferry.service.snapshots``); none without ``log_location``. ``--ncs``
    turns them off."""
    ready_file: Path | None = None
    """If set, a JSON file with the bound addresses is written here once models are loaded."""

    @property
    def tensor_element_limit(self) -> int:
        """``max_tensor_elements``, or its default."""
        return self.max_tensor_elements or self.max_request_size

    @property
    def grpc_inference_endpoint(self) -> Address:
        """Where the gRPC inference API listens (``grpc://`` or, with TLS, ``grpcs://``)."""
        host = self.grpc_inference_address or "127.0.0.1"
        port = 7070 if self.grpc_inference_port is None else self.grpc_inference_port
        return Address(host, port, "grpcs" if self.enable_grpc_ssl else "grpc")

    @property
    def grpc_management_endpoint(self) -> Address:
        """Where the gRPC management API listens."""
        host = self.grpc_management_address or "127.0.0.1"
        port = 7071 if self.grpc_management_port is None else self.grpc_management_port
        return Address(host, port, "grpcs" if self.enable_grpc_ssl else "grpc")

    @property
    def grpc_requested(self) -> bool:
        """Whether a setting asks for the gRPC APIs, so that they must start."""
        return bool(self.enable_grpc) or any(
            value is not None
            for value in (
                self.grpc_inference_address,
                self.grpc_inference_port,
                self.grpc_management_address,
                self.grpc_management_port,
            )
        )


def usable_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity, e.g. in containers), else every CPU."""
    try:
        return frozenset(os.sched_getaffinity(0)) or frozenset({0})
    except AttributeError:  # not Linux
        return frozenset(range(max(1, os.cpu_count() or 1)))


def available_cores() -> int:
    """Cores this process may run on (respects CPU affinity, e.g. in containers)."""
    return len(usable_cpus())


def default_workers_per_model(cores: int, gpus: int) -> int:
    """One worker per GPU; on CPU one worker, since torch already uses every core."""
    return gpus if gpus > 0 else 1


def default_max_workers_total(cores: int) -> int:
    """Twice the cores, at least 8: room for a few models, not for thousands of workers."""
    return max(8, 2 * cores)


def threads_per_worker(cores: int, workers: int) -> int:
    """Split the cores between a model's workers so they do not oversubscribe the CPU."""
    return max(1, cores // max(1, workers))
