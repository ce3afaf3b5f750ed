"""Built-in ``image_classifier``: JPEG/PNG in, top-k ``{label: probability}`` out.

model-config.yaml may set, under ``image_classifier:``, ``resize``, ``crop``, ``mean``,
``std``, ``topk`` and ``gpu_decode`` (decode JPEGs on the worker's GPU when torchvision is
importable; see ``gpu_decode.py``); ``ferry.config.sections`` defines and checks them. An
image that cannot be decoded fails alone; the rest of its batch is still classified.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from PIL import Image

from ferry.config.sections import ImageClassifierConfig, handler_section, read_section
from ferry.errors import InvalidInput
from ferry.handlers.builtin.base_handler import BaseHandler, timed_stage
from ferry.handlers.builtin.gpu_decode import (
    JpegDecoder,
    decode_each,
    is_jpeg,
    load_gpu_jpeg_decoder,
)
from ferry.handlers.builtin.insights import IntegratedGradients
from ferry.handlers.builtin.optimize import GraphedModel, prepare_input
from ferry.handlers.builtin.vision import DefaultImageProcessing, ImageTransform, image_bytes
from ferry.handlers.contract.context import Context
from ferry.handlers.torchserve.ts_utils import map_class_to_label


class VisionHandler(BaseHandler):
    """Decodes a batch of images into one tensor, as TorchServe's ``VisionHandler``.

    ``image_processing`` is the transform from a PIL image to a tensor (by default
    ``DefaultImageProcessing``, sized by the model-config.yaml section). A subclass may
    replace it, as a class attribute or in ``initialize``: each image is then opened as
    stored (no mode forced), checked against the image limits, given to
    ``image_processing``, and the results are stacked. While it is the default, Ferry
    decodes its own way, to the same input: uint8 upload normalised on the device, optional
    GPU decoding, and JPEG draft mode if ``draft_decode`` asks for it (then not the same).
    """

    image_processing: Callable[[Image.Image], torch.Tensor] = DefaultImageProcessing()
    config_section = "image_classifier"
    """The model-config.yaml section holding resize / crop / mean / std."""

    # Defaults for a subclass whose ``__init__`` skips ``super().__init__()``.
    transform = ImageTransform()
    jpeg_decoder: JpegDecoder | None = None
    _builtin_processing = DefaultImageProcessing()
    _insights: IntegratedGradients | None = None
    _local_lock = threading.Lock()

    def __init__(self) -> None:
        super().__init__()
        self.transform = ImageTransform()
        self.jpeg_decoder = None
        self._builtin_processing = DefaultImageProcessing()
        self._local = threading.local()  # preprocess may run in several pipeline threads
        self._insights = None

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        self._thread_state()
        section = handler_section(context.model_yaml_config, self.config_section)
        self.transform = ImageTransform(
            section.resize,
            section.crop,
            section.mean,
            section.std,
            context.image_limits,
            draft=section.draft_decode,
        )
        if self._uses_builtin_processing():
            self._builtin_processing = DefaultImageProcessing(
                section.resize, section.crop, tuple(section.mean), tuple(section.std)
            )
            self.image_processing = self._builtin_processing
        if section.gpu_decode:
            self.jpeg_decoder = load_gpu_jpeg_decoder(self._device())

    def _uses_builtin_processing(self) -> bool:
        """Whether ``image_processing`` is still Ferry's own (compared by value, so that
        a copy in a preprocess process agrees)."""
        return bool(self.image_processing == self._builtin_processing)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_local=None, jpeg_decoder=None, _insights=None)  # these stay in the worker
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def _thread_state(self) -> threading.local:
        """Per-thread state of ``preprocess`` (made here when ``__init__`` did not)."""
        state: threading.local | None = self.__dict__.get("_local")
        if state is None:
            with VisionHandler._local_lock:
                state = self.__dict__.get("_local")
                if state is None:
                    state = self._local = threading.local()
        return state

    def forget_failures(self) -> None:
        """Before a batch whose ``preprocess`` may not be this one (a subclass's): no
        failures left from the batch before, in this thread."""
        self._thread_state().failures = {}

    @property
    def failures(self) -> dict[int, Exception]:
        """Requests of the last ``preprocess`` call (in this thread) that could not be decoded."""
        failures: dict[int, Exception] = getattr(self._thread_state(), "failures", {})
        return failures

    def _decode_builtin(self, row: dict[str, Any]) -> torch.Tensor:
        """One image resized and cropped as uint8 (normalised later, on the device)."""
        return self.transform.to_uint8(self.transform.decode(image_bytes(row)))

    def _decode_for_processing(self, row: dict[str, Any]) -> torch.Tensor:
        """One image through ``image_processing``, as TorchServe's ``VisionHandler``."""
        value = row.get("data") or row.get("body")
        if isinstance(value, list):  # TorchServe takes a JSON list as the tensor itself
            return torch.tensor(value, dtype=torch.float32)
        tensor: torch.Tensor = self.image_processing(self.transform.open(image_bytes(row)))
        return tensor

    def preprocess(self, data: list[dict[str, Any]]) -> Any:
        """Stack the decodable images; remember which requests failed and why."""
        failures: dict[int, Exception] = {}
        self._thread_state().failures = failures
        # A row holding a JSON list is the tensor itself (TorchServe's rule, which KServe's
        # V2 requests rely on): such a batch goes through ``image_processing`` whole.
        has_tensors = any(isinstance(row.get("data") or row.get("body"), list) for row in data)
        builtin = self._uses_builtin_processing() and not has_tensors
        if builtin and self.jpeg_decoder is not None:
            return self._preprocess_on_device(data, failures)
        decode = self._decode_builtin if builtin else self._decode_for_processing
        tensors = []
        for index, row in enumerate(data):
            try:
                tensors.append(decode(row))
            except InvalidInput as exc:
                failures[index] = exc
        if not tensors:
            return None
        if builtin:
            # Pixels travel as uint8 (a quarter of the bytes) and are normalised on the device.
            return self.to_device(torch.stack(tensors), self.transform.normalise)
        return self.batch_images(tensors)

    def batch_images(self, tensors: list[torch.Tensor]) -> Any:
        """The model's input from the processed images: stacked, on the device."""
        return self.to_device(torch.stack(tensors))

    def _preprocess_on_device(
        self, data: list[dict[str, Any]], failures: dict[int, Exception]
    ) -> torch.Tensor | None:
        encoded: dict[int, bytes] = {}
        for index, row in enumerate(data):
            try:
                raw = image_bytes(row)
                self.transform.check(raw)  # the GPU decoder knows no limits
                encoded[index] = raw
            except InvalidInput as exc:
                failures[index] = exc
        result: torch.Tensor | None = self.device_path.on_upload_stream(
            lambda: self._decode_on_device(encoded, failures)
        )
        return result

    def _decode_on_device(
        self, encoded: dict[int, bytes], failures: dict[int, Exception]
    ) -> torch.Tensor | None:
        """JPEGs decoded, resized and cropped on the device; the rest through PIL."""
        assert self.jpeg_decoder is not None
        jpegs = {index: raw for index, raw in encoded.items() if is_jpeg(raw)}
        decoded, _ = decode_each(self.jpeg_decoder, jpegs)
        images = {i: self.transform.resize_crop_tensor(image) for i, image in decoded.items()}
        for index, raw in encoded.items():
            if index in images:
                continue
            try:
                images[index] = self._decode_builtin({"body": raw}).to(self._device())
            except InvalidInput as exc:
                failures[index] = exc
        if not images:
            return None
        return self.transform.normalise(torch.stack([images[i] for i in sorted(images)]))

    def get_insights(self, tensor_data: torch.Tensor, _: Any, target: int = 0) -> list[Any]:
        """Integrated Gradients attributions of the preprocessed images to class ``target``
        (TorchServe's explanations; needs captum)."""
        if self._insights is None:
            # Gradients need the eager model: captured CUDA graphs replay without them.
            model = self.model.model if isinstance(self.model, GraphedModel) else self.model
            self._insights = IntegratedGradients(model)
        # The model's own input: cast and laid out as the served path prepares it.
        batch, rows = prepare_input(tensor_data, self.optimizations, self._device())
        return self._insights.attribute(batch, int(target))[:rows]

    def handle(self, data: list[dict[str, Any]], context: Context) -> list[Any]:
        """BaseHandler's flow, where an image that cannot be decoded fails alone: its
        request gets the error, the others their answers."""
        self.context = context
        if self._is_describe():
            return [self.describe_handle()]
        self.forget_failures()
        if self._is_explain():
            explained: list[Any] = self.explain_handle(self.preprocess(data), data)
            return explained
        start = time.perf_counter()
        batch = timed_stage(context, "preprocess", self.preprocess, data)
        failures = self.failures
        answers: list[Any] = []
        # No image decoded: nothing to infer. Otherwise, as in TorchServe, inference and
        # postprocess run even on a None batch (a subclass's preprocess may return one).
        if batch is not None or not failures:
            output = timed_stage(context, "inference", self.inference, batch)
            answers = list(timed_stage(context, "postprocess", self.postprocess, output))
        results = _with_failures(answers, failures, len(data))
        context.metrics.add_time("HandlerTime", (time.perf_counter() - start) * 1000, None, "ms")
        return results


def _with_failures(answers: list[Any], failures: dict[int, Exception], size: int) -> list[Any]:
    """One result per request: its decoding failure, or the next answer in order. Should the
    counts not add up (a subclass's preprocess decoding other rows than its batch's), the
    first failure fails the whole batch, as it would in TorchServe."""
    if not failures:
        return answers
    if len(answers) + len(failures) != size:
        raise failures[min(failures)]
    remaining = iter(answers)
    return [failures[i] if i in failures else next(remaining) for i in range(size)]


class TopClasses:
    """The ``topk`` classes' probabilities as ``{label: p}`` per row (TorchServe's image
    classifier answer), with its ``set/get_max_result_classes``; for a handler whose
    ``mapping`` holds the labels."""

    topk = 5
    mapping: Any

    def set_max_result_classes(self, topk: int) -> None:
        self.topk = topk

    def get_max_result_classes(self) -> int:
        return self.topk

    def postprocess(self, data: torch.Tensor) -> list[dict[str, float]]:
        probabilities = torch.softmax(data.float(), dim=1)
        k = min(self.topk, probabilities.shape[1])
        top_probs, top_classes = torch.topk(probabilities, k, dim=1)
        return map_class_to_label(top_probs.tolist(), self.mapping, top_classes.tolist())


class ImageClassifier(TopClasses, VisionHandler):
    def initialize(self, context: Context) -> None:
        super().initialize(context)
        section = context.model_yaml_config.get("image_classifier")
        self.topk = read_section(ImageClassifierConfig, section, "image_classifier").topk
