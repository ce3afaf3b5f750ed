"""Helpers TorchServe handlers import from ``ts.utils.util`` and ``ts.handler_utils.utils``."""

from __future__ import annotations

import importlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from ferry.handlers.contract import streaming
from ferry.handlers.contract.loader import classes_defined_in

log = logging.getLogger(__name__)

CLEANUP_REGEX = re.compile(r"<[^\n]*?>|&(?:[a-z0-9]+|#[0-9]{1,6}|#x[0-9a-f]{1,6});")
"""What text handlers strip before tokenizing: HTML tags (``<`` to the nearest ``>`` on the
same line) and character references with lower-case names (``&amp;``, ``&#38;``,
``&#x26;``)."""

PT2_BACKENDS = (
    "eager",
    "aot_eager",
    "inductor",
    "nvfuser",
    "aot_nvfuser",
    "aot_cudagraphs",
    "ofi",
    "fx2trt",
    "onnxrt",
    "ipex",
    "torchxla_trace_once",
    "openvino",
    "tensorrt",
    "hpu_backend",
)
"""The ``torch.compile`` backends TorchServe accepts in model-config.yaml's ``pt2``."""


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


def check_valid_pt2_backend(backend: str) -> bool:
    """Whether ``backend`` is one of ``PT2_BACKENDS`` (case matters); a warning if not."""
    if backend in PT2_BACKENDS:
        return True
    log.warning("%s is not a supported backend", backend)
    return False


def send_intermediate_predict_response(
    ret: Any, req_id_map: Any, message: str, code: int, context: Any = None
) -> None:
    """Stream ``ret[i]`` to request ``req_id_map[i]`` ahead of the final answer (see
    ``ferry.handlers.contract.streaming``). As in TorchServe, only the process of local
    rank 0 sends (``LOCAL_RANK`` unset or ``0``); other ranks' parts are dropped."""
    if str(os.environ.get("LOCAL_RANK", "0")) != "0":
        return
    streaming.send_intermediate_predict_response(ret, req_id_map, message, code, context)
