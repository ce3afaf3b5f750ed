"""Which functions serve a SageMaker model: the user's, from its ``code/`` module, or the
defaults, by the toolkit's rules.

- The module is ``SAGEMAKER_PROGRAM`` (default ``inference.py``; ``.py`` dropped), imported
  with the model's ``code/`` folder first on ``sys.path``. Without such a module every
  function is a default.
- ``model_fn`` falls back to the default loader; ``input_fn``, ``predict_fn`` and
  ``output_fn`` each to their default; ``transform_fn`` to the three in turn. Defining
  ``transform_fn`` beside any of the three is an error (the model fails to load).
- ``pre_model_fn(model_dir)`` runs before ``model_fn`` and ``model_warmup_fn(model_dir,
  model)`` after it, when the module defines them.
- Every function may take one more parameter than the toolkit passes: the handler's
  ``context``, given last (``call``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

DEFAULT_PROGRAM = "inference.py"
PROGRAM_VARIABLE = "SAGEMAKER_PROGRAM"

Function = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class ServingFunctions:
    """The functions one model is served with, user's or default."""

    model_fn: Function
    transform_fn: Function
    input_fn: Function
    predict_fn: Function
    output_fn: Function
    pre_model_fn: Function | None = None
    model_warmup_fn: Function | None = None
    own_transform: bool = False
    """Whether ``transform_fn`` is the module's (else it runs the three in turn, and a
    batch's predictions may be made together: ``ferry.handlers.sagemaker.batching``)."""


@dataclasses.dataclass(frozen=True)
class Defaults:
    """The functions a module that lacks one is served with (PyTorch's:
    ``ferry.handlers.sagemaker.defaults``)."""

    model_fn: Function
    input_fn: Function
    predict_fn: Function
    output_fn: Function


def program_module(environ: Mapping[str, str]) -> str:
    """The user module's name: ``SAGEMAKER_PROGRAM`` without ``.py``."""
    program = environ.get(PROGRAM_VARIABLE) or DEFAULT_PROGRAM
    return program.removesuffix(".py")


_IMPORTING = threading.Lock()
"""One model's import at a time: the models of a shared process load on threads of it."""
_CODE_DIRS: set[str] = set()
"""The ``code/`` folders this process imported models from."""


def import_user_module(code_dir: Path, module_name: str) -> ModuleType | None:
    """The user's module, with ``code_dir`` first on ``sys.path`` (its sibling modules
    import too); None when there is no module of that name.

    In a process that serves several models (a multi-model endpoint's shared worker
    process), each model imports its own: the modules another model imported from its
    ``code/`` (its ``inference.py``, its ``utils.py``) are dropped from ``sys.modules``
    first, so a same-named module is read from this model's folder. The other model keeps
    the module objects it holds."""
    path = str(code_dir)
    with _IMPORTING:
        _forget_modules_from(_CODE_DIRS - {path})
        _CODE_DIRS.add(path)
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
        loaded = sys.modules.get(module_name)
        if loaded is not None and not _is_under(loaded, code_dir):
            del sys.modules[module_name]  # e.g. an installed module of the same name
        if importlib.util.find_spec(module_name) is None:
            return None
        return importlib.import_module(module_name)


def _forget_modules_from(folders: set[str]) -> None:
    prefixes = tuple(os.path.join(folder, "") for folder in folders)
    if not prefixes:
        return
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if isinstance(origin, str) and origin.startswith(prefixes):
            del sys.modules[name]


def _is_under(module: ModuleType, folder: Path) -> bool:
    origin = getattr(module, "__file__", None)
    return origin is not None and Path(origin).resolve().is_relative_to(folder.resolve())


def resolve(module: ModuleType | None, defaults: Defaults) -> ServingFunctions:
    """The functions to serve with: the module's where it defines them, else ``defaults``."""

    def pick(name: str) -> Function | None:
        found = getattr(module, name, None) if module is not None else None
        return found if callable(found) else None

    transform_fn, input_fn, predict_fn, output_fn = (
        pick(name) for name in ("transform_fn", "input_fn", "predict_fn", "output_fn")
    )
    if transform_fn is not None and (input_fn or predict_fn or output_fn):
        raise ValueError(
            "inference.py defines transform_fn and also input_fn, predict_fn or output_fn: "
            "transform_fn replaces all three, so define either it or them"
        )
    functions = ServingFunctions(
        model_fn=pick("model_fn") or defaults.model_fn,
        transform_fn=transform_fn or _unset,
        input_fn=input_fn or defaults.input_fn,
        predict_fn=predict_fn or defaults.predict_fn,
        output_fn=output_fn or defaults.output_fn,
        pre_model_fn=pick("pre_model_fn"),
        model_warmup_fn=pick("model_warmup_fn"),
        own_transform=transform_fn is not None,
    )
    if transform_fn is None:
        return with_default_transform(functions)
    return functions


def _unset(*args: Any) -> Any:
    raise AssertionError("replaced by resolve()")


def with_default_transform(functions: ServingFunctions) -> ServingFunctions:
    """``functions`` with a ``transform_fn`` that runs their ``input_fn``, ``predict_fn``
    and ``output_fn`` in turn (the toolkit's, when the module has none)."""

    def transform_fn(model: Any, data: Any, content_type: str, accept: str, context: Any) -> Any:
        decoded = call(functions.input_fn, (data, content_type), context)
        prediction = call(functions.predict_fn, (decoded, model), context)
        return call(functions.output_fn, (prediction, accept), context)

    return dataclasses.replace(functions, transform_fn=transform_fn)


def call(function: Function, args: tuple[Any, ...], context: Any) -> Any:
    """``function(*args)``, or ``function(*args, context)`` when it takes one parameter
    more: the toolkit counts parameters, defaults included. Any other count is a
    ``TypeError`` naming the function."""
    count = len(inspect.signature(function).parameters)
    if count == len(args):
        return function(*args)
    if count == len(args) + 1:
        return function(*args, context)
    name = getattr(function, "__name__", repr(function))
    raise TypeError(
        f"{name} takes {count} parameters; the toolkit passes {len(args)} "
        f"(or {len(args) + 1} with the context)"
    )
