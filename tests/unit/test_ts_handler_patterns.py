"""The patterns TorchServe's own handlers and examples rely on, each in a handler written in
its style (``tests/fixtures/handlers/ts_*``), packaged as an archive and loaded as a worker
loads it (``ferry.worker.loading.load_handler``).

Patterns, and the TorchServe file that uses each:

- ``__init__`` without ``super().__init__()``: ``examples/micro_batching/
  micro_batching_handler.py`` (ImageClassifier), ``examples/dcgan_fashiongen/
  dcgan_fashiongen_handler.py`` and ``examples/nmt_transformer/model_handler_generalized.py``
  (BaseHandler), ``examples/torchrec_dlrm/dlrm_handler.py``;
- ``initialize`` without ``super().initialize()``: DCGAN, ``examples/Huggingface_Transformers/
  Transformer_handler_generalized.py``, ``examples/object_detector/yolo/yolov8/
  custom_handler.py``, DLRM;
- ``_load_pickled_model`` / ``_load_torchscript_model`` overrides that ``BaseHandler.initialize``
  calls: ``examples/image_classifier/vgg_16/vgg_handler.py``, ``examples/pt2/torch_compile_hpu/
  hpu_image_classifier.py``, ``examples/text_classification_with_scriptable_tokenizer/
  handler.py``;
- a module-level ``handle(data, context)`` initialised with ``data`` None (and one around a
  handler object initialised by its ``initialized`` flag): ``docs/custom_service.md``,
  ``test/pytest/test_send_intermediate_prediction_response.py``;
- a ``handle`` of its own calling ``preprocess`` / ``inference`` / ``postprocess``:
  ``docs/custom_service.md``, ``examples/asr_rnnt_emformer/handler.py``;
- ``preprocess`` that may return None, with ``inference`` / ``postprocess`` coping:
  ``examples/Workflows/dog_breed_classification/dog_breed_classification_handler.py``;
- ``self.get_device()`` and ``get_max_result_classes()``: ``test/pytest/test_device_config.py``,
  ``ts/torch_handler/image_classifier.py``;
- the ``text_classifier`` built-in: ``examples/text_classification``.
"""

from __future__ import annotations

import importlib
import io
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ferry.errors import ArchiveError
from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.builtin.image_classifier import ImageClassifier, VisionHandler
from ferry.handlers.builtin.model_loading import load_label_mapping
from ferry.handlers.builtin.text_classifier import TextClassifier
from ferry.handlers.builtin.vision_tasks import ImageEmbedder, ImageSegmenter, ObjectDetector
from ferry.handlers.contract.loader import BUILTIN_HANDLERS
from ferry.store.archive import open_model
from ferry.store.writer import ArchiveSpec, check_spec, write_archive
from ferry.worker.loading import SHIM_ROOT, ReadyHandler, load_handler
from ferry.worker.micro_batching import MicroBatching
from ferry.worker.pipeline import StagePipeline
from tests.fixtures.handler_inputs import png
from tests.fixtures.models import (
    DOUBLING_MODEL,
    HANDLERS,
    Doubler,
    archive_handler_spec,
    save_torchscript,
    write_config,
)

COLOUR_MODEL = """
import torch
from torch import nn


class ColourNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, x):
        return x.mean(dim=(2, 3)) * self.scale
"""
COLOURS = {"0": "red", "1": "green", "2": "blue"}
RED, GREEN, BLUE = png((255, 0, 0)), png((0, 255, 0)), png((0, 0, 255))
SMALL_IMAGES = {"image_classifier": {"resize": 16, "crop": 16, "topk": 1}}


class _ColourNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3)) * self.scale


class _LengthNet(nn.Module):
    """Per text ``[length, 5]``: texts longer than 5 characters are class 0."""

    def forward(self, texts: list[str]) -> torch.Tensor:
        return torch.tensor([[float(len(text)), 5.0] for text in texts])


class _WordCountNet(nn.Module):
    """Per row of token ids: ``[count of id 1, count of id 2]``."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.stack([(ids == 1).sum(dim=1), (ids == 2).sum(dim=1)], dim=1).float()


class _Brightness(nn.Module):
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images.mean(dim=(1, 2, 3))


@pytest.fixture
def worker_imports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """``sys.path`` as it was, and the test's handler and model modules forgotten, after."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        module_file = getattr(sys.modules[name], "__file__", None) or ""
        if name.endswith("_handler") or module_file.startswith(str(tmp_path)):
            del sys.modules[name]


