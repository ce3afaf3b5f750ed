from ferry.handlers.exceptions import PredictionException
from ferry.handlers.image_classifier import map_class_to_label
from ferry.handlers.model_loading import classes_defined_in as list_classes_from_module
from ferry.handlers.model_loading import load_label_mapping

__all__ = [
    "PredictionException",
    "list_classes_from_module",
    "load_label_mapping",
    "map_class_to_label",
]
