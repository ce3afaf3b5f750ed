"""The tuner on a fake latency model, and sweep spec validation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from ferry.errors import ConfigError
from ferry_bench.servers import ServerConfig
from ferry_bench.sweep import SweepSpec
from ferry_bench.tune import (
    Trial,
    config_changes,
    configurations,
    model_config_yaml,
    requests_for_percentile,
    search,
    tuned_config,
)


def fake_server(config: ServerConfig, concurrency: int) -> Trial:
    """A queueing caricature: a batch costs 4 ms + 1 ms per item per worker; batches fill up
    to the concurrency; latency grows with the requests queued ahead."""
    batch = min(config.batch_size, concurrency)
    batch_ms = 4 + batch
    capacity = config.workers * batch * 1000 / batch_ms
    throughput = min(capacity, concurrency * 1000 / batch_ms)
    p99 = batch_ms * (1 + concurrency / (config.workers * batch)) + config.max_batch_delay / 4
    return Trial(config, concurrency, throughput, p99)


GRID = [ServerConfig(b, d, w) for b in (1, 4, 16) for d in (5, 50) for w in (1, 2)]


def test_tuner_picks_the_fastest_configuration_within_the_slo() -> None:
    calls: list[tuple[ServerConfig, int]] = []

    def evaluate(config: ServerConfig, concurrency: int) -> Trial:
        calls.append((config, concurrency))
        return fake_server(config, concurrency)

    result = search(evaluate, GRID, [1, 2, 4, 8, 16, 32, 64], slo_ms=60)
    exhaustive = [fake_server(c, n) for c in GRID for n in (1, 2, 4, 8, 16, 32, 64)]
    expected = max((t for t in exhaustive if t.p99_ms <= 60), key=lambda t: t.throughput)
    assert result.best == expected
    assert result.best.config == ServerConfig(16, 5, 2)
    assert len(calls) < len(exhaustive)  # stopped raising load once p99 broke the SLO
    assert len(result.runners_up) == 3
    assert all(t.throughput <= result.best.throughput for t in result.runners_up)
    assert len({t.config for t in result.runners_up}) == 3


def test_errors_or_impossible_slos_choose_nothing() -> None:
    failing = search(lambda c, n: Trial(c, n, 100.0, 1.0, error_rate=0.1), GRID[:2], [1], 60)
    assert failing.best is None
    impossible = search(fake_server, GRID, [1, 2], slo_ms=0.5)
    assert impossible.best is None and len(impossible.trials) == len(GRID)


ARCHIVE_CONFIG = {
    "minWorkers": 1,
    "batchSize": 1,
    "responseTimeout": 30,
    "image_classifier": {"resize": 36, "mean": [0.5], "topk": 5},
    "optimization": {"channels_last": True},
}


def test_the_tuned_config_keeps_every_key_of_the_archive() -> None:
    trial = Trial(ServerConfig(8, 10, 2), 16, 123.4, 45.6)
    text = model_config_yaml(trial, 100, ARCHIVE_CONFIG)
    assert text.startswith("# Tuned by ferry bench tune: 123.4 requests/s")
    document = yaml.safe_load(text)
    assert document == {
        **ARCHIVE_CONFIG,
        "minWorkers": 2,
        "maxWorkers": 2,
        "batchSize": 8,
        "maxBatchDelay": 10,
    }
    assert ARCHIVE_CONFIG["batchSize"] == 1  # the archive's own document is not changed
    bf16 = tuned_config(ARCHIVE_CONFIG, ServerConfig(4, 5, 1, "bf16"))
    assert bf16["optimization"] == {"channels_last": True, "precision": "bf16"}


def test_config_changes_say_what_tune_changed() -> None:
    tuned = tuned_config(ARCHIVE_CONFIG, ServerConfig(8, 10, 1, "bf16"))
    assert config_changes(ARCHIVE_CONFIG, tuned) == [
        "minWorkers: 1 (unchanged)",
        "maxWorkers: 1 (new)",
        "batchSize: 1 -> 8",
        "maxBatchDelay: 10 (new)",
        "optimization.precision: bf16 (new)",
    ]


def test_points_that_cannot_differ_are_not_measured() -> None:
    grid = configurations([1, 4], [5, 20], [1], ["fp32", "bf16"])
    assert [(c.batch_size, c.max_batch_delay, c.precision) for c in grid] == [
        (1, 5, "fp32"),
        (1, 5, "bf16"),
        (4, 5, "fp32"),
        (4, 5, "bf16"),
        (4, 20, "fp32"),
        (4, 20, "bf16"),
    ]


def test_enough_requests_for_the_percentile_and_every_client() -> None:
    assert requests_for_percentile(99, 1) == 1000  # ten answers beyond p99
    assert requests_for_percentile(90, 1) == 100
    assert requests_for_percentile(99, 512) == 5120  # ten per client


def test_a_configuration_that_failed_is_reported_and_the_search_goes_on() -> None:
    broken = ServerConfig(4, 5, 1)

    def evaluate(config: ServerConfig, concurrency: int) -> Trial:
        if config == broken:
            return Trial(config, concurrency, 0.0, math.inf, 1.0, "server exited with 1")
        return fake_server(config, concurrency)

    grid = [ServerConfig(1, 5, 1), broken, ServerConfig(16, 5, 1)]
    result = search(evaluate, grid, [1, 2, 4], slo_ms=60)
    assert result.best is not None and result.best.config == ServerConfig(16, 5, 1)
    failed = [t for t in result.trials if t.failure]
    assert len(failed) == 1 and failed[0].config == broken  # one try, then the next config


def test_sweep_spec_reading_and_validation(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        "model: m.mar\ninput: [a.jpg, b.jpg]\nbatch_size: [1, 8]\nconcurrency: 4\nduration: 2\n"
    )
    spec = SweepSpec.read(spec_file)
    assert spec.model == tmp_path / "m.mar" and [p.name for p in spec.inputs] == ["a.jpg", "b.jpg"]
    assert spec.batch_size == [1, 8] and spec.concurrency == [4] and spec.workers == [1]
    assert spec.duration == 2 and spec.requests is None and len(spec.configurations()) == 2
    for bad, message in (
        ("input: a\n", "model"),
        ("model: m\ninput: a\nbatch_size: [0]\n", "batch_size"),
        ("model: m\ninput: a\nrequests: 1\nduration: 1\n", "not both"),
        ("model: m\ninput: a\nserver: triton\n", "server"),
        ("model: m\ninput: a\nbatch_sizes: [1, 8]\n", "unknown key 'batch_sizes'.*'batch_size'"),
        ("model: m\ninput: a\nthreads: 2\n", "unknown key 'threads'; a spec's keys are model"),
    ):
        spec_file.write_text(bad)
        with pytest.raises(ConfigError, match=message):
            SweepSpec.read(spec_file)


def test_server_config_properties_drive_batch_settings(tmp_path: Path) -> None:
    from ferry.config.sources import load_settings
    from ferry_bench.servers import write_config
    from tests.fixtures.models import digest_archive

    store = tmp_path / "store"
    store.mkdir()
    model = store / digest_archive(store, "echo", version="3.0")
    ports = {
        "inference": 1001,
        "management": 1002,
        "metrics": 1003,
        "grpc_inference": 1004,
        "grpc_management": 1005,
    }
    properties = write_config(tmp_path, model, ServerConfig(8, 25, 2), ports)
    settings = load_settings({}, {}, properties)
    assert settings.models == ("echo.mar",) and settings.model_store == store
    assert settings.inference_address.port == 1001 and settings.disable_token_authorization
    assert (settings.grpc_inference_port, settings.grpc_management_port) == (1004, 1005)
    version = settings.model_overrides["echo"]["3.0"]
    assert (version["batchSize"], version["maxBatchDelay"], version["minWorkers"]) == (8, 25, 2)


def test_precision_axis(tmp_path: Path) -> None:
    import json
    import zipfile

    import yaml

    from ferry_bench.servers import with_precision
    from tests.fixtures.models import DEMO_STORE

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("model: m.mar\ninput: a\nprecision: [fp32, bf16]\nworkers: [1, 2]\n")
    spec = SweepSpec.read(spec_file)
    assert [(c.workers, c.precision) for c in spec.configurations()] == [
        (1, "fp32"),
        (1, "bf16"),
        (2, "fp32"),
        (2, "bf16"),
    ]
    spec_file.write_text("model: m.mar\ninput: a\nprecision: int8\n")
    with pytest.raises(ConfigError, match="precision"):
        SweepSpec.read(spec_file)
    variant = with_precision(DEMO_STORE / "shapes.mar", "bf16", tmp_path / "variants")
    config = yaml.safe_load((variant / "model-config.yaml").read_text())
    assert config["optimization"] == {"precision": "bf16"} and config["batchSize"] == 8
    with zipfile.ZipFile(DEMO_STORE / "shapes.mar") as zf:
        original = json.loads(zf.read("MAR-INF/MANIFEST.json"))
    assert json.loads((variant / "MAR-INF" / "MANIFEST.json").read_text()) == original
    text = model_config_yaml(Trial(ServerConfig(4, 5, 1, "bf16"), 8, 10.0, 9.0), 50, {})
    assert text.endswith("optimization:\n  precision: bf16\n")


def test_child_servers_get_no_ferry_or_torchserve_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from ferry_bench.servers import log_reason, server_environment

    monkeypatch.setenv("FERRY_BATCH_SIZE", "64")
    monkeypatch.setenv("TS_CONFIG_FILE", "/elsewhere")
    monkeypatch.setenv("TORCHSERVE_BIN_DIR", "/opt/ts/bin")
    environment = server_environment()
    assert "FERRY_BATCH_SIZE" not in environment and "TS_CONFIG_FILE" not in environment
    assert environment["TORCHSERVE_BIN_DIR"] == "/opt/ts/bin" and "PATH" in environment
    log = tmp_path / "server.log"
    log.write_text("starting\nConfigError: bad key x\nshutting down\n\n")
    assert log_reason(log) == "ConfigError: bad key x"
    log.write_text("one\ntwo\n")
    assert log_reason(log) == "one | two"