def package(
    tmp_path: Path,
    handler: str,
    *,
    name: str = "m",
    weights: Path | None = None,
    model_source: str | None = None,
    files: dict[str, bytes] | None = None,
    config: dict[str, Any] | None = None,
) -> Path:
    """``handler`` (a fixture file, or a built-in name) and the model as ``NAME.mar`` in
    ``tmp_path/store``, checked as ``ferry archive`` checks it; the archive's path."""
    source = tmp_path / f"{name}-src"
    source.mkdir(exist_ok=True)
    model_file = None
    if model_source is not None:
        model_file = source / _model_file_name(model_source)
        model_file.write_text(model_source)
    extra = []
    for file_name, content in (files or {}).items():
        (source / file_name).write_bytes(content)
        extra.append(source / file_name)
    handler_path = HANDLERS / handler
    spec = ArchiveSpec(
        model_name=name,
        handler=str(handler_path) if handler_path.is_file() else handler,
        serialized_file=weights,
        model_file=model_file,
        extra_files=tuple(extra),
        config_file=write_config(source, config or {}),
    )
    assert check_spec(spec, tmp_path / "store", builtin_handlers=BUILTIN_HANDLERS) in (
        [],
        ["no --serialized-file or --model-file: the handler must build or fetch its model"],
    )
    (tmp_path / "store").mkdir(exist_ok=True)
    return write_archive(spec, tmp_path / "store", force=True)


def serve(tmp_path: Path, handler: str, **packaging: Any) -> ReadyHandler:
    """``handler`` packaged (see ``package``), unpacked and loaded as a worker does."""
    archive_path = package(tmp_path, handler, **packaging)
    (tmp_path / "work").mkdir(exist_ok=True)
    archive = open_model(archive_path.parent, archive_path.name, tmp_path / "work")
    return load_handler(archive_handler_spec(archive, "m", 8), gpu_id=None)


def _model_file_name(source: str) -> str:
    return {COLOUR_MODEL: "colour_model.py", DOUBLING_MODEL: "doubler_model.py"}.get(
        source, "net_model.py"
    )


def run(
    ready: ReadyHandler, rows: list[dict[str, Any]], headers: dict[str, str] | None = None
) -> Any:
    ids = [f"r{i}" for i in range(len(rows))]
    ready.context.start_batch(ids, [dict(headers or {}) for _ in rows])
    return ready.entry(rows, ready.context)


def instance(ready: ReadyHandler) -> Any:
    """The handler object of a class-based handler."""
    assert ready.instance is not None
    return ready.instance


def colour_weights(tmp_path: Path, scale: float = 10.0) -> Path:
    model = _ColourNet()
    with torch.no_grad():
        model.scale.fill_(scale)
    path = tmp_path / "colour.pt"
    torch.save(model.state_dict(), path)
    return path


def scripted(model: nn.Module, path: Path) -> Path:
    save_torchscript(model, path)
    return path


def label_files(mapping: dict[str, str]) -> dict[str, bytes]:
    return {"index_to_name.json": json.dumps(mapping).encode()}


def top_labels(answers: list[Any]) -> list[Any]:
    """Each answer's most likely label (answers that are not ``{label: p}`` as they are)."""
    return [max(a.items(), key=lambda kv: kv[1])[0] if isinstance(a, dict) else a for a in answers]


# --- handlers whose __init__ skips super().__init__() ------------------------------------


@pytest.mark.parametrize("in_model_config", [True, False])
def test_torchserves_micro_batching_example_skips_super_init(
    tmp_path: Path, worker_imports: None, in_model_config: bool
) -> None:
    micro = {"micro_batch_size": 2, "parallelism": {"preprocess": 2, "postprocess": 2}}
    config = {**SMALL_IMAGES, **({"micro_batching": micro} if in_model_config else {})}
    ready = serve(
        tmp_path,
        "ts_mb_classifier_handler.py",
        weights=colour_weights(tmp_path),
        model_source=COLOUR_MODEL,
        files=label_files(COLOURS),
        config=config,
    )
    try:
        handler = instance(ready)
        assert type(handler).__name__ == "MicroBatchedClassifier"
        assert isinstance(handler.handle, MicroBatching)
        if in_model_config:
            assert isinstance(ready.pipeline, StagePipeline)  # the section runs the pipeline
            assert handler.handle.micro_batch_size == 2
            assert handler.handle.parallelism == {"preprocess": 2, "inference": 1, "postprocess": 2}
        else:
            assert ready.pipeline is None and handler.handle.micro_batch_size == 1
        rows = [{"body": image} for image in (RED, GREEN, BLUE, BLUE, RED)]
        rows.insert(2, {"body": b"not an image"})
        for answers in (run(ready, rows), handler.handle(rows, ready.context)):
            assert isinstance(answers[2], Exception) and "cannot decode" in str(answers[2])
            del answers[2]
            assert top_labels(answers) == ["red", "green", "blue", "blue", "red"]
    finally:
        ready.close()
        instance(ready).handle.shutdown()


