"""The segmenter, detector and embedder handlers serve their example archives."""

from __future__ import annotations

import math
from pathlib import Path

from examples.build_vision_archives import build
from examples.demo.shapes import encode, labelled_samples
from tests.fixtures.server import ferry_server


def test_segmenter_detector_and_embedder(tmp_path: Path) -> None:
    store = tmp_path / "store"
    archives = build(store, size=64)
    images = [encode(image, "JPEG") for _, image in labelled_samples(3, seed=5)]
    serving = ferry_server(store, [a.name for a in archives], tmp_path)
    with serving as server, server.client() as client:
        for image in images:
            mask = client.post("/predictions/segmenter", content=image).json()
            assert len(mask) == 64 and len(mask[0]) == 64
            # TorchServe's shape: [class index, probability] per pixel
            assert {cls for row in mask for cls, _ in row} <= {0, 1, 2, 3}
            assert all(0 < prob <= 1 for row in mask for _, prob in row)

            detections = client.post("/predictions/detector", content=image).json()
            assert isinstance(detections, list)
            for detection in detections:
                score = detection.pop("score")
                ((label, box),) = detection.items()
                assert label in {"circle", "square", "star"} and 0.3 <= score <= 1
                assert len(box) == 4 and box[0] <= box[2] and box[1] <= box[3]

            vector = client.post("/predictions/embedder", content=image).json()
            assert len(vector) == 32
            assert math.isclose(math.sqrt(sum(v * v for v in vector)), 1.0, rel_tol=1e-4)
        bad = client.post("/predictions/detector", content=b"not an image")
        assert bad.status_code == 400
