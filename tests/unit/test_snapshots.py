"""Model snapshots: writing, rotation, the latest one, and their round trip into settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.cli.main import build_parser
from ferry.cli.serve import config_file_from_args
from ferry.config.settings import ServerSettings
from ferry.config.sources import load_settings, read_properties
from ferry.errors import ConfigError
from ferry.service.snapshots import (
    KEEP,
    ServerSnapshot,
    VersionSnapshot,
    latest_snapshot,
    restore_snapshot,
    snapshot_folder,
    write_snapshot,
)


def _version(model: str = "digest", version: str = "1.0", **changes: object) -> VersionSnapshot:
    values: dict[str, object] = {
        "model": model,
        "version": version,
        "source": f"{model}-{version}.mar",
        "is_default": True,
        "min_workers": 2,
        "max_workers": 3,
        "batch_size": 4,
        "max_batch_delay_ms": 50.0,
        "response_timeout": 30.0,
    }
    values.update(changes)
    return VersionSnapshot(**values)  # type: ignore[arg-type]


def _state(tmp_path: Path, *versions: VersionSnapshot) -> ServerSnapshot:
    return ServerSnapshot(tmp_path / "store", versions)


def test_write_is_atomic_and_latest_is_the_newest(tmp_path: Path) -> None:
    folder = tmp_path / "config"
    assert latest_snapshot(folder) is None
    first = write_snapshot(folder, _state(tmp_path), "startup")
    second = write_snapshot(folder, _state(tmp_path, _version()))
    assert first.name.endswith("-startup.cfg") and second.name.endswith("-snapshot.cfg")
    assert first.name < second.name  # written within a microsecond, still in order
    assert latest_snapshot(folder) == second
    assert [p.name for p in folder.iterdir() if not p.name.endswith(".cfg")] == []
    (folder / "notes.cfg").write_text("not a snapshot")
    assert latest_snapshot(folder) == second


def test_only_the_newest_snapshots_are_kept(tmp_path: Path) -> None:
    folder = tmp_path / "config"
    written = [write_snapshot(folder, _state(tmp_path)) for _ in range(KEEP + 3)]
    assert sorted(folder.iterdir()) == written[-KEEP:]


def test_a_shutdown_snapshot_is_the_latest_and_counts_in_the_rotation(tmp_path: Path) -> None:
    """TorchServe's three kinds: ``-startup.cfg``, ``-snapshot.cfg``, ``-shutdown.cfg``;
    the newest of any kind is the one restored."""
    folder = tmp_path / "config"
    kinds = ["startup", *["snapshot"] * (KEEP - 1), "shutdown"]
    written = [write_snapshot(folder, _state(tmp_path, _version()), kind) for kind in kinds]
    assert written[-1].name.endswith("-shutdown.cfg")
    assert latest_snapshot(folder) == written[-1]
    assert sorted(folder.iterdir()) == written[-KEEP:]  # the startup one rotated out
    restored = restore_snapshot(ServerSettings(log_location=tmp_path))
    assert restored.models == ("digest=digest-1.0.mar",)
    with pytest.raises(ValueError, match="snapshot kind 'stopped'"):
        write_snapshot(folder, _state(tmp_path), "stopped")


def test_snapshot_is_a_config_properties_with_torchserve_models_json(tmp_path: Path) -> None:
    switched = _version(version="2.0", is_default=False, batch_policy="immediate")
    objective = _version(batch_policy_options={"latencyObjectiveMs": 80.0})
    state = _state(tmp_path, objective, switched)
    values = read_properties(write_snapshot(tmp_path / "config", state))
    assert values["model_store"] == str(tmp_path / "store")
    assert values["load_models"] == "digest=digest-1.0.mar,digest=digest-2.0.mar"
    settings = load_settings({}, {}, write_snapshot(tmp_path / "config", state))
    assert settings.model_overrides["digest"]["2.0"] == {
        "defaultVersion": False,
        "marName": "digest-2.0.mar",
        "minWorkers": 2,
        "maxWorkers": 3,
        "batchSize": 4,
        "maxBatchDelay": 50.0,
        "responseTimeout": 30.0,
        "batchPolicy": "immediate",
    }
    assert settings.model_overrides["digest"]["1.0"]["latencyObjectiveMs"] == 80.0


def test_restore_loads_the_latest_snapshots_models(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_snapshot(logs / "config", _state(tmp_path, _version(model="old")))
    write_snapshot(logs / "config", _state(tmp_path, _version(), _version(model="other")))
    configured = {"digest": {"1.0": {"deviceType": "cpu", "batchSize": 1}}}
    settings = ServerSettings(log_location=logs, model_overrides=configured)
    restored = restore_snapshot(settings)
    assert restored.models == ("digest=digest-1.0.mar", "other=other-1.0.mar")
    assert restored.model_store == tmp_path / "store"
    # The snapshot's values win; the config file's other keys stay.
    digest = restored.model_overrides["digest"]["1.0"]
    assert digest["deviceType"] == "cpu" and digest["batchSize"] == 4
    assert digest["minWorkers"] == 2 and digest["defaultVersion"] is True


def test_restore_keeps_a_given_model_store(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_snapshot(logs / "config", _state(tmp_path, _version()))
    mine = tmp_path / "mine"
    assert restore_snapshot(ServerSettings(log_location=logs, model_store=mine)).model_store == mine


@pytest.mark.parametrize(
    "changes",
    [
        {"models": ("digest.mar",)},  # --models wins over the snapshot
        {"config_snapshots": False},  # --ncs
        {"log_location": None},  # no log folder, no snapshots
    ],
)
def test_restore_does_nothing_when_told_or_without_a_log_folder(
    tmp_path: Path, changes: dict[str, object]
) -> None:
    logs = tmp_path / "logs"
    write_snapshot(logs / "config", _state(tmp_path, _version()))
    settings = ServerSettings(**{"log_location": logs, **changes})  # type: ignore[arg-type]
    assert restore_snapshot(settings) == settings


def test_a_config_file_means_no_snapshot_is_restored(tmp_path: Path) -> None:
    """TorchServe's rule: only a start with neither ``TS_CONFIG_FILE`` nor ``--ts-config``
    restores the latest snapshot."""
    logs = tmp_path / "logs"
    write_snapshot(logs / "config", _state(tmp_path, _version()))
    settings = ServerSettings(log_location=logs)
    assert restore_snapshot(settings, tmp_path / "config.properties") == settings
    assert restore_snapshot(settings, None).models == ("digest=digest-1.0.mar",)


def test_the_config_file_is_the_flags_else_ts_config_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parser = build_parser()
    monkeypatch.delenv("TS_CONFIG_FILE", raising=False)
    assert config_file_from_args(parser.parse_args(["serve"])) is None
    monkeypatch.setenv("TS_CONFIG_FILE", "")  # set but empty: as if unset
    assert config_file_from_args(parser.parse_args(["serve"])) is None
    monkeypatch.setenv("TS_CONFIG_FILE", str(tmp_path / "env.properties"))
    assert config_file_from_args(parser.parse_args(["serve"])) == tmp_path / "env.properties"
    flagged = parser.parse_args(["serve", "--ts-config", str(tmp_path / "flag.properties")])
    assert config_file_from_args(flagged) == tmp_path / "flag.properties"


def test_an_empty_snapshot_restores_nothing(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_snapshot(logs / "config", _state(tmp_path))
    settings = ServerSettings(log_location=logs)
    assert restore_snapshot(settings) == settings


def test_a_broken_snapshot_stops_start_up_naming_it_and_ncs(tmp_path: Path) -> None:
    path = write_snapshot(tmp_path / "logs" / "config", _state(tmp_path, _version()))
    path.write_text("load_models=digest\nmodels={not json\n")
    with pytest.raises(ConfigError, match=r"snapshot .*models: invalid JSON.*--ncs"):
        restore_snapshot(ServerSettings(log_location=tmp_path / "logs"))


def test_a_snapshot_naming_an_archive_gone_from_the_store_stops_start_up(
    tmp_path: Path,
) -> None:
    """Issue 51: a start-up model missing from the store stops start-up; restored from a
    snapshot, the message says where the name came from and how to start without it."""
    (tmp_path / "store").mkdir()
    path = write_snapshot(tmp_path / "logs" / "config", _state(tmp_path, _version()))
    with pytest.raises(ConfigError) as refused:
        restore_snapshot(ServerSettings(log_location=tmp_path / "logs"))
    assert refused.value.message == (
        f"snapshot {path}: start-up model not found in the model store {tmp_path / 'store'}: "
        "digest=digest-1.0.mar; --ncs ignores snapshots"
    )


def test_snapshot_folder_follows_log_location(tmp_path: Path) -> None:
    assert snapshot_folder(ServerSettings(log_location=tmp_path)) == tmp_path / "config"
    assert snapshot_folder(ServerSettings()) is None
    assert snapshot_folder(ServerSettings(log_location=tmp_path, config_snapshots=False)) is None