def test_dcgan_style_handler_skips_super_init_and_initialize(
    tmp_path: Path, worker_imports: None
) -> None:
    weights = tmp_path / "doubler.pt"
    torch.save(Doubler().state_dict(), weights)
    ready = serve(
        tmp_path,
        "ts_no_super_handler.py",
        weights=weights,
        model_source=DOUBLING_MODEL,
        config={"handler": {"offset": 1}},
    )
    answers = run(ready, [{"body": b"[1, 2]"}, {"data": [0.5, -1]}])
    assert answers == [[4.0, 6.0], [3.0, 0.0]]  # BaseHandler's inference and postprocess
    assert instance(ready).map_location == "cpu" and instance(ready).initialized is True


def test_from_scratch_handler_with_its_own_handle(tmp_path: Path, worker_imports: None) -> None:
    weights = scripted(Doubler(), tmp_path / "doubler.torchscript.pt")
    ready = serve(tmp_path, "ts_from_scratch_handler.py", weights=weights)
    assert run(ready, [{"body": b"[[1.5, 2]]"}]) == [[[3.0, 4.0]]]
    assert instance(ready)._context is ready.context and instance(ready).initialized


@pytest.mark.parametrize(
    "cls", [BaseHandler, VisionHandler, ImageClassifier, ImageSegmenter, ObjectDetector]
)
def test_builtins_read_only_class_defaults_before_initialize(cls: type[BaseHandler]) -> None:
    """What TorchServe's ``__init__`` sets, readable on an instance whose ``__init__`` did
    not run (as a subclass that skips ``super().__init__()`` has)."""
    handler = cls.__new__(cls)
    assert handler.model is None and handler.mapping is None and handler.device is None
    assert handler.context is None and handler.manifest is None and handler.map_location is None
    assert handler.model_pt_path is None and handler.initialized is False
    assert handler.explain is False and handler.target == 0
    assert handler.get_device() is None
    if isinstance(handler, VisionHandler):
        assert handler.failures == {}
    for extra in (TextClassifier, ImageEmbedder):
        assert extra.__new__(extra).model is None


# --- model loading: overrides, devices, files ------------------------------------------


@pytest.mark.parametrize("fixture", ["ts_vgg_style_handler.py", "ts_hpu_style_handler.py"])
def test_base_initialize_calls_a_pickled_model_override(
    tmp_path: Path, worker_imports: None, fixture: str
) -> None:
    weights = colour_weights(tmp_path)
    ready = serve(
        tmp_path,
        fixture,
        weights=weights,
        model_source=COLOUR_MODEL,
        files=label_files(COLOURS),
        config=SMALL_IMAGES,
    )
    handler = instance(ready)
    if fixture == "ts_vgg_style_handler.py":
        model_dir = ready.context.system_properties["model_dir"]
        expected = (Path(model_dir).name, "colour_model.py", os.path.join(model_dir, "colour.pt"))
        assert handler.loaded_by_override == expected
    else:
        assert handler.device_set_after_loading is True
    assert float(handler.model.scale.detach()) == 10.0  # the weights the override loaded
    assert top_labels(run(ready, [{"body": GREEN}, {"body": RED}])) == ["green", "red"]


def test_base_initialize_calls_a_torchscript_override_and_html_is_stripped(
    tmp_path: Path, worker_imports: None
) -> None:
    weights = scripted(_LengthNet(), tmp_path / "texts.pt")
    ready = serve(
        tmp_path,
        "ts_scripted_text_handler.py",
        weights=weights,
        files=label_files({"0": "long", "1": "short"}),
    )
    assert instance(ready).loaded_on == torch.device("cpu")
    rows: list[dict[str, Any]] = [
        {"body": b"<p>ok</p>"},
        {"data": "&amp;&#38;&#x26;hi"},
        {"body": b"a long text"},
    ]
    assert top_labels(run(ready, rows)) == ["short", "short", "long"]


