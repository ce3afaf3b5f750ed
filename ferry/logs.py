"""Log set-up: plain lines or one JSON object per line, on stderr or in TorchServe's files.

With a log location, records go to files laid out as TorchServe's (``LOG_FILES``) and
nothing goes to stderr; without one, everything goes to stderr (what containers expect).
``ts_metrics.log`` gets TorchServe's system metrics lines (``SystemMetricsLines``), in
TorchServe's layout whatever ``log_format`` says: metric agents parse them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.config
import shutil
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from ferry import log_escape
from ferry.metrics.gpu import GpuReading
from ferry.procinfo import cpu_jiffies, memory_bytes

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

ACCESS_LOGGER = "ferry.access"
MODEL_LOGGER = "ferry.worker.output"  # ferry.worker_handles.output_relay.OUTPUT_LOGGER
TS_METRICS_LOGGER = "ferry.ts_metrics"
LOG_FILES = {
    "ts_log.log": None,  # everything the loggers below do not take
    "access_log.log": ACCESS_LOGGER,
    "model_log.log": MODEL_LOGGER,
    "ts_metrics.log": TS_METRICS_LOGGER,
    "model_metrics.log": None,  # created for scripts that tail it; Ferry writes no metric lines
}
"""TorchServe's log files, each with the logger whose records it holds."""

TS_METRICS_FORMAT = "%(asctime)s - %(message)s"
"""TorchServe's log4j2 layout of ``ts_metrics.log``: ``%d{ISO8601} - %m%n``."""

log = logging.getLogger("ferry")


class JsonFormatter(logging.Formatter):
    """One JSON object per line; ``extra={"fields": {...}}`` adds structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            document.update(fields)
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document)


class AccessLines:
    """``ferry.access`` lines written straight into the stream of the handler that would
    take their records, exactly as ``PLAIN_FORMAT`` formats them.

    A busy server writes one line per request: through the logging module (a record, a
    look up the stack for the caller, the formatter, the handler chain) that cost the no-op
    server a tenth of its requests/s (``benchmarks/results/revision_ab.md``). Used only
    while Ferry's own plain set-up is in force: JSON lines, and a log config of the user's,
    go through logging."""

    def __init__(
        self, handler: logging.StreamHandler[Any], clock: Callable[[], float] = time.time
    ) -> None:
        self._handler = handler
        self._clock = clock
        self._second = -1
        self._stamp = ""

    def write(self, message: str) -> None:
        """From the event loop's thread only: the cached time stamp is not locked.
        ``message`` is escaped already (no record, so no record factory escapes it)."""
        now = self._clock()
        second = int(now)
        if second != self._second:  # what Formatter.formatTime does, once a second
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        milliseconds = int((now - second) * 1000)
        line = f"{self._stamp},{milliseconds:03d} INFO {ACCESS_LOGGER}: {message}\n"
        handler = self._handler
        with handler.lock or contextlib.nullcontext():  # other threads log through it too
            if handler.stream is None:  # a file handler closed by a reconfiguration
                # (uvicorn's dictConfig): logging reopens it for this record
                logging.getLogger(ACCESS_LOGGER).info(message)
                return
            try:
                handler.stream.write(line)
                handler.stream.flush()
            except Exception:  # e.g. a closed stream at shutdown: as logging would report it
                handler.handleError(logging.makeLogRecord({"msg": message}))


_access_lines: AccessLines | None = None


def access_lines() -> AccessLines | None:
    """Where to write access lines directly; None: log them through ``ferry.access``."""
    return _access_lines


def configure_logging(log_format: str, level: str, log_location: Path | None = None) -> None:
    """Send every record to stderr, or, given ``log_location``, to the files of
    ``LOG_FILES`` in that folder (created if missing; files are appended to). Values in
    records are escaped from now on (``ferry.log_escape``), whichever handlers write them."""
    global _access_lines
    log_escape.install()
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(PLAIN_FORMAT)
    access_handler: logging.Handler
    handlers: list[logging.Handler]
    metrics_handler: logging.Handler | None = None
    if log_location is None:
        access_handler = logging.StreamHandler(sys.stderr)
        handlers = [access_handler]
    else:
        files = _file_handlers(log_location)
        access_handler, handlers = files[ACCESS_LOGGER], list(files.values())
        metrics_handler = files[TS_METRICS_LOGGER]
    for handler in handlers:
        handler.setFormatter(formatter)
    if metrics_handler is not None:
        metrics_handler.setFormatter(_iso8601_formatter(TS_METRICS_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(level)
    # TorchServe logs its metrics whatever the log level (its TS_METRICS logger: level all).
    logging.getLogger(TS_METRICS_LOGGER).setLevel(logging.INFO)
    _access_lines = AccessLines(access_handler) if log_format == "plain" else None


def _iso8601_formatter(layout: str) -> logging.Formatter:
    """``asctime`` as log4j2's ISO8601: ``2025-01-31T12:00:00,123``."""
    formatter = logging.Formatter(layout)
    formatter.default_time_format = "%Y-%m-%dT%H:%M:%S"
    return formatter


