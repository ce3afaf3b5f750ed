"""model-config.yaml parsed once, typed and validated: the sections Ferry owns, their typos,
non-finite numbers, and documents too large or expanded by aliases."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ferry.config.model_config import (
    ModelConfig,
    apply_overrides,
    load_model_config,
    parse_model_config,
)
from ferry.config.sections import (
    PRECISIONS,
    ImageClassifierConfig,
    ImageEmbedderConfig,
    ImageSegmenterConfig,
    ImageTransformConfig,
    MicroBatchingConfig,
    ObjectDetectorConfig,
    OptimizationConfig,
    handler_section,
)
from ferry.errors import ArchiveError, ConfigError, ModelConfigError
from ferry.handlers.builtin.optimize import DTYPES, Optimizations
from ferry.scheduling.runner_settings import sequence_settings
from ferry.scheduling.sequences import SequenceSettings
from ferry.store.archive import open_model
from ferry.store.writer import ArchiveSpec, check_spec
from ferry.worker.pipeline import PipelineSettings
from tests.fixtures.models import HANDLERS, digest_archive

FULL = """
minWorkers: 2
responseTimeout: 30
jobQueueSize: 10            # TorchServe keys Ferry does not read are left alone
handler: {scale: 3}
micro_batching:
  micro_batch_size: 4
  parallelism: {preprocess: 3, inference: 1, postprocess: 2}
  pool: Process
optimization:
  precision: BF16
  channels_last: true
  compile: true
  batch_buckets: [8, 1, 4]
  warmup: {input_shape: [3, 224, 224], batch_sizes: [1, 8]}
