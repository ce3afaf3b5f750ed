"""Process-wide torch settings: applied by each worker, and by benchmarks that mimic one."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc


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


def return_freed_memory() -> None:
    """Give the kernel back what the load freed. glibc keeps freed blocks in its heap for
    reuse, and a load frees much: a state dict copied into its model, a TorchScript file
    split into mapped weights (``ferry.handlers.builtin.shared_weights``). Measured on a
    384 MiB TorchScript model: the worker that split it kept the whole freed copy, 1,144
    MiB of whole-server PSS with one worker against 740 without sharing."""
    gc.collect()  # a module's reference cycles, before the heap is trimmed
    name = ctypes.util.find_library("c")
    if name is None:  # not glibc (musl): nothing to trim
        return
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim(0)
