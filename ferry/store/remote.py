"""Remote archive URLs: refused unless ``allowed_urls`` matches, then downloaded into the store.

TorchServe's ShellTorch (CVE-2023-43654) came from fetching any URL by default; Ferry's
default allow-list is empty.

The patterns match the URL as RFC 3986 normalises it (``normalise_url``), and that normalised
URL is the one fetched, so ``/public/../secret.mar`` or ``%2e%2e`` cannot reach a path the
patterns keep out. A redirect is followed only when its (normalised) target matches too.

The download uses the standard library (``urllib`` in a thread) so that the server's base
install needs no HTTP client. It streams into a hidden file in the store, stops at
``MAX_ARCHIVE_BYTES``, and removes that file whenever it does not complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import re
import string
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, TypeVar
from urllib.parse import urlsplit, urlunsplit

from ferry.errors import InvalidRequest, UrlNotAllowed

MAX_ARCHIVE_BYTES = 4 * 2**30
DOWNLOAD_SECONDS = 600.0
"""The whole download's deadline, checked between chunks."""
READ_TIMEOUT_SECONDS = 60.0
"""A connect or a single read that stalls this long fails the download."""
_CHUNK_BYTES = 1 << 20
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_PERCENT_ENCODED = re.compile("%([0-9A-Fa-f]{2})")
_DEFAULT_PORTS = {"http": 80, "https": 443}

T = TypeVar("T")


def is_remote(url: str) -> bool:
    return urlsplit(url).scheme in ("http", "https")


def normalise_url(url: str) -> str:
    """``url`` as RFC 3986 §6.2.2 normalises it: scheme and host lower-cased, percent-encoded
    unreserved characters decoded (``%2e`` is ``.``), the other encodings upper-cased, dot
    segments removed (§5.2.4), the default port and the fragment (never sent) dropped.

    URLs that servers could still read in more than one way are refused (``UrlNotAllowed``):
    user information, a port that is not a number, percent-encodings left in the host, and a
    backslash or an encoded ``/`` or ``\\`` in the path.

    >>> normalise_url("HTTP://Example.com:80/models/%2E%2e/a.mar")
    'http://example.com/a.mar'
    """
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise UrlNotAllowed(f"{url} has an invalid port") from None
    if "@" in parts.netloc:
        raise UrlNotAllowed(f"{url} carries user information, which Ferry does not send")
    host = _decode_unreserved(parts.hostname or "").lower()
    if "%" in host:
        raise UrlNotAllowed(f"{url} has percent-encoded characters in its host")
    path = _decode_unreserved(parts.path)
    if "\\" in path or re.search("%(2F|5C)", path):
        raise UrlNotAllowed(f"{url} has a \\ or an encoded / or \\ in its path")
    scheme = parts.scheme.lower()
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        netloc += f":{port}"
    path = _remove_dot_segments(path) or "/"
    return urlunsplit((scheme, netloc, path, _decode_unreserved(parts.query), ""))


