"""Bodies built to break decoding (issue 29): JSON nested a hundred thousand deep on every
inference path, and V2 tensors that claim more elements than a request may hold. Each gets
a 400 or 413 for itself alone; the worker that would have decoded it keeps serving."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.fixtures.models import digest_archive, handler_archive
from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer, ferry_server, worker_pid

DEEP = b"[" * 100_000 + b"]" * 100_000
"""200 KB of nested lists: past any recursion limit of the parser."""
MAX_ELEMENTS = 4096
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("hostile-bodies")
    store = tmp / "store"
    store.mkdir()
    models = [
        f"digest={digest_archive(store, 'digest', batchSize=8, maxBatchDelay=200)}",
        f"tensors={handler_archive(store, 'tensors', 'v2_tensor_handler.py', batchSize=1)}",
    ]
    limit = ["--max-tensor-elements", str(MAX_ELEMENTS)]
    with ferry_server(store, models, tmp, *limit) as running:
        yield running


def _pids(server: RunningServer) -> tuple[int, int]:
    return worker_pid(server, "digest"), _tensor_worker_pid(server)


def _tensor_worker_pid(server: RunningServer) -> int:
    with server.management() as api:
        return int(api.get("/models/tensors").json()[0]["workers"][0]["pid"])


@pytest.mark.parametrize(
    "path",
    ["/predictions/digest", "/v2/models/tensors/infer", "/v1/models/tensors:predict"],
)
def test_json_nested_past_the_parser_is_400_and_the_worker_lives(
    server: RunningServer, path: str
) -> None:
    before = _pids(server)
    with server.client() as client:
        response = client.post(path, content=DEEP, headers=JSON)
    assert response.status_code == 400, response.text
    assert "nested too deeply" in response.text
    assert _pids(server) == before
    assert "Traceback" not in server.log(), "a decode failure is one line, not a traceback"


def test_a_deep_form_field_is_400(server: RunningServer) -> None:
    files = {"data": ("deep.json", DEEP, "application/json")}
    before = _pids(server)
    with server.client() as client:
        response = client.post("/predictions/digest", files=files)
    assert "nested too deeply" in assert_error(response, 400, "BadRequestException")
    assert _pids(server) == before


def test_a_deep_body_fails_alone_among_batch_mates(server: RunningServer) -> None:
    """Eight requests in one window of 200 ms: the deep one gets 400, the rest 200 from the
    same worker (it used to die and take them with it, re-run with the poison)."""
    bodies = [DEEP if i == 3 else f"fine-{i}".encode() for i in range(8)]
    before = worker_pid(server, "digest")

    def send(body: bytes) -> int:
        headers = JSON if body == DEEP else {}
        with server.client() as client:
            return client.post("/predictions/digest", content=body, headers=headers).status_code

    with ThreadPoolExecutor(len(bodies)) as pool:
        statuses = list(pool.map(send, bodies))
    assert statuses == [400 if i == 3 else 200 for i in range(8)]
    assert worker_pid(server, "digest") == before


def _binary_request(datatype: str, shape: list[int], raw: bytes) -> tuple[bytes, dict[str, str]]:
    header = (
        f'{{"inputs": [{{"name": "x", "datatype": "{datatype}", "shape": {shape}, '
        f'"parameters": {{"binary_data_size": {len(raw)}}}}}]}}'
    ).encode()
    headers = {"inference-header-content-length": str(len(header))}
    return header + raw, headers


def test_binary_tensors_reach_the_handler_as_lists(server: RunningServer) -> None:
    body, headers = _binary_request("UINT8", [4], bytes([1, 2, 3, 4]))
    with server.client() as client:
        response = client.post("/v2/models/tensors/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [2, 4, 6, 8]


def test_tensors_over_the_element_limit_are_413_before_decoding(server: RunningServer) -> None:
    """The issue's 6,000,000 BOOLs in 6 MB, against a limit of 4096 elements (the data
    itself is sent short: the declared shape alone is refused)."""
    body, headers = _binary_request("BOOL", [6_000_000], b"\x01" * 64)
    with server.client() as client:
        response = client.post("/v2/models/tensors/infer", content=body, headers=headers)
    assert response.status_code == 413, response.text
    assert "max_tensor_elements" in response.json()["error"]


def test_json_tensors_over_the_element_limit_are_413(server: RunningServer) -> None:
    count = MAX_ELEMENTS + 1
    body = (
        f'{{"inputs": [{{"name": "x", "datatype": "INT8", "shape": [{count}], '
        f'"data": {[0] * count}}}]}}'
    ).encode()
    with server.client() as client:
        response = client.post("/v2/models/tensors/infer", content=body, headers=JSON)
    assert response.status_code == 413, response.text


def test_fp16_and_bf16_bytes_unpack_as_floats(server: RunningServer) -> None:
    bf16 = struct.pack("<2H", 0x3FC0, 0xC000)  # 1.5, -2.0 as the top halves of float32
    for datatype, raw in (("FP16", struct.pack("<2e", 1.5, -2.0)), ("BF16", bf16)):
        body, headers = _binary_request(datatype, [2], raw)
        with server.client() as client:
            response = client.post("/v2/models/tensors/infer", content=body, headers=headers)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [3.0, -4.0]
