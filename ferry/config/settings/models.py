"""Settings of the models served and their workers: stores and packages, workers and
batching, many models and memory, Ray.

Each field is one setting, declared once (``ferry.config.settings.declare``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferry.config import values as v
from ferry.config.settings.declare import setting, setting_factory
from ferry.config.settings.operations import RESOURCE_LIMITS

_PACKAGES = ("Per-model packages", "configuration.md#per-model-packages")
_MANY = ("Many models on one machine", "many-models.md")
_ON_DEMAND = ("Load on demand", "many-models.md#load-on-demand-evict-under-a-budget")
_RAY = ("Ferry on a Ray cluster", "ray.md")
_RAY_PATH = ("Ferry on a Ray cluster", "ray.md#the-path-of-a-request")
_STREAMING = ("Streaming", "handlers.md#streaming")


@dataclass(frozen=True)
class ModelStoreSettings:
    """Which models are served, from where, and with which packages."""

    model_store: Path | None = setting(
        None,
        v.PATH,
        "Folder of model archives (symbolic links in it are followed; `..` is refused).",
        default_note="none",
    )
    models: tuple[str, ...] = setting(
        (),
        v.LIST,
        "Models to load at start-up: `all`, or `NAME=ARCHIVE` / `ARCHIVE` entries; one "
        "missing from the store stops start-up (exit 2) naming it, where TorchServe logs it "
        "and starts without it.",
        key="load_models",
        flag="--models",
        default_note="the latest snapshot's, when no config file is given",
    )
    model_overrides: dict[str, dict[str, dict[str, Any]]] = setting_factory(
        dict,
        v.MODELS_JSON,
        "TorchServe's per-version JSON (`minWorkers`, `maxWorkers`, `batchSize`, "
        "`maxBatchDelay`, `responseTimeout`, `defaultVersion`, `marName`); it wins over "
        "model-config.yaml, except an archive's own `minWorkers`/`maxWorkers`.",
        key="models",
        flag="--models-config",
        default_note="none",
    )
    workflow_store: Path | None = setting(
        None,
        v.PATH,
        "Where `.war` workflow archives are found.",
        default_note="the model store",
        see=("Workflows", "workflows.md"),
    )
    service_envelope: str = setting(
        "",
        v.ENVELOPE,
        "TorchServe's request envelope for every model, applied in the workers around each "
        "handler.",
        default_note="none",
    )
    install_py_dep_per_model: bool = setting(
        False,
        v.BOOLEAN,
        "pip-install each archive's requirements file for its workers (pip runs the code it "
        "downloads).",
        see=_PACKAGES,
    )
    """``ferry.store.packages``. ``allowed_urls`` does not restrict pip: unless
    ``pip_index_url`` or ``pip_find_links`` is set, the file can name any index, URL or
    repository."""
    pip_index_url: str | None = setting(
        None,
        v.INDEX_URL,
        "The only package index pip may use for archives' requirements (`--index-url`); "
        "requirements files naming other sources are refused.",
        default_note="no restriction",
        see=_PACKAGES,
    )
    """Set (or ``pip_find_links`` set), a requirements file that names its own index,
    links, trusted host, URL or VCS requirement is refused (400 ``ModelException``) before pip
    runs (``ferry.store.pip_sources``)."""
    pip_find_links: Path | None = setting(
        None,
        v.PATH,
        "A folder of wheels pip may install archives' requirements from (`--find-links`; "
        "alone, with `--no-index`).",
        default_note="no restriction",
        see=_PACKAGES,
    )
    config_snapshots: bool = setting(
        True,
        v.BOOLEAN,
        "Keep model snapshots in `<log_location>/config/` and restore the latest at a start "
        "without `--models` or a config file (`--ncs` turns them off).",
        see=("Model snapshots", "management.md#model-snapshots"),
    )
    """``ferry.service.snapshots``; none are kept without ``log_location``."""


@dataclass(frozen=True)
class WorkerSettings:
    """A model's workers and batches when its own configuration does not say."""

    default_workers_per_model: int = setting(
        0,
        v.integer(0),
        "Workers per model when the model does not say.",
        default_note="one per GPU the model runs on, else one",
    )
    """0 derives it: ``default_workers_per_model()``."""
    default_batch_size: int = setting(
        1, v.integer(1), "Batch size when the model's `batchSize` does not say."
    )
    default_max_batch_delay_ms: float = setting(
        100.0,
        v.MILLISECONDS,
        "Longest wait to fill a batch when the model's `maxBatchDelay` does not say.",
        key="default_max_batch_delay",
    )
    job_queue_size: int = setting(
        100,
        v.integer(1),
        "Requests a model version may hold waiting; beyond it requests get 503 at once (a "
        "model-config.yaml `jobQueueSize` wins).",
    )
    default_response_timeout: float = setting(
        120.0, v.SECONDS, "Time a worker may take for one batch before it is replaced (504)."
    )
    stream_timeout: float = setting(
        600.0,
        v.SECONDS_OR_ZERO,
        "Time a streamed answer may take in all before its worker is replaced; 0: no bound.",
        see=_STREAMING,
    )
    """Each part restarts responseTimeout, so without this bound a handler that never
    stops streaming would hold its worker forever; past it the stream ends with a 504 error
    chunk."""
    cancel_grace: float = setting(
        5.0,
        v.SECONDS,
        "Time a worker has to stop streaming once all its clients hung up, before it is replaced.",
        see=_STREAMING,
    )
    """The handler learns of it when its next part raises ``RequestCancelled``."""
    number_of_gpu: int | None = setting(
        None,
        v.integer(0),
        "Use at most this many GPUs; each GPU worker sees only its own. A model whose "
        "weights do not fit its GPU's free memory (NVML) is refused.",
        default_note="all visible",
    )
    cpu_pinning: bool = setting(
        False,
        v.BOOLEAN,
        "Bind each worker's torch threads to cores no other worker of this server holds "
        "(off: two servers on one machine would pin to the same cores).",
        see=("Lone requests on CPU", "architecture.md#lone-requests-on-cpu-torchs-helper-threads"),
    )
    """``ferry.worker_handles.core_allocation``."""
    spare_worker_for_compiled_models: bool = setting(
        True,
        v.BOOLEAN,
        "While a model that compiles as it loads (`optimization: compile`, `pt2`) is "
        "served, keep one worker process waiting with torch's compiler imported (about 340 "
        "MB; one per GPU and one for the CPU), so its next worker starts sooner.",
        see=("Model formats", "handlers.md#model-formats-compiled-once"),
    )
    """``ferry.worker_handles.spares``: the next worker (a restart, a scale-up) starts in
    the spare. Unpinned workers only."""
    fork_workers: bool = setting(
        True,
        v.BOOLEAN,
        "Start CPU workers by forking them from one process that has imported torch: "
        "milliseconds and about 20 MB of their own each, against about 2.5 s and 155 MB for "
        "a process started afresh. Workers pinned to cores, on a GPU, or of a model with "
        "packages of its own always start afresh.",
        see=("One copy of the weights", "architecture.md#one-copy-of-the-weights"),
    )
    """``ferry.worker.forks``, ``ferry.worker_handles.fork_server``."""


