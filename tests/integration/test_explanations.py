"""TorchServe's explanations API: ``/explanations/{model}`` runs the handler's
``explain_handle``; the built-in image classifier answers Captum's Integrated Gradients."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.models import DEMO_STORE, ts_style_archive
from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer, ferry_server

SAMPLES = Path(__file__).parents[2] / "examples" / "demo" / "samples"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("explanations")
    store = tmp / "store"
    store.mkdir()
    shutil.copy(DEMO_STORE / "shapes.mar", store / "shapes.mar")
    ts_style_archive(store)
    with ferry_server(store, ["shapes=shapes.mar", "doubler=doubler.mar"], tmp) as running:
        yield running


def _shape(nested: object) -> list[int]:
    dims = []
    while isinstance(nested, list):
        dims.append(len(nested))
        nested = nested[0]
    return dims


def test_the_image_classifier_explains_with_integrated_gradients(server: RunningServer) -> None:
    image = (SAMPLES / "star.png").read_bytes()
    with server.client() as client:
        explained = client.post("/explanations/shapes", content=image)
        versioned = client.post("/explanations/shapes/1.0", content=image)
        predicted = client.post("/predictions/shapes", content=image)
    assert explained.status_code == 200, explained.text
    attributions = explained.json()
    channels, height, width = _shape(attributions)
    assert channels == 3 and height == width and height > 1  # one attribution per pixel
    assert any(value != 0 for row in attributions[0] for value in row)
    assert versioned.json() == attributions  # deterministic for the same image
    assert "star" in predicted.json()  # predictions are unaffected


def test_a_handler_without_get_insights_answers_501(server: RunningServer) -> None:
    with server.client() as client:
        response = client.post("/explanations/doubler", content=b"[1, 2]")
    assert "does not explain its predictions" in assert_error(
        response, 501, "InternalServerException"
    )


def test_an_unknown_model_is_404(server: RunningServer) -> None:
    with server.client() as client:
        assert_error(client.post("/explanations/nope", content=b"x"), 404, "ModelNotFoundException")
