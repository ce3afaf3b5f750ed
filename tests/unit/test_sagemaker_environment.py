"""SageMaker's container variables as Ferry's settings (``ferry.config.sagemaker``), through
the same sources ``ferry serve`` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ferry.config.sagemaker import check_code_is_local, sagemaker_start
from ferry.config.settings import Address, ServerSettings
from ferry.config.sources import OPTIONS_BY_KEY, load_settings
from ferry.errors import ConfigError
from ferry.procinfo import memory_limit_bytes


def _settings(environ: dict[str, str], memory: int = 0) -> ServerSettings:
    start = sagemaker_start(environ, memory)
    return load_settings({}, start.environ(environ), None)


def test_every_setting_it_writes_is_one_of_ferry_s() -> None:
    environ = {
        "SAGEMAKER_MODEL_SERVER_WORKERS": "2",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "20",
        "SAGEMAKER_TS_BATCH_SIZE": "4",
    }
    for multi in ("false", "true"):
        start = sagemaker_start({**environ, "SAGEMAKER_MULTI_MODEL": multi}, 8 << 30)
        assert set(start.settings) <= set(OPTIONS_BY_KEY)


def test_without_variables_it_serves_opt_ml_model_on_port_8080_of_every_address() -> None:
    settings = _settings({})
    assert settings.inference_address == Address("0.0.0.0", 8080)
    assert settings.management_address == Address("127.0.0.1", 8081)
    assert settings.metrics_address == Address("127.0.0.1", 8082)
    assert settings.model_store == Path("/opt/ml")
    assert settings.models == ("model=model",)
    assert settings.default_response_timeout == 60.0  # the toolkit always writes its 60
    assert settings.disable_token_authorization is True
    assert settings.enable_envvars_config is True
    assert settings.install_py_dep_per_model is True
    assert settings.enable_grpc is False
    assert settings.enable_model_api is False
    assert settings.model_overrides == {}


def test_the_toolkit_s_variables_become_ferry_s_settings() -> None:
    settings = _settings(
        {
            "SAGEMAKER_BIND_TO_PORT": "9000",
            "SAGEMAKER_MODEL_SERVER_WORKERS": "3",
            "SAGEMAKER_MODEL_SERVER_TIMEOUT": "45",
            "SAGEMAKER_MAX_PAYLOAD_IN_MB": "25",
            "SAGEMAKER_BASE_DIR": "/srv/ml",
        }
    )
    assert settings.inference_address == Address("0.0.0.0", 9000)
    assert settings.default_workers_per_model == 3
    assert settings.default_response_timeout == 45.0
    assert settings.max_request_size == 25 * 1024 * 1024
    assert settings.model_store == Path("/srv/ml")


def test_the_mms_toolkit_s_timeout_in_seconds_wins() -> None:
    environ = {
        "SAGEMAKER_MODEL_SERVER_TIMEOUT": "45",
        "SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS": "90",
    }
    assert _settings(environ).default_response_timeout == 90.0


def test_ferry_s_own_variables_and_flags_win_over_sagemaker_s() -> None:
    environ = {
        "SAGEMAKER_MODEL_SERVER_WORKERS": "3",
        "FERRY_DEFAULT_WORKERS_PER_MODEL": "5",
        "FERRY_DISABLE_TOKEN_AUTHORIZATION": "false",
    }
    start = sagemaker_start(environ)
    settings = load_settings({"job_queue_size": "7"}, start.environ(environ), None)
    assert settings.default_workers_per_model == 5
    assert settings.disable_token_authorization is False
    assert settings.job_queue_size == 7
    flagged = load_settings({"default_workers_per_model": "6"}, start.environ(environ), None)
    assert flagged.default_workers_per_model == 6


def test_sagemaker_s_variables_win_over_torchserve_s() -> None:
    """The toolkit's config.properties enables TS_* variables; SageMaker's own are
    written into that file, which TS_* then override in TorchServe. Ferry puts them
    above: a SageMaker setting is what the endpoint's operator set last."""
    settings = _settings(
        {"SAGEMAKER_MODEL_SERVER_WORKERS": "3", "TS_DEFAULT_WORKERS_PER_MODEL": "4"}
    )
    assert settings.default_workers_per_model == 3
    assert _settings({"TS_JOB_QUEUE_SIZE": "9"}).job_queue_size == 9


def test_the_batching_variables_configure_the_one_model_with_the_toolkit_s_defaults() -> None:
    settings = _settings({"SAGEMAKER_TS_BATCH_SIZE": "8", "SAGEMAKER_TS_MAX_BATCH_DELAY": "20"})
    assert settings.model_overrides == {
        "model": {
            "1.0": {
                "batchSize": 8,
                "maxBatchDelay": 20,
                "minWorkers": 1,
                "maxWorkers": 1,
                "responseTimeout": 60,
            }
        }
    }


