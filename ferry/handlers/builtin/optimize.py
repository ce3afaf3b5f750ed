"""Model optimisations chosen in model-config.yaml, under ``optimization:``::

    optimization:
      precision: bf16            # fp32 (default), fp16 or bf16: weights and inputs cast
      channels_last: true        # NHWC memory format for convolution models
      compile: default           # torch.compile mode: default, reduce-overhead, max-autotune
      torchscript_freeze: true   # TorchScript: torch.jit.freeze + optimize_for_inference
      batch_buckets: [1, 2, 4, 8]  # pad each batch to the next bucket (compiled graphs reuse)
      cuda_graphs: true          # GPU: capture one CUDA graph per bucket, replay it per batch
      warmup:
        input_shape: [3, 224, 224]
        batch_sizes: [1, 8]      # run once at load, so the first requests are not slow

Padded rows are cut from the model's output before postprocess ever sees them.

``cuda_graphs`` needs fixed shapes: ``warmup.input_shape`` and the batch sizes to capture
(``batch_buckets``, else ``warmup.batch_sizes``); a batch of any other shape runs eagerly.
On a CPU worker it is ignored with a warning. With ``compile``, use ``compile:
reduce-overhead`` instead, which captures graphs itself.

``compile: reduce-overhead`` and ``max-autotune`` record CUDA graph trees, where each call
may overwrite the outputs of the one before: outputs are copied as they leave the
inference stage (the stage pipeline runs the next micro-batch while postprocess still
reads this one), each call begins a new graph-tree step, and warm-up calls each size
three times (compile, record, replay). ``max-autotune`` gets a 900 s start-up timeout
unless one is set. ``precision`` and ``channels_last`` are applied before
``torchscript_freeze``, which turns the weights into constants.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

from ferry.config.sections import OptimizationConfig, parse_optimization
from ferry.errors import ConfigError
from ferry.handlers.builtin.aot_package import AotiModel
from ferry.handlers.builtin.precompile import compile_once, precompilable

log = logging.getLogger("ferry.handlers")

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
GRAPH_TREE_MODES = ("reduce-overhead", "max-autotune")


@dataclass(frozen=True)
class Optimizations(OptimizationConfig):
    """The ``optimization:`` section (parsed by ``ferry.config``) with what the handler
    needs to apply it."""

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.precision]

    @property
    def graph_trees(self) -> bool:
        """Whether ``compile`` records CUDA graph trees (``reduce-overhead``,
        ``max-autotune``): each call may overwrite the outputs of the one before, so
        outputs are copied before they leave the inference stage (``finish_output``)."""
        return self.compile_mode in GRAPH_TREE_MODES

    @classmethod
    def from_model_config(cls, config: dict[str, Any]) -> Optimizations:
        return cls.from_section(parse_optimization(config.get("optimization")))

    @classmethod
    def from_section(cls, section: OptimizationConfig) -> Optimizations:
        return cls(**{f.name: getattr(section, f.name) for f in fields(OptimizationConfig)})

    def bucket_for(self, size: int) -> int:
        """The smallest bucket holding ``size`` rows (``size`` itself beyond the largest)."""
        index = bisect.bisect_left(self.batch_buckets, size)
        return self.batch_buckets[index] if index < len(self.batch_buckets) else size


def optimize_model(model: Any, options: Optimizations, device: torch.device) -> Any:
    """Apply the chosen switches to a loaded model, in a safe order: casts and layout
    first, since freezing turns the weights into constants that ``.to`` no longer moves."""
    if isinstance(model, AotiModel):
        _check_compiled_package(options)
        return model
    if options.torchscript_freeze and not isinstance(model, torch.jit.ScriptModule):
        raise ConfigError("optimization: torchscript_freeze needs a TorchScript model")
    if options.precision != "fp32":
        model = model.to(options.dtype)
    if options.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if options.torchscript_freeze:
        model = torch.jit.optimize_for_inference(torch.jit.freeze(model.eval()))
    if options.compile_mode is not None:
        if isinstance(model, torch.jit.ScriptModule):
            raise ConfigError("optimization: compile needs an eager or torch.export model")
        model = _compiled(model, options, device)
    return model


def _compiled(model: Any, options: Optimizations, device: torch.device) -> Any:
    """``torch.compile`` of the model: with a warm-up shape, its warm-up batches compiled
    once per model and loaded by every later worker (``precompile``); CUDA graph trees
    record as they run, so they compile in each worker."""
    mode = options.compile_mode or "default"
    examples = [] if options.graph_trees else warmup_batches(options, device)
    if precompilable(model, examples):
        return compile_once(model, mode, examples)
    return torch.compile(model, mode=mode)


def _check_compiled_package(options: Optimizations) -> None:
    """What cannot change a model compiled ahead of time: its weights, kernels and the
    layout its kernels read are fixed (``optimization:`` choices that only shape the input
    batch, such as ``batch_buckets`` and ``warmup``, still apply)."""
    fixed = {
        "compile": options.compile_mode is not None,
        "torchscript_freeze": options.torchscript_freeze,
        "precision": options.precision != "fp32",
        "channels_last": options.channels_last,
        "cuda_graphs": options.cuda_graphs,
    }
    chosen = [name for name, on in fixed.items() if on]
    if chosen:
        raise ConfigError(
            f"optimization: {', '.join(chosen)} cannot apply to an AOTInductor package, "
            "which is compiled already: compile the package with them instead"
        )


Replay = Callable[[torch.Tensor], Any]
Capture = Callable[[Any, torch.Tensor, Any], tuple[Replay, Any]]


class GraphedModel:
    """Replays a captured CUDA graph for each batch whose shape and dtype were captured;
    anything else runs the model eagerly."""

    def __init__(self, model: Any, examples: list[torch.Tensor], capture: Capture) -> None:
        self.model = model
        self._graphs: dict[tuple[Any, ...], Replay] = {}
        pool = None
        # Largest first, all in one memory pool: smaller graphs reuse the largest's blocks.
        for example in sorted(examples, key=lambda e: e.shape[0], reverse=True):
            replay, pool = capture(model, example, pool)
            self._graphs[self._key(example)] = replay

    @staticmethod
    def _key(batch: torch.Tensor) -> tuple[Any, ...]:
        return (*batch.shape, batch.dtype, batch.device)

    @property
    def captured_batch_sizes(self) -> list[int]:
        return sorted(int(key[0]) for key in self._graphs)

    def __call__(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        replay = None
        if isinstance(batch, torch.Tensor) and not args and not kwargs:
            replay = self._graphs.get(self._key(batch))
        return replay(batch) if replay is not None else self.model(batch, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Handlers that reach into self.model (attributes, submodules) still find them.
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)


def capture_cuda_graph(model: Any, example: torch.Tensor, pool: Any) -> tuple[Replay, Any]:
    """Capture ``model(example)`` as a CUDA graph; returns a replay function and its pool."""
    # On the example's device, whatever this thread's current one: the capture stream is
    # made on the current device (a worker sees only its own GPU; bench profile does not).
    with torch.cuda.device(example.device):
        return _capture_on_device(model, example, pool)


def _capture_on_device(model: Any, example: torch.Tensor, pool: Any) -> tuple[Replay, Any]:
    static_input = example.clone()
    device = example.device
    side = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream(device))
    # Warm-up iterations off the capture stream, as CUDA graph capture requires.
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(3):
            model(static_input)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph, pool=pool):
        static_output = model(static_input)

    def replay(batch: torch.Tensor) -> Any:
        static_input.copy_(batch)
        graph.replay()
        # The next replay overwrites the static output: hand out a copy.
        return _clone(static_output)

    return replay, graph.pool()


def _clone(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output.clone()
    if isinstance(output, (list, tuple)):
        return type(output)(_clone(item) for item in output)
    if isinstance(output, dict):
        return {key: _clone(value) for key, value in output.items()}
    return output


def graph_model(
    model: Any, options: Optimizations, device: torch.device, capture: Capture = capture_cuda_graph
) -> Any:
    """``model`` wrapped to replay CUDA graphs when ``cuda_graphs`` is on and there is a GPU."""
    if not options.cuda_graphs:
        return model
    if device.type != "cuda":
        log.warning("cuda_graphs needs a GPU; the model runs eagerly on %s", device)
        return model
    if not isinstance(model, torch.nn.Module):
        raise ConfigError("optimization: cuda_graphs needs a torch model")
    examples = [
        prepare_input(torch.zeros(size, *options.warmup_shape), options, device)[0]
        for size in options.graph_batch_sizes
    ]
    graphed = GraphedModel(model, examples, capture)
    log.info("CUDA graphs captured for batch sizes %s", graphed.captured_batch_sizes)
    return graphed


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def copy_graph_tree_outputs(output: Any, options: Optimizations) -> Any:
    """Under graph trees, every tensor of ``output`` copied (the next call overwrites
    them); ``output`` itself otherwise."""
    return _clone(output) if options.graph_trees else output


def begin_graph_tree_step(options: Optimizations) -> None:
    """Before each model call under graph trees: a new step (no call's outputs are read
    after the next call begins: ``finish_output`` copied them)."""
    if options.graph_trees:
        torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]


def prepare_input(
    batch: torch.Tensor, options: Optimizations, device: torch.device
) -> tuple[torch.Tensor, int]:
    """Cast, lay out and pad a batch; returns it and how many rows are real."""
    rows = batch.shape[0]
    target = options.bucket_for(rows)
    if target > rows:
        padding = batch[:1].expand(target - rows, *batch.shape[1:])
        batch = torch.cat([batch, padding])
    batch = batch.to(device, non_blocking=True)
    if batch.is_floating_point() and options.precision != "fp32":
        batch = batch.to(options.dtype)
    if options.channels_last and batch.dim() == 4:
        batch = batch.contiguous(memory_format=torch.channels_last)
    return batch, rows


def finish_output(output: Any, rows: int, padded: int, options: Optimizations) -> Any:
    """Drop padded rows; half-precision outputs back to fp32 for postprocess. Under CUDA
    graph trees a copy in any case: the pipeline runs the next micro-batch's inference
    while postprocess still reads this one's output, which that call would overwrite."""
    if isinstance(output, torch.Tensor):
        original = output
        if padded > rows and output.dim() > 0 and output.shape[0] == padded:
            output = output[:rows]
        if options.precision != "fp32" and output.is_floating_point():
            output = output.float()  # a copy, unless the model's output was fp32 already
        if options.graph_trees and _shares_memory(output, original):
            output = output.clone()
        return output
    if isinstance(output, (list, tuple)):
        return type(output)(finish_output(item, rows, padded, options) for item in output)
    if isinstance(output, dict):
        return {key: finish_output(v, rows, padded, options) for key, v in output.items()}
    return output


