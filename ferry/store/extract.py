"""Extraction that cannot write outside its destination (zip-slip, tar links, absolute paths)."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from ferry.errors import ArchiveError


def _safe_target(dest: Path, member_name: str) -> Path:
    relative = PurePosixPath(member_name.replace("\\", "/"))
    if relative.is_absolute() or ".." in relative.parts:
        raise ArchiveError(f"archive entry escapes the model folder: {member_name!r}")
    target = (dest / relative).resolve()
    if not target.is_relative_to(dest.resolve()):
        raise ArchiveError(f"archive entry escapes the model folder: {member_name!r}")
    return target


def extract_zip(archive: Path, dest: Path) -> None:
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                target = _safe_target(dest, info.filename)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as out:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
    except zipfile.BadZipFile as exc:
        raise ArchiveError(f"{archive.name}: not a valid zip archive") from exc


def extract_tar(archive: Path, dest: Path) -> None:
    try:
        with tarfile.open(archive, "r:*") as tf:
            for member in tf.getmembers():
                target = _safe_target(dest, member.name)
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                elif member.isfile():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    src = tf.extractfile(member)
                    assert src is not None
                    with src, open(target, "wb") as out:
                        while chunk := src.read(1 << 20):
                            out.write(chunk)
                else:
                    # Links, devices and FIFOs have no place in a model archive.
                    raise ArchiveError(f"{archive.name}: unsupported entry type: {member.name!r}")
    except tarfile.TarError as exc:
        raise ArchiveError(f"{archive.name}: not a valid tar archive") from exc
