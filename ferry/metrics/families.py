"""Every metric family Ferry exposes, each declared once: name, help, type, labels and
buckets in one place. ``FerryMetrics`` (``ferry.metrics.definitions``) records into them.

TorchServe's Prometheus metrics keep their names and labels, so existing dashboards and
checks work: the three ``ts_*`` counters and the unprefixed ones of TorchServe's default
metrics.yaml (``Requests2XX``, ``QueueTime``, ``CPUUtilization``, ``PredictionTime`` ...),
whose dimensions are capitalised (``Level``, ``Hostname``). Ferry's own are prefixed ``ferry_``.
"""

from __future__ import annotations

from ferry.metrics.prometheus import Family

LATENCY_BUCKETS = tuple(float(f"{10 ** (exponent / 6 - 4):.3g}") for exponent in range(34))
"""100 µs to 31.6 s, six buckets a decade (each bound ~1.47x the last): a percentile
interpolated within one is off by far less than with Prometheus' 1-2.5-5 defaults, which
made ``ferry bench load``'s server-side p99 exceed the slowest answer it saw."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TS_HISTOGRAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
"""The buckets of TorchServe's handler histograms (its Java Prometheus client's defaults),
so a query of ``le="2.5"`` finds the same bucket on both servers."""
MODEL = ("model_name", "model_version")
TS_COUNTER = (*MODEL, "hostname")
TS_HOST = ("Level", "Hostname")
TS_MODEL = ("ModelName", "Level", "Hostname")
TS_GPU = ("Level", "DeviceId", "Hostname")

_TORCHSERVE = (
    ("Requests2XX", "counter", TS_HOST, "Inference responses with a 2xx status."),
    ("Requests4XX", "counter", TS_HOST, "Inference responses with a 4xx status."),
    ("Requests5XX", "counter", TS_HOST, "Inference responses with a 5xx status."),
    ("QueueTime", "gauge", TS_HOST, "Queue time of the latest dispatched request, ms."),
    (
        "WorkerThreadTime",
        "gauge",
        TS_HOST,
        "Latest batch's round trip to its worker less the worker's own time, ms.",
    ),
    ("WorkerLoadTime", "gauge", ("WorkerName", *TS_HOST), "Worker start-up time, ms."),
    ("CPUUtilization", "gauge", TS_HOST, "Host CPU use since the last scrape, %."),
    ("MemoryUsed", "gauge", TS_HOST, "Host memory in use, MB."),
    ("MemoryAvailable", "gauge", TS_HOST, "Host memory available, MB."),
    ("MemoryUtilization", "gauge", TS_HOST, "Host memory in use, %."),
    ("DiskUsage", "gauge", TS_HOST, "Disk space used on /, GB."),
    ("DiskAvailable", "gauge", TS_HOST, "Disk space free on /, GB."),
    ("DiskUtilization", "gauge", TS_HOST, "Disk space used on /, %."),
    ("GPUMemoryUtilization", "gauge", TS_GPU, "GPU memory in use (NVML), %."),
    ("GPUMemoryUsed", "gauge", TS_GPU, "GPU memory in use (NVML), MB."),
    ("GPUUtilization", "gauge", TS_GPU, "GPU utilisation (NVML), %."),
    ("HandlerTime", "gauge", TS_MODEL, "Handler time of the latest batch, ms."),
    ("PredictionTime", "gauge", TS_MODEL, "Worker time of the latest batch, ms."),
)
"""TorchServe's default frontend and model metrics (its metrics.yaml): name, type, labels,
help."""


def torchserve_families() -> dict[str, Family]:
    """A fresh family of each of ``_TORCHSERVE``, by name."""
    return {
        name: Family(name, text, kind, labels, java_style=True)
        for name, kind, labels, text in _TORCHSERVE
    }


class MetricFamilies:
    """Ferry's own families, then TorchServe's by name (``torchserve``). Each is declared
    once, below, in the order the scrape lists them; ``own_families`` derives that list."""

    def __init__(self) -> None:
        self.requests_total = Family(
            "ts_inference_requests_total", "Inference requests received.", "counter", TS_COUNTER
        )
        self.inference_latency = Family(
            "ts_inference_latency_microseconds",
            "Cumulative inference latency.",
            "counter",
            TS_COUNTER,
        )
        self.queue_latency = Family(
            "ts_queue_latency_microseconds",
            "Cumulative time requests spent queued.",
            "counter",
            TS_COUNTER,
        )
        self.request_seconds = Family(
            "ferry_request_duration_seconds",
            "End-to-end latency of inference requests.",
            "histogram",
            MODEL,
            LATENCY_BUCKETS,
        )
        self.queue_seconds = Family(
            "ferry_queue_wait_seconds",
            "Time from arrival to dispatch to a worker.",
            "histogram",
            MODEL,
            LATENCY_BUCKETS,
        )
        self.batch_size = Family(
            "ferry_batch_size",
            "Requests per batch sent to a worker.",
            "histogram",
            MODEL,
            BATCH_BUCKETS,
        )
        self.stage_seconds = Family(
            "ferry_batch_stage_seconds",
            "Handler stage time per batch (preprocess, inference, "
            "postprocess; handle for handlers without stages).",
            "histogram",
            (*MODEL, "stage"),
            LATENCY_BUCKETS,
        )
        self.queue_depth = Family(
            "ferry_queue_depth", "Requests waiting in the model's queue.", "gauge", MODEL
        )
        self.workers = Family("ferry_workers", "Workers by state.", "gauge", (*MODEL, "state"))
        self.worker_restarts = Family(
            "ferry_worker_restarts_total",
            "Worker processes replaced after a crash or hang.",
            "counter",
            MODEL,
        )
        self.worker_recycles = Family(
            "ferry_worker_recycles_total",
            "Workers replaced on reaching their request or memory limit (recycle settings).",
            "counter",
            MODEL,
        )
        self.model_loads = Family(
            "ferry_model_loads_total",
            "Loads of a model registered to load on demand (loadOnDemand).",
            "counter",
            MODEL,
        )
        self.model_load_seconds = Family(
            "ferry_model_load_seconds",
            "Time an on-demand load took, from its first request to its workers ready.",
            "histogram",
            MODEL,
            LATENCY_BUCKETS,
        )
        self.model_evictions = Family(
            "ferry_model_evictions_total",
            "On-demand models evicted to keep the resident models within the memory budget.",
            "counter",
            MODEL,
        )
        self.model_resident = Family(
            "ferry_model_resident",
            "1 while the model has workers (0: it loads on its next request).",
            "gauge",
            MODEL,
        )
        self.model_memory = Family(
            "ferry_model_memory_bytes",
            "Memory its workers measured at their load, by device (host, cuda:N).",
            "gauge",
            (*MODEL, "device"),
        )
        self.budget_exceeded = Family(
            "ferry_memory_budget_exceeded_total",
            "Loads that took the resident models past a memory budget, nothing idle being "
            "left to evict.",
            "counter",
            (),
        )
        self.trace_spans_dropped = Family(
            "ferry_trace_spans_dropped_total",
            "Spans dropped, the exporter being slow, failing or unreachable (enable_tracing).",
            "counter",
            (),
        )
        self.requests_abandoned = Family(
            "ferry_requests_abandoned_total",
            "Requests dropped before reaching a worker because their client hung up.",
            "counter",
            MODEL,
        )
        self.batch_dispatches = Family(
            "ferry_batch_dispatch_total",
            "Batches handed to workers, by why the batch policy let each go: full, "
            "delay_bound, idle_worker, cost_model, deadline, window.",
            "counter",
            (*MODEL, "reason"),
        )
        self.request_outcomes = Family(
            "ferry_requests_total",
            "Inference requests by how they ended: ok, or the error's kind (WorkerDied, "
            "DeadlineExceeded, HandlerFailed, Cancelled when the client went away, ...).",
            "counter",
            (*MODEL, "outcome"),
        )
        self.requests_shed = Family(
            "ferry_requests_shed_total",
            "Requests answered DeadlineExceeded because their deadline could not be met.",
            "counter",
            MODEL,
        )
        self.requests_delayed = Family(
            "ferry_requests_delayed_total",
            "Requests that missed their deadline and were kept, behind every request "
            "still on time (deadlineAction: delay).",
            "counter",
            MODEL,
        )
        self.responses = Family(
            "ferry_responses_total",
            "Responses by API and status class.",
            "counter",
            ("api", "status_class"),
        )
        self.process_cpu = Family(
            "ferry_process_cpu_seconds_total",
            "CPU time of the frontend and each worker.",
            "counter",
            ("process",),
        )
        self.process_memory = Family(
            "ferry_process_resident_memory_bytes",
            "Resident memory of the frontend and each worker.",
            "gauge",
            ("process",),
        )
        self.gpu_memory = Family(
            "ferry_gpu_memory_used_bytes", "GPU memory in use (NVML).", "gauge", ("gpu",)
        )
        self.gpu_utilization = Family(
            "ferry_gpu_utilization_percent", "GPU utilisation (NVML).", "gauge", ("gpu",)
        )
        self.handler_values_dropped = Family(
            "ferry_handler_metric_values_dropped_total",
            "Handler metric values dropped: series_limit, their metric had "
            "max_handler_metric_series series already; dimensions, other dimension "
            "names than the metric's first values.",
            "counter",
            (*MODEL, "reason"),
        )
        self.torchserve = torchserve_families()

    def own_families(self) -> list[Family]:
        """Every family declared here, in the order declared: an attribute that is a
        ``Family`` is one (handlers' metrics are kept apart, in a dict)."""
        declared = [value for value in vars(self).values() if isinstance(value, Family)]
        return [*declared, *self.torchserve.values()]
