"""Log set-up: plain lines or one JSON object per line, on stderr or in TorchServe's files.

With a log location, records go to files laid out as TorchServe's (``LOG_FILES``) and
nothing goes to stderr; without one, everything goes to stderr (what containers expect).
"""

from __future__ import annotations

import json
import logging
import logging.config
import sys
from datetime import UTC, datetime
from pathlib import Path

import yaml

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

ACCESS_LOGGER = "ferry.access"
MODEL_LOGGER = "ferry.worker.output"  # ferry.worker.output_relay.OUTPUT_LOGGER
LOG_FILES = {
    "ts_log.log": None,  # everything the two below do not take
    "access_log.log": ACCESS_LOGGER,
    "model_log.log": MODEL_LOGGER,
    "model_metrics.log": None,  # created for scripts that tail it; Ferry writes no metric lines
}
"""TorchServe's log files, each with the logger whose records it holds."""

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


def configure_logging(log_format: str, level: str, log_location: Path | None = None) -> None:
    """Send every record to stderr, or, given ``log_location``, to the files of
    ``LOG_FILES`` in that folder (created if missing; files are appended to)."""
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(PLAIN_FORMAT)
    handlers: list[logging.Handler] = (
        _file_handlers(log_location)
        if log_location is not None
        else [logging.StreamHandler(sys.stderr)]
    )
    for handler in handlers:
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(level)


def _file_handlers(folder: Path) -> list[logging.Handler]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_metrics.log").touch()
    own_files = [name for name in LOG_FILES.values() if name is not None]
    general = logging.FileHandler(folder / "ts_log.log", encoding="utf-8")
    general.addFilter(lambda record: not any(_within(record, name) for name in own_files))
    handlers: list[logging.Handler] = [general]
    for file_name, logger_name in LOG_FILES.items():
        if logger_name is not None:
            handler = logging.FileHandler(folder / file_name, encoding="utf-8")
            handler.addFilter(logging.Filter(logger_name))
            handlers.append(handler)
    return handlers


def _within(record: logging.LogRecord, logger_name: str) -> bool:
    return record.name == logger_name or record.name.startswith(logger_name + ".")


def apply_log_config(path: Path) -> None:
    """Replace the set-up with a Python logging config: ``logging.config.fileConfig`` INI
    (``.ini``, ``.conf``, ``.cfg``) or a ``dictConfig`` document (``.json``, ``.yaml``,
    ``.yml``). TorchServe's log4j2 XML cannot be read: it is ignored with a warning.
    Raises ``ValueError`` or ``OSError`` for a file that cannot be applied."""
    suffix = path.suffix.lower()
    if suffix == ".xml":
        log.warning("%s: log4j2 XML is TorchServe's (Java) format; ignored", path)
        return
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
