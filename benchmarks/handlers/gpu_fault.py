"""A handler whose ``assert`` request triggers a real device-side assert (an index out of
range on the GPU): a sticky CUDA error, after which every CUDA call in the process fails.
Any other request answers the worker's pid. For benchmarks/gpu_checks.py."""

import os

import torch


def handle(data, context):
    if data is None:
        return None
    answers = []
    for row in data:
        body = bytes(row.get("body") or row.get("data") or b"")
        values = torch.arange(4, device="cuda")
        if body == b"assert":
            values[torch.tensor([7], device="cuda")].sum().item()  # syncs: the assert fires
        answers.append({"pid": os.getpid(), "sum": int(values.sum().item())})
    return answers
