"""Workflow archives (``.war``), read from the workflow store and written in
torch-workflow-archiver's layout, so TorchServe and Ferry read each other's.

A .war is a zip: the spec file, the handler file and any extra files at its root, and
``WAR-INF/MANIFEST.json``::

    {"createdOn": "DD/MM/YYYY HH:MM:SS",
     "workflow": {"workflowName": "...", "specFile": "spec.yaml", "handler": "handler.py"},
     "archiverVersion": "..."}
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

from ferry import __version__
from ferry.errors import ArchiveError, InvalidRequest, InvalidWorkflow, WorkflowNotFound
from ferry.store.extract import extract_zip, unpacked
from ferry.workflows.functions import check_function_nodes
from ferry.workflows.spec import load_spec

WAR_MANIFEST_PATH = Path("WAR-INF") / "MANIFEST.json"
WORKFLOW_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]*$")
"""torch-workflow-archiver's rule for ``--workflow-name``."""

_SKIPPED_DIRS = {"__pycache__", "__MACOSX"}


@dataclass(frozen=True)
class WarManifest:
    workflow_name: str
    spec_file: str
    handler: str
    document: dict[str, Any]
    """The manifest as read."""

    @classmethod
    def read(cls, folder: Path) -> WarManifest:
        """Read and check the manifest of an unpacked .war; ``ArchiveError`` says what is
        wrong. A missing manifest reads as an empty one, as in TorchServe."""
        document = _manifest_document(folder)
        workflow = document.get("workflow")
        if not isinstance(workflow, dict):
            raise ArchiveError(f"{folder.name}: Missing Workflow entry in manifest file.")
        name = workflow.get("workflowName")
        if not isinstance(name, str) or not name:
            raise ArchiveError(f"{folder.name}: Workflow name is not defined.")
        return cls(
            workflow_name=name,
            spec_file=_file_entry(folder, workflow, "specFile"),
            handler=_file_entry(folder, workflow, "handler"),
            document=document,
        )


def _manifest_document(folder: Path) -> dict[str, Any]:
    path = folder / WAR_MANIFEST_PATH
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ArchiveError(f"{folder.name}: unreadable {WAR_MANIFEST_PATH}: {exc}") from exc
    if not isinstance(document, dict):
        raise ArchiveError(f"{folder.name}: {WAR_MANIFEST_PATH} is not a JSON object")
    return document


def _file_entry(folder: Path, workflow: dict[str, Any], key: str) -> str:
    """``workflow.KEY``, which must name a file inside ``folder`` (symbolic links
    followed), so a manifest cannot make Ferry read or run a file of the host."""
    value = workflow.get(key)
    if not isinstance(value, str) or not value:
        raise ArchiveError(f"{folder.name}: the manifest has no workflow.{key}")
    path = (folder / value).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise ArchiveError(f"{folder.name}: workflow.{key} {value!r} is outside the archive")
    if not path.is_file():
        raise ArchiveError(f"{folder.name}: workflow.{key} {value!r} is not in the archive")
    return value


