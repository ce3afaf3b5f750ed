"""The HTTP target for ``ferry bench load``: a POST of the payload to the URL (any REST API),
over one ``aiohttp`` session."""

from __future__ import annotations

import aiohttp

from ferry_bench.target_types import REQUEST_TIMEOUT_S, Answer, NoAnswer, TargetSpec


class HttpTarget:
    protocol = "http"

    def __init__(self, spec: TargetSpec) -> None:
        self._url = spec.url
        self._payloads = spec.payloads
        self._headers = {"Content-Type": spec.content_type}
        if spec.token:
            self._headers["Authorization"] = f"Bearer {spec.token}"
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=spec.connections, ssl=False),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        )

    async def send(self, index: int) -> Answer:
        payload = self._payloads[index % len(self._payloads)]
        try:
            async with self._session.post(
                self._url, data=payload, headers=self._headers
            ) as response:
                return Answer(response.status, await response.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise NoAnswer(type(exc).__name__, str(exc)) from exc

    async def close(self) -> None:
        await self._session.close()
