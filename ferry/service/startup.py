"""The start-up models: which archives ``load_models`` (and the ``models`` JSON) name, opened
with their overrides applied. ``ferry serve`` starts workers for them
(``ferry.service.lifecycle``); ``ferry serve --ray`` deploys them, each to replicas that
open it themselves.

One that is missing from the model store stops start-up (``ConfigError``: exit status 2),
naming it and the store's close names. TorchServe logs it and serves without it, its
``/ping`` Healthy; a server that cannot load what it was told to load must not look
healthy, and exiting says why where a probe that never passes would not.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from ferry.config.model_config import apply_overrides
from ferry.config.settings import ServerSettings
from ferry.errors import ConfigError
from ferry.store.archive import ModelArchive, open_model, resolve_model_entries, store_models
from ferry.suggest import close_matches

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


def refuse_missing(store: Path, entries: list[tuple[str | None, str]]) -> None:
    """``ConfigError`` naming every entry missing from ``store``, each with the store's
    archive or folder that looks like it, if one does."""
    missing = [(name, relative) for name, relative in entries if not (store / relative).exists()]
    if not missing:
        return
    # Compared without their suffixes, which every archive shares: gone.mar is no good.mar.
    present = {_stem(child): child for child in store_models(store)}
    lines = []
    for name, relative in missing:
        close = close_matches(_stem(relative), present, limit=1)
        hint = f" (did you mean {present[close[0]]!r}?)" if close else ""
        lines.append(f"{name}={relative}{hint}" if name else f"{relative}{hint}")
    raise ConfigError(
        f"start-up model{'s' if len(lines) > 1 else ''} not found in the model store "
        f"{store}: {'; '.join(lines)}"
    )


def _stem(relative: str) -> str:
    for suffix in (".mar", ".tar.gz", ".tgz"):
        relative = relative.removesuffix(suffix)
    return relative


def open_startup_model(
    settings: ServerSettings, store: Path, name: str | None, relative: str, work_dir: Path
) -> ModelArchive:
    """The archive unpacked under ``work_dir``, its ``models`` JSON overrides applied."""
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
    entries = startup_entries(settings, store)
    refuse_missing(store, entries)
    opened = []
    for name, relative in entries:
        archive = open_startup_model(settings, store, name, relative, work_dir)
        opened.append((f"{archive.name}={relative}", archive))
    return opened


def is_default(settings: ServerSettings, archive: ModelArchive) -> bool:
    """Whether the ``models`` JSON makes this version its model's default."""
    versions = settings.model_overrides.get(archive.name, {})
    return versions.get(archive.version, {}).get("defaultVersion") is True
