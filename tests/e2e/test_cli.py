"""The CLI as a user runs it: package a model with ``ferry archive``, serve it, query it."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from examples.demo.shapes import encode, labelled_samples
from tests.fixtures.cli import FERRY, run_ferry, serve_args
from tests.fixtures.models import DEMO_STORE, HANDLERS
from tests.fixtures.processes import is_running
from tests.fixtures.server import ferry_server

pytestmark = pytest.mark.e2e


def _archive_echo(store: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``ferry archive`` of the digest handler as model ``echo`` into ``store``."""
    return run_ferry(
        "archive",
        "--model-name",
        "echo",
        "--handler",
        str(HANDLERS / "digest_handler.py"),
        "--export-path",
        str(store),
        *extra,
        check=True,
    )


def test_archive_then_serve_then_predict(tmp_path: Path) -> None:
    store = tmp_path / "store"
    made = _archive_echo(store, "--version", "3.1")
    assert Path(made.stdout.strip()) == store / "echo.mar"
    again = run_ferry(
        "archive",
        "--model-name",
        "echo",
        "--handler",
        "image_classifier",
        "--export-path",
        str(store),
    )
    assert again.returncode == 1 and "already exists" in again.stderr
    with ferry_server(store, ["all"], tmp_path, command=FERRY) as server, server.client() as client:
        response = client.post("/predictions/echo/3.1", content=b"abc")
        assert response.status_code == 200 and response.json()["batch"] == 1


def test_readme_demo_serves_shapes(tmp_path: Path) -> None:
    sample = DEMO_STORE.parent / "samples" / "star.png"
    expected = sample.stem
    server_context = ferry_server(DEMO_STORE, ["shapes=shapes.mar"], tmp_path, command=FERRY)
    with server_context as server, server.client() as client:
        assert client.get("/ping").json() == {"status": "Healthy"}
        scores = client.post("/predictions/shapes", content=sample.read_bytes()).json()
        assert max(scores, key=scores.get) == expected
        label, image = labelled_samples(1, seed=77)[0]
        files = {"data": ("shape.png", encode(image), "image/png")}
        scores = client.post("/predictions/shapes", files=files).json()
        assert max(scores, key=scores.get) == label


def test_serve_refuses_a_missing_store(tmp_path: Path) -> None:
    result = run_ferry(
        "serve", "--model-store", str(tmp_path / "absent"), "--models", "all", timeout=60
    )
    assert result.returncode == 2 and "is not a folder" in result.stderr


def test_serve_exits_2_naming_a_model_missing_from_the_store(tmp_path: Path) -> None:
    """Issue 51: TorchServe logs it and answers /ping Healthy with no model; Ferry does
    not start, and says which model is missing and what the store holds like it."""
    store = tmp_path / "store"
    _archive_echo(store)
    result = run_ferry(*serve_args(store, "--models", "nothere=nothere.mar,echo=eho.mar"))
    assert result.returncode == 2, result.stderr
    line = (
        f"ferry serve: start-up models not found in the model store {store}: "
        "nothere=nothere.mar; echo=eho.mar (did you mean 'echo.mar'?)"
    )
    assert line in result.stderr.splitlines()
    assert "Traceback" not in result.stderr and "listening on" not in result.stderr


def test_serve_stops_on_an_unloadable_archive(tmp_path: Path) -> None:
    (tmp_path / "bad.mar").write_bytes(b"nope")
    result = run_ferry(*serve_args(tmp_path, "--models", "bad.mar"))
    assert result.returncode == 1 and "not a valid zip" in result.stderr


def test_sigterm_stops_the_server_and_its_workers(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _archive_echo(store)
    with ferry_server(store, ["echo.mar"], tmp_path, command=FERRY) as server:
        with server.client() as client:
            worker_pid = client.post("/predictions/echo", content=b"x").json()["pid"]
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0
    assert not is_running(worker_pid)
