"""A model folder as SageMaker unpacks ``model.tar.gz`` into ``/opt/ml/model``: the
weights at the top, the serving code in ``code/`` (``inference.py``, optionally
``requirements.txt``), and no ``MAR-INF/MANIFEST.json``.

Such a folder (or a ``.tar.gz`` of one) is served with the built-in handler
``sagemaker_pytorch`` under the name ``model``, as the toolkit names its one model
(``NAME=PATH`` in ``--models`` names it otherwise); ``code/requirements.txt`` is its
requirements file, installed with ``install_py_dep_per_model`` (docs/sagemaker.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

HANDLER = "sagemaker_pytorch"
MODEL_NAME = "model"
"""The name the toolkit gives the model of a single-model endpoint."""
CODE_DIR = "code"
REQUIREMENTS = f"{CODE_DIR}/requirements.txt"
WEIGHT_SUFFIXES = (".pt", ".pth")


def is_sagemaker_model(model_dir: Path) -> bool:
    """A ``code/`` folder, or a ``.pt``/``.pth`` file at the top (the default
    ``model_fn``'s TorchScript model) with no Python file beside it: a TorchServe model
    folder that lost its manifest (a handler ``.py`` beside its weights) is not taken for
    one, and keeps its "no MAR-INF/MANIFEST.json" error."""
    if (model_dir / CODE_DIR).is_dir():
        return True
    files = [p for p in model_dir.iterdir() if p.is_file()]
    has_weights = any(p.suffix in WEIGHT_SUFFIXES for p in files)
    return has_weights and not any(p.suffix == ".py" for p in files)


def sagemaker_manifest(model_dir: Path) -> dict[str, Any]:
    """The manifest such a folder is served with."""
    model: dict[str, Any] = {"modelName": MODEL_NAME, "modelVersion": "1.0", "handler": HANDLER}
    if (model_dir / REQUIREMENTS).is_file():
        model["requirementsFile"] = REQUIREMENTS
    return {"runtime": "python", "model": model}
