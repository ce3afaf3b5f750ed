"""The default JSON / CSV / NPY formats of SageMaker's input_fn and output_fn."""

from __future__ import annotations

import io

import numpy as np
import pytest

from ferry.handlers.sagemaker import codecs
from ferry.handlers.sagemaker.codecs import UnsupportedFormat, choose_accept, decode, encode


def _npy(array: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


def test_json_decodes_to_an_array_from_bytes_or_text() -> None:
    assert decode(b"[[1, 2], [3, 4]]", "application/json").tolist() == [[1, 2], [3, 4]]
    assert decode("[0.5]", "application/json").tolist() == [0.5]


def test_csv_decodes_rows_of_floats() -> None:
    array = decode("1,2,3\n4,5,6\n", "text/csv")
    assert array.shape == (2, 3)
    assert array.dtype == np.float64
    assert decode(b"7,8", "text/csv").tolist() == [7.0, 8.0]


def test_npy_keeps_shape_and_dtype() -> None:
    original = np.arange(6, dtype=np.int16).reshape(2, 3)
    array = decode(_npy(original), "application/x-npy")
    assert array.dtype == np.int16
    assert array.tolist() == original.tolist()


def test_npy_never_unpickles_an_object_array() -> None:
    payload = _npy(np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        decode(payload, "application/x-npy")


def test_parameters_and_case_of_the_media_type_are_ignored() -> None:
    assert decode(b"[1]", "Application/JSON; charset=utf-8").tolist() == [1]


@pytest.mark.parametrize("content_type", ["image/png", "application/x-npz", "", None])
def test_other_types_are_unsupported_naming_the_type(content_type: str | None) -> None:
    with pytest.raises(UnsupportedFormat, match="define input_fn or output_fn") as raised:
        decode(b"x", content_type)
    assert raised.value.content_type == (content_type or "(none)")


def test_json_encodes_arrays_and_nested_lists() -> None:
    assert encode(np.array([[1.5, 2.0]]), "application/json") == b"[[1.5, 2.0]]"
    assert encode({"scores": np.float32(0.5)}, "application/json") == b'{"scores": 0.5}'


def test_csv_encodes_one_line_per_row() -> None:
    assert encode([[1, 2], [3, 4]], "text/csv") == b"1,2\n3,4\n"
    assert encode([1.5, 2.5], "text/csv") == b"1.5\n2.5\n"


def test_npy_round_trips() -> None:
    data = [[1.0, 2.0], [3.0, 4.0]]
    assert np.load(io.BytesIO(encode(data, "application/x-npy"))).tolist() == data


def test_encoding_an_unknown_type_is_unsupported() -> None:
    with pytest.raises(UnsupportedFormat):
        encode([1], "application/xml")


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        ("text/csv", codecs.CSV),
        ("application/xml, application/x-npy", codecs.NPY),
        ("application/json;q=0.9", codecs.JSON),
        ("image/png, */*", codecs.JSON),
    ],
)
def test_the_first_writable_accept_type_wins(accept: str, chosen: str) -> None:
    assert choose_accept(accept) == chosen


def test_an_accept_list_with_nothing_writable_is_unsupported_naming_the_header() -> None:
    with pytest.raises(UnsupportedFormat) as raised:
        choose_accept("image/png, application/xml")
    assert raised.value.content_type == "image/png, application/xml"
