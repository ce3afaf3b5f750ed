"""TorchServe's large-model and DALI modules in Ferry: every ``ts.*`` name their examples
import resolves; the torchrun-launched ones (DeepSpeed, PiPPy) fail the load with one line
saying why; the DALI handlers run over a DALI pipeline, and say what is missing when
they cannot."""

from __future__ import annotations

import importlib
import shutil
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ferry.handlers.contract.context import Context
from ferry.handlers.contract.loader import BUILTIN_HANDLERS
from ferry.handlers.torchserve import dali, distributed
from ferry.handlers.torchserve.unsupported import NotSupportedByFerry
from ferry.wire.spec import HandlerSpec
from ferry.worker.loading import SHIM_ROOT, load_handler
from tests.fixtures.models import HANDLERS

TS_NAMES = {
    "ts.torch_handler.distributed.base_deepspeed_handler": ["BaseDeepSpeedHandler"],
    "ts.torch_handler.distributed.base_pippy_handler": ["BasePippyHandler"],
    "ts.handler_utils.distributed.deepspeed": ["get_ds_engine", "create_checkpoints_json"],
    "ts.handler_utils.distributed.pt_pippy": ["get_pipeline_driver", "initialize_rpc_workers"],
    "ts.handler_utils.hf_batch_streamer": ["TextIteratorStreamerBatch"],
    "ts.handler_utils.preprocess.dali": ["get_dali_pipeline"],
    "ts.torch_handler.dali_handler": ["DALIHandler"],
    "ts.torch_handler.dali_image_classifier": ["DALIImageClassifier"],
}
"""What TorchServe 0.12's DeepSpeed, PiPPy, Inferentia2 streaming and DALI examples (and
its docs/large_model_inference.md) import from these modules."""


@pytest.fixture
def ts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Any]]:
    """``importlib.import_module`` with the ``ts`` shim importable, as in a worker."""
    monkeypatch.syspath_prepend(str(SHIM_ROOT))
    yield importlib.import_module
    for name in [m for m in sys.modules if m == "ts" or m.startswith("ts.")]:
        del sys.modules[name]


@pytest.mark.parametrize("module", sorted(TS_NAMES))
def test_each_module_the_examples_import_resolves(ts: Callable[[str], Any], module: str) -> None:
    imported = ts(module)
    assert set(TS_NAMES[module]) <= set(imported.__all__)
    for name in TS_NAMES[module]:
        assert getattr(imported, name) is not None


def context(tmp_path: Path, yaml_config: dict[str, Any] | None = None) -> Context:
    return Context("big", str(tmp_path), {}, 1, None, model_yaml_config=yaml_config or {})


def one_line(error: pytest.ExceptionInfo[BaseException]) -> str:
    message = f"{error.type.__name__}: {error.value}"
    assert "\n" not in message
    return message


UNSUPPORTED_USES: dict[str, Callable[[Context], object]] = {
    "BaseDeepSpeedHandler.initialize": lambda c: distributed.BaseDeepSpeedHandler().initialize(c),
    "BasePippyHandler.initialize": lambda c: distributed.BasePippyHandler().initialize(c),
    "get_ds_engine": lambda c: distributed.get_ds_engine(torch.nn.Linear(1, 1), c),
    "create_checkpoints_json": lambda c: distributed.create_checkpoints_json("m", "c.json"),
    "initialize_rpc_workers": lambda c: distributed.initialize_rpc_workers(0, 2, c),
    "get_pipeline_driver": lambda c: distributed.get_pipeline_driver(torch.nn.Linear(1, 1), 2, c),
}


@pytest.mark.parametrize("use", sorted(UNSUPPORTED_USES))
def test_each_torchrun_entry_point_fails_with_one_line_saying_why(tmp_path: Path, use: str) -> None:
    with pytest.raises(NotSupportedByFerry) as error:
        UNSUPPORTED_USES[use](context(tmp_path))
    message = one_line(error)
    feature = "DeepSpeed" if "ds" in use or "DeepSpeed" in use or "checkpoints" in use else "PiPPy"
    assert message.startswith(f"NotSupportedByFerry: {feature} ")
    assert "does not launch torchrun multi-process workers" in message


@pytest.fixture
def worker_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``sys.path`` as it was, and the handler and ``ts`` modules forgotten, after."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.endswith("_handler") or name == "ts" or name.startswith("ts."):
            del sys.modules[name]


def test_a_deepspeed_example_style_handler_fails_its_load_before_building_a_model(
    tmp_path: Path, worker_imports: None
) -> None:
    """Imported at its top, the names resolve; its ``super().initialize`` stops the load."""
    shutil.copy(HANDLERS / "ts_deepspeed_style_handler.py", tmp_path)
    config = {"parallelType": "tp", "torchrun": {"nproc-per-node": 2}}
    with pytest.raises(NotSupportedByFerry, match="DeepSpeed tensor parallelism") as error:
        handler = "ts_deepspeed_style_handler.py"
        spec = HandlerSpec("big", str(tmp_path), handler, {}, 1, config)
        load_handler(spec, gpu_id=None)
    assert error.traceback[-1].name == "refuse"


