"""A batch of several requests through ``SageMakerHandler``: the inputs that stack go
through one ``predict_fn`` call, and every request gets exactly the answer it gets alone."""

from __future__ import annotations

import dataclasses
import doctest
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ferry.handlers.contract.context import Context
from ferry.handlers.sagemaker import batching
from ferry.handlers.sagemaker.functions import with_default_transform
from ferry.handlers.sagemaker.handler import SageMakerHandler
from tests.fixtures.sagemaker_handlers import (  # noqa: F401 (an autouse fixture)
    fresh_inference_module,
    loaded_handler,
)
from tests.fixtures.sagemaker_models import mnist_model, transform_model

JSON = {"content-type": "application/json"}
NPY = {"content-type": "application/x-npy", "accept": "application/x-npy"}


def _loaded(folder: Path) -> tuple[SageMakerHandler, Context]:
    return loaded_handler(folder, batch_size=8)


def _run(
    handler: SageMakerHandler, context: Context, requests: list[tuple[Any, dict[str, str]]]
) -> list[tuple[int, Any]]:
    """Each request's status and answer."""
    context.start_batch([f"r{i}" for i in range(len(requests))], [h for _, h in requests])
    answers = handler.handle([{"body": body} for body, _ in requests], context)
    return [(context.get_response_status(i)[0], a) for i, a in enumerate(answers)]


def _serve_with(handler: SageMakerHandler, predict_fn: Callable[..., Any]) -> None:
    """``predict_fn`` in place of the handler's, alone and in batches."""
    assert handler.functions is not None
    handler.functions = with_default_transform(
        dataclasses.replace(handler.functions, predict_fn=predict_fn)
    )


def _counting(handler: SageMakerHandler) -> list[int]:
    """Wraps the handler's ``predict_fn``; the list gets each call's row count."""
    assert handler.functions is not None
    calls: list[int] = []
    predict: Callable[..., Any] = handler.functions.predict_fn

    def predict_fn(data: Any, model: Any) -> Any:
        calls.append(int(data.shape[0]) if isinstance(data, torch.Tensor) else -1)
        return predict(data, model)

    _serve_with(handler, predict_fn)
    return calls


def _npy(array: np.ndarray[Any, Any]) -> bytes:
    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


def _mixed_batch() -> list[tuple[Any, dict[str, str]]]:
    generator = np.random.default_rng(7)
    images = [generator.random((rows, 1, 28, 28), dtype=np.float32) for rows in (1, 3, 2, 1)]
    return [
        (json.dumps(images[0].tolist()), JSON),  # float32 (1, 1, 28, 28)
        (_npy(images[1]), NPY),  # float32 (3, 1, 28, 28): stacks with the first
        (b"[[1, 2", JSON),  # input_fn fails: this request alone
        (json.dumps(images[2].reshape(2, 784).tolist()), JSON),  # (2, 784)
        (_npy(images[3].reshape(1, 784)), NPY),  # stacks with the (2, 784)
        (_npy(images[3].astype(np.float64)), NPY),  # float64: alone (the model refuses it)
    ]


def _decoded(answer: Any) -> Any:
    if bytes(answer).startswith(b"\x93NUMPY"):
        return np.load(io.BytesIO(answer))
    return json.loads(answer)


def test_a_batch_predicts_stacked_inputs_once_and_answers_each_as_alone(tmp_path: Path) -> None:
    handler, context = _loaded(mnist_model(tmp_path / "m"))
    requests = _mixed_batch()
    alone = [_run(handler, context, [request])[0] for request in requests]
    calls = _counting(handler)
    together = _run(handler, context, requests)
    assert sorted(calls) == [1, 3, 4]  # (1 + 3) and (2 + 1) stacked; the float64 alone
    assert [status for status, _ in together] == [200, 200, 500, 200, 200, 500]
    for (status, answer), (_, expected) in zip(together, alone, strict=True):
        if status != 200:
            assert answer == expected  # the same error, word for word
            continue
        assert np.allclose(_decoded(answer), _decoded(expected), atol=1e-5)
    assert [len(_decoded(together[i][1])) for i in (0, 1, 3, 4)] == [1, 3, 2, 1]


def test_a_failing_stacked_call_lets_each_request_run_and_answer_alone(tmp_path: Path) -> None:
    handler, context = _loaded(mnist_model(tmp_path / "m"))
    assert handler.functions is not None
    predict = handler.functions.predict_fn

    def refuses_nan(data: torch.Tensor, model: Any) -> Any:
        if torch.isnan(data).any():
            raise ValueError("NaN in the input")
        return predict(data, model)

    _serve_with(handler, refuses_nan)
    calls = _counting(handler)
    good, bad = np.zeros((1, 1, 28, 28)), np.full((1, 1, 28, 28), np.nan, dtype=np.float32)
    together = _run(handler, context, [(json.dumps(good.tolist()), JSON), (_npy(bad), NPY)])
    assert together[0][0] == 200 and len(json.loads(together[0][1])) == 1
    assert together[1] == (500, "NaN in the input")
    assert calls == [2, 1, 1]
    assert handler.predicts_together  # a failure is no reason to stop stacking


def test_a_prediction_not_one_row_per_input_row_stops_stacking(tmp_path: Path) -> None:
    handler, context = _loaded(mnist_model(tmp_path / "m"))
    assert handler.functions is not None
    predict = handler.functions.predict_fn
    _serve_with(handler, lambda data, model: predict(data, model).sum(dim=0))
    calls = _counting(handler)
    images = [np.full((1, 1, 28, 28), value, dtype=np.float32) for value in (0.0, 1.0)]
    requests = [(json.dumps(image.tolist()), JSON) for image in images]
    alone = [_run(handler, context, [request])[0] for request in requests]
    assert _run(handler, context, requests) == alone
    assert calls == [1, 1, 2, 1, 1]  # alone twice, stacked once, then each again
    assert not handler.predicts_together
    _run(handler, context, requests)
    assert calls[5:] == [1, 1]


def test_a_transform_fn_of_the_modules_own_runs_each_request_alone(tmp_path: Path) -> None:
    handler, context = _loaded(transform_model(tmp_path / "m"))
    octets = {"content-type": "application/octet-stream"}
    answers = _run(handler, context, [(b"\x01", octets), (b"\x02\x03", octets)])
    assert [json.loads(answer) for _, answer in answers] == [
        {"bytes": 1, "sum": 1.0},
        {"bytes": 2, "sum": 5.0},
    ]


def test_what_stacks_and_what_splits_back() -> None:
    assert doctest.testmod(batching).failed == 0
    inputs: dict[int, Any] = {
        0: torch.ones(2, 3),
        1: torch.ones(1, 3, dtype=torch.float64),
        2: torch.ones(5, 3),
        3: np.ones((1, 3)),
        4: torch.ones(3),
        5: torch.ones(1, 3, dtype=torch.float64),
        6: torch.ones(1, 4),
    }
    assert batching.stackable_groups(inputs) == [[0, 2], [1, 5]]
    assert batching.split_rows(torch.zeros(7, 2), [2, 5]) is not None
    assert batching.split_rows(torch.zeros(6, 2), [2, 5]) is None
    assert batching.split_rows(torch.tensor(1.0), [1, 1]) is None
    assert batching.split_rows([[0.0]] * 2, [1, 1]) is None
