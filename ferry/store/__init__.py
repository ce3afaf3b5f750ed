"""The model store: archives (.mar, .tar.gz) and folders, their manifest, safe extraction."""

from ferry.store.archive import ModelArchive, open_model, resolve_model_entries
from ferry.store.manifest import Manifest
from ferry.store.writer import ArchiveSpec, write_archive

__all__ = [
    "ArchiveSpec",
    "Manifest",
    "ModelArchive",
    "open_model",
    "resolve_model_entries",
    "write_archive",
]
