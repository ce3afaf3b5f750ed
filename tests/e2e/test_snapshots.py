"""Model snapshots across restarts: what the management API changed (batch policy
included) comes back, unless --ncs or a config file is given; a stop writes a
``-shutdown.cfg`` snapshot, as TorchServe's does."""

from __future__ import annotations

from pathlib import Path

import httpx

from ferry.config.sources import read_properties
from ferry.service.snapshots import latest_snapshot
from tests.fixtures.models import digest_archive
from tests.fixtures.server import ferry_server


def _ok(response: httpx.Response) -> None:
    assert response.status_code == 200, response.text


def test_registered_models_and_scaling_survive_a_restart_unless_ncs_or_a_config_file(
    tmp_path: Path,
) -> None:
    store, logs = tmp_path / "store", tmp_path / "logs"
    store.mkdir()
    digest_archive(store, "digest")
    digest_archive(store, "digest", version="2.0", file_stem="digest_v2")
    snapshots = ("--enable-model-api", "--log-location", str(logs))

    with ferry_server(store, [], tmp_path, *snapshots) as server, server.management() as api:
        for url in ("digest.mar", "digest_v2.mar"):
            registration = {
                "url": url,
                "initial_workers": 1,
                "synchronous": "true",
                "batch_size": 4,
            }
            _ok(api.post("/models", params=registration))
        _ok(api.put("/models/digest/2.0/set-default"))
        _ok(api.put("/models/digest/2.0", params={"min_worker": 2, "synchronous": "true"}))
        _ok(api.put("/models/digest/1.0", params={"batch_policy": "immediate"}))
        after_changes = latest_snapshot(logs / "config")
        assert after_changes is not None and after_changes.name.endswith("-snapshot.cfg")
    stopped = latest_snapshot(logs / "config")
    assert stopped is not None and stopped.name.endswith("-shutdown.cfg")
    assert read_properties(stopped)["models"] == read_properties(after_changes)["models"]

    with ferry_server(store, [], tmp_path, *snapshots) as server, server.management() as api:
        (default,) = api.get("/models/digest").json()
        assert default["modelVersion"] == "2.0" and default["loadedAtStartup"] is True
        assert default["minWorkers"] == 2 and default["batchSize"] == 4
        assert [w["status"] for w in default["workers"]] == ["READY", "READY"]
        (first,) = api.get("/models/digest/1.0").json()
        assert first["minWorkers"] == 1 and first["batchSize"] == 4
        assert first["batchPolicy"]["policy"] == "immediate"
        assert default["batchPolicy"]["policy"] == "adaptive"
        with server.client() as inference:
            assert inference.post("/predictions/digest", content=b"x").status_code == 200
        restarted = latest_snapshot(logs / "config")
        assert restarted is not None and restarted.name.endswith("-startup.cfg")
    stopped = latest_snapshot(logs / "config")
    assert stopped is not None and stopped.name.endswith("-shutdown.cfg")
    assert read_properties(stopped)["load_models"] == read_properties(restarted)["load_models"]

    with (
        ferry_server(store, [], tmp_path, *snapshots, "--ncs") as server,
        server.management() as api,
    ):
        assert api.get("/models").json() == {"models": []}
    assert latest_snapshot(logs / "config") == stopped  # --ncs writes none either

    config = tmp_path / "config.properties"
    config.write_text("default_workers_per_model=1\n")
    with (  # TorchServe's rule: a config file given, the snapshot is not restored
        ferry_server(store, [], tmp_path, *snapshots, "--ts-config", str(config)) as server,
        server.management() as api,
    ):
        assert api.get("/models").json() == {"models": []}
    ts_log = (logs / "ts_log.log").read_text()
    assert f"snapshot {stopped} not restored: config file {config} given" in ts_log
