"""An invalid model-config.yaml is refused where the archive is opened: 400 at
registration, exit status 2 at start-up; never a worker that fails to load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.fixtures.models import digest_archive
from tests.fixtures.server import ferry_server

TYPO = (
    "image_classifier: unknown key 'tpok'; expected one of crop, draft_decode, gpu_decode, "
    "mean, resize"
)


def test_registering_an_invalid_config_answers_400_naming_the_key(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    digest_archive(store, "typo", image_classifier={"tpok": 3})
    digest_archive(store, "endless", responseTimeout=float("inf"))
    with ferry_server(store, [], tmp_path, "--enable-model-api") as server:
        with server.management() as api:
            for archive, message in (("typo.mar", TYPO), ("endless.mar", "responseTimeout")):
                response = api.post("/models", params={"url": archive, "synchronous": "true"})
                assert response.status_code == 400, response.text
                body = response.json()
                assert body["type"] == "InvalidModelException" and message in body["message"]
            assert api.get("/models").json() == {"models": []}
        assert "failed to load" not in server.log()


def test_serve_exits_2_naming_the_key(tmp_path: Path) -> None:
    digest_archive(tmp_path, "typo", image_classifier={"tpok": 3})
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ferry",
            "serve",
            "--model-store",
            str(tmp_path),
            "--models",
            "typo.mar",
            "--inference-address",
            "http://127.0.0.1:0",
            "--management-address",
            "http://127.0.0.1:0",
            "--metrics-address",
            "http://127.0.0.1:0",
            "--disable-token-auth",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert TYPO in result.stderr
    assert result.returncode == 2, result.stderr
