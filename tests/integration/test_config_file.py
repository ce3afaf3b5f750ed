"""A TorchServe config.properties with a ``models=`` JSON loads the right models and settings."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.cli import run_ferry
from tests.fixtures.models import digest_archive
from tests.fixtures.server import ferry_server


def test_config_properties_models_json(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    digest_archive(store, "noop", batchSize=1)
    digest_archive(store, "noop", version="2.0", file_stem="noop_v2", batchSize=1)
    config = tmp_path / "config.properties"
    config.write_text(
        f"model_store={store}\n"
        "load_models=noop\n"
        "job_queue_size=7\n"
        "models={\\\n"
        '  "noop": {\\\n'
        '    "1.0": {"marName": "noop.mar", "minWorkers": 1,\\\n'
        '            "batchSize": 4, "maxBatchDelay": 30},\\\n'
        '    "2.0": {"marName": "noop_v2.mar", "minWorkers": 1, "batchSize": 2,\\\n'
        '            "responseTimeout": 60, "defaultVersion": true}\\\n'
        "  }\\\n"
        "}\n"
        "vmargs=-Xmx1g\n"
    )
    with ferry_server(store, [], tmp_path, "--ts-config", str(config)) as server:
        with server.management() as api:
            described = {m["modelVersion"]: m for m in api.get("/models/noop/all").json()}
            assert described["1.0"]["batchSize"] == 4 and described["1.0"]["maxBatchDelay"] == 30
            assert described["2.0"]["batchSize"] == 2 and described["2.0"]["responseTimeout"] == 60
            assert described["2.0"]["jobQueueStatus"]["remainingCapacity"] == 7
            assert api.get("/models/noop").json()[0]["modelVersion"] == "2.0"  # defaultVersion
        with server.client() as client:
            assert client.post("/predictions/noop/1.0", content=b"x").status_code == 200
        assert "vmargs is a TorchServe setting Ferry does not use" in server.log()


def test_invalid_config_value_stops_start_up_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text("job_queue_size=-3\n")
    result = run_ferry("serve", "--ts-config", str(config), timeout=60)
    assert result.returncode == 2 and "job_queue_size" in result.stderr
