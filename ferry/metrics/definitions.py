"""The recording side of Ferry's metrics: ``FerryMetrics`` holds every family
(declared in ``ferry.metrics.families``) and the handlers' own, refreshes the scrape-time
ones, and hands out ``ModelMetrics``, one model version's series labelled once.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import socket
from collections.abc import Callable, Iterable, Sequence

from ferry.metrics.families import MODEL, TS_HISTOGRAM_BUCKETS, MetricFamilies
from ferry.metrics.gpu import GpuReading
from ferry.metrics.prometheus import (
    Child,
    Counter,
    Family,
    Gauge,
    label_name,
    metric_name,
    render,
)
from ferry.procinfo import cpu_jiffies, cpu_seconds, memory_bytes, resident_bytes

MB, GB = 2**20, 2**30

log = logging.getLogger("ferry.metrics")

HANDLER_KINDS = ("counter", "gauge", "histogram")


def _handler_labels(dimensions: Sequence[str], kind: str) -> tuple[str, ...]:
    """TorchServe's labels of a handler metric: each dimension as a valid label name that
    repeats none, then ``Hostname`` (a dimension of that name, or a histogram's ``le``,
    becomes ``dim_...``)."""
    reserved = {"Hostname", "le"} if kind == "histogram" else {"Hostname"}
    labels: list[str] = []
    for dimension in dimensions:
        label = label_name(dimension)
        while label in labels or label in reserved:
            label = f"dim_{label}"
        labels.append(label)
    return (*labels, "Hostname")


def _record(child: Child, value: float) -> None:
    """``value`` into a handler series as its family's type takes it (as TorchServe, whose
    metric keeps the type it was first declared or recorded with): counters add up (never
    down), gauges keep the latest value, histograms observe it."""
    if isinstance(child, Counter):
        if value >= 0:
            child.inc(value)
    elif isinstance(child, Gauge):
        child.set(value)
    else:
        child.observe(value)


class FerryMetrics(MetricFamilies):
    """Every metric family (``MetricFamilies``), handlers' own included, and what records
    into them."""

    def __init__(
        self,
        *,
        enabled: bool = True,
        hostname: str | None = None,
        max_handler_series: int = 2000,  # ServerSettings.max_handler_metric_series
    ) -> None:
        self.enabled = enabled
        self.max_handler_series = max_handler_series
        self.hostname = hostname or socket.gethostname()
        super().__init__()
        self.handler_metrics: dict[str, Family] = {}
        # Which model versions write each handler series: it has no model label, so two
        # models can share one, and unloading one leaves it to the other.
        self._handler_owners: dict[tuple[str, tuple[str, ...]], set[tuple[str, str]]] = {}
        self._refused: set[str] = set()
        self._full: set[str] = set()  # handler metrics warned about at max_handler_series
        self._cpu_before = (0, 0)

    def _host(self, name: str) -> Gauge:
        return self.torchserve[name].gauge(*self.host_labels)

    def families(self) -> list[Family]:
        return [*self.own_families(), *self.handler_metrics.values()]

    def handler_family(
        self, name: str, kind: str, dimensions: Sequence[str], unit: str = ""
    ) -> Family | None:
        """The family for a handler's metric, its name and labels made valid: TorchServe's
        type (``counter``, ``gauge`` or ``histogram``; anything else a gauge) and labels
        (its dimensions and ``Hostname``), both fixed by the metric's first value. A name
        that would collide with Ferry's own metrics gets ``handler_`` in front; a metric
        seen before with other dimensions is refused (None), once with a warning."""
        metric = metric_name(name)
        if metric in self._reserved_names():
            metric = f"handler_{metric}"
        family = self.handler_metrics.get(metric)
        if family is None:
            kind = kind if kind in HANDLER_KINDS else "gauge"
            family = Family(
                metric,
                f"Handler {kind} metric {name}, unit: {unit}.",
                kind,
                _handler_labels(dimensions, kind),
                TS_HISTOGRAM_BUCKETS if kind == "histogram" else (),
                java_style=True,
            )
            self.handler_metrics[metric] = family
        elif family.label_names != _handler_labels(dimensions, family.kind):
            if metric not in self._refused:
                self._refused.add(metric)
                log.warning(
                    "handler metric %s: dimensions %s differ from the first ones %s; "
                    "values with these dimensions are dropped",
                    name,
                    list(dimensions),
                    list(family.label_names[:-1]),
                )
            return None
        return family

    def handler_series(
        self, family: Family, values: tuple[str, ...], owner: tuple[str, str]
    ) -> Child | None:
        """The series of a handler's metric for ``values`` (``Hostname``'s last), written by
        the model version ``owner``; None, counted and warned about once per metric, for a
        new one beyond max_handler_series.

        The cap is per metric: one flooded metric loses only its own new series."""
        if values not in family.children and len(family.children) >= self.max_handler_series:
            self.handler_values_dropped.counter(*owner, "series_limit").inc()
            if family.name not in self._full:
                self._full.add(family.name)
                log.warning(
                    "handler metric %s: %d series (max_handler_metric_series); values with "
                    "new dimension values are dropped (ferry_handler_metric_values_dropped_total)",
                    family.name,
                    len(family.children),
                )
            return None
        self._handler_owners.setdefault((family.name, values), set()).add(owner)
        return family.labels(*values)

    def _reserved_names(self) -> set[str]:
        names = set()
        for family in self.own_families():
            names.add(family.name)
            if family.kind == "histogram":
                names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        return names

    def for_model(self, name: str, version: str) -> ModelMetrics:
        return ModelMetrics(self, name, version)

    def forget_model(self, name: str, version: str) -> None:
        """Drop an unloaded version's series: those labelled with it, TorchServe's of its
        name, and the handler series no other loaded version writes."""
        for family in self.own_families():
            if family.label_names[:2] == MODEL:
                family.remove_matching((name, version))
            elif family.label_names[:1] == ("ModelName",):  # TorchServe's: no version label
                family.remove_matching((name,))
        for (metric, values), owners in list(self._handler_owners.items()):
            owners.discard((name, version))
            if not owners:
                del self._handler_owners[(metric, values)]
                self.handler_metrics[metric].children.pop(values, None)

    def response_recorder(self, api: str) -> Callable[[int], None]:
        """Counts one API's responses by status class (does nothing when disabled)."""
        if not self.enabled:
            return lambda status: None
        by_class = {n: [self.responses.counter(api, f"{n}xx")] for n in range(1, 6)}
        if api == "inference":  # TorchServe's RequestsNXX, as its postman checks expect
            for n in (2, 4, 5):
                by_class[n].append(self.torchserve[f"Requests{n}XX"].counter(*self.host_labels))

        def record(status: int) -> None:
            for counter in by_class[status // 100]:
                counter.value += 1

        return record

    def record_processes(self, worker_pids: Iterable[tuple[str, int]]) -> None:
        """Refresh CPU and memory gauges at scrape time."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.process_cpu.remove_matching(())
        self.process_memory.remove_matching(())
        self.process_cpu.counter("frontend").value = usage.ru_utime + usage.ru_stime
        self.process_memory.gauge("frontend").set(resident_bytes(os.getpid()))
        for label, pid in worker_pids:
            self.process_cpu.counter(label).value = cpu_seconds(pid)
            self.process_memory.gauge(label).set(resident_bytes(pid))

    def record_gpus(self, readings: Iterable[GpuReading]) -> None:
        for reading in readings:
            self.gpu_memory.gauge(str(reading.index)).set(reading.memory_used_bytes)
            self.gpu_utilization.gauge(str(reading.index)).set(reading.utilization_percent)
            labels = ("Host", str(reading.index), self.hostname)
            used, total = reading.memory_used_bytes, reading.memory_total_bytes
            self.torchserve["GPUMemoryUsed"].gauge(*labels).set(used / MB)
            self.torchserve["GPUMemoryUtilization"].gauge(*labels).set(_percent(used, total))
            self.torchserve["GPUUtilization"].gauge(*labels).set(reading.utilization_percent)

    def record_host(self, disk_path: str = "/") -> None:
        """Refresh TorchServe's host gauges at scrape time: CPU use since the last scrape
        (since boot on the first), memory, and the disk holding ``disk_path``."""
        if not self.enabled:
            return
        busy, total = cpu_jiffies()
        if total > self._cpu_before[1]:
            cpu = _percent(busy - self._cpu_before[0], total - self._cpu_before[1])
            self._host("CPUUtilization").set(cpu)
            self._cpu_before = (busy, total)
        memory_total, available = memory_bytes()
        self._host("MemoryUsed").set((memory_total - available) / MB)
        self._host("MemoryAvailable").set(available / MB)
        self._host("MemoryUtilization").set(_percent(memory_total - available, memory_total))
        try:
            disk = shutil.disk_usage(disk_path)
        except OSError:
            return
        self._host("DiskUsage").set(disk.used / GB)
        self._host("DiskAvailable").set(disk.free / GB)
        self._host("DiskUtilization").set(_percent(disk.used, disk.used + disk.free))

    def exposition(self) -> str:
        return render(self.families())

    @property
    def host_labels(self) -> tuple[str, str]:
        return ("Host", self.hostname)


def _percent(part: float, whole: float) -> float:
    return round(100 * part / whole, 2) if whole > 0 else 0.0


class ModelMetrics:
    """The metrics of one model version, labelled once."""

    def __init__(self, metrics: FerryMetrics, name: str, version: str) -> None:
        self.metrics = metrics
        self.enabled = metrics.enabled
        self.labels = (name, version)
        ts_labels = (name, version, metrics.hostname)
        self._requests = metrics.requests_total.counter(*ts_labels)
        self._latency_us = metrics.inference_latency.counter(*ts_labels)
        self._queue_us = metrics.queue_latency.counter(*ts_labels)
        self._request_seconds = metrics.request_seconds.histogram(*self.labels)
        self._queue_seconds = metrics.queue_seconds.histogram(*self.labels)
        self._batch_size = metrics.batch_size.histogram(*self.labels)
        self._restarts = metrics.worker_restarts.counter(*self.labels)
        self._recycles = metrics.worker_recycles.counter(*self.labels)
        self._abandoned = metrics.requests_abandoned.counter(*self.labels)
        # Present from the start (at 0), so a dashboard's rate of them is 0, not empty.
        metrics.requests_shed.counter(*self.labels)
        metrics.requests_delayed.counter(*self.labels)
        self._outcomes = {"ok": metrics.request_outcomes.counter(*self.labels, "ok")}
        self._handler_children: dict[tuple[object, ...], Child] = {}
        self._queue_time = metrics.torchserve["QueueTime"].gauge(*metrics.host_labels)
        self._worker_thread_time = metrics.torchserve["WorkerThreadTime"].gauge(
            *metrics.host_labels
        )
        # Looked up at each use: unloading another version of this model forgets them.
        self._ts_model = (name, "Model", metrics.hostname)

    def request_done(self, seconds: float, queued_seconds: float) -> None:
        if self.enabled:
            self._requests.inc()
            self._latency_us.inc(seconds * 1e6)
            self._queue_us.inc(queued_seconds * 1e6)
            self._request_seconds.observe(seconds)

    def request_outcome(self, outcome: str) -> None:
        """One more request that ended ``outcome`` (``ok``, or its error's kind)."""
        if self.enabled:
            counter = self._outcomes.get(outcome)
            if counter is None:
                counter = self._outcomes[outcome] = self.metrics.request_outcomes.counter(
                    *self.labels, outcome
                )
            counter.inc()

    def dispatched(self, queued_seconds: Iterable[float], batch_size: int) -> None:
        if self.enabled:
            for waited in queued_seconds:
                self._queue_seconds.observe(waited)
                self._queue_time.set(waited * 1000)
            self._batch_size.observe(batch_size)

    def stages(self, stage_ms: dict[str, float]) -> None:
        if self.enabled:
            for stage, ms in stage_ms.items():
                self.metrics.stage_seconds.histogram(*self.labels, stage).observe(ms / 1000)
            if stage_ms:  # a handler that records HandlerTime itself overrides this
                self._ts_gauge("HandlerTime").set(sum(stage_ms.values()))

    def batch_done(self, handler_ms: float, overhead_ms: float = 0.0) -> None:
        """A batch's time in the worker, handler included (TorchServe's PredictionTime), and
        the rest of its round trip: framing, the socket, decoding (``WorkerThreadTime``)."""
        if self.enabled:
            self._ts_gauge("PredictionTime").set(handler_ms)
            self._worker_thread_time.set(overhead_ms)

    def _ts_gauge(self, name: str) -> Gauge:
        return self.metrics.torchserve[name].gauge(*self._ts_model)

    def worker_loaded(self, worker: str, milliseconds: float) -> None:
        """A worker's start-up, model load included (TorchServe's WorkerLoadTime)."""
        if self.enabled:
            family = self.metrics.torchserve["WorkerLoadTime"]
            family.gauge(worker, *self.metrics.host_labels).set(milliseconds)

    def worker_restarted(self) -> None:
        if self.enabled:
            self._restarts.inc()

    def loaded_on_demand(self, seconds: float) -> None:
        if self.enabled:
            self.metrics.model_loads.counter(*self.labels).inc()
            self.metrics.model_load_seconds.histogram(*self.labels).observe(seconds)

    def evicted(self) -> None:
        if self.enabled:
            self.metrics.model_evictions.counter(*self.labels).inc()

    def set_residency(self, resident: bool, footprint: dict[str, int]) -> None:
        """Whether it has workers, and the memory they measured at their load."""
        self.metrics.model_resident.gauge(*self.labels).set(1 if resident else 0)
        self.metrics.model_memory.remove_matching(self.labels)
        for device, size in footprint.items():
            self.metrics.model_memory.gauge(*self.labels, device).set(size)

    def worker_recycled(self) -> None:
        if self.enabled:
            self._recycles.inc()

    def abandoned(self, count: int) -> None:
        if self.enabled:
            self._abandoned.inc(count)

    def shed(self, count: int) -> None:
        if self.enabled:
            self.metrics.requests_shed.counter(*self.labels).inc(count)

    def delayed(self, count: int) -> None:
        if self.enabled:
            self.metrics.requests_delayed.counter(*self.labels).inc(count)

    def batch_released(self, reason: str, size: int) -> None:
        """A batch of ``size`` left the queue for ``reason`` (the policy's)."""
        if self.enabled:
            self.metrics.batch_dispatches.counter(*self.labels, reason or "unknown").inc()

    def handler_metric(
        self, name: str, value: float, unit: str, kind: str, dimensions: dict[str, str]
    ) -> None:
        """A value a handler recorded through ``context.metrics``, into TorchServe's series
        of it (see ``FerryMetrics.handler_family``)."""
        if not self.enabled:
            return
        if name == "HandlerTime" and set(dimensions) <= {"ModelName", "Level"}:
            self._ts_gauge("HandlerTime").set(value)  # as TorchServe's base handler records it
            return
        dims = tuple(sorted(dimensions))
        key = (name, unit, dims, tuple(dimensions[d] for d in dims))
        child = self._handler_children.get(key)
        if child is None:
            family = self.metrics.handler_family(name, kind, dims, unit)
            if family is None:
                self.metrics.handler_values_dropped.counter(*self.labels, "dimensions").inc()
                return
            values = (*key[3], self.metrics.hostname)
            child = self.metrics.handler_series(family, values, self.labels)
            if child is None:
                return
            self._handler_children[key] = child
        _record(child, value)

    def set_queue_and_workers(self, depth: int, states: dict[str, int]) -> None:
        self.metrics.queue_depth.gauge(*self.labels).set(depth)
        self.metrics.workers.remove_matching(self.labels)
        for state, count in states.items():
            self.metrics.workers.gauge(*self.labels, state).set(count)
