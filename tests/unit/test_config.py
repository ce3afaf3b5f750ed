from __future__ import annotations

from pathlib import Path

import pytest

from ferry.config.model_config import load_model_config, parse_model_config
from ferry.config.settings import Address, default_workers_per_model, threads_per_worker
from ferry.errors import ConfigError


def test_model_config_keys_and_passthrough() -> None:
    config = parse_model_config(
        {
            "minWorkers": 2,
            "maxWorkers": 4,
            "batchSize": 8,
            "maxBatchDelay": 25,
            "responseTimeout": 60,
            "deviceType": "GPU",
            "deviceIds": [0, 1],
            "extra": {"a": 1},
        },
        source="t",
    )
    assert (config.min_workers, config.max_workers, config.batch_size) == (2, 4, 8)
    assert config.max_batch_delay_ms == 25 and config.response_timeout == 60
    assert config.device_type == "gpu" and config.device_ids == (0, 1)
    assert config.raw["extra"] == {"a": 1}


@pytest.mark.parametrize(
    ("key", "value"),
    [("batchSize", 0), ("batchSize", "many"), ("maxBatchDelay", -1), ("deviceType", "tpu")],
)
def test_invalid_model_config_names_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key):
        parse_model_config({key: value}, source="model-config.yaml")


def test_unreadable_model_config(tmp_path: Path) -> None:
    path = tmp_path / "model-config.yaml"
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_model_config(path)


def test_addresses() -> None:
    assert Address.parse("http://127.0.0.1:8080", key="k") == Address("127.0.0.1", 8080)
    assert Address.parse("0.0.0.0:0", key="k").port == 0
    assert Address("::1", 80).url() == "http://[::1]:80"
    assert Address.parse("https://0.0.0.0:8443", key="k").url() == "https://0.0.0.0:8443"
    assert Address("127.0.0.2", 1).is_loopback and not Address("0.0.0.0", 1).is_loopback
    with pytest.raises(ConfigError, match="k"):
        Address.parse("ftp://x:1", key="k")
    with pytest.raises(ConfigError, match="k"):
        Address.parse("http://x:notaport", key="k")
    with pytest.raises(ConfigError):
        Address.parse("http://nohost", key="k")


def test_cpu_split_does_not_oversubscribe() -> None:
    assert default_workers_per_model(cores=2, gpus=0) == 1
    assert default_workers_per_model(cores=16, gpus=4) == 4
    assert threads_per_worker(cores=2, workers=1) == 2
    assert threads_per_worker(cores=2, workers=2) == 1
    assert threads_per_worker(cores=2, workers=8) == 1


def test_unix_socket_addresses() -> None:
    address = Address.parse("unix:/tmp/management.sock", key="management_address")
    assert (address.scheme, address.path, address.url()) == (
        "unix",
        "/tmp/management.sock",
        "unix:/tmp/management.sock",
    )
    assert address.is_loopback  # local only: the file's permissions decide who connects
    with pytest.raises(ConfigError, match="expected unix:/ABSOLUTE/PATH"):
        Address.parse("unix:relative.sock", key="management_address")
