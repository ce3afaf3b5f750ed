"""``MAR-INF/MANIFEST.json``, as torch-model-archiver writes it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferry.errors import ArchiveError
from ferry.store.sagemaker_layout import is_sagemaker_model, sagemaker_manifest

MANIFEST_PATH = Path("MAR-INF") / "MANIFEST.json"
_PATH_KEYS = ("serializedFile", "modelFile", "configFile", "requirementsFile", "handler")
"""The ``model`` keys that name files of the archive (``handler`` only when it is a path)."""


@dataclass(frozen=True)
class Manifest:
    model_name: str
    model_version: str
    handler: str
    serialized_file: str | None
    model_file: str | None
    config_file: str | None
    document: dict[str, Any]
    requirements_file: str | None = None
    """``model.requirementsFile`` (``torch-model-archiver -r``), installed only with
    ``install_py_dep_per_model``."""
    """The manifest as read; handlers get it as ``context.manifest``."""

    @classmethod
    def read(cls, model_dir: Path) -> Manifest:
        path = model_dir / MANIFEST_PATH
        try:
            document = json.loads(path.read_text())
        except FileNotFoundError as exc:
            if is_sagemaker_model(model_dir):  # /opt/ml/model's layout: no manifest
                return cls.from_document(model_dir, sagemaker_manifest(model_dir))
            raise ArchiveError(f"{model_dir.name}: no {MANIFEST_PATH} in the archive") from exc
        except (OSError, ValueError) as exc:
            raise ArchiveError(f"{model_dir.name}: unreadable manifest: {exc}") from exc
        return cls.from_document(model_dir, document)

    @classmethod
    def from_document(cls, model_dir: Path, document: Any) -> Manifest:
        model = document.get("model") if isinstance(document, dict) else None
        if not isinstance(model, dict) or not model.get("handler"):
            raise ArchiveError(f"{model_dir.name}: manifest lacks model.handler")
        for key in _PATH_KEYS:
            _check_inside(model_dir, key, model.get(key))
        return cls(
            model_name=str(model.get("modelName") or model_dir.name),
            model_version=str(model.get("modelVersion") or "1.0"),
            handler=str(model["handler"]),
            serialized_file=model.get("serializedFile") or None,
            model_file=model.get("modelFile") or None,
            config_file=model.get("configFile") or None,
            document=document,
            requirements_file=model.get("requirementsFile") or None,
        )


def _check_inside(model_dir: Path, key: str, value: object) -> None:
    """Raise ``ArchiveError`` unless the manifest's ``model.KEY`` names a file inside
    ``model_dir`` once resolved (symlinks followed), so no manifest makes a worker read or
    import a file of the host. A handler that is not a path (a built-in's name, or
    ``module:function``) names no file."""
    if not value:
        return
    if not isinstance(value, str):
        raise ArchiveError(f"{model_dir.name}: manifest model.{key} must be a path, got {value!r}")
    path = value
    if key == "handler":
        path = value.partition(":")[0]
        if not path.endswith(".py") and "/" not in path and "\\" not in path:
            return
    root = model_dir.resolve()
    if not (root / path).resolve().is_relative_to(root):
        raise ArchiveError(
            f"{model_dir.name}: manifest model.{key} {value!r} is outside the model folder"
        )


def manifest_document(
    *,
    model_name: str,
    version: str,
    handler: str,
    serialized_file: str | None,
    model_file: str | None,
    config_file: str | None,
    created_on: str,
    archiver_version: str,
) -> dict[str, Any]:
    """The manifest torch-model-archiver would write, so TorchServe reads our archives."""
    model: dict[str, Any] = {"modelName": model_name, "handler": handler, "modelVersion": version}
    if serialized_file:
        model["serializedFile"] = serialized_file
    if model_file:
        model["modelFile"] = model_file
    if config_file:
        model["configFile"] = config_file
    return {
        "createdOn": created_on,
        "runtime": "python",
        "model": model,
        "archiverVersion": archiver_version,
    }
