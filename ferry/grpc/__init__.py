"""TorchServe's gRPC APIs: inference (``InferenceAPIsService``, port 7070) and management
(``ManagementAPIsService``, port 7071), thin adapters over ``ferry.service`` as the HTTP
ones are.

    protos/      the .proto files (Ferry's own text; TorchServe's names and numbers)
    generated/   protoc's modules, committed; ``scripts/generate-grpc.sh`` remakes them
    torchserve_inference.py, torchserve_management.py   the servicers
    errors.py    domain error -> gRPC status code, in one table
    auth.py      ``authorization: Bearer <key>`` metadata
    listener.py  a ``grpc.aio`` server per API, driven by ``ferry.server``

grpcio is an optional extra (``pip install 'ferry-serve[grpc]'``): nothing here imports it
until ``available()`` said it is there.
"""

from __future__ import annotations

import importlib.util

INSTALL_HINT = "pip install 'ferry-serve[grpc]'"


def available() -> bool:
    """Whether grpcio, protobuf and googleapis-common-protos can be imported."""
    try:
        return all(
            importlib.util.find_spec(name) is not None
            for name in ("grpc", "google.protobuf", "google.rpc")
        )
    except ModuleNotFoundError:  # ``google`` itself is missing
        return False


__all__ = ["INSTALL_HINT", "available"]