def test_transformers_style_handler_loads_everything_itself(
    tmp_path: Path, worker_imports: None
) -> None:
    weights = scripted(_WordCountNet(), tmp_path / "words.pt")
    vocabulary = {"good": 1, "great": 1, "bad": 2, "awful": 2}
    setup = {"save_mode": "torchscript", "max_length": 6, "vocabulary": vocabulary}
    ready = serve(
        tmp_path,
        "ts_transformers_style_handler.py",
        weights=weights,
        files=label_files({"0": "positive", "1": "negative"}),
        config={"handler": setup},
    )
    rows: list[dict[str, Any]] = [{"body": b"a good great film"}, {"data": "awful bad but good"}]
    assert run(ready, rows) == ["positive", "negative"]
    explained = run(ready, [{"body": b"good not bad", "target": 1}], {"explain": "True"})
    assert explained == [{"words": ["good", "not", "bad"], "importances": [0, 0, 1], "target": 1}]


def test_dlrm_style_handler_loads_an_eager_model_without_weights(
    tmp_path: Path, worker_imports: None
) -> None:
    summer = "from torch import nn\n\nclass Summer(nn.Module):\n    def forward(self, x):\n"
    summer += "        return x.sum(dim=1, keepdim=True)\n"
    ready = serve(tmp_path, "ts_dlrm_style_handler.py", model_source=summer)
    assert instance(ready).model_pt_path is None
    assert run(ready, [{"body": b"[1, 2]"}, {"body": b"[3, 4.5]"}]) == [[3.0], [7.5]]


def test_yolo_style_detector_loads_its_model_itself(tmp_path: Path, worker_imports: None) -> None:
    weights = scripted(_Brightness(), tmp_path / "detector.pt")
    ready = serve(tmp_path, "ts_yolo_style_handler.py", weights=weights)
    rows = [{"body": png((255, 255, 255))}, {"data": png((0, 0, 0))}]
    assert run(ready, rows) == [{"brightness": 1.0}, {"brightness": 0.0}]


def test_label_mapping_formats_torchserve_reads(tmp_path: Path) -> None:
    path = tmp_path / "index_to_name.json"
    path.write_text(json.dumps({"0": ["n01440764", "tench"], "1": "goldfish"}))
    assert load_label_mapping(path) == {"0": "tench", "1": "goldfish"}
    path.write_text(json.dumps({"object_type_names": ["background", "person"]}))
    assert load_label_mapping(path) == {"0": "background", "1": "person"}
    path.write_text(json.dumps({"0": 7}))
    with pytest.raises(ArchiveError, match="label"):
        load_label_mapping(path)


# --- function entry points, streaming, preprocess returning None -------------------------


def test_module_level_handle_is_initialised_with_none_data(
    tmp_path: Path, worker_imports: None
) -> None:
    weights = scripted(Doubler(), tmp_path / "doubler.pt")
    ready = serve(tmp_path, "ts_function_handler.py", weights=weights)
    module = importlib.import_module("ts_function_handler")
    assert module.init_calls == ["m"] and ready.instance is None
    assert run(ready, [{"body": b"[1, 2]"}, {"body": b"[0, -3]"}]) == [[2.0, 4.0], [0.0, -6.0]]


def test_module_level_handle_around_a_handler_object(tmp_path: Path, worker_imports: None) -> None:
    ready = serve(
        tmp_path,
        "ts_service_wrapper_handler.py",
        weights=colour_weights(tmp_path),
        model_source=COLOUR_MODEL,
        files=label_files(COLOURS),
        config=SMALL_IMAGES,
    )
    service = importlib.import_module("ts_service_wrapper_handler")._service
    assert service.initialized is True and service.mapping == COLOURS
    assert top_labels(run(ready, [{"body": BLUE}, {"body": RED}])) == ["blue", "red"]