def test_the_safe_port_range_holds_the_management_and_metrics_ports() -> None:
    settings = _settings({"SAGEMAKER_SAFE_PORT_RANGE": "9100-9200"})
    assert settings.management_address == Address("127.0.0.1", 9100)
    assert settings.metrics_address == Address("127.0.0.1", 9101)
    clash = _settings({"SAGEMAKER_BIND_TO_PORT": "8081"})
    assert (clash.management_address.port, clash.metrics_address.port) == (8082, 8083)
    inside = _settings({"SAGEMAKER_BIND_TO_PORT": "9100", "SAGEMAKER_SAFE_PORT_RANGE": "9100-9102"})
    assert (inside.management_address.port, inside.metrics_address.port) == (9101, 9102)


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"SAGEMAKER_BIND_TO_PORT": "http"}, "SAGEMAKER_BIND_TO_PORT"),
        ({"SAGEMAKER_BIND_TO_PORT": "70000"}, "SAGEMAKER_BIND_TO_PORT"),
        ({"SAGEMAKER_MODEL_SERVER_WORKERS": "0"}, "SAGEMAKER_MODEL_SERVER_WORKERS"),
        ({"SAGEMAKER_MODEL_SERVER_TIMEOUT": "1m"}, "SAGEMAKER_MODEL_SERVER_TIMEOUT"),
        ({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "-1"}, "SAGEMAKER_MAX_PAYLOAD_IN_MB"),
        ({"SAGEMAKER_SAFE_PORT_RANGE": "a-b"}, "SAGEMAKER_SAFE_PORT_RANGE"),
        ({"SAGEMAKER_SAFE_PORT_RANGE": "9100"}, "SAGEMAKER_SAFE_PORT_RANGE"),
        ({"SAGEMAKER_TS_BATCH_SIZE": "x"}, "SAGEMAKER_TS_BATCH_SIZE"),
    ],
)
def test_a_bad_value_names_its_variable(environ: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        sagemaker_start(environ)


def test_multi_model_loads_nothing_at_start_and_loads_on_demand_under_a_budget() -> None:
    settings = _settings({"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_TS_BATCH_SIZE": "4"}, 8 << 30)
    assert settings.models == ()
    assert settings.model_overrides == {}
    assert settings.enable_model_api is True
    assert settings.load_models_on_demand is True
    assert settings.model_memory_budget_mb == 6 * 1024  # three quarters of 8 GiB
    assert _settings({"SAGEMAKER_MULTI_MODEL": "true"}).model_memory_budget_mb == 0  # unknown
    own = {"SAGEMAKER_MULTI_MODEL": "true", "FERRY_MODEL_MEMORY_BUDGET_MB": "100"}
    assert _settings(own, 8 << 30).model_memory_budget_mb == 100


def test_unread_variables_are_noted() -> None:
    repacked = sagemaker_start({"SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code"})
    assert repacked.notes == []
    uploaded = sagemaker_start({"SAGEMAKER_SUBMIT_DIRECTORY": "s3://bucket/sourcedir.tar.gz"})
    assert (
        "SAGEMAKER_SUBMIT_DIRECTORY=s3://bucket/sourcedir.tar.gz is not read" in uploaded.notes[0]
    )
    multi = sagemaker_start({"SAGEMAKER_MULTI_MODEL": "true", "SAGEMAKER_TS_MIN_WORKERS": "2"})
    assert "single-model endpoint only" in multi.notes[0]
    assert json.dumps(multi.settings)  # plain text values


def test_code_named_on_s3_must_be_in_the_model_s_code_folder(tmp_path: Path) -> None:
    uploaded = {"SAGEMAKER_SUBMIT_DIRECTORY": "s3://bucket/sourcedir.tar.gz"}
    with pytest.raises(
        ConfigError, match=r"does not fetch code from s3://.*inference\.py is missing"
    ):
        check_code_is_local(uploaded, tmp_path)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "serve.py").touch()
    with pytest.raises(ConfigError, match=r"inference\.py is missing"):
        check_code_is_local(uploaded, tmp_path)
    check_code_is_local({**uploaded, "SAGEMAKER_PROGRAM": "serve.py"}, tmp_path)  # packaged
    check_code_is_local({**uploaded, "SAGEMAKER_PROGRAM": "serve"}, tmp_path)
    check_code_is_local({"SAGEMAKER_SUBMIT_DIRECTORY": "file:///elsewhere"}, tmp_path)
    check_code_is_local({"SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code"}, tmp_path)
    check_code_is_local({}, tmp_path)


def test_the_container_memory_is_its_cgroup_s_limit(tmp_path: Path) -> None:
    limit = tmp_path / "memory.max"
    limit.write_text("1073741824\n")
    assert memory_limit_bytes((limit,)) == 1 << 30
    limit.write_text("max\n")
    assert memory_limit_bytes((limit,)) > 0  # no limit: the host's memory
    assert memory_limit_bytes((tmp_path / "missing",)) == memory_limit_bytes((limit,))
