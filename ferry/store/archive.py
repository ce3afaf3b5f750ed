"""Open a model from the store: a .mar, a .tar.gz or a plain folder."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from ferry.config.model_config import ModelConfig, load_model_config
from ferry.errors import ArchiveError, ArchiveNotFound, ModelConfigError
from ferry.store.extract import Extractor, extract_tar, extract_zip, unpacked
from ferry.store.manifest import MANIFEST_PATH, Manifest

log = logging.getLogger("ferry.store")

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class ModelArchive:
    """A model ready to load: its unpacked folder, manifest and model-config.yaml."""

    name: str
    version: str
    model_dir: Path
    manifest: Manifest
    config: ModelConfig
    source: str
    unpacked: Path | None = None
    """The folder Ferry unpacked the archive into, which ``free`` removes; None for a
    model given as a folder in the store, which is never deleted."""
    packages: Path | None = None
    """Where its requirements file was installed (``ferry.store.packages``), if it was."""
    workflow: str | None = None
    """The workflow this model is a node of: registered and removed with it, never in
    snapshots."""
    downloaded: Path | None = None
    """The store file fetched from a URL to register it: deleted when it is unregistered,
    as TorchServe does, so registering the URL again downloads it again."""
    compile_cache: Path | None = None
    """The folder its workers share for compiled graphs (``ferry.worker.compile_cache``),
    in the server's work folder: removed with the model."""

    def free(self) -> None:
        """Remove what Ferry unpacked, installed and compiled (once no worker uses it: stop
        the workers first)."""
        for folder in (self.unpacked, self.packages, self.compile_cache):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


def _within(store: Path, relative: str) -> Path:
    """``relative`` under ``store``, judged by the name itself, not by where symbolic links
    point: the store's owner may link archives in from elsewhere (TorchServe's tooling
    does), while a requested name must not climb out with ``..`` or an absolute path."""
    base = Path(os.path.abspath(store))
    path = Path(os.path.abspath(base / relative))
    if ".." in Path(relative).parts or not path.is_relative_to(base):
        raise ArchiveError(f"{relative!r} is outside the model store")
    return path


def _extractor(source: Path) -> Extractor:
    if source.suffix in (".mar", ".zip"):
        return extract_zip
    if source.name.endswith((".tar.gz", ".tgz", ".tar")):
        return extract_tar
    raise ArchiveError(f"{source.name}: expected a .mar, .tar.gz or a folder")


def _manifest_folder(dest: Path) -> Path:
    """The folder of the unpacked ``dest`` that holds the manifest."""
    if not (dest / MANIFEST_PATH).exists():
        # torch-model-archiver's tgz format wraps everything in one top-level folder.
        children = [child for child in dest.iterdir() if child.is_dir()]
        if len(children) == 1 and (children[0] / MANIFEST_PATH).exists():
            return children[0]
    return dest


def open_model(
    store: Path,
    relative: str,
    work_dir: Path,
    name: str | None = None,
    *,
    max_unpacked_size: int | None = None,
) -> ModelArchive:
    """Unpack ``relative`` (inside ``store``) into ``work_dir`` and read its metadata.

    An archive that would unpack to more than ``max_unpacked_size`` bytes is refused. If
    opening fails, nothing stays in ``work_dir``; once opened, ``ModelArchive.free``
    removes what was unpacked.

    model-config.yaml is parsed and validated here, so an invalid value or a typo in a
    section Ferry owns fails the registration or the start-up, not the workers: raises
    ``ModelConfigError`` (an ``ArchiveError`` and a ``ConfigError``) naming the key.
    """
    source = _within(store, relative)
    if not source.exists():
        raise ArchiveNotFound(f"{relative!r} not found in the model store")
    if source.is_dir():
        model = _read_model(source, relative, name, unpacked=None)
    else:
        with unpacked(source, work_dir, _extractor(source), max_unpacked_size) as dest:
            model = _read_model(_manifest_folder(dest), relative, name, unpacked=dest)
    # Its own folder, never the store's: a model given as a folder is not written to.
    cache = Path(tempfile.mkdtemp(prefix=f"{model.name}-compile-cache-", dir=work_dir))
    return replace(model, compile_cache=cache)


def _read_model(
    model_dir: Path, relative: str, name: str | None, unpacked: Path | None
) -> ModelArchive:
    manifest = Manifest.read(model_dir)
    model_name = name or manifest.model_name
    if not _MODEL_NAME.match(model_name):
        raise ArchiveError(f"invalid model name {model_name!r}")
    config = ModelConfig()
    if manifest.config_file:
        config_path = _within(model_dir, manifest.config_file)
        try:
            config = load_model_config(config_path)
        except ModelConfigError as exc:
            # Still a ModelConfigError: 400 at registration, exit status 2 at start-up.
            raise ModelConfigError(f"{model_name}: {exc.message}") from exc
        for warning in config.warnings:
            log.warning("model %s: %s", model_name, warning)
    return ModelArchive(
        name=model_name,
        version=manifest.model_version,
        model_dir=model_dir,
        manifest=manifest,
        config=config,
        source=relative,
        unpacked=unpacked,
    )


def _is_model(path: Path) -> bool:
    if path.is_dir():
        return (path / MANIFEST_PATH).exists()
    return path.name.endswith((".mar", ".tar.gz", ".tgz"))


def store_models(store: Path) -> list[str]:
    """The archives and model folders in ``store`` (what ``all`` loads), by name."""
    return [child.name for child in sorted(store.iterdir()) if _is_model(child)]


def resolve_model_entries(store: Path, models: tuple[str, ...]) -> list[tuple[str | None, str]]:
    """Turn ``--models`` values into (name, path-in-store) pairs, TorchServe's way.

    ``all`` loads every archive and folder in the store; ``NAME=FILE`` names a model;
    a bare ``FILE`` takes the name from the manifest.
    """
    entries: list[tuple[str | None, str]] = []
    for item in models:
        for part in (p.strip() for p in item.split(",")):
            if not part:
                continue
            if part == "all":
                entries.extend((None, child) for child in store_models(store))
            elif "=" in part:
                name, _, path = part.partition("=")
                entries.append((name.strip(), path.strip()))
            else:
                entries.append((None, part))
    return entries
