"""Loading weights the ways TorchServe archives ship them: TorchScript, eager, torch.export
programs and AOTInductor packages (both ``.pt2``, told apart by their contents), ONNX."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ferry.errors import ArchiveError
from ferry.handlers.builtin.aot_package import is_aoti_package, load_aoti_package
from ferry.handlers.builtin.shared_weights import (
    eager_on_mapped_weights,
    share_loaded,
    torchscript_on_mapped_weights,
)
from ferry.handlers.contract.loader import classes_defined_in, import_file


def select_device(gpu_id: int | None) -> torch.device:
    if gpu_id is not None and torch.cuda.is_available():
        return torch.device(f"cuda:{gpu_id}")
    return torch.device("cpu")


def load_eager_model(
    model_file: Path, weights: Path | None, device: torch.device
) -> torch.nn.Module:
    """The one ``nn.Module`` class of ``model_file``, instantiated, with the state dict of
    ``weights`` (if any) loaded on ``device`` (TorchServe's ``_load_pickled_model``)."""
    if not model_file.is_file():
        raise ArchiveError(f"model file {model_file.name!r} not found in the model folder")
    classes = classes_defined_in(import_file(model_file), torch.nn.Module)
    if len(classes) != 1:
        names = [cls.__name__ for cls in classes]
        raise ArchiveError(
            f"{model_file.name} must define exactly one nn.Module class, found {names}"
        )
    if weights is not None:
        shared = eager_on_mapped_weights(classes[0], weights, device)
        if shared is not None:
            return shared
    model: torch.nn.Module = classes[0]()
    if weights is not None:
        state = torch.load(weights, map_location=device, weights_only=True)
        model.load_state_dict(state)
    return model


def load_model(
    model_dir: Path, serialized_file: str | None, model_file: str | None, device: torch.device
) -> torch.nn.Module | None:
    """The model described by the manifest, in eval mode on ``device``; None if it names none."""
    weights = model_dir / serialized_file if serialized_file else None
    if weights is not None and not weights.is_file():
        raise ArchiveError(f"serialized file {serialized_file!r} not found in the archive")
    model: Any
    if weights is not None and weights.suffix == ".onnx":
        from ferry.handlers.builtin.onnx_model import OnnxModel

        return OnnxModel(weights, device)  # type: ignore[return-value]
    if weights is not None and weights.suffix == ".pt2":
        if is_aoti_package(weights):
            return load_aoti_package(weights, device)  # type: ignore[return-value]
        model = torch.export.load(str(weights)).module()
        share_loaded(model, weights, device)
    elif model_file:
        model = load_eager_model(model_dir / model_file, weights, device)
    elif weights is not None:
        model = torchscript_on_mapped_weights(weights, device)
        if model is None:
            model = torch.jit.load(str(weights), map_location=device)  # type: ignore[no-untyped-call]
    else:
        return None
    model = model.to(device)
    if hasattr(model, "eval") and not isinstance(model, torch.fx.GraphModule):
        model.eval()
    return model  # type: ignore[no-any-return]


def load_label_mapping(path: str | Path) -> dict[str, str] | None:
    """``index_to_name.json``: class index (as a string) to label. A label may be a list
    (its last item is the label), and the older ``{"object_type_names": [...]}`` form lists
    the labels in index order; None when the file is absent."""
    path = Path(path)
    if not path.is_file():
        return None
    mapping = json.loads(path.read_text())
    if not isinstance(mapping, dict):
        raise ArchiveError(f"{path.name} must map class indices to labels")
    names = mapping.get("object_type_names")
    if isinstance(names, list):
        mapping = dict(enumerate(names))
    labels = {}
    for key, value in mapping.items():
        label = value[-1] if isinstance(value, list) and value else value
        if not isinstance(label, str):
            raise ArchiveError(f"{path.name}: the label of {key!r} must be a string or a list")
        labels[str(key)] = label
    return labels