image_classifier: {resize: 64, crop: 56, mean: [0.5], std: [0.5, 0.5, 0.5], topk: 3}
object_detector: {score_threshold: 0.25, iou_threshold: 0.7, gpu_decode: true}
image_embedder: {normalize: false}
image_segmenter: {resize: 520, crop: 480}
"""


def _load(tmp_path: Path, text: str) -> ModelConfig:
    path = tmp_path / "model-config.yaml"
    path.write_text(text)
    return load_model_config(path)


def test_every_section_parses_to_typed_fields(tmp_path: Path) -> None:
    config = _load(tmp_path, FULL)
    assert config.min_workers == 2 and config.response_timeout == 30
    assert config.micro_batching == MicroBatchingConfig(4, 3, 1, 2, "process")
    assert config.optimization == OptimizationConfig(
        precision="bf16",
        channels_last=True,
        compile_mode="default",
        batch_buckets=(1, 4, 8),
        warmup_shape=(3, 224, 224),
        warmup_batch_sizes=(1, 8),
    )
    sections = config.handler_sections
    assert sections["image_classifier"] == ImageClassifierConfig(
        resize=64, crop=56, mean=(0.5,), std=(0.5, 0.5, 0.5), topk=3
    )
    assert sections["object_detector"] == ObjectDetectorConfig(
        score_threshold=0.25, iou_threshold=0.7, gpu_decode=True
    )
    assert sections["image_embedder"] == ImageEmbedderConfig(normalize=False)
    assert sections["image_segmenter"] == ImageSegmenterConfig(resize=520, crop=480)
    assert config.raw["handler"] == {"scale": 3} and config.raw["jobQueueSize"] == 10


def test_deadline_action_is_read() -> None:
    config = parse_model_config({"deadlineAction": "delay"}, source="t")
    assert config.deadline_action == "delay"
    assert parse_model_config({}, source="t").deadline_action is None


def test_sequence_batching_keys_become_the_sequence_limits() -> None:
    document = {
        "sequenceBatching": True,
        "sequenceMaxIdleMSec": 5000,
        "sequenceTimeoutMSec": 60000,
        "maxNumSequence": 4,
        "maxSequenceJobQueueSize": 10,
        "batchSize": 4,
        "maxWorkers": 2,
    }
    config = parse_model_config(document, source="t")
    # TorchServe's floor for maxNumSequence: batchSize times maxWorkers.
    assert sequence_settings(config, workers=1) == SequenceSettings(
        max_sequences=8, queue_size=10, max_idle=5.0, timeout=60.0
    )
    defaults = parse_model_config({"sequenceBatching": True, "sequenceMaxIdleMSec": 10}, source="t")
    assert sequence_settings(defaults, workers=3) == SequenceSettings(3, 1, 0.01, None)
    assert sequence_settings(parse_model_config({}, source="t"), workers=1) is None


def test_sequence_batching_without_an_idle_limit_is_refused() -> None:
    # TorchServe accepts it and then refuses every request of the model.
    with pytest.raises(ModelConfigError, match="sequenceMaxIdleMSec above 0"):
        parse_model_config({"sequenceBatching": True}, source="t")
    with pytest.raises(ModelConfigError, match="sequenceBatching: expected true or false"):
        parse_model_config({"sequenceBatching": "yes"}, source="t")


def test_absent_sections_are_defaults() -> None:
    config = parse_model_config({"micro_batching": {}, "optimization": None}, source="t")
    assert config.micro_batching is None and config.optimization == OptimizationConfig()
    assert config.handler_sections == {}
    assert handler_section({}, "image_classifier") == ImageClassifierConfig()


def test_the_worker_reads_the_sections_with_the_same_rules(tmp_path: Path) -> None:
    config = _load(tmp_path, FULL)
    settings = PipelineSettings.from_model_config(config.raw)
    assert settings == PipelineSettings(4, 3, 2, preprocess_in_processes=True)
    assert Optimizations.from_model_config(config.raw) == Optimizations.from_section(
        config.optimization
    )
    assert set(DTYPES) == set(PRECISIONS)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {"image_classifier": {"tpok": 3}},
            "image_classifier: unknown key 'tpok'; expected one of crop, draft_decode, "
            "gpu_decode, mean, resize, std, topk",
        ),
        ({"object_detector": {"score": 0.3}}, "object_detector: unknown key 'score'"),
        ({"image_embedder": {"normalise": False}}, "image_embedder: unknown key 'normalise'"),
        ({"image_segmenter": {"topk": 2}}, "image_segmenter: unknown key 'topk'"),
        ({"micro_batching": {"micro_batchsize": 2}}, "micro_batching: unknown key"),
        (
            {"micro_batching": {"parallelism": {"pre": 2}}},
            "micro_batching: parallelism: unknown key 'pre'; expected one of inference, "
            "postprocess, preprocess",
        ),
        ({"optimization": {"precison": "fp16"}}, "optimization: unknown key 'precison'"),
        ({"optimization": {"warmup": {"shape": [3]}}}, "optimization: warmup: unknown key"),
    ],
)
def test_a_typo_in_a_section_names_the_key(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelConfigError, match="^" + re.escape(f"model-config.yaml: {message}")):
        parse_model_config(document, source="model-config.yaml")


@pytest.mark.parametrize(
    ("document", "key"),
    [
        ({"image_classifier": {"topk": 0}}, "image_classifier: topk"),
        ({"image_classifier": {"topk": 2.5}}, "image_classifier: topk"),
        ({"image_classifier": {"gpu_decode": "false"}}, "image_classifier: gpu_decode"),
        ({"image_classifier": {"mean": [0.5, 0.5]}}, "image_classifier: mean"),
        ({"image_classifier": {"std": [0, 1, 1]}}, r"image_classifier: std\[0\]"),
        ({"image_classifier": {"resize": 128}}, "image_classifier: crop 224 is larger"),
        ({"image_classifier": [1]}, "image_classifier: expected a mapping"),
        ({"object_detector": {"iou_threshold": 1.5}}, "object_detector: iou_threshold"),
        ({"image_embedder": {"normalize": 1}}, "image_embedder: normalize"),
        ({"micro_batching": {"pool": "fibers"}}, "micro_batching: pool"),
        ({"micro_batching": {"parallelism": {"preprocess": 0}}}, "parallelism: preprocess"),
        ({"optimization": {"precision": 16}}, "optimization: precision"),
        ({"optimization": {"compile": "fastest"}}, "optimization: compile"),
        ({"optimization": {"cuda_graphs": "yes"}}, "optimization: cuda_graphs"),
        ({"optimization": {"batch_buckets": [4, 0]}}, r"optimization: batch_buckets\[1\]"),
        ({"optimization": {"cuda_graphs": True}}, "cuda_graphs needs warmup.input_shape"),
        ({"responseTimeout": 0}, "responseTimeout: must be greater than 0"),
        ({"deviceIds": [0, -1]}, r"deviceIds\[1\]"),
        ({"maxWorkers": True}, "maxWorkers: expected an integer"),
        ({"deadlineAction": "drop"}, "deadlineAction"),
    ],
)
def test_invalid_values_name_the_key(document: dict[str, Any], key: str) -> None:
    with pytest.raises(ModelConfigError, match=key):
        parse_model_config(document, source="model-config.yaml")


@pytest.mark.parametrize(
    "line",
    [
        "responseTimeout: .inf",
        "responseTimeout: .nan",
        "maxBatchDelay: .nan",
        "maxBatchDelay: -.inf",
        "object_detector: {score_threshold: .nan}",
        "image_classifier: {mean: [.nan, 0.5, 0.5]}",
    ],
)
def test_non_finite_numbers_are_refused(tmp_path: Path, line: str) -> None:
    key = line.split(":")[0]
    with pytest.raises(ModelConfigError, match=f"{key}.*finite"):
        _load(tmp_path, line + "\n")


def _alias_bomb(levels: int = 9) -> str:
    """The "billion laughs": each level lists the one before nine times."""
    lines = ['l0: &l0 "lol"']
    for n in range(1, levels):
        lines.append(f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


def test_alias_bombs_and_huge_documents_are_refused(tmp_path: Path) -> None:
    bomb = _alias_bomb()
    assert len(bomb) < 1024  # written out (as it travels to a worker): 9**8 "lol"s, 300 MB
    with pytest.raises(ModelConfigError, match="aliases expand the document beyond 1 MiB"):
        _load(tmp_path, bomb)
    with pytest.raises(ModelConfigError, match="aliases"):
        _load(tmp_path, "loop: &loop [*loop]\n")
    with pytest.raises(ModelConfigError, match="at most 1 MiB"):
        _load(tmp_path, "handler: {blob: '" + "x" * (1 << 20) + "'}\n")
    small = _load(tmp_path, "handler: &h {scale: 2}\nother: *h\n")  # a few aliases are fine
    assert small.raw["other"] == {"scale": 2}


def test_only_plain_data_is_accepted(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="only strings, numbers"):
        _load(tmp_path, "handler: {released: 2024-01-01}\n")
    with pytest.raises(ModelConfigError, match="expected a mapping at the top level"):
        _load(tmp_path, "- a list\n")


def test_per_model_overrides_go_through_the_same_rules() -> None:
    base = parse_model_config({"batchSize": 2, "optimization": {"precision": "fp16"}}, source="t")
    config = apply_overrides(base, {"batchSize": 8, "marName": "m.mar"}, source="models[m][1]")
    assert config.batch_size == 8 and config.optimization.precision == "fp16"
    with pytest.raises(ModelConfigError, match=r"models\[m\]\[1\]: responseTimeout"):
        apply_overrides(base, {"responseTimeout": float("nan")}, source="models[m][1]")


@pytest.mark.parametrize(
    ("document", "sets"),
    [
        ({"minWorkers": 2, "maxWorkers": 2}, True),
        ({"minWorkers": 1, "maxWorkers": 4}, True),
        ({"minWorkers": 2}, False),  # TorchServe needs maxWorkers too
        ({"minWorkers": 3, "maxWorkers": 2}, False),
        ({"minWorkers": 0, "maxWorkers": 2}, False),
        ({}, False),
    ],
)
def test_the_archive_sets_its_workers_by_torchserves_rule(
    document: dict[str, int], sets: bool
) -> None:
    assert parse_model_config(document, source="t").sets_workers is sets


def test_the_models_json_does_not_override_workers_the_archive_sets() -> None:
    """TorchServe's ModelServer: an archive's valid minWorkers/maxWorkers pair wins over
    config.properties' models JSON; its other keys still win over the archive's."""
    archive = parse_model_config({"minWorkers": 2, "maxWorkers": 2, "batchSize": 1}, source="t")
    overrides = {"minWorkers": 1, "maxWorkers": 1, "batchSize": 4}
    config = apply_overrides(archive, overrides, source="models[m][1]")
    assert (config.min_workers, config.max_workers, config.batch_size) == (2, 2, 4)
    lone = parse_model_config({"minWorkers": 2}, source="t")
    config = apply_overrides(lone, overrides, source="models[m][1]")
    assert (config.min_workers, config.max_workers) == (1, 1)


def test_a_misspelt_key_in_the_models_json_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 51: config.properties' models JSON dropped ``batchSzie`` in silence."""
    base = parse_model_config({}, source="t")
    overrides = {"batchSzie": 4, "marName": "m.mar", "defaultVersion": True}
    with caplog.at_level("WARNING", logger="ferry.config"):
        config = apply_overrides(base, overrides, source="models[m][1.0]")
    assert config.batch_size is None
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "models[m][1.0]: unknown top-level key 'batchSzie'" in warned[0]
    assert "did you mean 'batchSize'" in warned[0]


