"""Ferry's gRPC APIs, thin adapters over ``ferry.service`` as the HTTP ones are: TorchServe's
inference (``InferenceAPIsService``, port 7070) and management (``ManagementAPIsService``,
port 7071), and the Open Inference Protocol's ``inference.GRPCInferenceService`` on the
inference port beside TorchServe's.

    protos/      the .proto files (Ferry's own text; the protocols' names and numbers)
    generated/   protoc's modules, committed; ``scripts/generate-grpc.sh`` remakes them
    torchserve_inference.py, torchserve_management.py, open_inference.py   the servicers
    open_inference_codec.py   V2 tensors to and from plain values (no protobuf imported)
    calls.py     a call's metadata as headers, and its hang-up
    errors.py    domain error -> gRPC status code, in one table
    auth.py      ``authorization: Bearer <key>`` metadata, the key each method needs
    malformed.py request bytes that are no valid message: INVALID_ARGUMENT
    tls.py       the certificate and key, checked before binding
    listener.py  a ``grpc.aio`` server per API, driven by ``ferry.server``

grpcio is an optional extra (``pip install 'ferry-serve[grpc]'``): nothing here imports it
until ``available()`` said it is there.
"""

from __future__ import annotations

import importlib.util
import os

# Before grpc is imported. The server forks only to exec a worker at once; gRPC's fork
# handlers are for children that go on using gRPC, and when its threads are busy they
# are skipped ("Other threads are currently calling into gRPC, skipping fork()
# handlers"): twice under full-suite load a worker spawned just then died before its
# first message. A user's own value still wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

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
