"""GPU options on a machine without a GPU: the worker says why each one is off, runs on
CPU, and answers exactly as the plain model does."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
import yaml

from examples.demo.shapes import encode, labelled_samples
from tests.fixtures.models import DEMO_STORE
from tests.fixtures.server import ferry_server

DEMO_ARCHIVE = DEMO_STORE / "shapes.mar"


def _gpu_variant(store: Path) -> str:
    folder = store / "shapes_gpu"
    with zipfile.ZipFile(DEMO_ARCHIVE) as archive:
        archive.extractall(folder)
    config = yaml.safe_load((folder / "model-config.yaml").read_text())
    config["deviceType"] = "gpu"
    config["image_classifier"]["gpu_decode"] = True
    config["optimization"] = {
        "cuda_graphs": True,
        "batch_buckets": [1, 4, 8],
        "warmup": {"input_shape": [3, 64, 64]},
    }
    config["micro_batching"] = {"micro_batch_size": 4, "parallelism": {"preprocess": 2}}
    (folder / "model-config.yaml").write_text(yaml.safe_dump(config))
    return folder.name


def test_gpu_options_fall_back_to_cpu_with_the_same_answers(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(DEMO_ARCHIVE, store)
    models = ["shapes=shapes.mar", f"shapes_gpu={_gpu_variant(store)}"]
    images = [encode(image, "JPEG") for _, image in labelled_samples(6, seed=11)]
    with ferry_server(store, models, tmp_path) as server, server.client() as client:
        for image in images:
            plain = client.post("/predictions/shapes", content=image)
            gpu_options = client.post("/predictions/shapes_gpu", content=image)
            assert plain.status_code == gpu_options.status_code == 200
            assert list(plain.json()) == list(gpu_options.json())
            for label, probability in plain.json().items():
                assert gpu_options.json()[label] == pytest.approx(probability, abs=1e-5)
        bad = client.post("/predictions/shapes_gpu", content=b"\xff\xd8\xff not a jpeg")
        assert bad.status_code == 400
        log = server.log()
    assert "asks for a GPU but none is usable" in log
    assert "gpu_decode needs a GPU" in log
    assert "cuda_graphs needs a GPU" in log
