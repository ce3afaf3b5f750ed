"""One compile cache per model, shared by its workers: a model is compiled once, not
once per worker.

``torch.compile`` (model-config.yaml's ``optimization: compile``, or TorchServe's ``pt2``)
compiles in the worker that loads the model. Every worker of a model points Inductor's
cache (``TORCHINDUCTOR_CACHE_DIR``; Triton's lies inside it) at the model's own folder,
which the server made beside the unpacked archive and removes with it
(``ModelArchive.compile_cache``), under a name of the torch version and the worker's
device. A second worker, a scaled-up one or a restarted one finds the compiled graphs
there and loads them instead of compiling: Inductor's own cache keys (the graph, torch,
the device, the compile options) decide a hit, so a changed model, torch or GPU compiles
afresh and never runs stale kernels.

The model's workers may have different torch thread counts (a scale-up splits the cores
again): their kernels are generated for any count (``kernels_for_any_thread_count``), so
one compile serves them all.

Workers that start together would all compile: while one worker of a model that compiles
loads it, the others wait on a lock in the cache folder, then load from the cache.

A ``TORCHINDUCTOR_CACHE_DIR`` set for the server is the operator's choice and is kept.
Compiles that happen later (a first request of a new shape) use the same cache. In a
process shared by several models (``ferry.worker_handles.hosts``) the variable names the
folder of the model loaded last; a model compiling later into another's folder only
misses the cache, it never runs another model's kernels.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ferry.config.sections import compiles

log = logging.getLogger("ferry.worker")

CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
OPERATOR_CACHE = os.environ.get(CACHE_VARIABLE)
"""The cache the server was started with, if the operator chose one (read once, before
any model of this process sets its own)."""
LOCK_FILE = "loading.lock"
DYNAMIC_THREADS_VARIABLE = "TORCHINDUCTOR_CPP_DYNAMIC_THREADS"


def cache_folder(root: Path, torch_version: str, device: str) -> Path:
    """The model's cache for one torch version and device kind (``cpu``, ``cuda-sm90``)."""
    safe = "".join(c if c.isalnum() or c in ".-_" else "_" for c in torch_version)
    return root / f"torch-{safe}-{device}"


def device_kind(gpu_id: int | None) -> str:
    """``cpu``, or ``cuda-sm<capability>`` of the worker's GPU."""
    if gpu_id is None:
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    major, minor = torch.cuda.get_device_capability(gpu_id)
    return f"cuda-sm{major}{minor}"


@dataclass(frozen=True)
class CacheCounts:
    hits: int
    misses: int


def inductor_counts() -> CacheCounts:
    """Compiled graphs loaded and compiled in this process: Inductor's own cache hits and
    misses, and the graphs ``optimization: compile`` saved ahead of their first call
    (``ferry.handlers.builtin.precompile``, whose loads bypass Inductor's cache)."""
    from torch._dynamo.utils import counters

    from ferry.handlers.builtin.precompile import COUNTERS  # imports torch: not at start-up

    inductor, saved = counters["inductor"], counters[COUNTERS]
    return CacheCounts(
        inductor["fxgraph_cache_hit"] + saved["loaded"],
        inductor["fxgraph_cache_miss"] + saved["compiled"],
    )


def kernels_for_any_thread_count() -> None:
    """Inductor's CPU kernels generated for whatever torch thread count they run with
    (``cpp.dynamic_threads``), not for this worker's: the model's other workers, which
    may have another count (a scale-up splits the cores again), then use them and the
    graphs saved with them (``ferry.handlers.builtin.precompile``) instead of compiling
    their own. Unless the operator set ``TORCHINDUCTOR_CPP_DYNAMIC_THREADS``."""
    if DYNAMIC_THREADS_VARIABLE in os.environ:
        return
    from torch._inductor import config

    config.cpp.dynamic_threads = True


@contextlib.contextmanager
def model_compile_cache(
    root: str, gpu_id: int | None, model_yaml_config: dict[str, Any]
) -> Iterator[Path | None]:
    """Around loading a model: its workers' shared cache set for this process, and, for
    a model that compiles as it loads, that load alone among its workers (the others
    wait, then hit the cache). Yields the cache folder, or None when there is none (a
    loader without one, or the operator's own cache)."""
    if compiles(model_yaml_config):
        kernels_for_any_thread_count()
    if not root or OPERATOR_CACHE is not None:
        yield None
        return
    import torch

    folder = cache_folder(Path(root), torch.__version__, device_kind(gpu_id))
    folder.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_VARIABLE] = str(folder)
    if not compiles(model_yaml_config):
        yield folder
        return
    before = inductor_counts()
    with open(folder / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process ends
        yield folder
    after = inductor_counts()
    log.info(
        "compile cache %s: %d compiled graphs loaded from it, %d compiled",
        folder,
        after.hits - before.hits,
        after.misses - before.misses,
    )