def _decode_unreserved(text: str) -> str:
    def decode(match: re.Match[str]) -> str:
        char = chr(int(match[1], 16))
        return char if char in _UNRESERVED else match[0].upper()

    return _PERCENT_ENCODED.sub(decode, text)


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4, for the absolute paths of http(s) URLs: ``..`` stops at the root."""
    output: list[str] = []
    for segment in path.split("/")[1:]:
        if segment == "..":
            if output:
                output.pop()
        elif segment != ".":
            output.append(segment)
    # A trailing "." or ".." names a folder: keep its slash.
    if path.endswith(("/.", "/..")):
        output.append("")
    return "/" + "/".join(output) if path else ""


def allowed_url(url: str, allowed_urls: tuple[str, ...]) -> str:
    """The URL to fetch for ``url``: its normalised form, which one of the patterns (regular
    expressions, as in TorchServe) must match whole; else ``UrlNotAllowed`` says why."""
    normalised = normalise_url(url)
    if _matches(normalised, allowed_urls):
        return normalised
    if normalised == url:  # TorchServe's message, for the URL as given
        raise UrlNotAllowed(f"Given URL {url} does not match any allowed URL(s)")
    raise UrlNotAllowed(_unmatched(url, normalised))


def _matches(url: str, allowed_urls: tuple[str, ...]) -> bool:
    return any(re.fullmatch(pattern, url) for pattern in allowed_urls)


def _unmatched(url: str, normalised: str) -> str:
    if normalised == url:
        return f"{url} matches no allowed_urls pattern"
    return f"{url} normalises to {normalised}, which matches no allowed_urls pattern"


MODEL_SUFFIXES = (".mar", ".tar.gz", ".tgz")
WORKFLOW_SUFFIXES = (".war",)


async def fetch_archive(
    url: str, store: Path, allowed_urls: tuple[str, ...], suffixes: tuple[str, ...] = MODEL_SUFFIXES
) -> str:
    """Download an allowed archive (a model's, or with ``WORKFLOW_SUFFIXES`` a workflow's)
    into the store; returns its name there."""
    url = allowed_url(url, allowed_urls)
    name = PurePosixPath(urlsplit(url).path).name
    if not name.endswith(suffixes):
        raise InvalidRequest(f"{url} does not name a {' or '.join(suffixes)} archive")
    target = store / name
    if target.exists():
        raise InvalidRequest(f"{name} already exists in the model store")
    # A cancelled await cannot stop the thread; this tells it to give up at its next chunk.
    abandoned = threading.Event()
    try:
        await asyncio.to_thread(_download, url, target, allowed_urls, abandoned)
    finally:
        abandoned.set()
    return name


@contextlib.contextmanager
def removed_on_failure(download: Path | None) -> Iterator[None]:
    """Delete ``download``, an archive fetched for a registration, if the block raises: a
    registration that fails leaves nothing behind, so retrying it downloads the archive
    again instead of finding that it "already exists". None: nothing was downloaded."""
    try:
        yield
    except Exception:
        if download is not None:
            download.unlink(missing_ok=True)
        raise


async def removed_if_fails(download: Path | None, step: Awaitable[T]) -> T:
    """``removed_on_failure`` for a step that runs on in the background."""
    with removed_on_failure(download):
        return await step


class _AllowedRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to an http(s) URL that the allow-list matches, and fetch its
    normalised form; urllib alone would follow any redirect, to ftp included."""

    def __init__(self, allowed_urls: tuple[str, ...]) -> None:
        super().__init__()
        self.allowed_urls = allowed_urls

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
        try:
            target = normalise_url(newurl)
            if not _matches(target, self.allowed_urls):
                raise UrlNotAllowed(_unmatched(newurl, target))
        except UrlNotAllowed as exc:
            fp.close()
            raise UrlNotAllowed(
                f"redirect from {req.full_url} to {newurl} refused: {exc}"
            ) from None
        return super().redirect_request(req, fp, code, msg, headers, target)


def _opener(allowed_urls: tuple[str, ...]) -> urllib.request.OpenerDirector:
    # No ProxyHandler from the environment: the download goes where the allow-list said.
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), _AllowedRedirects(allowed_urls)
    )


def _download(
    url: str, target: Path, allowed_urls: tuple[str, ...], abandoned: threading.Event
) -> None:
    """Runs in a worker thread: stream ``url`` into a hidden file, then move it to ``target``."""
    deadline = time.monotonic() + DOWNLOAD_SECONDS
    fd, partial_name = tempfile.mkstemp(dir=target.parent, prefix=".download-")
    partial_path = Path(partial_name)
    try:
        with os.fdopen(fd, "wb") as partial, _open(url, allowed_urls) as response:
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


def _open(url: str, allowed_urls: tuple[str, ...]) -> http.client.HTTPResponse:
    opener = _opener(allowed_urls)
    try:
        response: http.client.HTTPResponse = opener.open(url, timeout=READ_TIMEOUT_SECONDS)
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
