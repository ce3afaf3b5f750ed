"""The sections of model-config.yaml that Ferry owns, typed and validated::

    micro_batching:              # the stage pipeline (TorchServe's keys, plus pool)
      micro_batch_size: 4
      parallelism: {preprocess: 2, inference: 1, postprocess: 1}
      pool: thread               # or process
    optimization:                # precision, compile, CUDA graphs ... (handlers/optimize.py)
      precision: bf16
    image_classifier:            # also image_segmenter, object_detector, image_embedder
      resize: 256
      topk: 5

The frontend parses them when an archive is opened, so a typo answers 400 at registration
and stops start-up; the worker, which receives the raw document, reads them with these same
functions. Unknown keys inside these sections are errors; unknown top-level keys are not
(they belong to handlers and to TorchServe). Pure code: no torch, no handler imports.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from ferry.errors import ModelConfigError

Reader = Callable[[Any, str], Any]
"""Parses one value; the ``str`` names where it sits (``optimization: precision``)."""


def _as_int(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ModelConfigError(f"{where}: expected an integer, got {value!r}")


def _as_float(value: Any, where: str) -> float:
    number = None
    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            number = float(value.strip())
    except (ValueError, OverflowError):
        pass
    if number is None:
        raise ModelConfigError(f"{where}: expected a number, got {value!r}")
    if not math.isfinite(number):
        raise ModelConfigError(f"{where}: expected a finite number, got {value!r}")
    return number


def integer(minimum: int) -> Reader:
    def read(value: Any, where: str) -> int:
        number = _as_int(value, where)
        if number < minimum:
            raise ModelConfigError(f"{where}: must be at least {minimum}, got {number}")
        return number

    return read


def number(low: float, high: float = math.inf, *, above_low: bool = False) -> Reader:
    """A finite number in ``[low, high]`` (``(low, high]`` with ``above_low``)."""

    def read(value: Any, where: str) -> float:
        result = _as_float(value, where)
        if result < low or (above_low and result == low):
            bound = "greater than" if above_low else "at least"
            raise ModelConfigError(f"{where}: must be {bound} {low:g}, got {result:g}")
        if result > high:
            raise ModelConfigError(f"{where}: must be at most {high:g}, got {result:g}")
        return result

    return read


def boolean(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ModelConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def choice(*options: str) -> Reader:
    """One of ``options``, in any case."""

    def read(value: Any, where: str) -> str:
        if isinstance(value, str) and value.strip().lower() in options:
            return value.strip().lower()
        raise ModelConfigError(f"{where}: expected one of {', '.join(options)}, got {value!r}")

    return read


GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def group_name(value: Any, where: str) -> str:
    """A process group's name: letters, digits, ``_ . -``, at most 64 characters."""
    if not isinstance(value, str) or not GROUP_NAME.fullmatch(value):
        raise ModelConfigError(
            f"{where}: expected a name of letters, digits, '_', '.' and '-' (at most 64), "
            f"got {value!r}"
        )
    return value


def integers(minimum: int, *, scalar: bool = False) -> Reader:
    """A list of integers (or, with ``scalar``, one integer standing for a list of one)."""
    item = integer(minimum)

    def read(value: Any, where: str) -> tuple[int, ...]:
        if scalar and not isinstance(value, list):
            return (item(value, where),)
        if not isinstance(value, list):
            raise ModelConfigError(f"{where}: expected a list of integers, got {value!r}")
        return tuple(item(v, f"{where}[{i}]") for i, v in enumerate(value))

    return read


def channels(*, positive: bool) -> Reader:
    """Per-channel numbers: one for all channels, or three (R, G, B)."""
    item = number(0.0, above_low=True) if positive else number(-math.inf)

    def read(value: Any, where: str) -> tuple[float, ...]:
        if not isinstance(value, list) or len(value) not in (1, 3):
            raise ModelConfigError(f"{where}: expected a list of 1 or 3 numbers, got {value!r}")
        return tuple(item(v, f"{where}[{i}]") for i, v in enumerate(value))

    return read


