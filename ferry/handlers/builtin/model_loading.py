"""Loading weights the ways TorchServe archives ship them: TorchScript, eager, torch.export
programs, TorchServe's ``aot_compile`` libraries. Which loader an archive needs, and the
AOTInductor packages and ONNX files, are ``ferry.handlers.builtin.formats``'s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ferry.errors import ArchiveError
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


def for_inference(model: Any, device: torch.device) -> Any:
    """``model`` on ``device``, in eval mode (a graph module from ``torch.export`` has no
    eval mode to set)."""
    model = model.to(device)
    if hasattr(model, "eval") and not isinstance(model, torch.fx.GraphModule):
        model.eval()
    return model


def load_exported_program(path: Path, device: torch.device) -> Any:
    """A ``torch.export`` program (``.pt2``), its weights shared between workers where
    they can be."""
    model = torch.export.load(str(path)).module()
    share_loaded(model, path, device)
    return for_inference(model, device)


def load_torchscript(path: Path, device: torch.device) -> Any:
    """A TorchScript file, on weights shared between workers where they can be."""
    model = torchscript_on_mapped_weights(path, device)
    if model is None:
        model = torch.jit.load(str(path), map_location=device)  # type: ignore[no-untyped-call]
    return for_inference(model, device)


def load_aot_compiled(path: Path, device: torch.device) -> Any:
    """TorchServe's earlier AOTInductor form: a shared library from
    ``torch._export.aot_compile`` (an AOTInductor package, ``.pt2``, is the current form)."""
    if not path.is_file():
        raise ArchiveError(f"serialized file {path.name!r} not found in the archive")
    aot_load = getattr(torch._export, "aot_load", None)  # deprecated: gone from a later torch
    if aot_load is None:
        raise ArchiveError(
            f"{path.name}: torch {torch.__version__} has no torch._export.aot_load to load "
            "it; compile an AOTInductor package instead (ferry archive --aot-inductor)"
        )
    if device.type == "cuda":
        torch.cuda.set_device(device)  # its loader takes a device type, not an index
    try:
        return aot_load(str(path), device.type)
    except RuntimeError as error:
        raise ArchiveError(f"{path.name}: AOTInductor could not load it: {error}") from error


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