def test_a_subclass_section_is_read_for_the_shared_keys_only() -> None:
    section = handler_section({"my_vision": {"resize": 32, "crop": 32, "extra": 1}}, "my_vision")
    assert section == ImageTransformConfig(resize=32, crop=32)
    with pytest.raises(ModelConfigError, match="my_vision: resize"):
        handler_section({"my_vision": {"resize": "big"}}, "my_vision")


def test_opening_an_archive_validates_its_config(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    digest_archive(store, "typo", image_classifier={"tpok": 3})
    with pytest.raises(
        ModelConfigError, match=r"typo: model-config\.yaml: image_classifier: unknown key 'tpok'"
    ) as caught:
        open_model(store, "typo.mar", tmp_path)
    assert isinstance(caught.value, ArchiveError) and isinstance(caught.value, ConfigError)
    digest_archive(store, "fine", image_classifier={"topk": 3})
    opened = open_model(store, "fine.mar", tmp_path)
    assert opened.config.handler_sections["image_classifier"] == ImageClassifierConfig(topk=3)


def test_worker_recycling_keys() -> None:
    config = parse_model_config(
        {"maxRequestsPerWorker": 1000, "maxWorkerMemoryMB": 4096}, source="m.yaml"
    )
    assert config.max_requests_per_worker == 1000
    assert config.max_worker_memory_mb == 4096
    with pytest.raises(ModelConfigError, match="maxRequestsPerWorker: must be at least 1"):
        parse_model_config({"maxRequestsPerWorker": 0}, source="m.yaml")


# --- misspelt top-level keys (issue 51) ---------------------------------------------------


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("batchSzie", "batchSize"),
        ("BatchSize", "batchSize"),  # TorchServe's own llama2 example has this one
        ("maxBatchDelya", "maxBatchDelay"),
        ("minWorker", "minWorkers"),
        ("image_clasifier", "image_classifier"),
        ("parallelTyp", "parallelType"),  # a TorchServe key Ferry does not read
    ],
)
def test_a_top_level_key_close_to_a_known_one_is_warned_naming_it(key: str, meant: str) -> None:
    config = parse_model_config({key: 4, "maxBatchDelay": 5}, source="model-config.yaml")
    assert config.batch_size is None and config.raw[key] == 4  # still the handler's
    assert config.warnings == (
        f"model-config.yaml: unknown top-level key {key!r} (did you mean {meant!r}?); "
        "Ferry ignores it (only the handler sees it)",
    )