@dataclass(frozen=True)
class ManyModelSettings:
    """Many models on one machine: workers of all models together, shared processes,
    loading on demand under memory budgets."""

    max_workers_total: int = setting(
        0,
        v.integer(0),
        "Worker processes of all models together; more is refused at start-up, registration "
        "and scaling.",
        default_note="twice the cores, at least 8",
        see=RESOURCE_LIMITS,
    )
    """More is refused with exit 2 at start-up and 400 at registration and scaling;
    0 derives it: ``default_max_workers_total()``."""
    share_worker_processes: str = setting(
        "auto",
        v.choice("auto", "always", "never"),
        "Which models without a `processGroup` share worker processes: `auto`, those past "
        "`max_workers_total`; `always`, every one; `never`, none.",
        see=_MANY,
    )
    """Shared ones join the group ``shared``; with ``auto``, at start-up all of them
    once the limit would be passed; with ``never``, past the limit is refused."""
    load_models_on_demand: bool = setting(
        False,
        v.BOOLEAN,
        "Models without `loadOnDemand` in their model-config.yaml load on their first "
        "request, and may be evicted under the memory budgets.",
        see=_ON_DEMAND,
    )
    model_memory_budget_mb: int = setting(
        0,
        v.MEGABYTES,
        "Host memory the resident models may take together; past it, idle on-demand models "
        "are evicted, least recently used first.",
        default_note="no budget",
        see=_ON_DEMAND,
    )
    """Each model counts what its workers measured at their load."""
    gpu_memory_budget_mb: int = setting(
        0,
        v.MEGABYTES,
        "The same, per GPU (GPU memory torch holds for the models).",
        default_note="no budget",
        see=_ON_DEMAND,
    )


@dataclass(frozen=True)
class RaySettings:
    """``ferry serve --ray``: how the models' replicas are laid out and reached."""

    ray_pool_replicas: int = setting(
        1,
        v.integer(1),
        "Replicas of the pool that multiplexes the models loaded on demand.",
        see=_RAY,
    )
    ray_models_per_replica: int = setting(
        8,
        v.integer(1),
        "Models one pool replica holds at most; past it, its least recently used one is evicted.",
        see=_RAY,
    )
    """Ray's ``max_num_models_per_replica``."""
    ray_direct_routes: bool = setting(
        True,
        v.BOOLEAN,
        "TorchServe's prediction paths go from Ray's proxy straight to the model's replicas "
        "(a request a lost replica held gets Ray's 500); false: every request passes "
        "Ferry's router, which retries it.",
        see=_RAY_PATH,
    )
    ray_handler_in_replica: bool = setting(
        False,
        v.BOOLEAN,
        "Each replica runs its model's handler on a thread of its own process instead of in "
        "a worker process (one hop less; a crash takes the replica down).",
        see=_RAY_PATH,
    )
    """A crash or a hung handler takes the replica down, and Ray starts another."""
