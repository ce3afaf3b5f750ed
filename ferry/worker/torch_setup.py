"""Process-wide torch settings: applied by each worker, and by benchmarks that mimic one."""

from __future__ import annotations


def configure_torch(threads: int) -> None:
    """Intra-op threads for this process: a worker's share of the cores."""
    import torch

    torch.set_num_threads(threads)


SPARE_READY = "spare worker process ready: torch's compiler imported"
"""What a spare logs once ``preload_compiler`` is done (the frontend relays it)."""


def preload_compiler() -> None:
    """Import torch and its compiler (Dynamo, Inductor, export): about 1.6 s beyond torch
    itself on 2 cores, done by a spare worker process before it has a model."""
    import torch
    import torch._dynamo
    import torch._inductor.compile_fx
    import torch.export  # noqa: F401
