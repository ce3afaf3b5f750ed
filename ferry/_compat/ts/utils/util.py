"""TorchServe compatibility: ``ts.utils.util``."""

from ferry.handlers.builtin.model_loading import load_label_mapping
from ferry.handlers.contract.exceptions import PredictionException
from ferry.handlers.torchserve.ts_utils import (
    CLEANUP_REGEX,
    check_valid_pt2_backend,
    get_yaml_config,
    list_classes_from_module,
    map_class_to_label,
)

__all__ = [
    "CLEANUP_REGEX",
    "PredictionException",
    "check_valid_pt2_backend",
    "get_yaml_config",
    "list_classes_from_module",
    "load_label_mapping",
    "map_class_to_label",
]
