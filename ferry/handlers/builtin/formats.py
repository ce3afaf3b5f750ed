"""The model formats the built-in handlers load, declared once: how each is told from the
manifest (``serializedFile``, ``modelFile``) and model-config.yaml, how it is loaded, and
the platform the Open Inference Protocol's model metadata names for it.

Both processes read this table: a worker's handler loads through it (``load_model``,
``BaseHandler.initialize``), the frontend names a model's platform from it
(``ferry.service.queries.metadata``). The first format that tells the archive wins: those
told by their file first, in the order registered, then TorchServe's two defaults (a
model file: an eager model; any other serialized file: TorchScript).

==================  ==================  ==================================================
format              platform            told by
==================  ==================  ==================================================
onnx                onnxruntime_onnx    ``.onnx``
aoti_package        torch_aoti          ``.pt2`` holding ``data/aotinductor/``
exported_program    torch_export        any other ``.pt2`` (``torch.export.save``)
aot_compiled        torch_aoti          ``.so`` with ``pt2: {export: {aot_compile: true}}``
eager               pytorch             a ``modelFile``
torchscript         pytorch_libtorch    any other ``serializedFile``
==================  ==================  ==================================================

Eager models, TorchScript and ``torch.export`` programs share their weights (one mapped
file per machine, or a weights keeper's copy: ``ModelFormat.shares_weights``); ONNX
Runtime and AOTInductor load their files themselves.

The platform names are Triton's where Triton serves the format (``onnxruntime_onnx``,
``pytorch_libtorch`` for TorchScript, ``torch_aoti`` for AOTInductor); an eager model is
KServe's ``pytorch`` model format, as is a model that names neither file (its handler
loads what it likes). Triton serves no ``torch.export`` program: ``torch_export`` follows
its ``torch_aoti``.

A new format is one ``MODEL_FORMATS.register(ModelFormat(...))`` beside its loader::

    MODEL_FORMATS.register(
        ModelFormat("tensorrt", "tensorrt_plan", lambda s: s.suffix == ".plan", load_plan)
    )
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ferry.errors import ArchiveError
from ferry.handlers.builtin.aot_package import is_aoti_package, load_aoti_package
from ferry.handlers.builtin.model_loading import (
    for_inference,
    load_aot_compiled,
    load_eager_model,
    load_exported_program,
    load_torchscript,
)

DEFAULT_PLATFORM = "pytorch"
"""The platform of a model no format tells: its handler loads it (KServe's model format)."""


@dataclass(frozen=True)
class ModelSource:
    """What a model is loaded from: the manifest's files in the model folder, and
    model-config.yaml."""

    model_dir: Path
    serialized_file: str | None = None
    model_file: str | None = None
    model_yaml_config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def suffix(self) -> str:
        """The serialized file's suffix (``.onnx``), "" without one."""
        return Path(self.serialized_file).suffix if self.serialized_file else ""

    @property
    def serialized_path(self) -> Path | None:
        return self.model_dir / self.serialized_file if self.serialized_file else None

    def weights(self) -> Path | None:
        """The serialized file, None without one; ``ArchiveError`` if the manifest names
        one that is absent."""
        path = self.serialized_path
        if path is not None and not path.is_file():
            raise ArchiveError(f"serialized file {self.serialized_file!r} not found in the archive")
        return path

    def required_weights(self) -> Path:
        """``weights()``, for a format told by its serialized file."""
        path = self.weights()
        if path is None:
            raise ArchiveError("the manifest names no serializedFile")
        return path


Loader = Callable[[ModelSource, torch.device], Any]


@dataclass(frozen=True, eq=False)
class ModelFormat:
    """One way a model is stored. Compared by identity: a table may key on the format."""

    name: str
    platform: str
    """What the Open Inference Protocol's model metadata answers (``platform``)."""
    tells: Callable[[ModelSource], bool]
    """Whether the archive holds this format (cheap: suffixes, a zip's listing)."""
    load: Loader
    """The model, ready for inference on the device."""
    shares_weights: bool = False
    """Whether its weights load over one mapped file, so that a weights keeper can hold
    them for its workers (``ferry.handlers.builtin.shared_weights``): not for a format
    whose runtime loads the file itself (ONNX Runtime, AOTInductor)."""


class FormatRegistry:
    """Formats in the order they are tried: those registered, then the defaults."""

    def __init__(self, defaults: tuple[ModelFormat, ...]) -> None:
        self._registered: list[ModelFormat] = []
        self._defaults = defaults

    def register(self, model_format: ModelFormat) -> ModelFormat:
        """Try ``model_format`` after those registered before it, before the defaults."""
        if any(known.name == model_format.name for known in self.formats()):
            raise ValueError(f"model format {model_format.name!r} is already registered")
        self._registered.append(model_format)
        return model_format

    def unregister(self, name: str) -> None:
        self._registered = [known for known in self._registered if known.name != name]

    def formats(self) -> tuple[ModelFormat, ...]:
        return (*self._registered, *self._defaults)

    def detect(self, source: ModelSource) -> ModelFormat | None:
        """The first format that tells ``source``; None when the manifest names no file."""
        return next((known for known in self.formats() if known.tells(source)), None)

    def shares_weights(self, source: ModelSource) -> bool:
        """Whether ``source``'s weights can be shared (a format tells it, and its loader
        shares them)."""
        detected = self.detect(source)
        return detected is not None and detected.shares_weights

    def platform_of(self, source: ModelSource) -> str:
        detected = self.detect(source)
        return DEFAULT_PLATFORM if detected is None else detected.platform


def _load_onnx(source: ModelSource, device: torch.device) -> Any:
    from ferry.handlers.builtin.onnx_model import OnnxModel  # onnxruntime: an extra

    return OnnxModel(source.required_weights(), device)


def _is_aoti_package(source: ModelSource) -> bool:
    path = source.serialized_path
    return path is not None and path.suffix == ".pt2" and is_aoti_package(path)


def _torchserve_aot_compiled(source: ModelSource) -> bool:
    """A ``.so`` that model-config.yaml says, as TorchServe reads it, was compiled by
    ``torch._export.aot_compile`` (``pt2: {export: {aot_compile: true}}``)."""
    pt2 = source.model_yaml_config.get("pt2")
    export = pt2.get("export") if isinstance(pt2, dict) else None
    return source.suffix == ".so" and isinstance(export, dict) and bool(export.get("aot_compile"))


def _load_eager(source: ModelSource, device: torch.device) -> Any:
    model = load_eager_model(source.model_dir / str(source.model_file), source.weights(), device)
    return for_inference(model, device)


ONNX = ModelFormat("onnx", "onnxruntime_onnx", lambda source: source.suffix == ".onnx", _load_onnx)
AOTI_PACKAGE = ModelFormat(
    "aoti_package",
    "torch_aoti",
    _is_aoti_package,
    lambda source, device: load_aoti_package(source.required_weights(), device),
)
EXPORTED_PROGRAM = ModelFormat(
    "exported_program",
    "torch_export",
    lambda source: source.suffix == ".pt2",
    lambda source, device: load_exported_program(source.required_weights(), device),
    shares_weights=True,
)
AOT_COMPILED = ModelFormat(
    "aot_compiled",
    "torch_aoti",
    _torchserve_aot_compiled,
    lambda source, device: load_aot_compiled(source.required_weights(), device),
)
EAGER = ModelFormat(
    "eager", "pytorch", lambda source: bool(source.model_file), _load_eager, shares_weights=True
)
TORCHSCRIPT = ModelFormat(
    "torchscript",
    "pytorch_libtorch",
    lambda source: bool(source.serialized_file),
    lambda source, device: load_torchscript(source.required_weights(), device),
    shares_weights=True,
)

MODEL_FORMATS = FormatRegistry(defaults=(EAGER, TORCHSCRIPT))
for _told_by_its_file in (ONNX, AOTI_PACKAGE, EXPORTED_PROGRAM, AOT_COMPILED):
    MODEL_FORMATS.register(_told_by_its_file)


def load_model(
    model_dir: Path,
    serialized_file: str | None,
    model_file: str | None,
    device: torch.device,
    model_yaml_config: Mapping[str, Any] | None = None,
) -> Any:
    """The model the manifest describes, ready for inference on ``device``; None if it
    names no file."""
    source = ModelSource(model_dir, serialized_file, model_file, model_yaml_config or {})
    source.weights()  # a named file that is absent is refused before any format is told
    detected = MODEL_FORMATS.detect(source)
    return None if detected is None else detected.load(source, device)


__all__ = [
    "DEFAULT_PLATFORM",
    "MODEL_FORMATS",
    "FormatRegistry",
    "ModelFormat",
    "ModelSource",
    "load_model",
]
