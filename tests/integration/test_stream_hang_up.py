"""A client that hangs up on a streamed answer (issue 29, defect 7): the handler is told
and stops, or its worker is replaced when it does not; either way the model's next request
is answered. The handler streams without end, so without the cancellation the next request
would wait for ever."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from ferry.grpc.generated import ferry_torchserve_inference_pb2 as inference
from ferry.grpc.generated import ferry_torchserve_inference_pb2_grpc as inference_grpc
from tests.fixtures.models import handler_archive
from tests.fixtures.polling import wait_until
from tests.fixtures.server import RunningServer, ferry_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("hang-up")
    store = tmp / "store"
    store.mkdir()
    archive = handler_archive(store, "endless", "endless_streaming_handler.py", batchSize=1)
    with ferry_server(store, [f"endless={archive}"], tmp, "--cancel-grace", "1") as running:
        yield running


def _pid(server: RunningServer) -> int:
    with server.management() as api:
        return int(api.get("/models/endless").json()[0]["workers"][0]["pid"])


def _read_three_chunks_and_hang_up(server: RunningServer, body: bytes) -> list[bytes]:
    with (
        server.client() as client,
        client.stream("POST", "/predictions/endless", content=body) as response,
    ):
        assert response.status_code == 200
        chunks = []
        for chunk in response.iter_raw():
            chunks.append(chunk)
            if len(chunks) == 3:
                break
    return chunks  # leaving both blocks closes the connection mid-stream


def _next_request_is_answered(server: RunningServer) -> None:
    with server.client() as client:
        response = client.post("/predictions/endless", content=b"2")
    assert response.status_code == 200, response.text
    assert response.text == "done after 2"


def test_a_handler_streaming_to_nobody_is_stopped_and_its_worker_kept(
    server: RunningServer,
) -> None:
    before = _pid(server)
    assert _read_three_chunks_and_hang_up(server, b"tell me everything")
    _next_request_is_answered(server)
    assert _pid(server) == before
    wait_until("the cancellation logged", lambda: "went away; cancelling it" in server.log())


def test_a_handler_that_ignores_the_cancel_loses_its_worker(server: RunningServer) -> None:
    before = _pid(server)
    assert _read_three_chunks_and_hang_up(server, b"stubborn stream")
    _next_request_is_answered(server)
    assert _pid(server) != before
    assert "did not stop within 1s after its clients went away" in server.log()


def test_a_grpc_stream_cancelled_by_its_client_stops_the_handler(server: RunningServer) -> None:
    """TorchServe's ``StreamPredictions``: cancelling the call is the gRPC hang-up."""
    before = _pid(server)
    request = inference.PredictionsRequest(model_name="endless", input={"data": b"go on"})
    with grpc.insecure_channel(server.grpc_url.removeprefix("grpc://")) as channel:
        stub = inference_grpc.InferenceAPIsServiceStub(channel)  # type: ignore[no-untyped-call]
        stream = stub.StreamPredictions(request, timeout=60)
        parts = [next(stream).prediction for _ in range(3)]
        stream.cancel()
    assert parts == [b"token1 ", b"token2 ", b"token3 "]
    _next_request_is_answered(server)
    assert _pid(server) == before
