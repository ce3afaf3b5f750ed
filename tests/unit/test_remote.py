"""Remote archives: the allow-list, the download, and what a failed download leaves (nothing)."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferry.errors import InvalidRequest, UrlNotAllowed
from ferry.store import remote
from ferry.store.remote import fetch_archive

ARCHIVE = b"not really a zip, but the download does not look inside" * 100
ANY_LOCAL = (r"http://127\.0\.0\.1:\d+/.*",)


class _ArchiveServer(http.server.BaseHTTPRequestHandler):
    """``/model.mar`` with a Content-Length; ``/streamed.mar`` without one (the cap must count);
    ``/slow.mar`` stalls after a first chunk; ``/to-ftp.mar`` redirects to ftp."""

    def do_GET(self) -> None:
        if self.path == "/model.mar":
            self._answer(200, {"Content-Length": str(len(ARCHIVE))}, ARCHIVE)
        elif self.path == "/streamed.mar":
            self.close_connection = True
            self._answer(200, {"Connection": "close"}, ARCHIVE)
        elif self.path == "/slow.mar":
            self._answer(200, {"Content-Length": str(2 * len(ARCHIVE))}, ARCHIVE)
            time.sleep(1)
        elif self.path == "/to-ftp.mar":
            self._answer(302, {"Location": "ftp://127.0.0.1/model.mar", "Content-Length": "0"})
        else:
            self._answer(404, {"Content-Length": "0"})

    def _answer(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ArchiveServer) as server:
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()
        thread.join()


def _fetch(url: str, store: Path, allowed: tuple[str, ...] = ANY_LOCAL) -> str:
    return asyncio.run(fetch_archive(url, store, allowed))


def test_an_allowed_archive_is_downloaded_into_the_store(base_url: str, tmp_path: Path) -> None:
    assert _fetch(f"{base_url}/model.mar", tmp_path) == "model.mar"
    assert (tmp_path / "model.mar").read_bytes() == ARCHIVE
    assert [p.name for p in tmp_path.iterdir()] == ["model.mar"]
    with pytest.raises(InvalidRequest, match="already exists"):
        _fetch(f"{base_url}/model.mar", tmp_path)


def test_urls_are_refused_before_anything_is_fetched(base_url: str, tmp_path: Path) -> None:
    with pytest.raises(UrlNotAllowed, match="does not match any allowed URL"):
        _fetch(f"{base_url}/model.mar", tmp_path, allowed=())
    with pytest.raises(InvalidRequest, match=r"does not name a \.mar"):
        _fetch(f"{base_url}/model.zip", tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/missing.mar", "failed: HTTP 404"),
        ("/to-ftp.mar", "redirects to ftp://"),
    ],
)
def test_failed_downloads_leave_nothing(
    base_url: str, tmp_path: Path, path: str, error: str
) -> None:
    with pytest.raises(InvalidRequest, match=error):
        _fetch(f"{base_url}{path}", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_server_is_an_invalid_request(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="failed"):
        _fetch("http://127.0.0.1:9/model.mar", tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", ["/model.mar", "/streamed.mar"])
def test_archives_over_the_size_cap_are_refused(
    base_url: str, tmp_path: Path, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Declared too large (refused before reading) or found too large while streaming."""
    monkeypatch.setattr(remote, "MAX_ARCHIVE_BYTES", len(ARCHIVE) - 1)
    monkeypatch.setattr(remote, "_CHUNK_BYTES", 1000)
    with pytest.raises(InvalidRequest, match="is larger than"):
        _fetch(f"{base_url}{path}", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_stalled_download_times_out(
    base_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "READ_TIMEOUT_SECONDS", 0.2)
    with pytest.raises(InvalidRequest, match="timed out"):
        _fetch(f"{base_url}/slow.mar", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_cancelled_download_removes_its_partial_file(
    base_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread outlives the cancelled await; it must still clean up after itself."""
    monkeypatch.setattr(remote, "READ_TIMEOUT_SECONDS", 0.5)

    async def cancel_midway() -> None:
        await asyncio.wait_for(fetch_archive(f"{base_url}/slow.mar", tmp_path, ANY_LOCAL), 0.1)

    with pytest.raises(TimeoutError):
        asyncio.run(cancel_midway())
    deadline = time.monotonic() + 10
    while list(tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.iterdir()) == []
