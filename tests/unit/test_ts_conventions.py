"""TorchServe's conventions: request ids, CORS, ignored settings, TS_CONFIG_FILE, per-model
queue and start-up timeout, describe's fields, missing start-up models, symlinked archives."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ferry.capacity.sizing import Machine
from ferry.cli.main import build_parser
from ferry.cli.serve import settings_from_args
from ferry.config.model_config import parse_model_config
from ferry.config.settings import ServerSettings
from ferry.config.sources import (
    IGNORED_TORCHSERVE_KEYS,
    MODEL_SNAPSHOT,
    OPTIONS_BY_KEY,
    load_settings,
)
from ferry.errors import ArchiveError, ConfigError, HandlerFailed, ModelConfigError
from ferry.http.errors import error_response
from ferry.http.listener import with_cors
from ferry.protocols.describe import model_json
from ferry.scheduling.model_runner import RunnerSettings
from ferry.scheduling.runner_settings import runner_settings
from ferry.service import FerryService
from ferry.service.requests import MAX_REQUEST_ID, RequestIds
from ferry.service.types import InputPart, PredictionRequest
from ferry.store.archive import open_model
from ferry.wire.spec import WorkerSpec
from tests.fixtures.fake_worker import Behaviour, FakeWorker
from tests.fixtures.models import digest_archive

BOUND = 30.0

# Every config.properties key TorchServe's configuration guide documents.
TORCHSERVE_KEYS = (
    "inference_address",
    "management_address",
    "metrics_address",
    "grpc_inference_port",
    "grpc_management_port",
    "keystore",
    "keystore_pass",
    "keystore_type",
    "private_key_file",
    "certificate_file",
    "cors_allowed_origin",
    "cors_allowed_methods",
    "cors_allowed_headers",
    "prefer_direct_buffer",
    "install_py_dep_per_model",
    "blacklist_env_vars",
    "number_of_gpu",
    "enable_metrics_api",
    "metrics_format",
    "enable_envvars_config",
    "number_of_netty_threads",
    "netty_client_threads",
    "default_workers_per_model",
    "job_queue_size",
    "async_logging",
    "default_response_timeout",
    "unregister_model_timeout",
    "decode_input_request",
    "initial_worker_port",
    "model_store",
    "model_server_home",
    "max_request_size",
    "max_response_size",
    "allowed_urls",
    "workflow_store",
    "load_models",
    "models",
    "vmargs",
    "model_snapshot",
    "enable_grpc_ssl",
    "disable_system_metrics",
    "metrics_mode",
    "metrics_config",
    "system_metrics_cmd",
    "enable_model_api",
    "disable_token_authorization",
    "use_env_allowed_urls",
)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), BOUND))


async def _echo_worker(spec: WorkerSpec, startup_timeout: float) -> FakeWorker:
    return FakeWorker(Behaviour.ECHO)


def _service(store: Path, **settings: object) -> FerryService:
    values: dict[str, object] = {"model_store": store, **settings}
    return FerryService(ServerSettings(**values), start_worker=_echo_worker)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    folder = tmp_path / "store"
    folder.mkdir()
    digest_archive(folder, "good")
    return folder


# --- x-request-id ----------------------------------------------------------------------


def test_predict_runs_under_the_clients_request_id_or_a_generated_one(store: Path) -> None:
    async def scenario() -> None:
        service = _service(store, models=("good=good.mar",))
        await service.load_startup_models()
        part = [InputPart("body", "text/plain", b"hi")]
        answer = await service.predict(
            service.admit("good"), PredictionRequest(part, {"x-request-id": "trace-42"})
        )
        assert answer.request_id == "trace-42" and answer.body == b"hi"
        generated = await service.predict(service.admit("good"), PredictionRequest(part, {}))
        assert generated.request_id.startswith("r")
        for unusable in ("", "x" * (MAX_REQUEST_ID + 1), "has space", "caf\u00e9", "r" + "9" * 20):
            answer = await service.predict(
                service.admit("good"), PredictionRequest(part, {"x-request-id": unusable})
            )
            assert answer.request_id != unusable and answer.request_id.startswith("r")
        assert not service._request_ids._in_flight  # released once answered
        await service.close()

    run(scenario)


def test_a_request_id_already_in_flight_is_not_reused() -> None:
    ids = RequestIds()
    assert ids.choose("same") == "same"
    second = ids.choose("same")
    assert second != "same" and second.startswith("r")
    ids.release("same")
    assert ids.choose("same") == "same"


# --- PredictionException ---------------------------------------------------------------


def test_a_handlers_status_keeps_torchserves_error_type() -> None:
    response = error_response(HandlerFailed("denied", status=418))
    assert response.status_code == 418
    assert response.body == b'{"code": 418, "type": "InternalServerException", "message": "denied"}'


# --- CORS ------------------------------------------------------------------------------


def _api() -> Starlette:
    async def describe(request: Request) -> Response:
        return PlainTextResponse("openapi")

    async def predict(request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(
        routes=[Route("/", describe, methods=["OPTIONS"]), Route("/p", predict, methods=["POST"])]
    )


def test_cors_is_off_unless_an_origin_is_allowed() -> None:
    app = _api()
    assert with_cors(app, ServerSettings()) is app


def test_cors_answers_preflights_and_marks_simple_requests() -> None:
    settings = ServerSettings(
        cors_allowed_origin=("https://app.example",),
        cors_allowed_methods=("GET", "POST"),
        cors_allowed_headers=("X-Custom-Header",),
    )
    origin = {"Origin": "https://app.example"}

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=with_cors(_api(), settings))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            preflight = await client.options(
                "/",
                headers={
                    **origin,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "X-Custom-Header",
                },
            )
            assert preflight.status_code == 200 and preflight.text != "openapi"
            assert preflight.headers["access-control-allow-origin"] == "https://app.example"
            assert "POST" in preflight.headers["access-control-allow-methods"]
            refused = await client.options(
                "/p", headers={**origin, "Access-Control-Request-Method": "DELETE"}
            )
            assert refused.status_code == 400
            assert (await client.options("/")).text == "openapi"  # not a preflight
            simple = await client.post("/p", headers=origin)
            assert simple.headers["access-control-allow-origin"] == "https://app.example"
            assert "x-request-id" in simple.headers["access-control-expose-headers"]
            other = await client.post("/p", headers={"Origin": "https://evil.example"})
            assert "access-control-allow-origin" not in other.headers

    run(scenario)


def test_cors_keys_are_settings(tmp_path: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text(
        "cors_allowed_origin=*\n"
        "cors_allowed_methods=GET, POST, PUT, OPTIONS\n"
        "cors_allowed_headers=X-Custom-Header\n"
    )
    settings = load_settings({}, {}, config)
    assert settings.cors_allowed_origin == ("*",)
    assert settings.cors_allowed_methods == ("GET", "POST", "PUT", "OPTIONS")
    assert settings.cors_allowed_headers == ("X-Custom-Header",)


# --- TorchServe's settings: honoured or ignored with a reason ---------------------------


def test_every_documented_torchserve_key_is_honoured_or_ignored_with_a_reason() -> None:
    unaccounted = [
        key
        for key in TORCHSERVE_KEYS
        if key not in OPTIONS_BY_KEY
        and key not in IGNORED_TORCHSERVE_KEYS
        and key != MODEL_SNAPSHOT  # read into load_models and models
    ]
    assert not unaccounted
    assert all(reason.strip() for reason in IGNORED_TORCHSERVE_KEYS.values())


def test_an_ignored_key_warns_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "config.properties"
    config.write_text("keystore=ks.p12\n")
    with caplog.at_level(logging.WARNING, logger="ferry.config"):
        load_settings({}, {}, config)
    assert IGNORED_TORCHSERVE_KEYS["keystore"] in caplog.text


# --- TS_CONFIG_FILE --------------------------------------------------------------------


def test_ts_config_file_names_the_config_file_unless_the_flag_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_env, from_flag = tmp_path / "env.properties", tmp_path / "flag.properties"
    from_env.write_text("job_queue_size=11\n")
    from_flag.write_text("job_queue_size=22\n")
    monkeypatch.setenv("TS_CONFIG_FILE", str(from_env))
    parser = build_parser()
    assert settings_from_args(parser.parse_args(["serve"])).job_queue_size == 11
    flagged = parser.parse_args(["serve", "--ts-config", str(from_flag)])
    assert settings_from_args(flagged).job_queue_size == 22
    monkeypatch.delenv("TS_CONFIG_FILE")
    assert settings_from_args(parser.parse_args(["serve"])).job_queue_size == 100


# --- jobQueueSize, startupTimeout --------------------------------------------------------


def test_job_queue_size_and_startup_timeout_are_model_config_keys() -> None:
    config = parse_model_config({"jobQueueSize": 3, "startupTimeout": 45}, source="m")
    assert config.job_queue_size == 3 and config.startup_timeout == 45
    with pytest.raises(ModelConfigError, match="jobQueueSize"):
        parse_model_config({"jobQueueSize": 0}, source="m")
    with pytest.raises(ModelConfigError, match="startupTimeout"):
        parse_model_config({"startupTimeout": -1}, source="m")


def test_the_models_queue_and_startup_timeout_win_over_the_servers(
    store: Path, tmp_path: Path
) -> None:
    digest_archive(store, "tiny", jobQueueSize=2, startupTimeout=30)
    settings = ServerSettings(model_store=store, job_queue_size=50)
    work = tmp_path / "work"
    work.mkdir()

    def plan(name: str, requested_startup_timeout: float | None) -> RunnerSettings:
        config = open_model(store, f"{name}.mar", work).config
        return runner_settings(
            config,
            settings,
            Machine(2, 0),
            gpu_ids=(),
            requested_startup_timeout=requested_startup_timeout,
        )

    tiny = plan("tiny", None)
    assert tiny.queue_capacity == 2 and tiny.startup_timeout == 30
    # TorchServe's precedence: model-config.yaml's startupTimeout wins over the request's.
    assert plan("tiny", 90).startup_timeout == 30
    good = plan("good", None)
    assert good.queue_capacity == 50 and good.startup_timeout == 120
    assert plan("good", 0).startup_timeout == 0


# --- describe --------------------------------------------------------------------------

TORCHSERVE_DESCRIBE_FIELDS = {
    "modelName", "modelVersion", "modelUrl", "runtime", "minWorkers", "maxWorkers",
    "batchSize", "maxBatchDelay", "responseTimeout", "maxRetryTimeoutInSec",
    "clientTimeoutInMills", "parallelType", "parallelLevel", "deviceType", "deviceIds",
    "continuousBatching", "useJobTicket", "useVenv", "stateful", "sequenceMaxIdleMSec",
    "sequenceTimeoutMSec", "maxNumSequence", "maxSequenceJobQueueSize", "loadedAtStartup",
    "workers", "jobQueueStatus",
}  # fmt: skip


def test_describe_has_torchserves_fields(store: Path) -> None:
    digest_archive(store, "tiny", jobQueueSize=2, startupTimeout=30)

    async def scenario() -> None:
        service = _service(store, models=("tiny=tiny.mar",))
        await service.load_startup_models()
        (status,) = service.describe("tiny", None)
        described = model_json(status)
        assert described.keys() >= TORCHSERVE_DESCRIBE_FIELDS
        assert described["jobQueueSize"] == 2 and described["startupTimeout"] == 30
        assert described["deviceType"] == "cpu" and described["deviceIds"] == []
        await service.close()

    run(scenario)


# --- start-up models missing from the store ---------------------------------------------


def test_a_missing_startup_model_stops_start_up_naming_it(store: Path) -> None:
    """TorchServe logs it and serves without it, /ping Healthy; Ferry refuses to start
    (exit status 2), naming every missing one and the store's close names, before any
    worker starts (issue 51)."""
    workers: list[str] = []

    async def scenario() -> None:
        models = ("good=good.mar", "gone=gone.mar", "godo.mar")
        settings = ServerSettings(model_store=store, models=models)
        service = FerryService(settings, start_worker=_recording(workers))
        with pytest.raises(ConfigError) as refused:
            await service.load_startup_models()
        assert refused.value.message == (
            f"start-up models not found in the model store {store}: gone=gone.mar; "
            "godo.mar (did you mean 'good.mar'?)"
        )
        assert not service.ready() and service.registry.names() == []
        await service.close()

    run(scenario)
    assert workers == []


def _recording(started: list[str]) -> Callable[[WorkerSpec, float], Awaitable[FakeWorker]]:
    async def start(spec: WorkerSpec, startup_timeout: float) -> FakeWorker:
        started.append(spec.model.model_name)
        return FakeWorker(Behaviour.ECHO)

    return start


def test_a_startup_model_escaping_the_store_still_stops_start_up(store: Path) -> None:
    (store.parent / "outside.mar").write_bytes(b"")

    async def scenario() -> None:
        service = _service(store, models=("x=../outside.mar",))
        with pytest.raises(ArchiveError, match="outside the model store"):
            await service.load_startup_models()
        await service.close()

    run(scenario)


# --- symlinks in the store ---------------------------------------------------------------


def test_a_symlink_inside_the_store_is_read_through(store: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    digest_archive(elsewhere, "linked")
    (store / "linked.mar").symlink_to(elsewhere / "linked.mar")
    (store / "folder-link").symlink_to(elsewhere)
    work = tmp_path / "work"
    work.mkdir()
    assert open_model(store, "linked.mar", work).name == "linked"
    assert open_model(store, "folder-link/linked.mar", work).name == "linked"
    for escape in ("../elsewhere/linked.mar", "folder-link/../../elsewhere/linked.mar"):
        with pytest.raises(ArchiveError, match="outside the model store"):
            open_model(store, escape, work)
    with pytest.raises(ArchiveError, match="outside the model store"):
        open_model(store, str(elsewhere / "linked.mar"), work)
