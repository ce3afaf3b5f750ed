"""Helpers TorchServe handlers import from ``ts.utils.util`` and ``ts.handler_utils.utils``."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from ferry.handlers.contract.loader import classes_defined_in


def map_class_to_label(
    probs: Sequence[Sequence[float]],
    mapping: Mapping[str, str] | None = None,
    lbl_classes: Sequence[Sequence[int]] | None = None,
) -> list[dict[str, float]]:
    """One ``{label: probability}`` dict per row of ``probs``.

    ``lbl_classes`` gives each row's class indices (default: ``0..n-1``); ``mapping``
    turns an index (as a string) into a label, and a class it lacks keeps its index.

    >>> map_class_to_label([[0.9, 0.1]], {"0": "cat", "1": "dog"})
    [{'cat': 0.9, 'dog': 0.1}]
    """
    if mapping is not None and not isinstance(mapping, Mapping):
        raise TypeError(f"the mapping must be a dict, not {type(mapping).__name__}")
    if lbl_classes is None:
        lbl_classes = [range(len(row)) for row in probs]
    results = []
    for row_probs, row_classes in zip(probs, lbl_classes, strict=True):
        labels = [mapping.get(str(c), str(c)) if mapping else str(c) for c in row_classes]
        results.append(dict(zip(labels, row_probs, strict=True)))
    return results


def import_class(class_name: str, module_prefix: str | None = None) -> type:
    """The class named ``module.Class`` (or ``Class`` inside ``module_prefix``), imported.

    >>> import_class("OrderedDict", "collections").__name__
    'OrderedDict'
    """
    module_name, _, name = class_name.rpartition(".")
    if module_prefix:
        module_name = f"{module_prefix}.{module_name}" if module_name else module_prefix
    if not module_name:
        raise ImportError(f"{class_name!r} names no module; pass module_prefix")
    module = importlib.import_module(module_name)
    found = getattr(module, name, None)
    if not isinstance(found, type):
        raise ImportError(f"class {name!r} not found in module {module_name!r}")
    return found


def get_yaml_config(yaml_file_path: str | Path) -> dict[str, Any]:
    """A YAML file's top-level mapping (an empty file gives ``{}``)."""
    loaded = yaml.safe_load(Path(yaml_file_path).read_text())
    return loaded if isinstance(loaded, dict) else {}


def list_classes_from_module(module: ModuleType, parent_class: type | None = None) -> list[type]:
    """The classes defined in ``module`` itself (not imported), subclasses of
    ``parent_class`` when given."""
    return classes_defined_in(module, parent_class)
