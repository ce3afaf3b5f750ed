"""ResNet-18 on NVIDIA Triton Inference Server (CPU) through PyTriton, for the peer
benchmark: the same pipeline as ``resnet_handler.py`` (``resnet_pipeline.py``) in Triton's
Python model, batched by Triton's dynamic batcher. Also a no-op model for the round trip.

Runs in its own environment (``scripts/triton-venv.sh``), started by
``benchmarks/batching_peers.py``:

    .venv-triton/bin/python benchmarks/handlers/triton_resnet.py WEIGHTS.pt \
        --http-port P --grpc-port P --metrics-port P --batch-size 8 --delay-ms 50

Requests: ``POST /v2/models/resnet18/infer`` with one BYTES input ``images`` of shape
[1, 1] holding the base64 of a JPEG (Triton's JSON carries text, not raw bytes); the answer
is one BYTES output ``classes``: the top five as JSON.
"""

import argparse
import base64
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from resnet_pipeline import image_tensor, normalised, top5


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("weights", type=Path, help="TorchScript ResNet-18")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = torch.jit.load(str(args.weights)).eval()

    @batch
    def classify(images):
        tensors = [image_tensor(base64.b64decode(row[0])) for row in images]
        with torch.inference_mode():
            answers = top5(model(normalised(tensors)))
        encoded = [json.dumps(answer).encode() for answer in answers]
        return {"classes": np.array(encoded, dtype=np.object_).reshape(-1, 1)}

    @batch
    def noop(data):
        return {"ok": np.ones((len(data), 1), dtype=np.int8)}

    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        allow_gpu_metrics=False,
    )
    batcher = DynamicBatcher(max_queue_delay_microseconds=int(args.delay_ms * 1000))
    with Triton(config=config) as triton:
        triton.bind(
            model_name="resnet18",
            infer_func=classify,
            inputs=[Tensor(name="images", dtype=np.bytes_, shape=(1,))],
            outputs=[Tensor(name="classes", dtype=np.bytes_, shape=(1,))],
            config=ModelConfig(max_batch_size=args.batch_size, batcher=batcher),
        )
        triton.bind(
            model_name="noop",
            infer_func=noop,
            inputs=[Tensor(name="data", dtype=np.bytes_, shape=(1,))],
            outputs=[Tensor(name="ok", dtype=np.int8, shape=(1,))],
            config=ModelConfig(max_batch_size=args.batch_size, batcher=DynamicBatcher()),
        )
        print("serving", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
