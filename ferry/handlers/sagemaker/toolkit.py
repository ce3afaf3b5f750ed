"""What an ``inference.py`` imports from AWS's toolkits, served by Ferry's own code: the
``sagemaker_inference`` modules (``content_types``, ``decoder``, ``encoder``, ``errors``,
``utils``, ``default_inference_handler``) and the PyTorch toolkit's
``sagemaker_pytorch_serving_container.default_pytorch_inference_handler``. The import
shims under ``ferry/_compat`` re-export these names; a worker serving a SageMaker model
puts them on ``sys.path`` when the real packages are not installed (``add_shims``).

They keep the toolkit's shapes: ``encoder.encode`` gives ``str`` for JSON and CSV and
bytes for NPY; ``decoder.decode`` and ``encoder.encode`` raise ``UnsupportedFormatError``
for another type; ``default_output_fn`` gives ``(body, content_type)``. Where Ferry's
defaults differ (NPY never unpickled, types compared without parameters) they differ here
too, as docs/sagemaker.md lists.

    >>> encode([[1, 2]], JSON)
    '[[1, 2]]'
    >>> decode("1,2", CSV).tolist()
    [1.0, 2.0]
"""

from __future__ import annotations

import importlib.util
import io
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ferry.handlers.sagemaker import codecs

JSON = codecs.JSON
CSV = codecs.CSV
OCTET_STREAM = "application/octet-stream"
ANY = codecs.ANY
NPY = codecs.NPY
NPZ = "application/x-npz"
UTF8_TYPES = [JSON, CSV]
SUPPORTED_CONTENT_TYPES = {JSON, CSV, NPY}
"""What ``encode`` writes (the toolkit's ``encoder.SUPPORTED_CONTENT_TYPES``)."""

SHIM_ROOT = Path(__file__).resolve().parents[2] / "_compat"
"""The folder holding the ``sagemaker_inference`` and
``sagemaker_pytorch_serving_container`` shims (beside TorchServe's ``ts``)."""
SHIMMED_PACKAGES = ("sagemaker_inference", "sagemaker_pytorch_serving_container")


def add_shims() -> None:
    """Put the shims last on ``sys.path`` unless both packages are installed (an installed
    one, earlier on the path, still wins over its shim)."""
    if all(importlib.util.find_spec(name) is not None for name in SHIMMED_PACKAGES):
        return
    if str(SHIM_ROOT) not in sys.path:
        sys.path.append(str(SHIM_ROOT))


class UnsupportedFormatError(Exception):
    """A content type the toolkit's decoder or encoder does not read or write (the
    handler answers it 500, as the toolkit)."""

    def __init__(self, content_type: str, **kwargs: Any) -> None:
        self._message = (
            f"Content type {content_type} is not supported by this framework. Implement "
            "input_fn to deserialize the request data or output_fn to serialize the response."
        )
        super().__init__(self._message, **kwargs)


class BaseInferenceToolkitError(Exception):
    """An error answered with its ``status_code`` and ``message`` (the handler reads them:
    ``ferry.handlers.sagemaker.handler.error_answer``); ``phrase`` as the toolkit keeps it."""

    def __init__(self, status_code: int, message: str, phrase: str) -> None:
        self.status_code = status_code
        self.message = message
        self.phrase = phrase
        super().__init__(status_code, message, phrase)


class GenericInferenceToolkitError(BaseInferenceToolkitError):
    """``BaseInferenceToolkitError`` with the toolkit's defaults: "Invalid Request", and the
    phrase the message."""

    def __init__(self, status_code: int, message: str | None = None, phrase: str | None = None):
        message = message or "Invalid Request"
        super().__init__(status_code, message, phrase or message)


def decode(obj: bytes | bytearray | str, content_type: str) -> Any:
    """The body as a NumPy array (JSON, CSV, NPY), or a SciPy sparse matrix (NPZ, as the
    toolkit: SciPy must be installed, e.g. by the model's ``code/requirements.txt``)."""
    if codecs.media_type(content_type) == NPZ:
        return _sparse_from_npz(obj)
    try:
        return codecs.decode(obj, content_type)
    except codecs.UnsupportedFormat:
        raise UnsupportedFormatError(content_type) from None


def _sparse_from_npz(obj: bytes | bytearray | str) -> Any:
    try:
        import scipy.sparse  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        raise UnsupportedFormatError(
            f"{NPZ} (it is read by scipy.sparse.load_npz: add scipy to code/requirements.txt)"
        ) from None
    data = obj.encode("latin-1") if isinstance(obj, str) else bytes(obj)
    return scipy.sparse.load_npz(io.BytesIO(data))


def encode(array_like: Any, content_type: str) -> str | bytes:
    """``array_like`` as ``content_type``: ``str`` for JSON and CSV, bytes for NPY."""
    try:
        encoded = codecs.encode(array_like, content_type)
    except codecs.UnsupportedFormat:
        raise UnsupportedFormatError(content_type) from None
    if codecs.media_type(content_type) in codecs.TEXT_TYPES:
        return encoded.decode("utf-8")
    return encoded


def parse_accept(accept: str) -> list[str]:
    """``"application/json, text/csv"`` → ``["application/json", "text/csv"]``."""
    return accept.replace(" ", "").split(",")


CONTENT_TYPE_KEY = re.compile("^[Cc]ontent-?[Tt]ype")


def retrieve_content_type_header(request_property: Mapping[str, str]) -> str | None:
    """The value of the first key spelled like ``Content-Type`` (or ``contenttype``)."""
    for key, value in request_property.items():
        if CONTENT_TYPE_KEY.match(key):
            return value
    return None


def read_file(path: str, mode: str = "r") -> Any:
    with open(path, mode) as file:
        return file.read()


def write_file(path: str, data: Any, mode: str = "w") -> None:
    with open(path, mode) as file:
        file.write(data)


def remove_crlf(illegal_string: str) -> str:
    return illegal_string.replace("\r", " ").replace("\n", " ")
