"""The Open Inference Protocol V2 (KServe V2, Triton's HTTP/REST protocol): tensors in JSON
and in the binary tensor data extension.

The rule Ferry applies (documented in docs/protocols.md): one V2 request is one request
to the handler, whatever its tensors' first dimension, so it batches with requests from
every other protocol. The handler receives the request as JSON (``{"id", "parameters",
"inputs": [{"name", "shape", "datatype", "parameters", "data"}]}``, binary inputs decoded
into ``data``), and TorchServe's
``kservev2`` envelope turns that into its rows for handlers written for TorchServe on
KServe. The handler's answer becomes the response's outputs: a V2 response document (what
the envelope produces) as it is, anything else as one output.

Shapes are whole numbers, except that a BYTES input may leave one dimension to its data
(``-1``, as TorchServe's KServe samples send ``"shape": [-1]``, which its ``kservev2``
envelope ignores for BYTES): the handler gets the size the elements give instead.

The protocol in three parts: its vocabulary (``tensors.py``: datatypes, ``Tensor``,
``InferRequest``), request decoding (``requests.py``) and response encoding
(``responses.py``). Transports import this package and call ``v2.parse_request``,
``v2.encode_response``, ...: the names below.
"""

from ferry.protocols.v2.requests import (
    ElementBudget,
    binary_input,
    decoded_input,
    infer_request,
    input_header,
    parse_request,
)
from ferry.protocols.v2.responses import (
    encode_binary,
    encode_response,
    error_document,
    outputs_from_answer,
    select_outputs,
    tensor_from_value,
)
from ferry.protocols.v2.tensors import (
    BINARY_HEADER,
    DATATYPES,
    FREE_DIMENSION,
    InferRequest,
    RequestedOutput,
    Tensor,
)

__all__ = [
    "BINARY_HEADER",
    "DATATYPES",
    "FREE_DIMENSION",
    "ElementBudget",
    "InferRequest",
    "RequestedOutput",
    "Tensor",
    "binary_input",
    "decoded_input",
    "encode_binary",
    "encode_response",
    "error_document",
    "infer_request",
    "input_header",
    "outputs_from_answer",
    "parse_request",
    "select_outputs",
    "tensor_from_value",
]
