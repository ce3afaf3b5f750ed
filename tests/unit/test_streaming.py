"""Streamed answers (``send_intermediate_predict_response``): from the handler through the
worker's runner and the dispatcher to the request, in order, never run twice."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from ferry.errors import HandlerFailed, ResponseTimeout, WorkerDied
from ferry.handlers.contract.context import Context, IntermediateResponse
from ferry.handlers.contract.streaming import send_intermediate_predict_response
from ferry.handlers.torchserve.mock_context import MockContext
from ferry.scheduling.jobs import PredictionPart
from ferry.wire.messages import (
    InputPart,
    ItemResult,
    Message,
    PartialResult,
    PredictBatch,
    RequestItem,
)
from ferry.worker.runner import BatchRunner
from tests.fixtures.fake_worker import Behaviour, FakeFactory, make_job, outcomes
from tests.unit.test_scheduling_core import bodies, run, runner_with


def _batch(*bodies: bytes) -> PredictBatch:
    items = [
        RequestItem(f"q{i}", {}, [InputPart("body", "text/plain", body)])
        for i, body in enumerate(bodies)
    ]
    return PredictBatch(7, items)


def _context(tmp_path: Path) -> Context:
    return Context("m", str(tmp_path), {"model": {}}, 4, None)


class StreamingEntry:
    """Streams each request's words one by one, then answers ``done``; a request whose
    body is ``boom`` makes the batch raise after the parts went out."""

    def __call__(self, rows: list[dict[str, Any]], context: Context) -> list[Any]:
        texts = [row["body"] for row in rows]  # text/plain bodies arrive decoded
        words = [text.split() for text in texts]
        for step in range(max(len(w) for w in words)):
            ret = [w[step] if step < len(w) else "" for w in words]
            send_intermediate_predict_response(ret, context.request_ids, "part", 200, context)
        if "boom" in texts:
            raise RuntimeError("failed after streaming")
        return ["done"] * len(rows)


def test_the_runner_sends_each_part_ahead_of_the_result(tmp_path: Path) -> None:
    sent: list[Message] = []
    runner = BatchRunner(StreamingEntry(), _context(tmp_path), sent.append)
    result = runner.run(_batch(b"a b", b"c"))
    assert [r.body for r in result.results] == [b"done", b"done"]
    assert sent == [
        PartialResult(7, "q0", b"a", "text/plain; charset=utf-8", 200),
        PartialResult(7, "q1", b"c", "text/plain; charset=utf-8", 200),
        PartialResult(7, "q0", b"b", "text/plain; charset=utf-8", 200),
        PartialResult(7, "q1", b"", "text/plain; charset=utf-8", 200),
    ]


def test_a_request_that_streamed_is_not_run_again_when_its_batch_fails(tmp_path: Path) -> None:
    """Retrying it alone would send its client the same parts twice."""
    sent: list[Message] = []
    runner = BatchRunner(StreamingEntry(), _context(tmp_path), sent.append)
    result = runner.run(_batch(b"x", b"boom"))
    assert [r.error_kind for r in result.results] == ["handler", "handler"]
    assert all("failed after streaming" in r.message for r in result.results)
    assert len(sent) == 2  # the one step of the batch, never repeated


def test_a_part_for_a_request_outside_the_batch_is_refused(tmp_path: Path) -> None:
    context = _context(tmp_path)
    context.start_batch(["q0"], [{}])
    with pytest.raises(ValueError, match="not in the current batch"):
        send_intermediate_predict_response(["x"], {0: "elsewhere"}, "part", 200, context)
    with pytest.raises(ValueError, match="no request for output 1"):
        send_intermediate_predict_response(["x", "y"], context.request_ids, "part", 200, context)
    with pytest.raises(TypeError, match="needs the handler's context"):
        send_intermediate_predict_response(["x"], context.request_ids, "part", 200)


def test_a_mock_context_keeps_streamed_parts_for_the_handlers_unit_test(tmp_path: Path) -> None:
    context = MockContext(model_pt_file=None, model_dir=str(tmp_path))
    send_intermediate_predict_response(["hello"], context.request_ids, "part", 200, context)
    assert context.intermediate_responses == [
        IntermediateResponse("mock-request-0", "hello", 200, "part")
    ]


class Collected:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def add(self, part: PredictionPart) -> None:
        self.bodies.append(part.body)


def test_parts_reach_their_request_in_order_before_its_answer() -> None:
    async def scenario() -> None:
        runner = runner_with(FakeFactory(Behaviour.STREAM), batch_size=2)
        runner.start()
        await runner.wait_started()
        received = {b"a": Collected(), b"b": Collected()}
        jobs = [make_job(body, on_part=received[body].add) for body in received]
        for job in jobs:
            runner.submit(job)
        assert bodies(await outcomes(jobs)) == [b"a", b"b"]
        assert [c.bodies for c in received.values()] == [[b"part1:", b"part2:"]] * 2
        assert all(job.streamed == 2 for job in jobs)
        await runner.stop()

    run(scenario)


def test_requests_that_streamed_are_answered_not_retried_when_the_worker_dies() -> None:
    """Batch-mates are normally retried one by one on a fresh worker; one that streamed
    parts is answered with the error instead (its client has part of an answer)."""

    async def scenario() -> None:
        factory = FakeFactory(Behaviour.STREAM_THEN_EXIT, Behaviour.ECHO)
        runner = runner_with(factory, batch_size=2)
        runner.start()
        await runner.wait_started()
        parts: list[PredictionPart] = []
        jobs = [make_job(body, on_part=parts.append) for body in (b"a", b"b")]
        for job in jobs:
            runner.submit(job)
        results = await outcomes(jobs)
        assert all(isinstance(r, WorkerDied) for r in results)
        assert len(parts) == 2
        await runner.stop()

    run(scenario)


def test_a_part_for_an_unknown_request_replaces_the_worker_and_answers_the_batch() -> None:
    async def scenario() -> None:
        factory = FakeFactory(Behaviour.STREAM_UNKNOWN, Behaviour.ECHO)
        runner = runner_with(factory)
        runner.start()
        await runner.wait_started()
        job = make_job(b"a")
        runner.submit(job)
        (result,) = await outcomes([job])
        assert isinstance(result, WorkerDied)  # a lone request broke its worker: answered
        assert factory.started[0].killed
        await runner.stop()

    run(scenario)


def test_a_consumer_that_refuses_a_part_fails_only_that_request() -> None:
    async def scenario() -> None:
        runner = runner_with(FakeFactory(Behaviour.STREAM), batch_size=2)
        runner.start()
        await runner.wait_started()

        def refuse(part: PredictionPart) -> None:
            raise HandlerFailed("too much")

        refused = make_job(b"a", on_part=refuse)
        fine = make_job(b"b", on_part=lambda part: None)
        runner.submit(refused)
        runner.submit(fine)
        results = await outcomes([refused, fine])
        assert isinstance(results[0], HandlerFailed)
        assert bodies([results[1]]) == [b"b"]
        await runner.stop()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_item_results_and_parts_round_trip_the_codec() -> None:
    from ferry.wire import codec

    part = PartialResult(3, "r1", b"\x00bytes", "application/octet-stream", 206)
    frame = codec.encode(part)
    assert codec.decode(frame[codec.FRAME_HEADER.size :]) == part
    assert ItemResult("r1", b"", "").status == 0


def test_each_part_restarts_the_response_timeout() -> None:
    """A stream that keeps sending outlives responseTimeout; the clock is injected."""

    async def scenario() -> None:
        now = [0.0]
        runner = runner_with(FakeFactory(Behaviour.STREAM), response_timeout=10.0)
        dispatcher = runner.dispatcher
        dispatcher._clock = lambda: now[0]
        dispatcher.timeouts = dataclasses.replace(dispatcher.timeouts, clock=dispatcher._clock)
        runner.start()
        await runner.wait_started()

        def late_part(part: PredictionPart) -> None:
            now[0] += 9.0  # each part comes 9 s after the last: 18 s in all

        job = make_job(b"a", on_part=late_part)
        runner.submit(job)
        assert bodies(await outcomes([job])) == [b"a"]
        await runner.stop()

    run(scenario)


def test_parts_a_slow_client_has_not_read_are_bounded() -> None:
    from ferry.errors import ResponseTooLarge
    from ferry.service.stream import AnswerStream
    from ferry.service.types import PredictionPart

    async def scenario() -> None:
        events = AnswerStream(max_pending_bytes=10)
        events.on_part(PredictionPart(b"123456", "text/plain", 200, "r"))
        with pytest.raises(ResponseTooLarge, match="fell behind the stream by over 10 bytes"):
            events.on_part(PredictionPart(b"12345", "text/plain", 200, "r"))
        await events.next()  # the client read the first part: room again
        events.on_part(PredictionPart(b"1234567890", "text/plain", 200, "r"))

    asyncio.run(asyncio.wait_for(scenario(), 30))


# --- a client that hangs up on a stream (issue 29, defect 7) -----------------------------


def test_a_stream_whose_clients_went_away_is_cancelled_in_the_worker() -> None:
    """The job's future is cancelled as the HTTP transport does on a hang-up: the next
    part tells the worker, which stops; the same worker serves the next request."""

    async def scenario() -> None:
        factory = FakeFactory(Behaviour.STREAM_FOREVER, Behaviour.ECHO)
        runner = runner_with(factory, batch_size=1, response_timeout=60.0)
        runner.start()
        await runner.wait_started()
        worker = factory.started[0]
        parts = Collected()
        streaming = make_job(b"long", on_part=parts.add)
        runner.submit(streaming)
        while len(parts.bodies) < 3:
            await asyncio.sleep(0)
        streaming.future.cancel()
        while not worker.cancels:
            await asyncio.sleep(0)
        assert worker.cancels == [(worker.batches[0].batch_id, [streaming.item.request_id])]
        worker.behaviour = Behaviour.ECHO
        later = make_job(b"next")
        runner.submit(later)
        assert bodies(await outcomes([later])) == [b"next"]
        assert not worker.killed and len(factory.started) == 1
        await runner.stop()

    run(scenario)


def test_a_worker_that_streams_on_after_the_cancel_is_replaced() -> None:
    async def scenario() -> None:
        factory = FakeFactory(Behaviour.STREAM_FOREVER, Behaviour.ECHO)
        runner = runner_with(factory, batch_size=1, response_timeout=60.0, cancel_grace=0.01)
        runner.start()
        await runner.wait_started()
        stubborn = factory.started[0]
        stubborn.ignores_cancel = True
        parts = Collected()
        streaming = make_job(b"long", on_part=parts.add)
        runner.submit(streaming)
        while not parts.bodies:
            await asyncio.sleep(0)
        streaming.future.cancel()
        later = make_job(b"next")
        runner.submit(later)
        assert bodies(await outcomes([later])) == [b"next"]
        assert stubborn.killed and len(factory.started) == 2
        await runner.stop()

    run(scenario)


def test_a_batch_mate_still_read_keeps_the_stream_going() -> None:
    """One of two clients hangs up: its parts are dropped and the worker told, but the
    batch is not abandoned, so nothing is killed."""

    async def scenario() -> None:
        factory = FakeFactory(Behaviour.STREAM_FOREVER)
        runner = runner_with(factory, batch_size=2, response_timeout=60.0, cancel_grace=0.01)
        kept_parts, gone_parts = Collected(), Collected()
        kept = make_job(b"kept", on_part=kept_parts.add)
        gone = make_job(b"gone", on_part=gone_parts.add)
        runner.start()
        await runner.wait_started()
        runner.submit(kept)  # together, before the dispatcher runs: one batch
        runner.submit(gone)
        while not gone_parts.bodies:
            await asyncio.sleep(0)
        gone.future.cancel()
        worker = factory.started[0]
        while not worker.cancels:
            await asyncio.sleep(0)
        before = len(kept_parts.bodies)
        while len(kept_parts.bodies) < before + 5:
            await asyncio.sleep(0)
        assert worker.cancels == [(worker.batches[0].batch_id, [gone.item.request_id])]
        assert not worker.killed and not kept.future.done()
        await runner.stop()

    run(scenario)


def test_a_stream_past_stream_timeout_ends_with_a_timeout() -> None:
    """Each part restarts responseTimeout; stream_timeout bounds the whole stream."""

    async def scenario() -> None:
        factory = FakeFactory(Behaviour.STREAM_FOREVER, Behaviour.ECHO)
        runner = runner_with(factory, batch_size=1, response_timeout=60.0, stream_timeout=0.01)
        runner.start()
        endless = make_job(b"long", on_part=Collected().add)
        runner.submit(endless)
        (result,) = await outcomes([endless])
        assert isinstance(result, ResponseTimeout) and "stream_timeout" in str(result)
        assert factory.started[0].killed
        await runner.stop()

    run(scenario)


def _streaming_handler(data: list[Any], context: Context) -> list[Any]:
    ids = context.request_ids
    for _ in range(1000):
        send_intermediate_predict_response(["t"] * len(data), ids, "ok", 200, context)
    return ["end"] * len(data)


def test_the_handler_is_stopped_once_every_client_of_its_batch_went_away(
    tmp_path: Path,
) -> None:
    sent: list[Message] = []
    runner = BatchRunner(_streaming_handler, _context(tmp_path), sent.append)
    gone = {"q0", "q1"}

    def cancelled(batch_id: int, request_id: str) -> bool:
        return batch_id == 7 and request_id in gone and len(sent) >= 4

    result = runner.run(_batch(b"a", b"b"), cancelled)
    assert len(sent) == 4, "parts stop at the first send after the cancel"
    assert all(r.error_kind == "handler" and "went away" in r.message for r in result.results)


def test_parts_for_a_request_whose_client_alone_went_away_are_dropped(tmp_path: Path) -> None:
    sent: list[Message] = []
    runner = BatchRunner(_streaming_handler, _context(tmp_path), sent.append)
    result = runner.run(_batch(b"a", b"b"), lambda batch_id, request_id: request_id == "q0")
    assert {m.request_id for m in sent if isinstance(m, PartialResult)} == {"q1"}
    assert len(sent) == 1000
    assert [r.body for r in result.results] == [b"end", b"end"]
    assert _context(tmp_path).is_cancelled("q0") is False
