"""Session-wide test settings."""

from __future__ import annotations

import os

# Every server a test starts picks free ports. Servers started without tests/fixtures/
# cli.py's serve_args (those that should fail before serving, or run `ferry serve` as a
# user types it) would otherwise bind the gRPC APIs' fixed defaults, 7070 and 7071.
os.environ.setdefault("FERRY_GRPC_INFERENCE_PORT", "0")
os.environ.setdefault("FERRY_GRPC_MANAGEMENT_PORT", "0")
