"""The bundled demo model names freshly drawn shapes correctly, under concurrent load."""

from __future__ import annotations

import asyncio
import json

from examples.demo.shapes import encode, labelled_samples
from ferry_bench.load import run_closed_loop
from tests.fixtures.load import closed_loop
from tests.fixtures.server import RunningServer


def test_demo_model_labels_generated_images_under_load(main_server: RunningServer) -> None:
    samples = labelled_samples(200, seed=4242)
    payloads = [encode(image, "PNG" if i % 2 else "JPEG") for i, (_, image) in enumerate(samples)]
    result = closed_loop(main_server, "shapes", payloads, concurrency=8)
    assert result.statuses == {200: len(payloads)}
    correct = 0
    for index, _, body in result.bodies:
        scores = json.loads(body)
        assert len(scores) == 3 and 0 < sum(scores.values()) <= 1.0001
        top = max(scores, key=scores.get)
        correct += top == samples[index][0]
    assert correct / len(payloads) >= 0.95


def test_one_undecodable_image_fails_alone(main_server: RunningServer) -> None:
    _, image = labelled_samples(1, seed=1)[0]
    good = encode(image)

    async def burst() -> list[tuple[int, bytes]]:
        results = await asyncio.gather(
            *(
                run_closed_loop(
                    f"{main_server.url}/predictions/shapes",
                    [payload],
                    concurrency=1,
                    requests=1,
                    keep_bodies=True,
                )
                for payload in [good, b"not an image", good, good]
            )
        )
        return [(r.bodies[0][1], r.bodies[0][2]) for r in results]

    answers = asyncio.run(burst())
    assert [status for status, _ in answers] == [200, 400, 200, 200]
    error = json.loads(answers[1][1])
    assert error["code"] == 400 and error["type"] == "BadRequestException"
    assert "cannot decode image" in error["message"]
