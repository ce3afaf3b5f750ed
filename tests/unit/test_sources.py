"""Settings sources: config.properties, FERRY_* / TS_* environment variables, flags."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ferry.cli.main import build_parser
from ferry.cli.serve import flags_from_args
from ferry.config.settings import Address
from ferry.config.sources import (
    IGNORED_TORCHSERVE_KEYS,
    OPTIONS_BY_KEY,
    load_settings,
    read_properties,
)
from ferry.errors import ConfigError

PROPERTIES = r"""
# TorchServe-style config
inference_address=http://0.0.0.0:9080
management_address: http://127.0.0.1:9081
job_queue_size = 50
load_models=noop
allowed_urls=https://models\.example\.com/.*\.mar,file:///tmp/.*
models={\
  "noop": {\
    "1.0": {"defaultVersion": true, "marName": "noop.mar", "minWorkers": 2, "batchSize": 4},\
    "2.0": {"marName": "noop_v2.mar", "maxBatchDelay": 50}\
  }\
}
! another comment
enable_model_api=true
"""


def _properties(tmp_path: Path, text: str = PROPERTIES) -> Path:
    path = tmp_path / "config.properties"
    path.write_text(text)
    return path


def test_properties_with_comments_separators_and_continuations(tmp_path: Path) -> None:
    values = read_properties(_properties(tmp_path))
    assert values["management_address"] == "http://127.0.0.1:9081"
    assert values["job_queue_size"] == "50"
    assert values["models"].startswith('{"noop": {"1.0"')
    assert "another comment" not in str(values)


def test_config_file_fills_settings(tmp_path: Path) -> None:
    settings = load_settings({}, {}, _properties(tmp_path))
    assert settings.inference_address == Address("0.0.0.0", 9080)
    assert settings.job_queue_size == 50 and settings.enable_model_api is True
    assert settings.models == ("noop",)
    assert settings.allowed_urls == (r"https://models\.example\.com/.*\.mar", "file:///tmp/.*")
    noop = settings.model_overrides["noop"]
    assert noop["1.0"]["minWorkers"] == 2 and noop["2.0"]["marName"] == "noop_v2.mar"


def test_precedence_flags_over_ferry_env_over_ts_env_over_file(tmp_path: Path) -> None:
    config = _properties(
        tmp_path,
        "job_queue_size=10\nmax_request_size=10\ndefault_response_timeout=10\nnumber_of_gpu=3\n",
    )
    env = {
        "FERRY_JOB_QUEUE_SIZE": "20",
        "FERRY_MAX_REQUEST_SIZE": "20",
        "TS_JOB_QUEUE_SIZE": "30",
        "TS_DEFAULT_RESPONSE_TIMEOUT": "30",
    }
    settings = load_settings({"job_queue_size": "40"}, env, config)
    assert settings.job_queue_size == 40  # flag
    assert settings.max_request_size == 20  # FERRY_ env
    assert settings.default_response_timeout == 10  # TS_ ignored unless enabled
    assert settings.number_of_gpu == 3  # file
    enabled = load_settings({}, {**env, "FERRY_ENABLE_ENVVARS_CONFIG": "true"}, config)
    assert enabled.default_response_timeout == 30 and enabled.job_queue_size == 20


def test_defaults_are_safe() -> None:
    settings = load_settings({}, {}, None)
    assert settings.inference_address == Address("127.0.0.1", 8080)
    assert settings.management_address == Address("127.0.0.1", 8081)
    assert settings.metrics_address == Address("127.0.0.1", 8082)
    assert settings.enable_model_api is False and settings.allowed_urls == ()
    assert settings.disable_token_authorization is False


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("job_queue_size", "0"),
        ("job_queue_size", "many"),
        ("enable_model_api", "yes"),
        ("inference_address", "ftp://x:1"),
        ("models", "{not json"),
        ("models", '{"a": 1}'),
        ("log_format", "xml"),
        ("default_response_timeout", "-1"),
        ("default_response_timeout", "nan"),
        ("default_response_timeout", "inf"),
        ("default_batch_size", "0"),
        ("default_batch_size", "eight"),
        ("default_max_batch_delay", "-5"),
        ("default_max_batch_delay", "nan"),
        ("default_max_batch_delay", "inf"),
    ],
)
def test_invalid_values_name_the_key(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_settings({}, {}, _properties(tmp_path, f"{key}={value}\n"))


def test_unknown_and_unused_keys_warn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ferry.config"):
        load_settings({}, {}, _properties(tmp_path, "vmargs=-Xmx4g\nfrobnicate=1\n"))
    messages = " ".join(record.getMessage() for record in caplog.records)
    assert "vmargs is a TorchServe setting Ferry does not use" in messages
    assert "unknown setting frobnicate" in messages


def test_unparsable_line_and_missing_file_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot parse"):
        read_properties(_properties(tmp_path, "just words\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        read_properties(tmp_path / "absent.properties")


def test_no_option_is_also_an_ignored_torchserve_key() -> None:
    assert not IGNORED_TORCHSERVE_KEYS & OPTIONS_BY_KEY.keys()


def test_enable_metrics_api_is_applied_without_an_ignored_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ferry.config"):
        settings = load_settings({}, {}, _properties(tmp_path, "enable_metrics_api=false\n"))
    assert settings.enable_metrics_api is False
    assert "enable_metrics_api" not in caplog.text


@pytest.mark.parametrize(
    ("key", "field", "text", "value"),
    [
        ("default_batch_size", "default_batch_size", "8", 8),
        ("default_max_batch_delay", "default_max_batch_delay_ms", "25.5", 25.5),
    ],
)
def test_batching_defaults_are_settable_from_every_source(
    tmp_path: Path, key: str, field: str, text: str, value: object
) -> None:
    default = getattr(load_settings({}, {}, None), field)
    assert default != value
    config = _properties(tmp_path, f"{key}={text}\n")
    env_key = key.upper()
    ts_env = {f"TS_{env_key}": text, "FERRY_ENABLE_ENVVARS_CONFIG": "true"}
    sources = [  # the file, FERRY_*, TS_* (when enabled), the flags as parsed, as given
        load_settings({}, {}, config),
        load_settings({}, {f"FERRY_{env_key}": text}, None),
        load_settings({}, ts_env, None),
        load_settings({key: text}, {}, None),
    ]
    flag = f"--{key.replace('_', '-')}"
    args = build_parser().parse_args(["serve", flag, text])
    sources.append(load_settings(flags_from_args(args), {}, None))
    assert [getattr(settings, field) for settings in sources] == [value] * 5
    assert getattr(load_settings({}, {f"TS_{env_key}": text}, None), field) == default


def test_kserves_model_snapshot_names_the_models_to_load(tmp_path: Path) -> None:
    """KServe's config.properties lists the models in TorchServe's ``model_snapshot``."""
    config = tmp_path / "config.properties"
    snapshot = (
        '{"name":"startup.cfg","modelCount":1,"models":{"mnist":{"1.0":{"defaultVersion":true,'
        '"marName":"mnist.mar","minWorkers":1,"maxWorkers":5,"batchSize":1,"maxBatchDelay":5000,'
        '"responseTimeout":120}}}}'
    )
    config.write_text(f"model_store=/mnt/models/model-store\nmodel_snapshot={snapshot}\n")
    settings = load_settings({}, {}, config)
    assert settings.models == ("mnist",)
    assert settings.model_overrides["mnist"]["1.0"]["marName"] == "mnist.mar"
    explicit = load_settings({"load_models": "other.mar"}, {}, config)
    assert explicit.models == ("other.mar",)  # load_models wins, as in TorchServe
    config.write_text("model_snapshot={not json\n")
    with pytest.raises(ConfigError, match="model_snapshot: invalid JSON"):
        load_settings({}, {}, config)


def test_torchserves_system_metrics_keys_are_read(tmp_path: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text("metric_time_interval=15\ndisable_system_metrics=true\n")
    settings = load_settings({}, {}, config)
    assert (settings.metric_time_interval, settings.disable_system_metrics) == (15.0, True)
    defaults = load_settings({}, {}, None)
    assert (defaults.metric_time_interval, defaults.disable_system_metrics) == (60.0, False)
