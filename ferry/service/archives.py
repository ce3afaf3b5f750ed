"""Opening archives for the service: from the model store or downloaded into it, unpacked
into the server's work folder, with their packages installed when
``install_py_dep_per_model`` is on."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

from ferry.config.settings import ServerSettings
from ferry.errors import InvalidRequest, PackageInstallFailed
from ferry.service.startup import open_startup_model, refuse_missing, startup_entries
from ferry.service.types import RegisterRequest
from ferry.store.archive import ModelArchive, open_model
from ferry.store.packages import with_packages
from ferry.store.pip_sources import PipSources, startup_warning
from ferry.store.remote import fetch_archive, is_remote, removed_on_failure

log = logging.getLogger("ferry.service")


class Archives:
    """Where the service's archives come from and are unpacked (``work_dir``)."""

    def __init__(self, settings: ServerSettings, work_dir: Path) -> None:
        self.settings = settings
        self.work_dir = work_dir
        self._pip_sources = PipSources(settings.pip_index_url, settings.pip_find_links)
        if settings.install_py_dep_per_model:
            # allowed_urls guards downloads, not pip: say so where operators look.
            log.warning("%s", startup_warning(self._pip_sources))

    def store(self) -> Path:
        """The model store; ``InvalidRequest`` when none is configured."""
        if self.settings.model_store is None:
            raise InvalidRequest("no --model-store is configured")
        return self.settings.model_store

    async def open(self, url: str, name: str | None) -> ModelArchive:
        """``url`` from the model store, or downloaded into it when ``allowed_urls`` lets
        it (deleted again if it cannot be opened), unpacked under the name ``name``."""
        store = self.store()
        relative, download = url, None
        if is_remote(url):
            relative = await fetch_archive(url, store, self.settings.allowed_urls)
            download = store / relative
        with removed_on_failure(download):  # not a zip, a bad manifest or model-config ...
            archive = await asyncio.to_thread(
                open_model,
                store,
                relative,
                self.work_dir,
                name,
                max_unpacked_size=self.settings.max_unpacked_size,
            )
        return dataclasses.replace(archive, downloaded=download)

    async def startup_models(self, store: Path) -> list[ModelArchive]:
        """Unpacked in a thread (the event loop keeps answering), their packages installed;
        ``ConfigError`` if one is missing from the store (``startup.refuse_missing``),
        ``PackageInstallFailed`` if one's packages fail: a server that cannot load what it
        was told to load does not start (issue 51; TorchServe logs it and starts without
        it). What was unpacked is freed."""
        entries = startup_entries(self.settings, store)
        refuse_missing(store, entries)
        archives = []
        for name, relative in entries:
            archive = await asyncio.to_thread(
                open_startup_model, self.settings, store, name, relative, self.work_dir
            )
            archives.append(archive)
        installed: list[ModelArchive] = []
        for index, archive in enumerate(archives):
            try:
                installed.append(await self.with_packages(archive))
            except PackageInstallFailed:  # with_packages freed this one
                for other in [*installed, *archives[index + 1 :]]:
                    await asyncio.to_thread(other.free)
                raise
        return installed

    async def with_packages(self, archive: ModelArchive) -> ModelArchive:
        """The archive with its requirements installed when ``install_py_dep_per_model``
        is on; its unpacked files are freed if pip fails."""
        if not self.settings.install_py_dep_per_model:
            return archive
        try:
            return await asyncio.to_thread(with_packages, archive, self.work_dir, self._pip_sources)
        except BaseException:
            archive.free()
            raise


def as_registered(archive: ModelArchive, request: RegisterRequest) -> ModelArchive:
    """The archive with what ``POST /models`` overrides: its handler, batching, timeouts
    and initial workers (none unless asked: TorchServe's default for registration). As in
    TorchServe, an archive that sets its workers (``minWorkers`` and ``maxWorkers``,
    ``ModelConfig.sets_workers``) keeps them whatever ``initial_workers`` says."""
    if request.handler:
        manifest = dataclasses.replace(archive.manifest, handler=request.handler)
        archive = dataclasses.replace(archive, manifest=manifest)
    initial = None if archive.config.sets_workers else request.initial_workers
    config = archive.config.merged(
        batch_size=request.batch_size,
        max_batch_delay_ms=request.max_batch_delay_ms,
        response_timeout=request.response_timeout,
        min_workers=initial,
    )
    if config.min_workers is None:
        config = config.merged(min_workers=0)
    return dataclasses.replace(archive, config=config)
