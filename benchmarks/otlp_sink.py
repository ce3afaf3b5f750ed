"""A stand-in for an OpenTelemetry collector in benchmarks: an OTLP traces endpoint (HTTP,
or gRPC with ``--grpc``) on a free port that decodes each export request, counts its spans
and answers success.

    python benchmarks/otlp_sink.py [--grpc] [--nice N] READY_FILE COUNTS_FILE

Writes ``{"url": ...}`` to READY_FILE once it listens, and ``{"spans": N}`` to COUNTS_FILE
after each export; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ready", type=Path, help='written {"url": ...} once it listens')
    parser.add_argument("counts", type=Path, help='written {"spans": N} after each export')
    parser.add_argument("--grpc", action="store_true", help="OTLP over gRPC, not HTTP")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="lower its CPU priority by N: a collector runs elsewhere, not on the server's cores",
    )
    args = parser.parse_args()
    os.nice(args.nice)
    ready, counts = args.ready, args.counts
    received = {"spans": 0}
    lock = threading.Lock()

    def count(request: Any) -> None:
        spans = sum(len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans)
        with lock:
            received["spans"] += spans
            counts.write_text(json.dumps(received))

    if args.grpc:
        _serve_grpc(ready, count)
        return

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            count(request)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    ready.write_text(json.dumps({"url": f"http://127.0.0.1:{server.server_address[1]}"}))
    server.serve_forever()
    server.server_close()


def _serve_grpc(ready: Path, count: Callable[[Any], None]) -> None:
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            count(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    ready.write_text(json.dumps({"url": f"http://127.0.0.1:{port}"}))
    stopped.wait()
    server.stop(grace=None)


if __name__ == "__main__":
    main()
