"""Model snapshots: the registered models and their scaling, kept across restarts.

Like TorchServe, Ferry writes a snapshot after start-up (``-startup.cfg``), after each
successful register, unregister, scale and set-default (and, Ferry's own, a batch policy
switch; ``-snapshot.cfg``) and when it stops (``-shutdown.cfg``). A snapshot is a
``config.properties`` that ``--ts-config`` could read too::

    model_store=/srv/models
    load_models=digest=digest.mar
    models={"digest": {"1.0": {"defaultVersion": true, "marName": "digest.mar", ...}}}

They live in ``<log_location>/config/`` (TorchServe keeps them under its log folder); a
server without ``log_location``, whose logs go to stderr, keeps none, nor does one started
with ``config_snapshots=false`` (``--ncs``). The last ``KEEP`` snapshots are kept, of
whichever kind.

The newest of them, whichever its kind, is restored at a start with no config file, as
TorchServe does (``ConfigManager``: only when neither ``TS_CONFIG_FILE`` nor
``--ts-config`` names one, and not with ``--ncs``). Ferry's difference: ``--models`` wins
over the snapshot (TorchServe ignores ``--models`` when it restores one).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ferry.config.settings import ServerSettings
from ferry.config.sources import OPTIONS_BY_KEY, read_properties
from ferry.errors import ConfigError
from ferry.scheduling.registry import ModelRegistry
from ferry.service.startup import refuse_missing, startup_entries

log = logging.getLogger("ferry.snapshots")

KEEP = 10
"""Snapshot files kept in the folder; older ones are deleted."""

KINDS = ("startup", "snapshot", "shutdown")
"""TorchServe's snapshot kinds, each a file name suffix: ``<timestamp>-<kind>.cfg``."""

_NAME = re.compile(rf"^(\d{{20}})-({'|'.join(KINDS)})\.cfg$")


@dataclass(frozen=True)
class VersionSnapshot:
    """One registered model version as a restart should bring it back."""

    model: str
    version: str
    source: str
    """The archive or folder, relative to the model store (TorchServe's ``marName``)."""
    is_default: bool
    min_workers: int
    max_workers: int
    batch_size: int
    max_batch_delay_ms: float
    response_timeout: float
    batch_policy: str = "adaptive"
    """Set through the management API (``PUT /models/M?batch_policy=``) or model-config."""
    batch_policy_options: Mapping[str, Any] = field(default_factory=dict)
    """The policy's options, by model-config.yaml key (``latencyObjectiveMs``)."""
    load_on_demand: bool = False
    """Loaded on demand: restored registered, not resident (``minWorkers``: its workers
    once loaded)."""


@dataclass(frozen=True)
class ServerSnapshot:
    model_store: Path | None
    versions: tuple[VersionSnapshot, ...]


def snapshot_of(registry: ModelRegistry, model_store: Path | None) -> ServerSnapshot:
    """Every registered version with its source, default flag and scaling: what a
    restart needs to bring the models back."""
    versions = []
    for entry in registry.all_versions():
        archive, runner = entry.archive, entry.runner
        if archive.workflow is not None:
            continue  # registered with its workflow, as in TorchServe
        versions.append(
            VersionSnapshot(
                model=archive.name,
                version=archive.version,
                source=archive.source,
                is_default=registry.default_version(archive.name) == archive.version,
                min_workers=runner.settings.workers
                if runner.settings.load_on_demand
                else len(runner.slots),
                max_workers=runner.max_workers,
                batch_size=runner.settings.batch_size,
                max_batch_delay_ms=runner.settings.max_batch_delay * 1000,
                response_timeout=runner.settings.response_timeout,
                batch_policy=runner.settings.batch_policy,
                batch_policy_options=runner.settings.batch_policy_options,
                load_on_demand=runner.settings.load_on_demand,
            )
        )
    return ServerSnapshot(model_store, tuple(versions))


def snapshot_folder(settings: ServerSettings) -> Path | None:
    """Where snapshots are written and read; None when the server keeps none."""
    if not settings.config_snapshots or settings.log_location is None:
        return None
    return settings.log_location / "config"


