"""The start-up models: which archives ``load_models`` (and the ``models`` JSON) name, opened
with their overrides applied. ``ferry serve`` starts workers for them
(``ferry.service.lifecycle``); ``ferry serve --ray`` deploys them, each to replicas that
open it themselves.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from ferry.config.model_config import apply_overrides
from ferry.config.settings import ServerSettings
from ferry.errors import ConfigError
from ferry.store.archive import ModelArchive, open_model, resolve_model_entries

log = logging.getLogger("ferry.service")


def startup_store(settings: ServerSettings) -> Path | None:
    """The model store start-up models come from; None when there are none to load."""
    if not settings.models:
        return None
    if settings.model_store is None:
        raise ConfigError("--models needs --model-store")
    return settings.model_store


def startup_entries(settings: ServerSettings, store: Path) -> list[tuple[str | None, str]]:
    """``load_models`` entries as (name or None, path in the store); a bare model name from
    the ``models`` JSON loads each of its versions from their ``marName`` (TorchServe's
    config.properties rules)."""
    resolved: list[tuple[str | None, str]] = []
    for name, relative in resolve_model_entries(store, settings.models):
        versions = settings.model_overrides.get(relative) if name is None else None
        if versions and not (store / relative).exists():
            for version in versions.values():
                resolved.append((relative, str(version.get("marName", f"{relative}.mar"))))
        else:
            resolved.append((name, relative))
    return resolved


def open_startup_model(
    settings: ServerSettings, store: Path, name: str | None, relative: str, work_dir: Path
) -> ModelArchive | None:
    """The archive unpacked under ``work_dir``, its ``models`` JSON overrides applied; None
    when it is missing from the store: like TorchServe, Ferry logs it and starts without
    it. Any other problem with it stops start-up."""
    if not (store / relative).exists():
        log.error("model %s not found in the model store %s; not loaded", relative, store)
        return None
    archive = open_model(
        store, relative, work_dir, name, max_unpacked_size=settings.max_unpacked_size
    )
    overrides = settings.model_overrides.get(archive.name, {}).get(archive.version)
    if overrides:
        source = f"models[{archive.name}][{archive.version}]"
        config = apply_overrides(archive.config, overrides, source=source)
        archive = dataclasses.replace(archive, config=config)
    return archive


def startup_archives(settings: ServerSettings, work_dir: Path) -> list[tuple[str, ModelArchive]]:
    """The start-up models as ``load_models`` entries naming one version each, with their
    archives opened but nothing started: what ``ferry serve --ray`` deploys."""
    store = startup_store(settings)
    if store is None:
        return []
    opened = []
    for name, relative in startup_entries(settings, store):
        archive = open_startup_model(settings, store, name, relative, work_dir)
        if archive is not None:
            opened.append((f"{archive.name}={relative}", archive))
    return opened


def is_default(settings: ServerSettings, archive: ModelArchive) -> bool:
    """Whether the ``models`` JSON makes this version its model's default."""
    versions = settings.model_overrides.get(archive.name, {})
    return versions.get(archive.version, {}).get("defaultVersion") is True
