"""Remote archive URLs: refused unless ``allowed_urls`` matches, then downloaded into the store.

TorchServe's ShellTorch (CVE-2023-43654) came from fetching any URL by default; Ferry's
default allow-list is empty.

The download uses the standard library (``urllib`` in a thread) so that the server's base
install needs no HTTP client. It streams into a hidden file in the store, stops at
``MAX_ARCHIVE_BYTES``, and removes that file whenever it does not complete.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from typing import IO
from urllib.parse import urlsplit

from ferry.errors import InvalidRequest, UrlNotAllowed

MAX_ARCHIVE_BYTES = 4 * 2**30
DOWNLOAD_SECONDS = 600.0
"""The whole download's deadline, checked between chunks."""
READ_TIMEOUT_SECONDS = 60.0
"""A connect or a single read that stalls this long fails the download."""
_CHUNK_BYTES = 1 << 20


def is_remote(url: str) -> bool:
    return urlsplit(url).scheme in ("http", "https")


def check_allowed(url: str, allowed_urls: tuple[str, ...]) -> None:
    """Every pattern must match the whole URL (regular expressions, as in TorchServe)."""
    if not any(re.fullmatch(pattern, url) for pattern in allowed_urls):
        raise UrlNotAllowed(f"Given URL {url} does not match any allowed URL(s)")


async def fetch_archive(url: str, store: Path, allowed_urls: tuple[str, ...]) -> str:
    """Download an allowed archive into the store; returns its name there."""
    check_allowed(url, allowed_urls)
    name = PurePosixPath(urlsplit(url).path).name
    if not name.endswith((".mar", ".tar.gz", ".tgz")):
        raise InvalidRequest(f"{url} does not name a .mar or .tar.gz archive")
    target = store / name
    if target.exists():
        raise InvalidRequest(f"{name} already exists in the model store")
    # A cancelled await cannot stop the thread; this tells it to give up at its next chunk.
    abandoned = threading.Event()
    try:
        await asyncio.to_thread(_download, url, target, abandoned)
    finally:
        abandoned.set()
    return name


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects to http(s) only; urllib would also follow them to ftp."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        if not is_remote(newurl):
            fp.close()
            raise InvalidRequest(f"{req.full_url} redirects to {newurl}, which is not http(s)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


# No ProxyHandler from the environment: the download goes where the allow-list said.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _HttpOnlyRedirects())


def _download(url: str, target: Path, abandoned: threading.Event) -> None:
    """Runs in a worker thread: stream ``url`` into a hidden file, then move it to ``target``."""
    deadline = time.monotonic() + DOWNLOAD_SECONDS
    fd, partial_name = tempfile.mkstemp(dir=target.parent, prefix=".download-")
    partial_path = Path(partial_name)
    try:
        with os.fdopen(fd, "wb") as partial, _open(url) as response:
            size = 0
            while chunk := _read(response, url):
                if abandoned.is_set():
                    raise InvalidRequest(f"downloading {url} was abandoned")
                if time.monotonic() > deadline:
                    raise InvalidRequest(f"downloading {url} took over {DOWNLOAD_SECONDS:g} s")
                size += len(chunk)
                if size > MAX_ARCHIVE_BYTES:
                    raise _too_large(url)
                partial.write(chunk)  # a full disk is the server's error, not the client's
        partial_path.replace(target)
    except BaseException:
        partial_path.unlink(missing_ok=True)
        raise


def _open(url: str) -> http.client.HTTPResponse:
    try:
        response: http.client.HTTPResponse = _OPENER.open(url, timeout=READ_TIMEOUT_SECONDS)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise InvalidRequest(f"downloading {url} failed: HTTP {exc.code}") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise _failed(url, exc) from exc
    if response.status != 200:
        response.close()
        raise InvalidRequest(f"downloading {url} failed: HTTP {response.status}")
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > MAX_ARCHIVE_BYTES:
        response.close()
        raise _too_large(url)
    return response


def _read(response: http.client.HTTPResponse, url: str) -> bytes:
    try:
        return response.read(_CHUNK_BYTES)
    except (OSError, http.client.HTTPException) as exc:
        raise _failed(url, exc) from exc


def _failed(url: str, exc: BaseException) -> InvalidRequest:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return InvalidRequest(f"downloading {url} failed: {reason or type(exc).__name__}")


def _too_large(url: str) -> InvalidRequest:
    return InvalidRequest(f"{url} is larger than {MAX_ARCHIVE_BYTES} bytes")
