"""Worker process entry point: load the handler, then answer batches until the socket closes.

Started by the frontend as ``python -m ferry.worker.main --fd N --spec JSON`` (a fresh
interpreter, never a fork, so CUDA state is never inherited).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import socket
import sys
import traceback
from typing import BinaryIO

from ferry.worker import codec
from ferry.worker.lifetime import die_with_parent, ignore_interrupts
from ferry.worker.messages import Message, PredictBatch, WorkerLoadFailed, WorkerReady
from ferry.worker.spec import WorkerSpec
from ferry.worker.torch_setup import configure_torch

log = logging.getLogger("ferry.worker")


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    return data if data is not None and len(data) == size else None


def read_message(stream: BinaryIO) -> Message | None:
    """The next message, or None when the frontend has gone."""
    header = _read_exact(stream, codec.FRAME_HEADER.size)
    if header is None:
        return None
    payload = _read_exact(stream, codec.frame_length(header))
    return None if payload is None else codec.decode(payload)


def _prepare_imports(model_dir: str) -> None:
    """The model folder first (handlers import their own files), the ``ts`` shim last."""
    sys.path.insert(0, model_dir)
    if importlib.util.find_spec("ts") is None:
        from ferry._compat import SHIM_ROOT

        sys.path.append(str(SHIM_ROOT))


def _load(spec: WorkerSpec):  # type: ignore[no-untyped-def]
    from ferry.handlers.context import Context
    from ferry.handlers.loader import load_entry_point
    from ferry.worker.pipeline import PipelineSettings, StagePipeline, staged_handler
    from ferry.worker.runner import BatchRunner

    context = Context(
        spec.model_name,
        spec.model_dir,
        spec.manifest,
        spec.batch_size,
        spec.gpu_id,
        model_yaml_config=spec.model_yaml_config,
    )
    entry = load_entry_point(spec.handler, context)
    pipeline = PipelineSettings.from_model_config(spec.model_yaml_config)
    if pipeline is not None:
        handler = staged_handler(entry)
        if handler is None:
            log.warning(
                "micro_batching ignored: the handler has no preprocess/inference/postprocess"
            )
        else:
            log.info("stage pipeline on: %s", pipeline)
            entry = StagePipeline(handler, pipeline).handle
    return BatchRunner(entry, context)


def serve(sock: socket.socket, spec: WorkerSpec) -> int:
    reader = sock.makefile("rb")
    _prepare_imports(spec.model_dir)
    try:
        runner = _load(spec)
    except Exception as exc:
        traceback.print_exc()
        sock.sendall(codec.encode(WorkerLoadFailed(f"{type(exc).__name__}: {exc}")))
        return 1
    device = "cpu" if spec.gpu_id is None else f"cuda:{spec.gpu_id}"
    sock.sendall(codec.encode(WorkerReady(os.getpid(), device)))
    while (message := read_message(reader)) is not None:
        if not isinstance(message, PredictBatch):
            raise codec.ProtocolError(f"worker got unexpected {type(message).__name__}")
        sock.sendall(codec.encode(runner.run(message)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferry-worker")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    spec = WorkerSpec.from_json(args.spec)
    die_with_parent()
    ignore_interrupts()
    # The frontend prefixes each line with the model, worker and time.
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    configure_torch(spec.torch_threads)
    with socket.socket(fileno=args.fd) as sock:
        return serve(sock, spec)


if __name__ == "__main__":
    raise SystemExit(main())