def _file_handlers(folder: Path) -> dict[str | None, logging.FileHandler]:
    """The handler of each file of ``LOG_FILES``, by the logger it holds (None: the
    general ``ts_log.log``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_metrics.log").touch()
    own_files = [name for name in LOG_FILES.values() if name is not None]
    general = logging.FileHandler(folder / "ts_log.log", encoding="utf-8")
    general.addFilter(lambda record: not any(_within(record, name) for name in own_files))
    handlers: dict[str | None, logging.FileHandler] = {None: general}
    for file_name, logger_name in LOG_FILES.items():
        if logger_name is not None:
            handler = logging.FileHandler(folder / file_name, encoding="utf-8")
            handler.addFilter(logging.Filter(logger_name))
            handlers[logger_name] = handler
    return handlers


class SystemMetricsLines:
    """TorchServe's system metrics as it logs them to ``ts_metrics.log`` (every
    ``metric_time_interval`` seconds, 60 by default, the first at start-up): its default
    metrics.yaml's host gauges, one line each, in the order its collector reports them::

        CPUUtilization.Percent:12.5|#Level:Host|#hostname:HOST,timestamp:1767225600
        GPUMemoryUsed.Megabytes:812.0|#Level:Host,DeviceId:0|#hostname:HOST,timestamp:...

    The values are those of Ferry's Prometheus host gauges (``FerryMetrics.record_host``):
    CPU use since the previous lines (since boot for the first; TorchServe's collector,
    a new process each time, always reported 0.0), memory in use as total less available,
    the disk holding ``/``, and each GPU through NVML."""

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        self._cpu_before = (0, 0)

    def lines(self, gpus: list[GpuReading], now: float) -> list[str]:
        busy, total = cpu_jiffies()
        cpu = _percent(busy - self._cpu_before[0], total - self._cpu_before[1])
        self._cpu_before = (busy, total)
        memory_total, available = memory_bytes()
        used = memory_total - available
        values: list[tuple[str, str, float, str]] = []
        for gpu in gpus:  # TorchServe's collector calls its functions in name order
            device = f",DeviceId:{gpu.index}"
            used_share = _percent(gpu.memory_used_bytes, gpu.memory_total_bytes)
            values.append(("GPUMemoryUtilization", "Percent", used_share, device))
            values.append(("GPUMemoryUsed", "Megabytes", gpu.memory_used_bytes // _MB, device))
            values.append(("GPUUtilization", "Percent", gpu.utilization_percent, device))
        values.append(("CPUUtilization", "Percent", cpu, ""))
        try:
            disk = shutil.disk_usage("/")
        except OSError:
            pass
        else:
            values.append(("DiskAvailable", "Gigabytes", disk.free / _GB, ""))
            values.append(("DiskUsage", "Gigabytes", disk.used / _GB, ""))
            values.append(
                ("DiskUtilization", "Percent", _percent(disk.used, disk.used + disk.free), "")
            )
        values.append(("MemoryAvailable", "Megabytes", available / _MB, ""))
        values.append(("MemoryUsed", "Megabytes", used / _MB, ""))
        values.append(("MemoryUtilization", "Percent", _percent(used, memory_total), ""))
        suffix = f"|#hostname:{self.hostname},timestamp:{int(now)}"
        return [
            f"{name}.{unit}:{float(value)!r}|#Level:Host{device}{suffix}"
            for name, unit, value, device in values
        ]

    def log(self, gpus: list[GpuReading]) -> None:
        """Log the lines on ``TS_METRICS_LOGGER`` (``ts_metrics.log``)."""
        metrics_log = logging.getLogger(TS_METRICS_LOGGER)
        for line in self.lines(gpus, time.time()):
            metrics_log.info("%s", line)


_MB, _GB = 2**20, 2**30


def _percent(part: float, whole: float) -> float:
    return round(100 * part / whole, 1) if whole > 0 else 0.0  # psutil's rounding


def _within(record: logging.LogRecord, logger_name: str) -> bool:
    return record.name == logger_name or record.name.startswith(logger_name + ".")


def apply_log_config(path: Path) -> None:
    """Replace the set-up with a Python logging config: ``logging.config.fileConfig`` INI
    (``.ini``, ``.conf``, ``.cfg``) or a ``dictConfig`` document (``.json``, ``.yaml``,
    ``.yml``). TorchServe's log4j2 XML cannot be read: it is ignored with a warning.
    Raises ``ValueError`` or ``OSError`` for a file that cannot be applied."""
    global _access_lines
    suffix = path.suffix.lower()
    if suffix == ".xml":
        log.warning("%s: log4j2 XML is TorchServe's (Java) format; ignored", path)
        return
    _access_lines = None  # the user's handlers and formats decide
    if suffix not in (".ini", ".conf", ".cfg", ".json", ".yaml", ".yml"):
        raise ValueError("expected .ini, .conf, .cfg, .json, .yaml or .yml (or log4j2 .xml)")
    text = path.read_text()
    try:
        if suffix in (".ini", ".conf", ".cfg"):
            logging.config.fileConfig(path, disable_existing_loggers=False)
            return
        document = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
        if not isinstance(document, dict):
            raise ValueError("expected a logging.config.dictConfig mapping")
        document.setdefault("disable_existing_loggers", False)
        logging.config.dictConfig(document)
    except (KeyError, RuntimeError, TypeError, yaml.YAMLError) as error:
        raise ValueError(str(error) or type(error).__name__) from None
