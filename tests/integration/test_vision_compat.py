"""TorchServe's MNIST tutorial handler (one-channel ``image_processing``) serves through Ferry."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.server import ferry_server
from tests.fixtures.vision_compat import digit_png, mnist_archive


def test_mnist_style_handler_answers_a_one_channel_png(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    archive = mnist_archive(store)
    with ferry_server(store, [archive], tmp_path) as server, server.client() as client:
        for seed in range(3):
            response = client.post("/predictions/mnist", content=digit_png(seed))
            assert response.status_code == 200, response.text
            assert response.json() in range(10)
        assert client.post("/predictions/mnist", content=b"not a png").status_code == 400