# --- DALI --------------------------------------------------------------------------------

DALI_SECTION = {"batch_size": 4, "num_threads": 1, "device_id": 0, "seed": 12}


class FakeTensorList:
    """A DALI ``TensorListCPU``: ``len`` and ``at(i)`` (a numpy array)."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays)

    def at(self, index: int) -> np.ndarray:
        return self.arrays[index]


class FakePipeline:
    """A deserialized pipeline that "decodes" each image to 3 channels of its byte sum."""

    made: list[dict[str, Any]] = []

    @classmethod
    def deserialize(cls, **kwargs: Any) -> FakePipeline:
        cls.made.append(kwargs)
        return cls()

    def run(self, source: list[np.ndarray]) -> tuple[FakeTensorList]:
        arrays = [np.full((3, 2, 2), float(image.sum()), dtype=np.float32) for image in source]
        return (FakeTensorList(arrays),)


@pytest.fixture
def fake_dali(monkeypatch: pytest.MonkeyPatch) -> type[FakePipeline]:
    """``nvidia.dali.pipeline.Pipeline`` importable, as ``FakePipeline``."""
    module = types.ModuleType("nvidia.dali.pipeline")
    module.Pipeline = FakePipeline  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nvidia.dali.pipeline", module)
    FakePipeline.made = []
    return FakePipeline


def test_the_dali_pipeline_is_the_archives_deserialized_with_the_sections_settings(
    tmp_path: Path, fake_dali: type[FakePipeline]
) -> None:
    (tmp_path / "model.dali").write_bytes(b"serialized")
    config = {"dali": {**DALI_SECTION, "pipeline_file": "model.dali"}}
    pipeline = dali.get_dali_pipeline(context(tmp_path, config))
    assert isinstance(pipeline, FakePipeline)
    assert fake_dali.made == [
        {"filename": str(tmp_path / "model.dali"), "prefetch_queue_depth": 1, **DALI_SECTION}
    ]
    assert (pipeline._max_batch_size, pipeline._num_threads) == (4, 1)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("dali_section", "expected"),
    [
        (None, "ValueError: big has no dali config in model config yaml file"),
        ({"batch_size": 2}, "ValueError: model-config.yaml's dali section lacks num_threads"),
        (DALI_SECTION, "NotSupportedByFerry: TorchServe's built-in default.dali pipeline"),
        ({**DALI_SECTION, "pipeline_file": "x.dali"}, "RuntimeError: Missing dali pipeline"),
    ],
)
def test_a_dali_section_that_cannot_work_says_why_in_one_line(
    tmp_path: Path, dali_section: dict[str, Any] | None, expected: str
) -> None:
    config = {} if dali_section is None else {"dali": dali_section}
    with pytest.raises(Exception) as error:
        dali.get_dali_pipeline(context(tmp_path, config))
    assert one_line(error).startswith(expected)


def test_without_dali_installed_the_load_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.dali.pipeline", None)  # import fails
    (tmp_path / "model.dali").write_bytes(b"serialized")
    config = {"dali": {**DALI_SECTION, "pipeline_file": "model.dali"}}
    with pytest.raises(ImportError) as error:
        dali.DALIImageClassifier().initialize(context(tmp_path, config))
    message = one_line(error)
    assert message.startswith("ImportError: the DALI handler needs NVIDIA DALI (nvidia.dali)")
    assert "pip install nvidia-dali-cuda120" in message


class Channels(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3)) * torch.tensor([1.0, 0.0, -1.0])


def test_the_dali_image_classifier_runs_requests_through_the_pipeline(
    tmp_path: Path, fake_dali: type[FakePipeline]
) -> None:
    (tmp_path / "model.dali").write_bytes(b"serialized")
    handler = dali.DALIImageClassifier()
    config = {"dali": {**DALI_SECTION, "pipeline_file": "model.dali"}}
    handler.initialize(context(tmp_path, config))
    handler.model, handler.mapping = Channels(), {"0": "up", "2": "down"}
    handler.set_max_result_classes(2)
    batch = handler.preprocess([{"data": b"\x01\x02"}, {"body": bytearray(b"\x00")}])
    assert batch.shape == (2, 3, 2, 2) and batch[:, 0, 0, 0].tolist() == [3.0, 0.0]
    first, second = handler.postprocess(handler.inference(batch))
    assert list(first) == ["up", "1"] and first["up"] > 0.9
    assert list(second.values()) == pytest.approx([1 / 3, 1 / 3])  # all logits 0
    assert BUILTIN_HANDLERS["dali_image_classifier"] == "ferry.handlers.torchserve.dali"
