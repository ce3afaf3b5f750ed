from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from ferry.errors import ArchiveError
from ferry.store import ArchiveSpec, open_model, resolve_model_entries, write_archive
from ferry.store.extract import extract_tar, extract_zip


def _spec(tmp: Path, archive_format: str = "default") -> ArchiveSpec:
    handler = tmp / "my_handler.py"
    handler.write_text("def handle(data, context):\n    return data\n")
    weights = tmp / "weights.pt"
    weights.write_bytes(b"w")
    config = tmp / "model-config.yaml"
    config.write_text("batchSize: 4\nmaxBatchDelay: 20\nminWorkers: 2\ncustom: {k: 1}\n")
    extra = tmp / "index_to_name.json"
    extra.write_text("{}")
    return ArchiveSpec("m1", str(handler), "2.0", weights, None, config, (extra,), archive_format)


@pytest.mark.parametrize("archive_format", ["default", "tgz", "no-archive"])
def test_written_archives_open_with_manifest_and_config(
    tmp_path: Path, archive_format: str
) -> None:
    store = tmp_path / "store"
    target = write_archive(_spec(tmp_path, archive_format), store)
    archive = open_model(store, target.name, _work(tmp_path))
    assert archive.name == "m1" and archive.version == "2.0"
    assert archive.manifest.handler == "my_handler.py"
    assert archive.manifest.serialized_file == "weights.pt"
    assert (archive.model_dir / "index_to_name.json").exists()
    assert archive.config.batch_size == 4 and archive.config.min_workers == 2
    assert archive.config.max_batch_delay_ms == 20
    assert archive.config.raw["custom"] == {"k": 1}


def _work(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    return work


def test_mar_manifest_matches_torch_model_archiver(tmp_path: Path) -> None:
    target = write_archive(_spec(tmp_path), tmp_path / "store")
    with zipfile.ZipFile(target) as zf:
        manifest = json.loads(zf.read("MAR-INF/MANIFEST.json"))
        assert set(zf.namelist()) >= {"my_handler.py", "weights.pt", "model-config.yaml"}
    assert manifest["runtime"] == "python"
    assert manifest["model"] == {
        "modelName": "m1",
        "handler": "my_handler.py",
        "modelVersion": "2.0",
        "serializedFile": "weights.pt",
        "configFile": "model-config.yaml",
    }


def test_existing_archive_needs_force(tmp_path: Path) -> None:
    write_archive(_spec(tmp_path), tmp_path / "store")
    with pytest.raises(ArchiveError, match="already exists"):
        write_archive(_spec(tmp_path), tmp_path / "store")
    write_archive(_spec(tmp_path), tmp_path / "store", force=True)


def test_zip_slip_is_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.mar"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../../escaped.txt", "x")
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ArchiveError, match="escapes"):
        extract_zip(evil, dest, None)
    assert not (tmp_path / "escaped.txt").exists()


@pytest.mark.parametrize("kind", ["absolute", "symlink", "dotdot"])
def test_tar_escapes_are_refused(tmp_path: Path, kind: str) -> None:
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tf:
        if kind == "symlink":
            info = tarfile.TarInfo("link")
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tf.addfile(info)
        else:
            info = tarfile.TarInfo("/tmp/abs.txt" if kind == "absolute" else "a/../../up.txt")
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(ArchiveError):
        extract_tar(evil, dest, None)


def test_paths_outside_the_store_are_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (tmp_path / "outside.mar").write_bytes(b"")
    with pytest.raises(ArchiveError, match="outside the model store"):
        open_model(store, "../outside.mar", _work(tmp_path))


def test_missing_manifest_and_bad_archives_are_clear_errors(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "folder").mkdir(parents=True)
    (store / "junk.mar").write_bytes(b"not a zip")
    with pytest.raises(ArchiveError, match="MANIFEST"):
        open_model(store, "folder", _work(tmp_path))
    with pytest.raises(ArchiveError, match="not a valid zip"):
        open_model(store, "junk.mar", _work(tmp_path))
    with pytest.raises(ArchiveError, match="not found"):
        open_model(store, "absent.mar", _work(tmp_path))


def test_models_flag_resolution(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_archive(_spec(tmp_path), store)
    write_archive(_spec(tmp_path, "no-archive"), store / "sub")
    assert resolve_model_entries(store, ("all",)) == [(None, "m1.mar")]
    assert resolve_model_entries(store, ("a=x.mar,b=y.mar", "z.mar")) == [
        ("a", "x.mar"),
        ("b", "y.mar"),
        (None, "z.mar"),
    ]