def mapping(value: Any, where: str) -> dict[str, Any]:
    """A section's mapping; absent or null is empty."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ModelConfigError(f"{where}: expected a mapping, got {value!r}")
    return value


def refuse_unknown(section: Mapping[Any, Any], valid: Iterable[str], where: str) -> None:
    names = sorted(valid)
    for key in section:
        if key not in names:
            raise ModelConfigError(
                f"{where}: unknown key {key!r}; expected one of {', '.join(names)}"
            )


def _get(section: Mapping[str, Any], key: str, read: Reader, default: Any, where: str) -> Any:
    return read(section[key], f"{where}: {key}") if key in section else default


# --- micro_batching ----------------------------------------------------------------------

POOLS = ("thread", "process")


@dataclass(frozen=True)
class MicroBatchingConfig:
    """``micro_batching:``: split each batch into micro-batches whose stages overlap."""

    micro_batch_size: int = 1
    preprocess: int = 1
    """``parallelism.preprocess``: micro-batches prepared at once (threads or processes)."""
    inference: int = 1
    """``parallelism.inference``: accepted as TorchServe writes it; Ferry runs one at a time."""
    postprocess: int = 1
    """``parallelism.postprocess``: threads finishing micro-batches."""
    pool: str = "thread"
    """Ferry's key: ``process`` runs preprocess in processes (GIL-bound preprocessing)."""


def parse_micro_batching(value: Any, where: str = "micro_batching") -> MicroBatchingConfig | None:
    """The section, or None when it is absent or empty (no stage pipeline)."""
    if not value:
        return None
    section = mapping(value, where)
    refuse_unknown(section, ("micro_batch_size", "parallelism", "pool"), where)
    parallel_where = f"{where}: parallelism"
    parallelism = mapping(section.get("parallelism"), parallel_where)
    refuse_unknown(parallelism, ("preprocess", "inference", "postprocess"), parallel_where)
    one_or_more = integer(1)
    return MicroBatchingConfig(
        micro_batch_size=_get(section, "micro_batch_size", one_or_more, 1, where),
        preprocess=_get(parallelism, "preprocess", one_or_more, 1, parallel_where),
        inference=_get(parallelism, "inference", one_or_more, 1, parallel_where),
        postprocess=_get(parallelism, "postprocess", one_or_more, 1, parallel_where),
        pool=_get(section, "pool", choice(*POOLS), "thread", where),
    )


# --- optimization ------------------------------------------------------------------------

