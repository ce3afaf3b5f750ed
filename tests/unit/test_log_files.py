"""Log records routed to TorchServe's log files, and ``--log-config`` files."""

from __future__ import annotations

import asyncio
import json
import logging
import logging.config
import re
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

import ferry.logs
from ferry import server
from ferry.config.settings import ServerSettings
from ferry.logs import (
    PLAIN_FORMAT,
    TS_METRICS_LOGGER,
    AccessLines,
    SystemMetricsLines,
    access_lines,
    apply_log_config,
    configure_logging,
)
from ferry.metrics.gpu import GpuReading
from ferry.service import FerryService


@pytest.fixture(autouse=True)
def restored_root_logger(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    metrics_level = logging.getLogger(TS_METRICS_LOGGER).level
    monkeypatch.setattr(ferry.logs, "_access_lines", None)  # put back after the test
    factory = logging.getLogRecordFactory()  # configure_logging installs the escaping one
    yield
    logging.setLogRecordFactory(factory)
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger(TS_METRICS_LOGGER).setLevel(metrics_level)


def _read(folder: Path, name: str) -> str:
    return (folder / name).read_text()


def test_each_logger_lands_in_its_torchserve_file_and_nothing_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "logs"
    configure_logging("plain", "INFO", logs)
    logging.getLogger("ferry.service").info("general line")
    logging.getLogger("ferry.access").info("access line")
    logging.getLogger("ferry.worker.output").info("[echo w0.0 pid 1] model line")
    logging.getLogger("ferry.worker").info("worker supervisor line")
    for handler in logging.getLogger().handlers:
        handler.flush()

    general = _read(logs, "ts_log.log")
    assert "general line" in general and "worker supervisor line" in general
    assert "access line" not in general and "model line" not in general
    assert "access line" in _read(logs, "access_log.log")
    assert "general line" not in _read(logs, "access_log.log")
    assert "model line" in _read(logs, "model_log.log")
    assert "worker supervisor line" not in _read(logs, "model_log.log")
    assert _read(logs, "model_metrics.log") == ""
    assert capsys.readouterr().err == ""


def test_json_lines_in_files(tmp_path: Path) -> None:
    configure_logging("json", "INFO", tmp_path)
    logging.getLogger("ferry.access").info("served", extra={"fields": {"status": 200}})
    for handler in logging.getLogger().handlers:
        handler.flush()
    record = json.loads(_read(tmp_path, "access_log.log"))
    assert record["logger"] == "ferry.access" and record["status"] == 200


def test_without_a_location_everything_goes_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("plain", "INFO")
    logging.getLogger("ferry.access").info("access line")
    assert "ferry.access: access line" in capsys.readouterr().err


@pytest.mark.parametrize("log_format", ["plain", "json"])
def test_values_are_escaped_in_ferrys_set_up_and_in_a_users(
    tmp_path: Path, log_format: str
) -> None:
    """The escaping factory is on once logging is configured, whoever's handlers write."""
    configure_logging(log_format, "INFO", tmp_path)
    logging.getLogger("ferry.service").warning("model %s not found", "x\nFORGED\x1b")
    config = tmp_path / "logging.json"
    users = tmp_path / "users.log"
    handlers = {"file": {"class": "logging.FileHandler", "filename": str(users)}}
    config.write_text(
        json.dumps({"version": 1, "handlers": handlers, "root": {"handlers": ["file"]}})
    )
    apply_log_config(config)
    logging.getLogger("ferry.service").warning("model %s not found", "y\rFORGED")
    for handler in logging.getLogger().handlers:
        handler.flush()
    general = _read(tmp_path, "ts_log.log")
    assert general.count("\n") == 1 and "\x1b" not in general
    assert "x\\nFORGED\\x1b" in (
        json.loads(general)["message"] if log_format == "json" else general
    )
    assert users.read_text() == "model y\\rFORGED not found\n"


def test_a_dict_config_replaces_the_set_up(tmp_path: Path) -> None:
    target = tmp_path / "custom.log"
    config = {
        "version": 1,
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(target)}},
        "root": {"handlers": ["file"], "level": "INFO"},
    }
    path = tmp_path / "logging.json"
    path.write_text(json.dumps(config))
    apply_log_config(path)
    logging.getLogger("ferry.service").info("custom line")
    for handler in logging.getLogger().handlers:
        handler.flush()
    assert "custom line" in target.read_text()


def test_log4j2_xml_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "log4j2.xml"
    path.write_text("<Configuration/>")
    apply_log_config(path)
    assert "log4j2 XML is TorchServe's (Java) format; ignored" in caplog.text


@pytest.mark.parametrize("name", ["logging.ini", "logging.yaml", "logging.txt"])
def test_an_unusable_log_config_raises_value_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text("[loggers]\nkeys=root\n" if name.endswith(".ini") else "- a list\n")
    with pytest.raises(ValueError):
        apply_log_config(path)


