"""TorchServe's request envelopes as Ferry runs them: TorchServe's rows for one request,
and every request's own share of the answers when several share a batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ferry.handlers.contract.context import Context
from ferry.handlers.torchserve.request_envelope import wrap


def _context(tmp_path: Path, count: int, headers: dict[str, str] | None = None) -> Context:
    manifest = {"model": {"modelName": "mnist", "modelVersion": "2.0"}}
    context = Context("mnist", str(tmp_path), manifest, 4, None)
    context.start_batch([f"r{i}" for i in range(count)], [headers or {} for _ in range(count)])
    return context


class Recorder:
    def __init__(self, answer: Any = None) -> None:
        self.rows: list[Any] = []
        self.answer = answer

    def __call__(self, rows: list[Any], context: Context) -> list[Any]:
        self.rows = rows
        return self.answer(rows) if callable(self.answer) else rows


def test_body_passes_each_body_through(tmp_path: Path) -> None:
    handler = Recorder()
    out = wrap(handler, "body")([{"body": b"a"}, {"data": {"x": 1}}], _context(tmp_path, 2))
    assert handler.rows == [b"a", {"x": 1}] and out == [b"a", {"x": 1}]


def test_json_decodes_b64_and_splits_predictions(tmp_path: Path) -> None:
    handler = Recorder(lambda rows: [len(rows)] * len(rows))
    data = [
        {"body": json.dumps({"instances": [{"a": 1}, {"a": 2}]}).encode()},
        {"body": {"instances": [{"b64": "aGk="}]}},
    ]
    out = wrap(handler, "json")(data, _context(tmp_path, 2))
    assert handler.rows == [{"a": 1}, {"a": 2}, b"hi"]
    assert [json.loads(o) for o in out] == [{"predictions": [3, 3]}, {"predictions": [3]}]


def test_kserve_passes_instances_and_wraps_predictions(tmp_path: Path) -> None:
    handler = Recorder(lambda rows: [row["data"] * 2 for row in rows])
    body = {"instances": [{"data": 1}, {"data": 2}]}
    out = wrap(handler, "kserve")([{"body": body}], _context(tmp_path, 1))
    assert out == [{"predictions": [2, 4]}]
    explained = wrap(handler, "kserve")(
        [{"body": body}], _context(tmp_path, 1, {"explain": "True"})
    )
    assert explained == [{"explanations": [2, 4]}]


def test_kserve_refuses_a_body_without_instances(tmp_path: Path) -> None:
    from ferry.errors import InvalidInput

    with pytest.raises(InvalidInput, match="instances"):
        wrap(Recorder(), "kserve")([{"body": {"inputs": []}}], _context(tmp_path, 1))


def test_kservev2_rows_are_input_tensors_shaped(tmp_path: Path) -> None:
    handler = Recorder(lambda rows: [[[1.0], [2.0]] for _ in rows])
    request = {
        "id": "abc",
        "inputs": [
            {"name": "input-0", "shape": [1, 2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}
        ],
    }
    out = wrap(handler, "kservev2")([{"body": request}], _context(tmp_path, 1))
    assert handler.rows[0]["data"] == [[[1, 2], [3, 4]]]
    assert out == [
        {
            "id": "abc",
            "model_name": "mnist",
            "model_version": "2.0",
            "outputs": [{"name": "input-0", "datatype": "FP64", "data": [1.0, 2.0], "shape": [2]}],
        }
    ]


def test_kservev2_batches_requests_and_splits_answers(tmp_path: Path) -> None:
    handler = Recorder(lambda rows: [i for i, _ in enumerate(rows)])
    one = {"inputs": [{"name": "a", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
    two = {
        "inputs": [
            {"name": "b", "shape": [1], "datatype": "INT64", "data": [1]},
            {"name": "c", "shape": [-1], "datatype": "INT64", "data": [1, 2]},
        ]
    }
    out = wrap(handler, "kservev2")([{"body": one}, {"body": two}], _context(tmp_path, 2))
    assert handler.rows[0]["data"] == "x"  # BYTES: the first element, as TorchServe
    assert handler.rows[2]["data"] == [1, 2]
    assert [o["id"] for o in out] == ["r0", "r1"]  # the request ids when none was sent
    assert [[t["name"] for t in o["outputs"]] for o in out] == [["a"], ["b", "c"]]
    assert [[t["data"] for t in o["outputs"]] for o in out] == [[[0]], [[1], [2]]]


def test_a_handler_answering_the_wrong_count_fails_the_batch(tmp_path: Path) -> None:
    handler = Recorder(lambda rows: rows[:1])
    data = [{"body": {"instances": [1]}}, {"body": {"instances": [2]}}]
    with pytest.raises(ValueError, match="answered 1 rows for 2 inputs"):
        wrap(handler, "kserve")(data, _context(tmp_path, 2))


def test_a_body_that_is_not_json_is_a_client_error(tmp_path: Path) -> None:
    from ferry.errors import InvalidInput

    with pytest.raises(InvalidInput, match="expects a JSON body"):
        wrap(Recorder(), "kservev2")([{"body": b"\x89PNG"}], _context(tmp_path, 1))


@pytest.mark.parametrize("envelope", ["json", "kserve", "kservev2"])
def test_a_row_the_handler_failed_fails_only_its_own_request(tmp_path: Path, envelope: str) -> None:
    from ferry.errors import InvalidInput

    bad = InvalidInput("row 1 is not an image")
    handler = Recorder(lambda rows: [bad if i == 1 else i for i, _ in enumerate(rows)])
    if envelope == "kservev2":
        bodies: list[Any] = [
            {"inputs": [{"name": "a", "shape": [1], "datatype": "INT64", "data": [v]}]}
            for v in (1, 2, 3)
        ]
    else:
        bodies = [{"instances": [v]} for v in (1, 2, 3)]
    out = wrap(handler, envelope)([{"body": b} for b in bodies], _context(tmp_path, 3))
    assert out[1] is bad  # the runner answers it as that error (a 400)
    assert not isinstance(out[0], BaseException) and not isinstance(out[2], BaseException)
