"""Safe defaults: token authorization, owner-only key file, loopback, HTTPS."""

from __future__ import annotations

import json
import ssl
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.fixtures.cli import run_ferry, serve_args
from tests.fixtures.models import digest_archive, echo_store
from tests.fixtures.server import ferry_server


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return echo_store(tmp_path)


def test_management_needs_the_key_and_inference_on_loopback_does_not(
    store: Path, tmp_path: Path
) -> None:
    with ferry_server(store, ["echo.mar"], tmp_path, auth=True) as server:
        key_file = tmp_path / "key_file.json"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        keys = json.loads(key_file.read_text())
        with server.management() as api:
            refused = api.get("/models")
            assert refused.status_code == 401
            assert refused.json()["type"] == "InvalidKeyException"
            # Issue 51: the message says where the key is (the server's working folder).
            assert f"'management' key of the key file {key_file.resolve()}" in refused.text
            # The interactive page opens in a browser, which sends no key; what it calls
            # still needs one.
            page = api.get("/docs")
            assert page.status_code == 200 and "<html" in page.text.lower()
            assert api.get("/api-description").status_code == 401
            wrong = api.get("/models", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            good = {"Authorization": f"Bearer {keys['management']['key']}"}
            assert api.get("/models", headers=good).status_code == 200
            inference_key = {"Authorization": f"Bearer {keys['inference']['key']}"}
            assert api.get("/models", headers=inference_key).status_code == 401
        with server.client() as client:  # loopback inference stays open
            assert client.post("/predictions/echo", content=b"x").status_code == 200
        assert httpx.get(f"{server.metrics_url}/metrics").status_code == 200


def test_inference_beyond_loopback_needs_its_key(store: Path, tmp_path: Path) -> None:
    with ferry_server(
        store, ["echo.mar"], tmp_path, "--inference-address", "http://0.0.0.0:0", auth=True
    ) as server:
        port = server.url.rsplit(":", 1)[1]
        url = f"http://127.0.0.1:{port}"
        keys = json.loads((tmp_path / "key_file.json").read_text())
        assert httpx.post(f"{url}/predictions/echo", content=b"x").status_code == 401
        assert httpx.get(f"{url}/ping").status_code == 200  # health checks need no key
        headers = {"Authorization": f"Bearer {keys['inference']['key']}"}
        assert (
            httpx.post(f"{url}/predictions/echo", content=b"x", headers=headers).status_code == 200
        )
        # KServe's protocols on the same port: the same key, the same open health checks.
        v2 = {"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
        for path, body in (
            ("/v2/models/echo/infer", v2),
            ("/v1/models/echo:predict", {"instances": ["x"]}),
        ):
            assert httpx.post(f"{url}{path}", json=body).status_code == 401
            # Past the key check (the echo handler itself takes only raw bodies).
            assert httpx.post(f"{url}{path}", json=body, headers=headers).status_code != 401
        assert httpx.get(f"{url}/v2/models/echo").status_code == 401
        for probe in ("/v2/health/live", "/v2/health/ready"):
            assert httpx.get(f"{url}{probe}").status_code == 200


def test_disable_token_auth_writes_no_key_file(store: Path, tmp_path: Path) -> None:
    with ferry_server(store, ["echo.mar"], tmp_path) as server, server.management() as api:
        assert api.get("/models").status_code == 200
    assert not (tmp_path / "key_file.json").exists()
    assert "token authorization is disabled" in server.log()


def test_a_start_that_fails_on_a_model_config_writes_no_key_file(tmp_path: Path) -> None:
    """Issue 47, item 8: new keys were written once the listeners were bound, before the
    start-up models' configurations were read."""
    digest_archive(tmp_path, "typo", image_classifier={"tpok": 3})
    key_file = tmp_path / "key_file.json"
    serve = serve_args(tmp_path, "--models", "typo.mar", "--key-file", str(key_file))
    result = run_ferry(*serve, timeout=120)
    assert result.returncode == 2 and "unknown key 'tpok'" in result.stderr, result.stderr
    assert not key_file.exists()


def test_https_listeners(store: Path, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    tls = [
        "--inference-address",
        "https://127.0.0.1:0",
        "--certificate-file",
        str(cert),
        "--private-key-file",
        str(key),
    ]
    with ferry_server(store, ["echo.mar"], tmp_path, *tls) as server:
        assert server.url.startswith("https://")
        trust = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(base_url=server.url, verify=trust) as client:
            assert client.get("/ping").json() == {"status": "Healthy"}
            assert client.post("/predictions/echo", content=b"x").status_code == 200


def test_https_without_certificate_stops_start_up(store: Path) -> None:
    https = serve_args(store, "--disable-token-auth", inference="https://127.0.0.1:0")
    result = run_ferry(*https, timeout=60)
    assert result.returncode == 2 and "certificate_file" in result.stderr


def test_https_with_a_key_the_security_level_refuses_stops_start_up_saying_why(
    store: Path, tmp_path: Path
) -> None:
    """TorchServe's test certificate has a 1024-bit RSA key, which OpenSSL's default
    security level refuses: exit 2, one line naming the file, the reason and the fix."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:1024", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    tls = ("--certificate-file", str(cert), "--private-key-file", str(key))
    https = serve_args(store, "--disable-token-auth", *tls, inference="https://127.0.0.1:0")
    result = run_ferry(*https, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"ferry serve: https://127.0.0.1:0: certificate_file {cert} has a 1024-bit RSA key; "
        "OpenSSL's security level 2 needs RSA keys of at least 2048 bits (EC: 224): make a "
        "2048-bit pair: openssl req -x509 -nodes -days 365 -newkey rsa:2048 -sha256 "
        f"-subj /CN=localhost -keyout {key} -out {cert}"
    )
