"""Each request read through its own protocol's envelope (``RequestItem.envelope``) where
no ``service_envelope`` is set: the worker's runner splits a batch that mixes envelopes
into one handler call per envelope and answers every request in its place."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.contract.context import Context
from ferry.handlers.torchserve.request_envelope import PerRequestEnvelopes
from ferry.wire.messages import InputPart, PredictBatch, RequestItem
from ferry.worker.loading import reads_envelopes
from ferry.worker.runner import BatchRunner


class RowsHandler:
    """Records each call's request ids and rows; answers each row with its ``data`` (or
    ``body``) doubled (a raw body upper-cased, a document as it is); a row whose value is
    ``"bad"`` fails its call."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[Any]]] = []

    def __call__(self, rows: list[Any], context: Context) -> list[Any]:
        self.calls.append((list(context.request_ids.values()), rows))
        if any(self._value(row) == "bad" for row in rows):
            raise ValueError("a bad row")
        return [self._answer(self._value(row)) for row in rows]

    @staticmethod
    def _value(row: Any) -> Any:
        return row.get("data") if "data" in row else row.get("body")

    @staticmethod
    def _answer(value: Any) -> Any:
        if isinstance(value, bytearray):
            return bytes(value).upper()
        if isinstance(value, list):
            return [v * 2 for v in value]
        return value * 2 if isinstance(value, int) else value


def _raw(rid: str, body: bytes) -> RequestItem:
    """A TorchServe ``/predictions`` request: the raw body, no envelope."""
    return RequestItem(rid, {}, [InputPart("body", "application/octet-stream", body)])


def _v1(rid: str, *values: Any, headers: dict[str, str] | None = None) -> RequestItem:
    body = json.dumps({"instances": [{"data": v} for v in values]}).encode()
    return RequestItem(rid, headers or {}, [InputPart("body", "application/json", body)], "kserve")


def _v2(rid: str, value: int) -> RequestItem:
    document = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [value]}]}
    body = json.dumps(document).encode()
    return RequestItem(rid, {}, [InputPart("body", "application/json", body)], "kservev2")


def _runner(handler: RowsHandler, *, per_request: bool = True) -> BatchRunner:
    context = Context("m", "/", {"model": {"modelName": "m", "modelVersion": "3.0"}}, 8, None)
    envelopes = PerRequestEnvelopes(handler) if per_request else None
    return BatchRunner(handler, context, envelopes=envelopes)


def test_a_mixed_batch_calls_the_handler_once_per_envelope_and_answers_in_order() -> None:
    handler = RowsHandler()
    batch = PredictBatch(
        1,
        [_raw("t1", b"png"), _v1("a", 1, 2), _v2("b", 5), _raw("t2", b"jpg"), _v1("c", 3)],
    )
    results = _runner(handler).run(batch).results
    # One call per envelope, in the order each first appears; each with its own ids.
    assert [ids for ids, _ in handler.calls] == [["t1", "t2"], ["a", "c"], ["b"]]
    raw_rows, v1_rows, v2_rows = (rows for _, rows in handler.calls)
    # TorchServe's rows as they always were: the body, undecoded, as a bytearray.
    assert raw_rows == [{"body": bytearray(b"png")}, {"body": bytearray(b"jpg")}]
    assert all(type(row["body"]) is bytearray for row in raw_rows)
    assert v1_rows == [{"data": 1}, {"data": 2}, {"data": 3}]  # every instance a row
    assert v2_rows == [{"name": "x", "shape": [1], "datatype": "INT64", "data": [5]}]
    assert [r.request_id for r in results] == ["t1", "a", "b", "t2", "c"]
    assert all(r.error_kind == "" for r in results)
    bodies = [r.body for r in results]
    assert bodies[0] == b"PNG" and bodies[3] == b"JPG"
    assert json.loads(bodies[1]) == {"predictions": [2, 4]}
    assert json.loads(bodies[4]) == {"predictions": [6]}
    v2 = json.loads(bodies[2])
    assert v2["id"] == "b" and v2["model_name"] == "m" and v2["model_version"] == "3.0"
    assert v2["outputs"] == [{"name": "x", "datatype": "INT64", "data": [10], "shape": [1]}]