PRECISIONS = ("fp32", "fp16", "bf16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
KEEPERS = ("off", "gpu", "all")
"""``weights_keeper``: none; GPU workers; every worker (CPU ones in shared memory)."""
_OPTIMIZATION_KEYS = (
    "share_weights",
    "weights_keeper",
    "precision",
    "channels_last",
    "compile",
    "torchscript_freeze",
    "batch_buckets",
    "cuda_graphs",
    "warmup",
)


@dataclass(frozen=True)
class OptimizationConfig:
    """``optimization:``: how the model is prepared and fed (see ``handlers/optimize.py``)."""

    precision: str = "fp32"
    """fp32, fp16 or bf16: weights and floating-point inputs are cast."""
    channels_last: bool = False
    compile_mode: str | None = None
    """``compile:`` as a ``torch.compile`` mode (``true`` is ``default``); None: off."""
    torchscript_freeze: bool = False
    batch_buckets: tuple[int, ...] = ()
    """Sorted; each batch is padded to the next bucket."""
    warmup_shape: tuple[int, ...] = ()
    """``warmup.input_shape``: one input without the batch dimension."""
    warmup_batch_sizes: tuple[int, ...] = ()
    """``warmup.batch_sizes``."""
    cuda_graphs: bool = False
    share_weights: bool = True
    """A CPU model's workers map one copy of its weights
    (``ferry.handlers.builtin.shared_weights``); false: each loads its own."""
    weights_keeper: str = "off"
    """``gpu``: a model version's workers on one GPU import one copy of its weights from a
    keeper process (``ferry.worker.weights_keeper``); ``all``: CPU workers too, in shared
    memory; ``off`` (or false): each GPU worker loads its own. Needs ``share_weights``."""

    @property
    def graph_batch_sizes(self) -> tuple[int, ...]:
        """The batch sizes CUDA graphs are captured for."""
        return self.batch_buckets or self.warmup_batch_sizes


def _compile_mode(value: Any, where: str) -> str | None:
    if value is None or value is False:
        return None
    if value is True:
        return "default"
    if isinstance(value, str) and value in COMPILE_MODES:
        return value
    raise ModelConfigError(
        f"{where}: expected true, false or one of {', '.join(COMPILE_MODES)}, got {value!r}"
    )


def _keeper(value: Any, where: str) -> str:
    return "off" if value is False else choice(*KEEPERS)(value, where)


def parse_optimization(value: Any, where: str = "optimization") -> OptimizationConfig:
    section = mapping(value, where)
    refuse_unknown(section, _OPTIMIZATION_KEYS, where)
    warmup_where = f"{where}: warmup"
    warmup = mapping(section.get("warmup"), warmup_where)
    refuse_unknown(warmup, ("input_shape", "batch_sizes"), warmup_where)
    options = OptimizationConfig(
        precision=_get(section, "precision", choice(*PRECISIONS), "fp32", where),
        channels_last=_get(section, "channels_last", boolean, False, where),
        compile_mode=_get(section, "compile", _compile_mode, None, where),
        torchscript_freeze=_get(section, "torchscript_freeze", boolean, False, where),
        batch_buckets=tuple(sorted(_get(section, "batch_buckets", integers(1), (), where))),
        warmup_shape=_get(warmup, "input_shape", integers(1), (), warmup_where),
        warmup_batch_sizes=_get(warmup, "batch_sizes", integers(1), (), warmup_where),
        cuda_graphs=_get(section, "cuda_graphs", boolean, False, where),
        share_weights=_get(section, "share_weights", boolean, True, where),
        weights_keeper=_get(section, "weights_keeper", _keeper, "off", where),
    )
    if options.cuda_graphs:
        if not options.warmup_shape or not options.graph_batch_sizes:
            raise ModelConfigError(
                f"{where}: cuda_graphs needs warmup.input_shape and batch_buckets "
                "(or warmup.batch_sizes): graphs are captured for fixed shapes"
            )
        if options.compile_mode is not None:
            raise ModelConfigError(
                f"{where}: cuda_graphs with compile: use compile: reduce-overhead instead"
            )
    return options


# --- the built-in vision handlers' sections ----------------------------------------------

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _key(default: Any, read: Reader) -> Any:
    """A section key: its default and the reader that parses it."""
    return field(default=default, metadata={"read": read})


@dataclass(frozen=True)
class ImageTransformConfig:
    """The keys every built-in vision handler reads from its own section."""

    resize: int = _key(256, integer(1))
    """Shorter side after resizing, in pixels."""
    crop: int = _key(224, integer(1))
    """Side of the center crop, at most ``resize``."""
    mean: tuple[float, ...] = _key(IMAGENET_MEAN, channels(positive=False))
    std: tuple[float, ...] = _key(IMAGENET_STD, channels(positive=True))
    gpu_decode: bool = _key(False, boolean)
    """Decode JPEGs on the worker's GPU (needs torchvision)."""
    draft_decode: bool = _key(False, boolean)
    """Decode a large JPEG at a fraction of its size (PIL's draft mode) before resizing:
    faster, but the model's input is no longer TorchServe's (docs/handlers.md)."""

    def check(self, where: str) -> None:
        if self.crop > self.resize:
            raise ModelConfigError(
                f"{where}: crop {self.crop} is larger than resize {self.resize} "
                "(the crop is cut from the resized image)"
            )


@dataclass(frozen=True)
class ImageClassifierConfig(ImageTransformConfig):
    topk: int = _key(5, integer(1))
    """Classes in each answer."""


@dataclass(frozen=True)
class ImageSegmenterConfig(ImageTransformConfig):
    pass


@dataclass(frozen=True)
class ObjectDetectorConfig(ImageTransformConfig):
    score_threshold: float = _key(0.5, number(0.0, 1.0))
    iou_threshold: float = _key(0.5, number(0.0, 1.0))
    """Boxes of one class overlapping more than this are suppressed (NMS)."""


@dataclass(frozen=True)
class ImageEmbedderConfig(ImageTransformConfig):
    normalize: bool = _key(True, boolean)
    """L2-normalise each embedding."""


HANDLER_SECTIONS: dict[str, type[ImageTransformConfig]] = {
    "image_classifier": ImageClassifierConfig,
    "image_segmenter": ImageSegmenterConfig,
    "object_detector": ObjectDetectorConfig,
    "image_embedder": ImageEmbedderConfig,
}
"""The built-in handlers' sections, by name: Ferry owns their keys."""

SectionT = TypeVar("SectionT", bound=ImageTransformConfig)


def read_section(kind: type[SectionT], value: Any, where: str, *, strict: bool = True) -> SectionT:
    """``value`` as a ``kind`` section; unknown keys are errors when ``strict``."""
    section = mapping(value, where)
    known = {f.name: f for f in fields(kind)}
    if strict:
        refuse_unknown(section, known, where)
    values = {
        key: known[key].metadata["read"](item, f"{where}: {key}")
        for key, item in section.items()
        if key in known
    }
    config = kind(**values)
    config.check(where)
    return config


def handler_section(document: Mapping[str, Any], name: str) -> ImageTransformConfig:
    """Section ``name`` of a model-config document for a vision handler. A built-in
    section is read strictly; another name (a subclass's own section) is read for the
    shared keys only, and may hold keys of its own."""
    kind = HANDLER_SECTIONS.get(name)
    if kind is None:
        return read_section(ImageTransformConfig, document.get(name), name, strict=False)
    return read_section(kind, document.get(name), name)


def torchserve_compile_options(config: dict[str, Any]) -> dict[str, Any] | None:
    """``torch.compile``'s options from model-config.yaml's ``pt2`` as TorchServe reads it: a
    backend name, ``{compile: {enable: true, backend: ..., mode: ...}}``, or (TorchServe's
    older form) a mapping of the options themselves; None when it asks for no compiling."""
    pt2 = config.get("pt2")
    if isinstance(pt2, str):
        return {"backend": pt2}
    if not isinstance(pt2, dict) or "export" in pt2:
        return None
    section = pt2.get("compile", pt2)
    if not isinstance(section, dict) or ("compile" in pt2 and not section.get("enable")):
        return None
    return {key: value for key, value in section.items() if key != "enable"}


def shares_weights(model_yaml_config: dict[str, Any]) -> bool:
    """``optimization: share_weights`` (true unless set false), read from the raw
    model-config.yaml a worker is handed (validated at registration)."""
    optimization = model_yaml_config.get("optimization")
    if isinstance(optimization, dict):
        return optimization.get("share_weights") is not False
    return True


def keeps_weights(model_yaml_config: dict[str, Any], gpu_id: int | None) -> bool:
    """Whether a worker on ``gpu_id`` (None: the CPU) takes its weights from a weights
    keeper: ``optimization: weights_keeper`` says so for its device, and its weights are
    shared at all (``share_weights``)."""
    optimization = model_yaml_config.get("optimization")
    if not isinstance(optimization, dict) or optimization.get("share_weights") is False:
        return False
    mode = optimization.get("weights_keeper")
    mode = mode.strip().lower() if isinstance(mode, str) else "off"
    return mode == "all" or (mode == "gpu" and gpu_id is not None)


def compiles(model_yaml_config: dict[str, Any]) -> bool:
    """Whether the model is compiled as it loads: ``optimization: compile`` or
    TorchServe's ``pt2`` (``ferry.config.sections.torchserve_compile_options``)."""
    optimization = model_yaml_config.get("optimization")
    if isinstance(optimization, dict) and optimization.get("compile") not in (None, False):
        return True
    return torchserve_compile_options(model_yaml_config) is not None
