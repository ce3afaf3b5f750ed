"""The model formats' table (``ferry.handlers.builtin.formats``): which format each archive
is told as, the platform the Open Inference Protocol's metadata names for it, and a new
format registered once, seen by the worker's loading, ``BaseHandler`` and the metadata."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ferry.config.model_config import parse_model_config
from ferry.errors import ArchiveError
from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.builtin.formats import (
    DEFAULT_PLATFORM,
    MODEL_FORMATS,
    ModelFormat,
    ModelSource,
    load_model,
)
from ferry.scheduling.model_runner import ModelRunner, RunnerSettings
from ferry.scheduling.registry import ModelRegistry, ModelVersion
from ferry.service.queries import metadata
from ferry.store.archive import ModelArchive
from ferry.store.manifest import Manifest
from tests.fixtures.fake_worker import FakeFactory, spec

AOT_COMPILE = {"pt2": {"export": {"aot_compile": True}}}


def _source(
    folder: Path, serialized: str | None, model_file: str | None = None, **config: Any
) -> ModelSource:
    if serialized:
        (folder / serialized).write_bytes(b"weights")
    return ModelSource(folder, serialized, model_file, config)


@pytest.mark.parametrize(
    ("serialized", "model_file", "config", "name", "platform"),
    [
        ("model.onnx", None, {}, "onnx", "onnxruntime_onnx"),
        ("model.onnx", "model.py", {}, "onnx", "onnxruntime_onnx"),
        ("model.pt2", None, {}, "exported_program", "torch_export"),
        ("model.so", None, AOT_COMPILE, "aot_compiled", "torch_aoti"),
        ("model.so", None, {}, "torchscript", "pytorch_libtorch"),
        ("model.pt", "model.py", {}, "eager", "pytorch"),
        (None, "model.py", {}, "eager", "pytorch"),
        ("model.pt", None, {}, "torchscript", "pytorch_libtorch"),
    ],
)
def test_each_archive_is_told_its_format_and_platform(
    tmp_path: Path,
    serialized: str | None,
    model_file: str | None,
    config: dict[str, Any],
    name: str,
    platform: str,
) -> None:
    source = _source(tmp_path, serialized, model_file, **config)
    detected = MODEL_FORMATS.detect(source)
    assert detected is not None and detected.name == name
    assert MODEL_FORMATS.platform_of(source) == platform


def test_a_pt2_holding_aotinductor_models_is_an_aoti_package(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "model.pt2", "w") as package:
        package.writestr("model/data/aotinductor/model/model.so", b"")
    source = ModelSource(tmp_path, "model.pt2")
    assert MODEL_FORMATS.platform_of(source) == "torch_aoti"


def test_a_model_naming_no_file_is_its_handlers_and_plain_pytorch(tmp_path: Path) -> None:
    source = ModelSource(tmp_path)
    assert MODEL_FORMATS.detect(source) is None
    assert MODEL_FORMATS.platform_of(source) == DEFAULT_PLATFORM == "pytorch"
    assert load_model(tmp_path, None, None, torch.device("cpu")) is None


def test_a_named_file_that_is_absent_is_refused_before_any_format_loads(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match=r"serialized file 'gone\.onnx' not found"):
        load_model(tmp_path, "gone.onnx", None, torch.device("cpu"))


def test_a_name_is_registered_once(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'onnx' is already registered"):
        MODEL_FORMATS.register(ModelFormat("onnx", "x", lambda source: False, _load_plan))


# --- one new format, registered in one place ------------------------------------------


class PlanModel(torch.nn.Module):
    """What the stand-in TensorRT loader returns: doubles its input."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        return batch * 2


def _load_plan(source: ModelSource, device: torch.device) -> Any:
    return PlanModel(source.required_weights()).to(device).eval()


@pytest.fixture
def plan_format() -> Iterator[ModelFormat]:
    registered = MODEL_FORMATS.register(
        ModelFormat("tensorrt_plan", "tensorrt_plan", lambda s: s.suffix == ".plan", _load_plan)
    )
    try:
        yield registered
    finally:
        MODEL_FORMATS.unregister(registered.name)


def _archive(model_dir: Path, serialized: str) -> ModelArchive:
    manifest = Manifest("m", "1.0", "base_handler", serialized, None, None, {})
    config = parse_model_config({}, source="model-config.yaml")
    return ModelArchive("m", "1.0", model_dir, manifest, config, "m.mar")


def _v2_platform(archive: ModelArchive) -> str:
    settings = RunnerSettings(
        batch_size=1,
        max_batch_delay=0.0,
        workers=0,
        response_timeout=5.0,
        startup_timeout=5.0,
        queue_capacity=10,
        torch_threads=1,
    )
    runner = ModelRunner("m", "1.0", spec("m"), settings, FakeFactory(), None)
    registry = ModelRegistry()
    registry.add(ModelVersion(archive, runner, loaded_at_startup=True))
    return metadata(registry, "m", None).platform


def test_a_new_format_registered_once_is_loaded_and_named_everywhere(
    tmp_path: Path, plan_format: ModelFormat
) -> None:
    (tmp_path / "model.plan").write_bytes(b"engine")
    loaded = load_model(tmp_path, "model.plan", None, torch.device("cpu"))
    assert isinstance(loaded, PlanModel)  # the worker's loading
    handler = BaseHandler()
    by_handler = handler._load_model(tmp_path, "model.plan", None)
    assert isinstance(by_handler, PlanModel)  # the base handler's dispatch
    assert by_handler(torch.ones(1)).item() == 2.0
    assert _v2_platform(_archive(tmp_path, "model.plan")) == "tensorrt_plan"  # V2 metadata
    assert _v2_platform(_archive(tmp_path, "model.pt")) == "pytorch_libtorch"
    MODEL_FORMATS.unregister(plan_format.name)
    assert MODEL_FORMATS.platform_of(ModelSource(tmp_path, "model.plan")) == "pytorch_libtorch"


def test_torchserve_helpers_a_subclass_overrides_still_load_their_formats(
    tmp_path: Path,
) -> None:
    loaded: list[str] = []

    class Overriding(BaseHandler):
        def _load_torchscript_model(self, model_pt_path: str) -> Any:
            loaded.append(Path(model_pt_path).name)
            return PlanModel(Path(model_pt_path))

    (tmp_path / "model.pt").write_bytes(b"weights")
    assert isinstance(Overriding()._load_model(tmp_path, "model.pt", None), PlanModel)
    assert loaded == ["model.pt"]