@dataclass(frozen=True)
class WorkflowArchive:
    """An unpacked .war: its name (the manifest's unless one was given) and files."""

    name: str
    folder: Path
    manifest: WarManifest
    source: str
    """The .war's path in the workflow store, as asked for."""

    @property
    def spec_path(self) -> Path:
        return self.folder / self.manifest.spec_file

    @property
    def handler_path(self) -> Path:
        return self.folder / self.manifest.handler

    def free(self) -> None:
        """Remove the unpacked folder (once no worker uses the handler file)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def war_in_store(store: Path, relative: str) -> Path:
    """The store file ``relative`` names. Raises ``InvalidRequest`` for a path that climbs
    out of the store (TorchServe's message) and ``WorkflowNotFound`` for a missing file."""
    if ".." in PurePosixPath(relative.replace("\\", "/")).parts:
        raise InvalidRequest(f"Relative path is not allowed in url: {relative}")
    base = Path(os.path.abspath(store))
    path = Path(os.path.abspath(base / relative))
    if not path.is_relative_to(base):
        raise InvalidRequest(f"{relative!r} is outside the workflow store")
    if not path.is_file():
        raise WorkflowNotFound(f"Workflow not found in workflow store: {relative}")
    return path


def open_war(
    store: Path,
    relative: str,
    work_dir: Path,
    name: str | None = None,
    *,
    max_unpacked_size: int | None,
) -> WorkflowArchive:
    """Unpack ``relative`` (a .war inside ``store``) into a new folder of ``work_dir`` and
    read its manifest; ``name`` overrides the manifest's workflow name. If opening fails,
    nothing stays in ``work_dir``.

    The .war goes through the store's extraction (``ferry.store.extract.unpacked``) with
    the server's ``max_unpacked_size``, as a .mar does: a larger one is refused with the
    same ``ArchiveError``. The limit has no default, so a caller cannot leave it out (the
    workflow manager once did, and a .war unpacked without any limit).
    """
    source = war_in_store(store, relative)
    # A .war is a zip whatever its file is called, as in TorchServe.
    with unpacked(source, work_dir, extract_zip, max_unpacked_size) as dest:
        manifest = WarManifest.read(dest)
        workflow_name = name or manifest.workflow_name
        _check_name(workflow_name)
        return WorkflowArchive(workflow_name, dest, manifest, relative)


def _check_name(name: str) -> None:
    if not WORKFLOW_NAME.match(name):
        raise ArchiveError(
            f"invalid workflow name {name!r}: use letters, digits, '_', '-' and '.', "
            "starting with a letter or digit"
        )


def write_war(
    name: str,
    spec_file: Path,
    handler: Path,
    extra_files: Sequence[Path],
    export_path: Path,
    force: bool = False,
) -> Path:
    """Write ``<export_path>/<name>.war`` and return its path. An existing archive is
    replaced only with ``force``. Folders among ``extra_files`` keep their name and
    contents (without ``__pycache__``, ``__MACOSX`` and dot-folders).

    Unlike torch-workflow-archiver, the spec and the handler's function nodes are checked
    first, so a broken workflow fails here rather than when it is registered."""
    _check_name(name)
    target = export_path / f"{name}.war"
    if target.exists() and not force:
        raise ArchiveError(
            f"{target} already exists. Please specify --force/-f option to overwrite"
        )
    files = _archive_files(spec_file, handler, extra_files)
    try:
        check_function_nodes(load_spec(spec_file), handler)
    except InvalidWorkflow as exc:
        raise ArchiveError(f"{spec_file.name}: {exc.message}") from exc
    manifest = {
        "createdOn": datetime.now().strftime("%d/%m/%Y %H:%M:%S"),
        "workflow": {"workflowName": name, "specFile": spec_file.name, "handler": handler.name},
        "archiverVersion": f"ferry-{__version__}",
    }
    export_path.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed, so a failure never leaves half an archive.
    fd, temp_name = tempfile.mkstemp(prefix=f".{name}-", suffix=".war", dir=export_path)
    os.close(fd)
    try:
        with zipfile.ZipFile(temp_name, "w", zipfile.ZIP_DEFLATED) as zf:
            for arcname, source in files.items():
                zf.write(source, arcname)
            zf.writestr(WAR_MANIFEST_PATH.as_posix(), json.dumps(manifest, indent=2))
        os.replace(temp_name, target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    return target


def _archive_files(spec_file: Path, handler: Path, extra: Sequence[Path]) -> dict[str, Path]:
    """Name in the archive -> source. Two sources for one name are refused: in
    torch-workflow-archiver the later one silently replaced, say, the spec file."""
    files: dict[str, Path] = {}
    for arcname, source in _sources(spec_file, handler, extra):
        if arcname in files and files[arcname] != source:
            raise ArchiveError(f"{source} and {files[arcname]} would both be {arcname!r}")
        files[arcname] = source
    return files


def _sources(spec_file: Path, handler: Path, extra: Sequence[Path]) -> Iterator[tuple[str, Path]]:
    for what, path in (("spec file", spec_file), ("handler", handler)):
        if not path.is_file():
            raise ArchiveError(f"{what} not found: {path}")
        yield path.name, path
    for item in extra:
        if item.is_file():
            yield item.name, item
        elif item.is_dir():
            yield from _folder_files(item)
        else:
            raise ArchiveError(f"extra file not found: {item}")


def _folder_files(folder: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        skipped = any(part in _SKIPPED_DIRS or part.startswith(".") for part in relative.parts)
        if path.is_file() and not skipped:
            yield (Path(folder.name) / relative).as_posix(), path
