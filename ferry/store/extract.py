"""Extraction that cannot write outside its destination (zip-slip, tar links, absolute paths)
nor more than ``max_size`` bytes (archive bombs).

The size is checked twice: the sizes the archive declares, before anything is written, and
the bytes actually written, as they are written, so an archive that lies about its sizes
stops at the limit too. ``unpacked`` is the one way the server unpacks an archive of any
kind (.mar, .tar.gz, .war): a new folder, these checks, and the partial folder removed on
failure. The limit is a required argument of each function here, so no caller can leave
it out by accident (None, no limit, is for trusted local files only).
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO

from ferry.errors import ArchiveError

_CHUNK = 1 << 20


def _safe_target(dest: Path, member_name: str) -> Path:
    relative = PurePosixPath(member_name.replace("\\", "/"))
    if relative.is_absolute() or ".." in relative.parts:
        raise ArchiveError(f"archive entry escapes the model folder: {member_name!r}")
    target = (dest / relative).resolve()
    if not target.is_relative_to(dest.resolve()):
        raise ArchiveError(f"archive entry escapes the model folder: {member_name!r}")
    return target


def _size_text(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} bytes"


class _Budget:
    """Bytes an extraction may still write; refuses the archive once they are spent."""

    def __init__(self, archive: Path, max_size: int | None) -> None:
        self.archive = archive
        self.max_size = max_size
        self.written = 0

    def refuse(self) -> ArchiveError:
        limit = _size_text(self.max_size or 0)
        return ArchiveError(
            f"{self.archive.name} unpacks to more than {limit} (max_unpacked_size); refused"
        )

    def check_declared(self, sizes: Iterable[int]) -> None:
        if self.max_size is not None and sum(sizes) > self.max_size:
            raise self.refuse()

    def copy(self, src: IO[bytes], target: Path) -> None:
        with open(target, "wb") as out:
            while chunk := src.read(_CHUNK):
                self.written += len(chunk)
                if self.max_size is not None and self.written > self.max_size:
                    raise self.refuse()
                out.write(chunk)


def extract_zip(archive: Path, dest: Path, max_size: int | None) -> None:
    """Unpack a zip (a .mar, a .war) into ``dest``; at most ``max_size`` bytes unless None."""
    budget = _Budget(archive, max_size)
    try:
        with zipfile.ZipFile(archive) as zf:
            budget.check_declared(info.file_size for info in zf.infolist())
            for info in zf.infolist():
                target = _safe_target(dest, info.filename)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src:
                    budget.copy(src, target)
    except zipfile.BadZipFile as exc:
        raise ArchiveError(f"{archive.name}: not a valid zip archive") from exc


def extract_tar(archive: Path, dest: Path, max_size: int | None) -> None:
    """Unpack a tar (.tar.gz, .tgz) into ``dest``; at most ``max_size`` bytes unless None."""
    budget = _Budget(archive, max_size)
    try:
        with tarfile.open(archive, "r:*") as tf:
            members = tf.getmembers()
            budget.check_declared(member.size for member in members if member.isfile())
            for member in members:
                target = _safe_target(dest, member.name)
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                elif member.isfile():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    src = tf.extractfile(member)
                    assert src is not None
                    with src:
                        budget.copy(src, target)
                else:
                    # Links, devices and FIFOs have no place in a model archive.
                    raise ArchiveError(f"{archive.name}: unsupported entry type: {member.name!r}")
    except tarfile.TarError as exc:
        raise ArchiveError(f"{archive.name}: not a valid tar archive") from exc


Extractor = Callable[[Path, Path, int | None], None]
"""``extract_zip`` or ``extract_tar``."""


@contextmanager
def unpacked(
    archive: Path, work_dir: Path, extract: Extractor, max_size: int | None
) -> Iterator[Path]:
    """A new folder of ``work_dir`` holding ``archive`` as ``extract`` unpacks it, within
    ``max_size`` bytes (``max_unpacked_size``; None only for a trusted local file). If
    unpacking or the ``with`` block raises, the folder is removed again, so a refused
    archive leaves nothing behind; otherwise it is the caller's to remove.

        >>> with unpacked(store / "wf.war", work_dir, extract_zip, 10_000_000) as folder:
        ...     manifest = read_manifest(folder)
    """
    dest = Path(tempfile.mkdtemp(prefix=f"{archive.stem}-", dir=work_dir))
    try:
        extract(archive, dest, max_size)
        yield dest
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