GRAPH_TREE_WARMUP_CALLS = 3
"""Calls per size under graph trees: the first compiles (and runs eagerly), the second
records the CUDA graph, the third replays it; a request after warm-up only replays."""


def warmup_batches(options: Optimizations, device: torch.device) -> list[torch.Tensor]:
    """The batches warm-up runs, as the model receives them (padded to their bucket, cast
    and laid out), one per distinct shape. Made outside ``torch.inference_mode``, as
    ``preprocess`` makes a request's batch: compiled graphs guard on the difference, so a
    warm-up with inference tensors would leave the first requests to compile again."""
    if not options.warmup_shape:
        return []
    sizes = options.warmup_batch_sizes or options.batch_buckets or (1,)
    batches: dict[tuple[int, ...], torch.Tensor] = {}
    for size in sizes:
        batch, _ = prepare_input(torch.zeros(size, *options.warmup_shape), options, device)
        batches.setdefault(tuple(batch.shape), batch)
    return list(batches.values())


def warm_up(model: Any, options: Optimizations, device: torch.device) -> None:
    batches = warmup_batches(options, device)
    if not batches:
        return
    calls = GRAPH_TREE_WARMUP_CALLS if options.graph_trees else 1
    with torch.inference_mode():
        for batch in batches:
            for _ in range(calls):
                begin_graph_tree_step(options)
                model(batch)
    log.info("warmed up at batch sizes %s", [batch.shape[0] for batch in batches])
