"""Remote archives: the allow-list, the download, and what a failed download leaves (nothing)."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import posixpath
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import unquote

import pytest

from ferry.errors import InvalidRequest, UrlNotAllowed
from ferry.store import remote
from ferry.store.remote import fetch_archive, normalise_url
from tests.fixtures.polling import HANG_GUARD

ARCHIVE = b"not really a zip, but the download does not look inside" * 100
SECRET = b"what the allow-list keeps out"
ANY_LOCAL = (r"http://127\.0\.0\.1:\d+/.*",)
PUBLIC_ONLY = (r"http://127\.0\.0\.1:\d+/public/.*",)


@dataclass
class _Stall:
    """The test's hold on ``/slow.mar``: its first half is sent, then ``sent`` is set and
    nothing more comes until the test sets ``release``."""

    sent: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


class _ArchiveServer(http.server.BaseHTTPRequestHandler):
    """``/model.mar`` with a Content-Length; ``/streamed.mar`` without one (the cap must count);
    ``/slow.mar`` stalls after its first half until the test releases it (``stall``);
    ``/to-ftp.mar`` redirects to ftp; ``/secret.mar`` is what the allow-list must keep out;
    ``/public/*`` redirects as its name says.

    Like most web servers, it routes by the percent-decoded path with dot-segments removed;
    ``requested`` records the paths exactly as clients sent them."""

    requested: list[str] = []
    stall = _Stall()

    def do_GET(self) -> None:
        self.requested.append(self.path)
        path = posixpath.normpath(unquote(self.path))
        port = cast(http.server.HTTPServer, self.server).server_port
        if path in ("/model.mar", "/public/model.mar"):
            self._answer(200, {"Content-Length": str(len(ARCHIVE))}, ARCHIVE)
        elif path == "/secret.mar":
            self._answer(200, {"Content-Length": str(len(SECRET))}, SECRET)
        elif path == "/streamed.mar":
            self.close_connection = True
            self._answer(200, {"Connection": "close"}, ARCHIVE)
        elif path == "/slow.mar":
            self._stalled()
        elif path == "/to-ftp.mar":
            self._redirect("ftp://127.0.0.1/model.mar")
        elif path == "/public/moved.mar":
            self._redirect("/public/./model.mar")
        elif path == "/public/to-secret.mar":
            self._redirect("/secret.mar")
        elif path == "/public/to-other-host.mar":
            self._redirect(f"http://localhost:{port}/public/model.mar")
        else:
            self._answer(404, {"Content-Length": "0"})

    def _stalled(self) -> None:
        stall = self.stall
        self._answer(200, {"Content-Length": str(2 * len(ARCHIVE))}, ARCHIVE)
        stall.sent.set()
        stall.release.wait(HANG_GUARD)  # only turns a test that hangs into one that fails
        with contextlib.suppress(OSError):  # the client may have hung up by now
            self.wfile.write(ARCHIVE)
            self.wfile.flush()

    def _redirect(self, location: str) -> None:
        self._answer(302, {"Location": location, "Content-Length": "0"})

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


@pytest.fixture
def stall() -> Iterator[_Stall]:
    """``/slow.mar``'s hold for this test; released at its end, whatever happened."""
    _ArchiveServer.stall = held = _Stall()
    yield held
    held.release.set()


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
    ("url", "normalised"),
    [
        ("HTTP://Example.COM:80/a.mar", "http://example.com/a.mar"),
        ("https://example.com:443/a.mar", "https://example.com/a.mar"),
        ("http://example.com:8080/a.mar", "http://example.com:8080/a.mar"),
        ("http://[::1]:80/a.mar", "http://[::1]/a.mar"),
        ("http://example.com", "http://example.com/"),
        ("http://example.com/%7euser/%61.mar", "http://example.com/~user/a.mar"),
        ("http://example.com/a/%2e%2E/b/./c.mar", "http://example.com/b/c.mar"),
        ("http://example.com/../../c.mar", "http://example.com/c.mar"),
        ("http://example.com/a/b/..", "http://example.com/a/"),
        ("http://example.com/a%3fb%3A.mar?x=%2e#part", "http://example.com/a%3Fb%3A.mar?x=."),
    ],
)
def test_urls_are_normalised_as_rfc_3986_says(url: str, normalised: str) -> None:
    assert normalise_url(url) == normalised


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:1@example.com/a.mar", "carries user information"),
        ("http://127.0.0.1:x/a.mar", "invalid port"),
        ("http://ex%2Fample.com/a.mar", "percent-encoded characters in its host"),
        ("http://example.com/public/..%2Fsecret.mar", r"encoded / or \\ in its path"),
        ("http://example.com/public/..%5csecret.mar", r"encoded / or \\ in its path"),
        ("http://example.com/public/..\\secret.mar", r"has a \\ or"),
    ],
)
def test_urls_servers_could_read_another_way_are_refused(url: str, reason: str) -> None:
    """Servers differ on whether an encoded / separates segments, or \\ is a /."""
    with pytest.raises(UrlNotAllowed, match=reason):
        normalise_url(url)


@pytest.mark.parametrize(
    "path", ["/public/../secret.mar", "/public/%2e%2e/secret.mar", "/public/x/.%2E/../secret.mar"]
)
def test_dot_segments_cannot_leave_the_allowed_path(
    base_url: str, tmp_path: Path, path: str
) -> None:
    """The raw URL matches the pattern, but the server resolves the dots: the normalised
    URL is the one that must match."""
    with pytest.raises(UrlNotAllowed) as refused:
        _fetch(f"{base_url}{path}", tmp_path, PUBLIC_ONLY)
    assert refused.value.message == (
        f"{base_url}{path} normalises to {base_url}/secret.mar, "
        "which matches no allowed_urls pattern"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_normalised_url_is_the_one_fetched(base_url: str, tmp_path: Path) -> None:
    _ArchiveServer.requested.clear()
    assert _fetch(f"{base_url}/public/./x/%2e%2e/model.mar", tmp_path, PUBLIC_ONLY) == "model.mar"
    assert _ArchiveServer.requested == ["/public/model.mar"]


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("/public/to-secret.mar", "{base}/secret.mar"),
        ("/public/to-other-host.mar", "http://localhost:{port}/public/model.mar"),
    ],
)
def test_redirects_outside_the_allow_list_are_refused(
    base_url: str, tmp_path: Path, path: str, target: str
) -> None:
    target = target.format(base=base_url, port=base_url.rpartition(":")[2])
    with pytest.raises(UrlNotAllowed) as refused:
        _fetch(f"{base_url}{path}", tmp_path, PUBLIC_ONLY)
    assert refused.value.message == (
        f"redirect from {base_url}{path} to {target} refused: "
        f"{target} matches no allowed_urls pattern"
    )
    assert list(tmp_path.iterdir()) == []


def test_redirects_within_the_allow_list_are_followed(base_url: str, tmp_path: Path) -> None:
    """... to the normalised target (the server answered ``/public/./model.mar``)."""
    _ArchiveServer.requested.clear()
    assert _fetch(f"{base_url}/public/moved.mar", tmp_path, PUBLIC_ONLY) == "moved.mar"
    assert (tmp_path / "moved.mar").read_bytes() == ARCHIVE
    assert _ArchiveServer.requested == ["/public/moved.mar", "/public/model.mar"]


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
    with socket.socket() as unused:  # bound, never listening: the connection is refused
        unused.bind(("127.0.0.1", 0))
        with pytest.raises(InvalidRequest, match="failed"):
            _fetch(f"http://127.0.0.1:{unused.getsockname()[1]}/model.mar", tmp_path)
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
    base_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stall: _Stall
) -> None:
    """The server sends nothing more until the test ends: the read timeout is the only way
    out, however long anything takes."""
    monkeypatch.setattr(remote, "READ_TIMEOUT_SECONDS", 0.2)
    with pytest.raises(InvalidRequest, match="timed out"):
        _fetch(f"{base_url}/slow.mar", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_cancelled_download_removes_its_partial_file(
    base_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stall: _Stall
) -> None:
    """The thread outlives the cancelled await; it must still clean up after itself. Told
    that the await was abandoned, it gives up at its next chunk, although the rest of the
    archive then comes and would complete the download."""
    outcomes: list[BaseException | None] = []
    finished = threading.Event()
    download = remote._download

    def watched(*args: Any) -> None:
        try:
            download(*args)
            outcomes.append(None)
        except BaseException as exc:
            outcomes.append(exc)
            raise
        finally:
            finished.set()

    monkeypatch.setattr(remote, "_download", watched)

    async def cancel_midway() -> list[str]:
        fetch = asyncio.create_task(fetch_archive(f"{base_url}/slow.mar", tmp_path, ANY_LOCAL))
        assert await asyncio.to_thread(stall.sent.wait, HANG_GUARD)  # half of it was sent
        partial = [path.name for path in tmp_path.iterdir()]
        fetch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await fetch
        stall.release.set()
        return partial

    partial = asyncio.run(cancel_midway())
    assert len(partial) == 1 and partial[0].startswith(".download-")  # there was one
    assert finished.wait(HANG_GUARD)
    (outcome,) = outcomes
    assert isinstance(outcome, InvalidRequest) and "was abandoned" in outcome.message
    assert list(tmp_path.iterdir()) == []
