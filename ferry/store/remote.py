"""Remote archive URLs: refused unless ``allowed_urls`` matches, then downloaded into the store.

TorchServe's ShellTorch (CVE-2023-43654) came from fetching any URL by default; Ferry's
default allow-list is empty.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import aiohttp

from ferry.errors import InvalidRequest, UrlNotAllowed

MAX_ARCHIVE_BYTES = 4 * 2**30


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
    timeout = aiohttp.ClientTimeout(total=600)
    with tempfile.NamedTemporaryFile(dir=store, prefix=".download-", delete=False) as partial:
        partial_path = Path(partial.name)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(url) as response,
            ):
                if response.status != 200:
                    raise InvalidRequest(f"downloading {url} failed: HTTP {response.status}")
                size = 0
                async for chunk in response.content.iter_chunked(1 << 20):
                    size += len(chunk)
                    if size > MAX_ARCHIVE_BYTES:
                        raise InvalidRequest(f"{url} is larger than {MAX_ARCHIVE_BYTES} bytes")
                    partial.write(chunk)
        except aiohttp.ClientError as exc:
            partial_path.unlink(missing_ok=True)
            raise InvalidRequest(f"downloading {url} failed: {exc}") from exc
        except BaseException:
            partial_path.unlink(missing_ok=True)
            raise
    partial_path.replace(target)
    return name
