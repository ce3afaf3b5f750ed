"""Every path a manifest names must stay inside the model's folder (symlinks resolved)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from ferry.errors import ArchiveError
from ferry.store import open_model
from ferry.store.archive import ModelArchive

HANDLER = "def handle(data, context):\n    return data\n"


def _model_folder(store: Path, **model: object) -> Path:
    """``store/m``: a handler, weights in a subfolder, and a manifest with ``model``'s keys."""
    folder = store / "m"
    (folder / "MAR-INF").mkdir(parents=True)
    (folder / "handler.py").write_text(HANDLER)
    (folder / "weights").mkdir()
    (folder / "weights" / "model.pt").write_bytes(b"w")
    document = {"model": {"modelName": "m", "handler": "handler.py", **model}}
    (folder / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(document))
    return folder


def _open(tmp_path: Path, relative: str = "m") -> ModelArchive:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return open_model(tmp_path / "store", relative, work)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file beside the store: what a hostile manifest would reach for."""
    path = tmp_path / "outside.py"
    path.write_text("raise SystemExit('executed a file outside the archive')\n")
    return path


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("serializedFile", "../../../../../etc/passwd"),
        ("serializedFile", "weights/../../outside.py"),
        ("modelFile", "{outside}"),
        ("configFile", "../outside.py"),
        ("handler", "{outside}"),
        ("handler", "../outside.py:handle"),
    ],
)
def test_manifest_paths_outside_the_model_folder_are_refused(
    tmp_path: Path, outside: Path, key: str, value: str
) -> None:
    value = value.format(outside=outside)
    _model_folder(tmp_path / "store", **{key: value})
    with pytest.raises(ArchiveError) as refused:
        _open(tmp_path)
    assert refused.value.message == f"m: manifest model.{key} {value!r} is outside the model folder"


def test_an_absolute_model_file_in_a_mar_is_refused(tmp_path: Path, outside: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    manifest = {"model": {"modelName": "m", "handler": "handler.py", "modelFile": str(outside)}}
    with zipfile.ZipFile(store / "m.mar", "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        mar.writestr("handler.py", HANDLER)
    with pytest.raises(ArchiveError, match=r"model\.modelFile .* is outside the model folder"):
        _open(tmp_path, "m.mar")


def test_a_symlink_out_of_the_model_folder_counts_as_outside(tmp_path: Path, outside: Path) -> None:
    folder = _model_folder(tmp_path / "store", modelFile="model.py")
    (folder / "model.py").symlink_to(outside)
    with pytest.raises(ArchiveError, match=r"model\.modelFile 'model.py' is outside"):
        _open(tmp_path)


def test_a_manifest_path_must_be_a_string(tmp_path: Path) -> None:
    _model_folder(tmp_path / "store", serializedFile=["weights/model.pt"])
    with pytest.raises(ArchiveError, match=r"model\.serializedFile must be a path, got \["):
        _open(tmp_path)


@pytest.mark.parametrize("handler", ["image_classifier", "handler.py", "handler:handle"])
def test_paths_inside_and_built_in_handler_names_stay_valid(tmp_path: Path, handler: str) -> None:
    folder = _model_folder(
        tmp_path / "store", handler=handler, serializedFile="weights/model.pt", modelFile="m.py"
    )
    (folder / "m.py").symlink_to(folder / "handler.py")  # a link that stays inside
    archive = _open(tmp_path)
    assert archive.manifest.handler == handler
    assert archive.manifest.serialized_file == "weights/model.pt"
