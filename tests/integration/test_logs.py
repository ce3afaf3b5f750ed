"""Access log lines, worker output prefixed with its model and worker, JSON log lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.models import HANDLERS, digest_archive
from tests.fixtures.server import RunningServer, ferry_server


def test_access_log_and_worker_output(main_server: RunningServer) -> None:
    with main_server.client() as client:
        assert client.post("/predictions/digest", content=b"logged").status_code == 200
        assert client.post("/predictions/absent", content=b"x").status_code == 404
    log = main_server.log()
    access = [line for line in log.splitlines() if "ferry.access" in line]
    assert any(
        "path=/predictions/digest status=200 model=digest version=1.0" in line
        and "queue_ms=" in line
        and "batch_size=" in line
        for line in access
    )
    assert any("status=404 model=absent" in line for line in access)
    assert "[digest w0.0 pid " in log and "digest handler ready for digest" in log
    for line in (
        "inference API listening on",
        "management API listening on",
        "metrics API listening on",
        "model digest v1.0: 1 worker ready on cpu",
    ):
        assert line in log


def test_json_log_lines(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    digest_archive(store, "echo")
    with ferry_server(store, ["echo.mar"], tmp_path, "--log-format", "json") as server:
        with server.client() as client:
            assert client.post("/predictions/echo", content=b"x").status_code == 200
        log = server.log()
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records)
    access = [r for r in records if r["logger"] == "ferry.access"]
    assert access and access[0]["model"] == "echo" and access[0]["status"] == 200
    assert access[0]["batch_size"] == 1 and access[0]["latency_ms"] > 0
    assert any(r["logger"] == "ferry.worker.output" for r in records)


def test_a_worker_error_is_one_json_record_with_its_traceback_and_request_id(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    spec = ArchiveSpec(model_name="noisy", handler=str(HANDLERS / "noisy_handler.py"))
    archive = write_archive(spec, store, force=True).name
    with ferry_server(store, [archive], tmp_path, "--log-format", "json") as server:
        with server.client() as client:
            response = client.post("/predictions/noisy", content=b"fail")
        log = server.log()
    assert response.status_code == 500
    assert response.json()["message"] == "ValueError: asked to fail"  # no traceback
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    worker = [r for r in records if r["logger"] == "ferry.worker.output"]
    errors = [r for r in worker if r["level"] == "ERROR"]
    [refusal] = [r for r in errors if r["worker_logger"] == "noisy_handler"]
    [failure] = [r for r in errors if "exception" in r]
    request_id = refusal["message"].rsplit(" ", 1)[-1]  # the id the handler saw
    assert refusal["request_id"] == failure["request_id"] == request_id
    assert "[noisy " in failure["message"] and failure["message"].endswith("handler failed")
    assert failure["exception"].startswith("Traceback (most recent call last):")
    assert failure["exception"].rstrip().endswith("ValueError: asked to fail")
    infos = [r["message"] for r in worker if r["level"] == "INFO"]
    assert not [m for m in infos if "Traceback" in m or 'File "' in m or "asked to fail" in m]
    assert not [line for line in log.splitlines() if "Traceback" in line and line[:1] != "{"]


FORGED = "2026-11-26 11:38:07,003 INFO ferry.access: method=DELETE path=models status=200"


def test_a_client_cannot_forge_or_drive_log_lines(main_server: RunningServer) -> None:
    """Issue 29, defect 3: a newline in the path wrote a second, forged access line; ESC
    and CR in the version segment reached the log raw."""
    with main_server.client() as client:
        forged = client.post(
            "/predictions/nosuch%0A2026-11-26%2011:38:07,003%20INFO%20ferry.access:"
            "%20method=DELETE%20path=models%20status=200",
            content=b"x",
        )
        coloured = client.post("/predictions/digest/%1b[31m%0d", content=b"x")
    assert forged.status_code == coloured.status_code == 404
    log = main_server.log_path.read_bytes()  # as bytes: text mode would turn CR into LF
    lines = log.decode(errors="replace").split("\n")
    assert not [line for line in lines if line.startswith(FORGED)]
    escaped = "nosuch\\n" + FORGED
    assert any(
        f"ferry.access: method=POST path=/predictions/{escaped} status=404 model={escaped} "
        "latency_ms=" in line
        for line in lines
    )
    assert any(
        "path=/predictions/digest/\\x1b[31m\\r status=404 model=digest version=\\x1b[31m\\r" in line
        for line in lines
    )
    assert b"\x1b" not in log and b"\r" not in log


def test_a_long_path_is_echoed_cut_in_the_answer_and_the_access_line(tmp_path: Path) -> None:
    """Issue 47, item 7: a 60 KB path gave a 120 KB access line (path and model name each
    in full) and a 60 KB 404 body."""
    store = tmp_path / "store"
    store.mkdir()
    name = "m" * 60_000
    with ferry_server(store, [], tmp_path) as server:
        with server.client() as client:
            answers = [
                client.post(f"/predictions/{name}", content=b"x"),
                client.post(f"/v2/models/{name}/infer", json={"inputs": []}),
            ]
        with server.management() as api:
            answers.append(api.get(f"/models/{name}"))
        log = server.log()
    for answer in answers:
        assert answer.status_code == 404, answer.text[:200]
        assert len(answer.content) < 2_000
        assert re.search(r"\.\.\. \(600\d\d characters\)", answer.text)
    [line] = [line for line in log.splitlines() if "ferry.access" in line]
    assert len(line) < 2_000
    assert f"path=/predictions/{'m' * 100}" in line and "(60013 characters)" in line
    assert f"model={'m' * 256}... (60000 characters) " in line