def test_send_intermediate_predict_response_from_handler_utils(
    tmp_path: Path, worker_imports: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ready = serve(tmp_path, "ts_intermediate_handler.py")
    assert run(ready, [{"body": b"a"}, {"body": b"b"}]) == ["done", "done"]
    parts = [(p.request_id, p.output, p.status) for p in ready.context.intermediate_responses]
    assert parts == [(rid, f"part {i}", 200) for i in range(3) for rid in ("r0", "r1")]
    # As in TorchServe, only the process of local rank 0 streams.
    ready.context.intermediate_responses.clear()
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert run(ready, [{"body": b"a"}]) == ["done"]
    assert ready.context.intermediate_responses == []


def test_dog_breed_style_preprocess_may_return_none(tmp_path: Path, worker_imports: None) -> None:
    ready = serve(
        tmp_path,
        "ts_dog_breed_handler.py",
        weights=colour_weights(tmp_path),
        model_source=COLOUR_MODEL,
        files=label_files(COLOURS),
        config=SMALL_IMAGES,
    )
    cats = [{"kind": b"cat", "image": RED}, {"kind": b"cat", "image": BLUE}]
    assert run(ready, cats) == ["It's a cat!", "It's a cat!"]
    mixed = [{"kind": b"dog", "image": BLUE}, cats[0], {"kind": b"dog", "image": GREEN}]
    assert top_labels(run(ready, mixed)) == ["blue", "It's a cat!", "green"]
    assert run(ready, cats) == ["It's a cat!", "It's a cat!"]  # no stale decoding failures


# --- names TorchServe handlers import ----------------------------------------------------


BAG_MODEL = """
from torch import nn


class BagNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.EmbeddingBag(4, 2, mode="sum")

    def forward(self, text, offsets):
        return self.embedding(text, offsets) * 5
"""


class _BagNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(4, 2, mode="sum")


def test_text_classifier_is_a_builtin_handler(tmp_path: Path, worker_imports: None) -> None:
    assert "text_classifier" in BUILTIN_HANDLERS
    model = _BagNet()
    with torch.no_grad():
        model.embedding.weight.copy_(torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0, 0]]))
    torch.save(model.state_dict(), tmp_path / "model.pt")
    vocab = io.BytesIO()
    torch.save({"<unk>": 0, "good": 1, "bad": 2, "meh": 3}, vocab)
    ready = serve(
        tmp_path,
        "text_classifier",
        weights=tmp_path / "model.pt",
        model_source=BAG_MODEL,
        files={"source_vocab.pt": vocab.getvalue(), **label_files({"0": "pos", "1": "neg"})},
    )
    assert type(ready.instance) is TextClassifier
    answers = run(ready, [{"body": b"good good bad"}, {"data": "bad film"}])
    assert top_labels(answers) == ["pos", "neg"]


@pytest.fixture
def ts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``importlib.import_module`` with the ``ts`` shim importable, as in a worker."""
    monkeypatch.syspath_prepend(str(SHIM_ROOT))
    yield importlib.import_module
    for name in [m for m in sys.modules if m == "ts" or m.startswith("ts.")]:
        del sys.modules[name]


def test_check_valid_pt2_backend(ts: Any, caplog: pytest.LogCaptureFixture) -> None:
    check = ts("ts.utils.util").check_valid_pt2_backend
    for backend in ("inductor", "eager", "aot_eager", "onnxrt", "openvino", "tensorrt"):
        assert check(backend) is True
    with caplog.at_level(logging.WARNING):
        assert check("Inductor") is False
        assert check("warp_drive") is False
    assert "warp_drive is not a supported backend" in caplog.text


def test_cleanup_regex_strips_tags_and_entities(ts: Any) -> None:
    regex = ts("ts.utils.util").CLEANUP_REGEX
    assert regex.sub("", "<b>bold</b> &amp; <a href='x'>link</a>") == "bold  link"
    assert regex.sub("", "&#169;&#x1f600;&nbsp;&AMP;") == "&AMP;"  # lower-case names only
    assert regex.sub("", "a < b and c > d") == "a  d"  # whatever lies between < and >
    assert regex.sub("", "<p\n>kept</p>") == "<p\n>kept"  # a tag does not span lines


def test_process_memory_metric(ts: Any, caplog: pytest.LogCaptureFixture) -> None:
    metric = ts("ts.metrics.process_memory_metric")
    statm = Path(f"/proc/{os.getpid()}/statm").read_text().split()
    rss = metric.get_cpu_usage(str(os.getpid()))
    assert abs(rss - int(statm[1]) * os.sysconf("SC_PAGE_SIZE")) < 64 * 2**20
    with caplog.at_level(logging.INFO):
        assert metric.get_cpu_usage(2**22 + 1) == 0  # above Linux's largest pid
        assert "cannot read the memory of process 4194305" in caplog.text
        caplog.clear()
        metric.check_process_mem_usage(io.StringIO(f"{os.getpid()},,1\n"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith(f"{os.getpid()}:") and int(lines[0].split(":")[1]) > 0
    assert lines[1].startswith("1:")
    assert len(lines) == 2


def test_archive_accepts_text_classifier(tmp_path: Path) -> None:
    spec = ArchiveSpec(model_name="t", handler="text_classifier")
    warnings = check_spec(spec, tmp_path, builtin_handlers=BUILTIN_HANDLERS)
    assert warnings == [
        "no --serialized-file or --model-file: the handler must build or fetch its model"
    ]
