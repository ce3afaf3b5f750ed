"""What a Ray user writes by hand for the same pipeline, for ``benchmarks/ray_benchmark.py``:
Ray Serve deployments with the model in the replica and Ray's own ``@serve.batch``.

- ``ResNet``: the TorchScript ResNet-18 behind the pipeline Ferry's archive runs
  (``resnet_pipeline.py``: PIL + torch), raw JPEG bodies, batches of up to 8 within 10 ms,
  the top five classes as JSON.
- ``Noop``: answers ``ok``, unbatched (Ray Serve's own round trip, proxy to replica).

Deployed with ``serve.run`` by the benchmark, one CPU per replica and as deep a
``max_ongoing_requests`` as Ferry's replicas (its queue plus a batch), no access log (as
Ferry's deployments); this folder is on the replicas' ``PYTHONPATH`` (the driver's
``runtime_env``).
"""

import json

import torch
from ray import serve
from resnet_pipeline import image_tensor, normalised, top5
from starlette.requests import Request
from starlette.responses import Response

BATCH_SIZE = 8
BATCH_WAIT_S = 0.010


QUIET = {"enable_access_log": False, "log_level": "WARNING"}
"""The logging Ferry's deployments run with: no line per request."""


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=108, logging_config=QUIET)
class ResNet:
    def __init__(self, weights: str) -> None:
        self.model = torch.jit.load(weights).eval()

    @serve.batch(max_batch_size=BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
    async def classify(self, bodies: list[bytes]) -> list[dict[str, float]]:
        tensors = [image_tensor(body) for body in bodies]
        with torch.inference_mode():
            return top5(self.model(normalised(tensors)))

    async def __call__(self, request: Request) -> Response:
        answer = await self.classify(await request.body())
        return Response(json.dumps(answer), media_type="application/json")


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=108, logging_config=QUIET)
class Noop:
    async def __call__(self, request: Request) -> Response:
        await request.body()
        return Response(b"ok")