def test_a_group_that_fails_retries_its_own_requests_alone() -> None:
    """One bad V1 request fails alone; its envelope's other request and the other
    envelope's requests are answered."""
    handler = RowsHandler()
    batch = PredictBatch(2, [_v1("a", 1), _raw("t", b"ok"), _v1("bad", "bad"), _v2("b", 2)])
    results = _runner(handler).run(batch).results
    assert [r.request_id for r in results] == ["a", "t", "bad", "b"]
    assert [r.error_kind for r in results] == ["", "", "handler", ""]
    assert "a bad row" in results[2].message
    assert json.loads(results[0].body) == {"predictions": [2]} and results[1].body == b"OK"
    # The V1 group failed together, then each of its requests ran alone.
    assert [ids for ids, _ in handler.calls] == [["a", "bad"], ["a"], ["bad"], ["t"], ["b"]]


def test_each_group_reads_its_own_requests_headers() -> None:
    """An explanation asked over V1 is answered as one (the envelope reads the request's
    ``explain`` header at its index within its own group)."""
    handler = RowsHandler()
    explain = _v1("e", 4, headers={"explain": "True"})
    batch = PredictBatch(3, [_raw("t", b"x"), explain])
    _, explained = _runner(handler).run(batch).results
    assert json.loads(explained.body) == {"explanations": [8]}


def test_an_unknown_envelope_fails_only_its_requests() -> None:
    handler = RowsHandler()
    odd = RequestItem("o", {}, [InputPart("body", "application/json", b"{}")], "nope")
    results = _runner(handler).run(PredictBatch(4, [_raw("t", b"x"), odd])).results
    assert results[0].body == b"X"
    assert results[1].error_kind == "handler" and "unknown request envelope" in results[1].message


def test_without_per_request_envelopes_the_whole_batch_is_one_call() -> None:
    """A worker with ``service_envelope`` (or a handler that reads the documents itself)
    calls its one entry point with every request of the batch, whatever they name."""
    handler = RowsHandler()
    batch = PredictBatch(5, [_raw("t", b"x"), _v1("a", 1)])
    results = _runner(handler, per_request=False).run(batch).results
    assert [ids for ids, _ in handler.calls] == [["t", "a"]]
    assert handler.calls[0][1][1] == {"body": {"instances": [{"data": 1}]}}  # the document
    assert [r.error_kind for r in results] == ["", ""]


def test_a_batch_of_one_envelope_is_one_call() -> None:
    handler = RowsHandler()
    results = _runner(handler).run(PredictBatch(6, [_v2("a", 1), _v2("b", 2)])).results
    assert [ids for ids, _ in handler.calls] == [["a", "b"]]
    assert [json.loads(r.body)["outputs"][0]["data"] for r in results] == [[2], [4]]


def test_stage_times_add_up_over_the_calls_of_a_batch() -> None:
    def timed(rows: list[Any], context: Context) -> list[Any]:
        context.add_stage_time("inference", 2.0)
        return ["ok"] * len(rows)

    context = Context("m", "/", {}, 8, None)
    runner = BatchRunner(timed, context, envelopes=PerRequestEnvelopes(timed))
    result = runner.run(PredictBatch(7, [_raw("t", b"x"), _v1("a", 1), _v2("b", 1)]))
    assert result.stage_ms == {"inference": 6.0}
    assert runner.run(PredictBatch(8, [_raw("t", b"x")])).stage_ms == {"inference": 2.0}


def test_per_request_envelopes_wrap_once_per_envelope() -> None:
    handler = RowsHandler()
    envelopes = PerRequestEnvelopes(handler)
    assert envelopes("") is handler
    kserve = envelopes("kserve")
    assert kserve is not handler and envelopes("kserve") is kserve
    assert envelopes("kservev2") is not kserve
    with pytest.raises(ValueError, match="unknown request envelope 'nope'"):
        envelopes("nope")


class _TorchServeStyle(BaseHandler):
    pass


class _OwnClass:
    def handle(self, data: Any, context: Context) -> Any:
        return data


def test_only_torchserves_handlers_read_protocols_through_envelopes() -> None:
    assert reads_envelopes(_TorchServeStyle())
    assert not reads_envelopes(_OwnClass())
    assert not reads_envelopes(None)  # a function handler