@pytest.mark.parametrize(
    "document",
    [
        {"labels_file": "index_to_name.json", "my_handler": {"threshold": 0.5}, "handler": {}},
        {"parallelType": "pp", "torchrun": {"nproc-per-node": 2}, "pt2": "inductor"},
        {"batchSize": 4, "image_classifier": {"topk": 3}, 7: "a key YAML reads as a number"},
    ],
)
def test_known_and_far_off_handler_keys_pass_silently(document: dict[Any, Any]) -> None:
    assert parse_model_config(document, source="model-config.yaml").warnings == ()


def test_opening_an_archive_logs_a_misspelt_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    digest_archive(store, "typo", batchSzie=4)
    with caplog.at_level("WARNING", logger="ferry.store"):
        opened = open_model(store, "typo.mar", tmp_path)
    assert opened.config.batch_size is None
    assert (
        "model typo: model-config.yaml: unknown top-level key 'batchSzie' "
        "(did you mean 'batchSize'?)" in caplog.text
    )


def test_ferry_archive_checks_warn_of_a_misspelt_key(tmp_path: Path) -> None:
    config = tmp_path / "model-config.yaml"
    config.write_text("batchSzie: 4\nlabels_file: x.json\n")
    spec = ArchiveSpec(
        model_name="m", handler=str(HANDLERS / "digest_handler.py"), config_file=config
    )
    warnings = check_spec(spec, tmp_path / "store")
    assert any(
        "unknown top-level key 'batchSzie' (did you mean 'batchSize'?)" in w for w in warnings
    )
    assert not any("labels_file" in w for w in warnings)