def to_properties(state: ServerSnapshot) -> dict[str, str]:
    """The snapshot as config.properties values: ``model_store``, ``load_models`` (one
    ``NAME=SOURCE`` per version) and TorchServe's ``models`` JSON."""
    models: dict[str, dict[str, dict[str, Any]]] = {}
    for v in state.versions:
        # batchPolicy and its options (latencyObjectiveMs) are Ferry's keys: TorchServe
        # reading such a file ignores them, Ferry applies them as model-config.yaml's.
        keys: dict[str, Any] = {
            "defaultVersion": v.is_default,
            "marName": v.source,
            "minWorkers": v.min_workers,
            "maxWorkers": v.max_workers,
            "batchSize": v.batch_size,
            "maxBatchDelay": v.max_batch_delay_ms,
            "responseTimeout": v.response_timeout,
            "batchPolicy": v.batch_policy,
            **v.batch_policy_options,
        }
        if v.load_on_demand:
            keys["loadOnDemand"] = True
        models.setdefault(v.model, {})[v.version] = keys
    values = {
        "load_models": ",".join(f"{v.model}={v.source}" for v in state.versions),
        "models": json.dumps(models, sort_keys=True),
    }
    if state.model_store is not None:
        values["model_store"] = str(state.model_store.absolute())
    return values


def write_snapshot(folder: Path, state: ServerSnapshot, kind: str = "snapshot") -> Path:
    """Write ``<timestamp>-<kind>.cfg`` atomically (a reader never sees half a file) and
    delete all but the newest ``KEEP``. ``kind`` is one of ``KINDS``."""
    if kind not in KINDS:
        raise ValueError(f"snapshot kind {kind!r} is not one of {KINDS}")
    folder.mkdir(parents=True, exist_ok=True)
    stamp = int(datetime.now(UTC).strftime("%Y%m%d%H%M%S%f"))
    latest = latest_snapshot(folder)
    if latest is not None:  # names must sort in writing order, even within a microsecond
        stamp = max(stamp, int(latest.name[:20]) + 1)
    path = folder / f"{stamp:020d}-{kind}.cfg"
    lines = [
        f"# Ferry model snapshot ({kind}); restored by the next start without --models, "
        "--ts-config or TS_CONFIG_FILE"
    ]
    lines += [f"{key}={value}" for key, value in to_properties(state).items()]
    descriptor, tmp = tempfile.mkstemp(dir=folder, prefix=".snapshot-", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write("\n".join(lines) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    for old in _snapshots(folder)[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


def latest_snapshot(folder: Path) -> Path | None:
    """The newest snapshot file in ``folder``, or None."""
    snapshots = _snapshots(folder)
    return snapshots[-1] if snapshots else None


def _snapshots(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.match(p.name))


def restore_snapshot(settings: ServerSettings, config_file: Path | None = None) -> ServerSettings:
    """``settings`` with the latest snapshot's models as start-up models, unless a config
    file was given (``config_file``: ``--ts-config`` or ``TS_CONFIG_FILE``; TorchServe's
    rule), ``--models`` named some, or snapshots are off. The snapshot's per-version values
    win over a ``models`` JSON from flags or variables; its other keys there stay."""
    folder = snapshot_folder(settings)
    path = latest_snapshot(folder) if folder is not None and not settings.models else None
    if path is None:
        return settings
    if config_file is not None:
        log.info("snapshot %s not restored: config file %s given", path, config_file)
        return settings
    try:
        values = read_properties(path)
        models = OPTIONS_BY_KEY["load_models"].parse("load_models", values.get("load_models", ""))
        overrides = OPTIONS_BY_KEY["models"].parse("models", values.get("models", "{}"))
    except ConfigError as error:
        raise ConfigError(f"snapshot {path}: {error.message}; --ncs ignores snapshots") from None
    if not models:
        return settings
    merged = {name: dict(versions) for name, versions in settings.model_overrides.items()}
    for name, versions in overrides.items():
        for version, keys in versions.items():
            merged.setdefault(name, {})[version] = {**merged.get(name, {}).get(version, {}), **keys}
    store = settings.model_store
    if store is None and "model_store" in values:
        store = Path(values["model_store"])
    log.info("restoring %d model versions from snapshot %s", len(models), path)
    restored = dataclasses.replace(
        settings, models=models, model_overrides=merged, model_store=store
    )
    if store is not None and store.is_dir():  # say where the missing names come from
        try:
            refuse_missing(store, startup_entries(restored, store))
        except ConfigError as error:
            raise ConfigError(
                f"snapshot {path}: {error.message}; --ncs ignores snapshots"
            ) from None
    return restored
