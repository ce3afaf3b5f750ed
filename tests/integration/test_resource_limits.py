"""Resource limits through real servers: image bombs and formats the vision handlers refuse,
unpacked archives freed on unregistering, the server-wide worker cap."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from tests.fixtures.cli import run_ferry, serve_args
from tests.fixtures.handler_inputs import bomb_png
from tests.fixtures.models import digest_archive
from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer, ferry_server


def test_an_image_bomb_is_refused_naming_the_limit(main_server: RunningServer) -> None:
    bomb = bomb_png(12000, 12000)  # 17 KB; 144 megapixels decoded
    with main_server.client() as client:
        response = client.post("/predictions/shapes", content=bomb)
        message = assert_error(response, 400, "BadRequestException")
        assert message == (
            "image of 12000x12000 = 144000000 pixels exceeds the limit of 40000000 "
            "(limit_max_image_pixels)"
        )


def test_an_image_format_outside_the_list_is_refused(main_server: RunningServer) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 20, 20)).save(buffer, format="GIF")
    with main_server.client() as client:
        response = client.post("/predictions/shapes", content=buffer.getvalue())
        message = assert_error(response, 400, "BadRequestException")
        assert message == "image format GIF is not allowed (allowed_image_formats: JPEG, PNG)"


@pytest.fixture(scope="module")
def tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder of the ``limited`` server: where it unpacks archives."""
    return tmp_path_factory.mktemp("server-tmpdir")


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, tmpdir: Path) -> Iterator[RunningServer]:
    """Model API on, no model at start, at most 2 workers in all."""
    tmp = tmp_path_factory.mktemp("limited")
    store = tmp / "store"
    store.mkdir()
    for name in ("cycled", "capped", "crowd"):
        digest_archive(store, name)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(tmpdir))
        with ferry_server(
            store, [], tmp, "--enable-model-api", "--max-workers-total", "2"
        ) as server:
            yield server


def _unpacked_models(tmpdir: Path) -> list[Path]:
    return sorted(tmpdir.rglob("MANIFEST.json"))


def test_unregistering_frees_the_unpacked_archive(limited: RunningServer, tmpdir: Path) -> None:
    with limited.management() as api:
        for _ in range(3):
            registered = api.post(
                "/models", params={"url": "cycled.mar", "initial_workers": 1, "synchronous": "true"}
            )
            assert registered.status_code == 200, registered.text
            assert len(_unpacked_models(tmpdir)) == 1
            assert api.delete("/models/cycled").status_code == 200
            assert _unpacked_models(tmpdir) == []


def test_workers_past_the_cap_are_refused(limited: RunningServer, tmpdir: Path) -> None:
    with limited.management() as api:
        registered = api.post(
            "/models", params={"url": "capped.mar", "initial_workers": 1, "synchronous": "true"}
        )
        assert registered.status_code == 200, registered.text
        try:
            scaled = api.put("/models/capped", params={"min_worker": 10000})
            message = assert_error(scaled, 400, "BadRequestException")
            assert message.startswith(
                "10000 worker processes in all (capped v1.0: 10000) exceed the limit of 2 "
                "(max_workers_total); raise it (--max-workers-total"
            )
            crowd = api.post("/models", params={"url": "crowd.mar", "initial_workers": 2})
            message = assert_error(crowd, 400, "BadRequestException")
            assert (
                "3 worker processes in all" in message
                and "limit of 2 (max_workers_total)" in message
            )
            assert api.get("/models/crowd").status_code == 404
            assert len(_unpacked_models(tmpdir)) == 1  # the refused archive is gone
            assert len(api.get("/models/capped").json()[0]["workers"]) == 1
        finally:
            api.delete("/models/capped")


def test_start_up_past_the_worker_cap_shares_processes_unless_told_never(
    tmp_path: Path,
) -> None:
    """Two models, a cap of one process: by default they share it (both answer, from one
    pid); with ``share_worker_processes=never`` start-up exits 2 naming the ways out."""
    for name in ("first", "second"):
        digest_archive(tmp_path, name)
    models = ["first.mar", "second.mar"]
    with ferry_server(tmp_path, models, tmp_path, "--max-workers-total", "1") as server:
        with server.client() as client:
            for name in ("first", "second"):
                assert client.post(f"/predictions/{name}", content=b"x").status_code == 200
        with server.management() as api:
            pids = {
                api.get(f"/models/{n}").json()[0]["workers"][0]["pid"] for n in ("first", "second")
            }
        assert len(pids) == 1
        assert "past max_workers_total (1): they share processes" in server.log()
    result = run_ferry(
        *serve_args(
            tmp_path,
            "--models",
            *models,
            "--max-workers-total",
            "1",
            "--share-worker-processes",
            "never",
            "--disable-token-auth",
        )
    )
    assert result.returncode == 2, result.stderr
    assert (
        "2 worker processes in all (second v1.0: 1, first v1.0: 1) exceed the limit of 1 "
        "(max_workers_total)" in result.stderr
    )