def test_access_lines_are_the_lines_logging_would_write(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Written straight to the handler's stream, and the same, to the character, as the
    plain formatter's line for that record."""
    configure_logging("plain", "INFO")
    (handler,) = logging.getLogger().handlers
    assert isinstance(handler, logging.StreamHandler)
    when = 1764061353.25  # exact in binary: both sides see 250 ms
    AccessLines(handler, clock=lambda: when).write("status=200 model=m")
    record = logging.makeLogRecord(
        {"name": "ferry.access", "levelno": logging.INFO, "levelname": "INFO"}
        | {"msg": "status=200 model=m", "created": when, "msecs": 250.0}
    )
    expected = logging.Formatter(PLAIN_FORMAT).format(record)
    assert capsys.readouterr().err == expected + "\n"


def test_access_lines_land_in_the_access_log_file_only(tmp_path: Path) -> None:
    configure_logging("plain", "INFO", tmp_path)
    lines = access_lines()
    assert lines is not None
    lines.write("path=/predictions/m status=200")
    # uvicorn's own dictConfig closes every handler; logging reopens a file on its next record
    logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})
    lines.write("path=/predictions/n status=200")
    lines.write("path=/predictions/o status=200")
    written = _read(tmp_path, "access_log.log")
    assert all(f"ferry.access: path=/predictions/{m} status=200" in written for m in "mno")
    assert "path=" not in _read(tmp_path, "ts_log.log")


def test_access_lines_go_through_logging_for_json_and_a_users_config(tmp_path: Path) -> None:
    configure_logging("json", "INFO")
    assert access_lines() is None  # JSON records carry the fields: the formatter's job
    configure_logging("plain", "INFO")
    assert access_lines() is not None
    config = tmp_path / "logging.json"
    config.write_text(json.dumps({"version": 1, "root": {"level": "INFO"}}))
    apply_log_config(config)
    assert access_lines() is None  # the user's handlers and format decide


TS_METRIC_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{3} - "  # log4j2's %d{ISO8601} - %m
    r"(\w+)\.(Percent|Megabytes|Gigabytes):(\d+\.\d+)\|#Level:Host(,DeviceId:\d+)?"
    r"\|#hostname:box,timestamp:\d+$"
)


@pytest.mark.parametrize("log_format", ["plain", "json"])
def test_system_metrics_land_in_ts_metrics_log_in_torchserves_layout(
    tmp_path: Path, log_format: str
) -> None:
    """Whatever the log format and level: metric agents parse TorchServe's lines."""
    configure_logging(log_format, "WARNING", tmp_path)
    lines = SystemMetricsLines("box")
    lines.log([])
    lines.log([])
    for handler in logging.getLogger().handlers:
        handler.flush()
    written = _read(tmp_path, "ts_metrics.log").splitlines()
    names = [TS_METRIC_LINE.match(line) for line in written]
    assert all(names), written
    host = [
        "CPUUtilization",
        "DiskAvailable",
        "DiskUsage",
        "DiskUtilization",
        "MemoryAvailable",
        "MemoryUsed",
        "MemoryUtilization",
    ]
    assert [m.group(1) for m in names if m] == host * 2
    for match in names:
        assert match is not None
        if match.group(2) == "Percent":
            assert 0.0 <= float(match.group(3)) <= 100.0
    assert _read(tmp_path, "ts_log.log") == ""  # WARNING and up only, and no metric lines


def test_gpu_metrics_come_first_per_device_as_torchserves_collector_reports_them() -> None:
    gpus = [GpuReading(0, 3 * 2**30, 4 * 2**30, 40.0), GpuReading(1, 0, 4 * 2**30, 0.0)]
    lines = SystemMetricsLines("box").lines(gpus, now=1767225600.9)
    assert lines[:6] == [
        "GPUMemoryUtilization.Percent:75.0|#Level:Host,DeviceId:0|#hostname:box,timestamp:1767225600",
        "GPUMemoryUsed.Megabytes:3072.0|#Level:Host,DeviceId:0|#hostname:box,timestamp:1767225600",
        "GPUUtilization.Percent:40.0|#Level:Host,DeviceId:0|#hostname:box,timestamp:1767225600",
        "GPUMemoryUtilization.Percent:0.0|#Level:Host,DeviceId:1|#hostname:box,timestamp:1767225600",
        "GPUMemoryUsed.Megabytes:0.0|#Level:Host,DeviceId:1|#hostname:box,timestamp:1767225600",
        "GPUUtilization.Percent:0.0|#Level:Host,DeviceId:1|#hostname:box,timestamp:1767225600",
    ]
    assert lines[6].startswith("CPUUtilization.Percent:")


def test_disable_system_metrics_writes_no_ts_metrics_lines(tmp_path: Path) -> None:
    """TorchServe's switch: nothing is read or logged (the service is never asked)."""
    settings = ServerSettings(log_location=tmp_path, disable_system_metrics=True)
    no_service = cast(FerryService, None)
    assert asyncio.run(server._log_system_metrics(no_service, settings)) is None
