"""``unix:`` addresses (TorchServe's ``management_address=unix:/tmp/management.sock``):
an API served on a Unix socket, a stale socket file replaced, a live one refused."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.fixtures.cli import serve_args
from tests.fixtures.models import echo_store
from tests.fixtures.server import ferry_server


def _client(path: Path, base: str = "http://ferry") -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url=base, timeout=60)


def test_inference_and_management_on_unix_sockets(tmp_path: Path) -> None:
    inference, management = tmp_path / "inference.sock", tmp_path / "management.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(management))  # a socket file whose server is gone
    stale.close()
    extra = (
        "--inference-address",
        f"unix:{inference}",
        "--management-address",
        f"unix:{management}",
    )
    store = echo_store(tmp_path)
    with ferry_server(store, ["echo=echo.mar"], tmp_path, *extra) as server:
        assert server.url == f"unix:{inference}"
        with _client(inference) as client, _client(management) as api:
            assert client.get("/ping").json() == {"status": "Healthy"}
            assert client.post("/predictions/echo", content=b"hi").status_code == 200
            assert api.get("/models").json()["models"][0]["modelName"] == "echo"
        second = subprocess.run(
            [sys.executable, "-m", "ferry", *serve_args(store, *extra)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2
        refusal = f"cannot listen on unix:{inference} (inference_address): address already in use"
        assert refusal in second.stderr
    assert not inference.exists() and not management.exists()  # removed at shutdown
