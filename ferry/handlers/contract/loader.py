"""Resolve a manifest's handler string to an entry point, by TorchServe's rules.

``module[:function]`` (``.py`` and folders stripped) is imported from the model folder;
if no such module exists, a built-in handler of that name is used. With a function
name, or a module-level ``handle``, that function is the entry point and is called once
with ``(None, context)`` to initialise. Otherwise the module must define exactly one
class, which is instantiated, ``initialize(context)``-ed, and whose ``handle`` is used.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ferry.errors import ArchiveError
from ferry.handlers.contract.context import Context

EntryPoint = Callable[[Any, Context], Any]

BUILTIN_HANDLERS = {
    "base_handler": "ferry.handlers.builtin.base_handler",
    "vision_handler": "ferry.handlers.builtin.image_classifier",
    "image_classifier": "ferry.handlers.builtin.image_classifier",
    "image_segmenter": "ferry.handlers.builtin.vision_tasks",
    "object_detector": "ferry.handlers.builtin.vision_tasks",
    "image_embedder": "ferry.handlers.builtin.vision_tasks",
    "text_classifier": "ferry.handlers.builtin.text_classifier",
    "dali_image_classifier": "ferry.handlers.torchserve.dali",
    "sagemaker_pytorch": "ferry.handlers.sagemaker.handler",
}
_BUILTIN_CLASSES = {
    "base_handler": "BaseHandler",
    "vision_handler": "VisionHandler",
    "image_classifier": "ImageClassifier",
    "image_segmenter": "ImageSegmenter",
    "object_detector": "ObjectDetector",
    "image_embedder": "ImageEmbedder",
    "text_classifier": "TextClassifier",
    "dali_image_classifier": "DALIImageClassifier",
    "sagemaker_pytorch": "SageMakerHandler",
}


def _import_handler_module(module_name: str) -> tuple[ModuleType, str | None]:
    """The handler's module, and the built-in class to use when it is a built-in."""
    try:
        return importlib.import_module(module_name), None
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise  # the handler exists but imports something missing: say that, not "not found"
    if module_name in BUILTIN_HANDLERS:
        return importlib.import_module(BUILTIN_HANDLERS[module_name]), _BUILTIN_CLASSES[module_name]
    raise ArchiveError(f"handler {module_name!r} is neither a file in the archive nor a built-in")


def load_entry_point(handler: str, context: Context) -> EntryPoint:
    """Import, instantiate and initialise the handler; returns ``handle(data, context)``."""
    module_part, _, function_name = handler.partition(":")
    module_name = module_part.removesuffix(".py").split("/")[-1]
    module, builtin_class = _import_handler_module(module_name)
    if builtin_class is not None:
        service = getattr(module, builtin_class)()
        service.initialize(context)
        return service.handle  # type: ignore[no-any-return]
    function_name = function_name or "handle"
    if hasattr(module, function_name):
        entry: EntryPoint = getattr(module, function_name)
        entry(None, context)
        return entry
    classes = classes_defined_in(module)
    if len(classes) != 1:
        names = [cls.__name__ for cls in classes]
        raise ArchiveError(
            f"handler {module_name!r} must define a {function_name}() function or exactly one "
            f"class, found {names}"
        )
    service = classes[0]()
    if not hasattr(service, "handle"):
        raise ArchiveError(f"handler class {classes[0].__name__} has no handle method")
    if hasattr(service, "initialize"):
        service.initialize(context)
    return service.handle  # type: ignore[no-any-return]


def import_file(path: Path) -> ModuleType:
    """Import a .py file of the model folder under its own name (TorchServe does the same)."""
    name = path.stem
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ArchiveError(f"cannot import {path.name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def classes_defined_in(module: ModuleType, base: type | None = None) -> list[type]:
    return [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__ and (base is None or issubclass(cls, base))
    ]
