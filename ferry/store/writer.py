"""Write model archives in torch-model-archiver's layout, so TorchServe reads them too."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ferry import __version__
from ferry.errors import ArchiveError
from ferry.store.manifest import MANIFEST_PATH, manifest_document

ARCHIVE_FORMATS = ("default", "tgz", "no-archive")


@dataclass(frozen=True)
class ArchiveSpec:
    model_name: str
    handler: str
    """A built-in handler name, or a path to a handler .py file (optionally ``:function``)."""
    version: str = "1.0"
    serialized_file: Path | None = None
    model_file: Path | None = None
    config_file: Path | None = None
    extra_files: tuple[Path, ...] = field(default_factory=tuple)
    archive_format: str = "default"


def _handler_entry(handler: str) -> tuple[str, Path | None]:
    """The manifest's handler value and the file to copy, if the handler is a file."""
    module, sep, function = handler.partition(":")
    path = Path(module)
    if path.suffix == ".py":
        if not path.is_file():
            raise ArchiveError(f"handler file not found: {module}")
        return f"{path.name}{sep}{function}", path
    return handler, None


def _files(spec: ArchiveSpec) -> Iterator[tuple[str, Path]]:
    """(name in archive, source) pairs; extra folders are added with their contents."""
    _, handler_file = _handler_entry(spec.handler)
    singles = [spec.serialized_file, spec.model_file, spec.config_file, handler_file]
    for source in singles:
        if source is not None:
            if not source.is_file():
                raise ArchiveError(f"file not found: {source}")
            yield source.name, source
    for extra in spec.extra_files:
        if extra.is_dir():
            for item in sorted(extra.rglob("*")):
                if item.is_file():
                    yield item.relative_to(extra).as_posix(), item
        elif extra.is_file():
            yield extra.name, extra
        else:
            raise ArchiveError(f"extra file not found: {extra}")


def write_archive(spec: ArchiveSpec, export_path: Path, *, force: bool = False) -> Path:
    """Write the archive into ``export_path`` and return its path."""
    if spec.archive_format not in ARCHIVE_FORMATS:
        raise ArchiveError(f"archive format must be one of {', '.join(ARCHIVE_FORMATS)}")
    handler_value, _ = _handler_entry(spec.handler)
    manifest = manifest_document(
        model_name=spec.model_name,
        version=spec.version,
        handler=handler_value,
        serialized_file=spec.serialized_file.name if spec.serialized_file else None,
        model_file=spec.model_file.name if spec.model_file else None,
        config_file=spec.config_file.name if spec.config_file else None,
        created_on=datetime.now().strftime("%d/%m/%Y %H:%M:%S"),
        archiver_version=f"ferry-{__version__}",
    )
    manifest_bytes = json.dumps(manifest, indent=2).encode()
    files = dict(_files(spec))  # a later duplicate name wins, as in torch-model-archiver
    suffix = {"default": ".mar", "tgz": ".tar.gz", "no-archive": ""}[spec.archive_format]
    target = export_path / f"{spec.model_name}{suffix}"
    if target.exists():
        if not force:
            raise ArchiveError(f"{target} already exists (use --force to overwrite)")
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
    export_path.mkdir(parents=True, exist_ok=True)
    if spec.archive_format == "default":
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(MANIFEST_PATH.as_posix(), manifest_bytes)
            for name, source in files.items():
                zf.write(source, name)
    elif spec.archive_format == "tgz":
        with tarfile.open(target, "w:gz") as tf:
            info = tarfile.TarInfo(f"{spec.model_name}/{MANIFEST_PATH.as_posix()}")
            info.size = len(manifest_bytes)
            tf.addfile(info, io.BytesIO(manifest_bytes))
            for name, source in files.items():
                tf.add(source, f"{spec.model_name}/{name}")
    else:
        (target / "MAR-INF").mkdir(parents=True)
        (target / MANIFEST_PATH).write_bytes(manifest_bytes)
        for name, source in files.items():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target / name)
    return target
