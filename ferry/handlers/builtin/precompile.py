"""``torch.compile``, compiled once per model: the first worker compiles the warm-up
shapes ahead of their first call and saves the result; every later worker loads it.

Inductor's own cache (``ferry.worker.compile_cache``) spares a second worker the kernel
compilation but not Dynamo's trace of the model and AOTAutograd's, about 2-4 s per shape
for a ResNet on 2 cores. With ``optimization: compile`` and ``warmup.input_shape``, the
worker compiles the warm-up batches with torch's ahead-of-time capture instead
(``OptimizedModule._aot_compile``, experimental in torch 2.13): one graph for a batch of 1
and one with a dynamic batch for the larger sizes, each with its guards. It saves them
(with the compiled kernels' sources) in the compile cache under a key of torch's version,
the device, the compile mode, the example inputs, the model's structure and its code; a
later worker of the model loads them and compiles nothing (their ``.so`` files are in the
same cache).

The code is in the key because the saved graphs *are* the model's code, traced: two
models whose classes differ only in ``forward`` (or a new version that fixed it) must
never share a file. The key holds, for every class of the model's modules that is not
torch's own, the source file it was defined in and its methods' bytecode (a class made
at run time has no file), and a ``torch.fx`` module's generated code.

The folder is trusted: the saved files are pickles, so whoever can write into the
compile cache can run code in the workers. Ferry's own cache is private to the server
(made beside the unpacked archive, mode 0700); a ``TORCHINDUCTOR_CACHE_DIR`` the operator
sets must be writable only by the account the server runs as.

A torch without the capture (it is experimental, and private: 2.13 has every piece this
module uses, older releases may lack some, as a later one may rename them; ``missing_capture``
names what is absent) compiles the ordinary way, each worker as it runs, with a warning
saying what was missing.

A call the saved guards reject (another shape or dtype, a call outside
``torch.inference_mode`` or with an inference tensor) runs through an ordinary
``torch.compile`` of the model, which compiles it as it would have without this. A
model the capture cannot take whole (a graph break) or a saved file that does not load
is compiled the ordinary way, with a warning saying why.

Graphs of any thread count: a scale-up splits the cores again (one worker with 2 torch
threads, then two with 1 each), and a restarted worker may get another count than the
one it replaces. Ferry's workers compile with Inductor's ``cpp.dynamic_threads``
(``ferry.worker.compile_cache``): the kernels ask OpenMP for the thread count as they run
instead of being generated for one (no slower on this project's 2-core CPU: ResNet-18,
1 and 2 threads, measured). Dynamo still guards on the count the graphs were traced at,
for kernels that would depend on it; these do not, so the saved file records that count
and the guards of graphs loaded by a worker with another one are checked under it. An
operator who turns the option off (``TORCHINDUCTOR_CPP_DYNAMIC_THREADS=0``) gets graphs
for one thread count each, saved side by side.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
import os
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ferry.handlers.builtin.vector_isa import vector_isa_from_cpu_flags

log = logging.getLogger("ferry.handlers")

FOLDER = "ferry-precompiled"
HEADER = b"ferry-precompiled 1 threads="
"""The saved file's first line, ending with the torch thread count the graphs were traced
at; their serialized form follows."""
COUNTERS = "ferry_precompile"
"""Key in torch's ``counters``: ``loaded`` and ``compiled`` graphs in this process (read by
``ferry.worker.compile_cache`` for its log line, beside Inductor's own)."""


def precompilable(model: Any, examples: Sequence[torch.Tensor]) -> bool:
    """Whether the ahead-of-time capture applies: an eager module (a ``torch.export``
    program's module included) and examples to compile for."""
    return (
        bool(examples)
        and isinstance(model, torch.nn.Module)
        and not isinstance(model, torch.jit.ScriptModule)
    )


CAPTURE = (
    ("torch._dynamo.aot_compile", "ModelInput"),
    ("torch._dynamo.aot_compile", "AOTCompiledFunction.guard_check"),
    ("torch._dynamo.aot_compile", "AOTCompiledFunction.disable_guard_check"),
    ("torch._dynamo.eval_frame", "OptimizedModule._aot_compile"),
    ("torch._dynamo.eval_frame", "OptimizedModule._save_aot_compiled_module"),
    ("torch._dynamo.eval_frame", "OptimizedModule._load_aot_compiled_module"),
    ("torch._dynamo.config", "enable_aot_compile"),
)
"""The private pieces of torch's ahead-of-time capture this module uses (torch 2.13)."""


@functools.cache
def missing_capture() -> tuple[str, ...]:
    """The pieces of ``CAPTURE`` this torch lacks; empty when it has them all."""
    missing = []
    for module_name, attribute in CAPTURE:
        try:
            found: Any = importlib.import_module(module_name)
            for name in attribute.split("."):
                found = getattr(found, name)
        except (ImportError, AttributeError):
            missing.append(f"{module_name}.{attribute}")
    return tuple(missing)


def compile_once(model: torch.nn.Module, mode: str, examples: Sequence[torch.Tensor]) -> Any:
    """``torch.compile(model, mode=mode)``, its graphs for ``examples`` loaded from the
    compile cache or compiled now and saved there; on a torch without the capture, the
    ordinary ``torch.compile`` (with a warning)."""
    fallback = torch.compile(model, mode=mode)
    if missing := missing_capture():
        log.warning(
            "compile: torch %s lacks the ahead-of-time capture (%s): each worker compiles "
            "the model as it runs (torch 2.13 has it)",
            torch.__version__,
            ", ".join(missing),
        )
        return fallback
    path = artifact_path(cache_root(), model, mode, examples)
    with vector_isa_from_cpu_flags():  # not Inductor's test builds, about 1 s a worker
        return _load_or_compile(model, mode, examples, path, fallback)


def _load_or_compile(
    model: torch.nn.Module,
    mode: str,
    examples: Sequence[torch.Tensor],
    path: Path,
    fallback: Callable[..., Any],
) -> Any:
    try:
        loaded = _load(model, mode, path) if path.exists() else None
    except Exception as error:  # a file from an incompatible torch, or damaged
        log.warning("precompiled graphs at %s did not load (%s); compiling again", path, error)
        loaded = None
    if loaded is None:
        try:
            compiled = _compile(model, mode, examples)
        except Exception as error:  # a graph break, or an op the capture does not take
            log.warning(
                "compile: the model cannot be compiled ahead of its first call (%s); it "
                "compiles as it runs, in each worker",
                _first_line(error),
            )
            return fallback
        traced_at = torch.get_num_threads()
        _save(compiled, path, traced_at)
    else:
        compiled, traced_at = loaded
    compiled.forward = GuardedForward(model, compiled.forward, fallback, traced_at)
    return compiled


class GuardedForward:
    """The saved graphs' dispatch by their guards, and the ordinary ``torch.compile`` for
    a call none of them accepts (torch's own dispatch raises instead).

    ``traced_at``: the torch thread count the graphs were traced at, under which their
    guards are checked (their kernels run with any count: the module's docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        saved: Any,
        fallback: Callable[..., Any],
        traced_at: int | None = None,
    ) -> None:
        self._model = model
        self._graphs = list(saved.compiled_results)
        for graph in self._graphs:
            graph.disable_guard_check()  # checked here, once, before each call
        self._fallback = fallback
        self._traced_at = traced_at

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for graph in self._graphs:
            if self._accepts(graph, args, kwargs):
                return graph(self._model, *args, **kwargs)
        return self._fallback(*args, **kwargs)

    def _accepts(self, graph: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        threads = torch.get_num_threads()
        if self._traced_at in (None, threads):
            return bool(graph.guard_check(self._model, *args, **kwargs))
        # Setting the count only sets OpenMP's for the next parallel region (no thread
        # starts or stops): under a microsecond there and back, measured.
        torch.set_num_threads(self._traced_at)
        try:
            return bool(graph.guard_check(self._model, *args, **kwargs))
        finally:
            torch.set_num_threads(threads)


def cache_root() -> Path:
    """Inductor's cache folder of this process: the model's compile cache in a Ferry
    worker (``ferry.worker.compile_cache``), the operator's or torch's default otherwise."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def artifact_path(
    root: Path, model: torch.nn.Module, mode: str, examples: Sequence[torch.Tensor]
) -> Path:
    """The saved graphs' file: a key of everything they were compiled for except the
    weights, which they read from the model at each call, and the torch thread count,
    unless Inductor generates kernels for one count (the module's docstring)."""
    key = hashlib.sha256()
    threads = f"{torch.get_num_threads()} threads"
    if _kernels_for_any_thread_count():
        threads = "any threads"
    for part in (torch.__version__, mode, threads, _fingerprint(model)):
        key.update(part.encode())
    for example in examples:
        layout = "channels_last" if _channels_last(example) else "contiguous"
        key.update(f"{tuple(example.shape)} {example.dtype} {example.device} {layout}".encode())
    return root / FOLDER / f"{key.hexdigest()[:32]}.bin"


def _kernels_for_any_thread_count() -> bool:
    from torch._inductor import config

    return bool(config.cpp.dynamic_threads)


def _fingerprint(model: torch.nn.Module) -> str:
    """The model's structure: its class, modules and every parameter's and buffer's name,
    shape, dtype and device; and its code (``code_fingerprint``)."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    described = [f"{name} {tuple(t.shape)} {t.dtype} {t.device}" for name, t in tensors]
    kind = type(model)
    header = [f"{kind.__module__}.{kind.__qualname__}", repr(model), code_fingerprint(model)]
    return "\n".join([*header, *described])


def code_fingerprint(model: torch.nn.Module) -> str:
    """A digest of what runs when the model is called: for every class of its modules
    that is not torch's own, the source file it was defined in (helpers beside the class
    included) and its methods' bytecode; a ``torch.fx`` module's generated code."""
    digest = hashlib.sha256()
    seen: set[type] = set()
    for module in model.modules():
        if isinstance(module, torch.fx.GraphModule):
            digest.update(module.code.encode())
        for kind in type(module).__mro__:
            if kind in seen or _torch_own(kind):
                continue
            seen.add(kind)
            digest.update(f"{kind.__module__}.{kind.__qualname__}".encode())
            digest.update(_source_file_digest(kind))
            for name, member in sorted(vars(kind).items()):
                digest.update(name.encode())
                _add_code(digest, member)
    return digest.hexdigest()


def _torch_own(kind: type) -> bool:
    return kind is object or str(kind.__module__).split(".")[0] == "torch"


def _source_file_digest(kind: type) -> bytes:
    """The file the class's methods were compiled from (their code says which: the
    class's module may be imported under a name ``sys.modules`` does not hold)."""
    for member in vars(kind).values():
        code = getattr(member, "__code__", None)
        if isinstance(code, types.CodeType):
            try:
                return hashlib.sha256(Path(code.co_filename).read_bytes()).digest()
            except OSError:  # made at run time (``<string>``), or the file is gone
                return b""
    return b""


def _add_code(digest: Any, member: Any) -> None:
    """A method's (or property's, or static or class method's) bytecode, constants and
    names, nested functions' included."""
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    if isinstance(member, property):
        for accessor in (member.fget, member.fset, member.fdel):
            _add_code(digest, accessor)
        return
    code = getattr(member, "__code__", None)
    if isinstance(code, types.CodeType):
        _add_code_object(digest, code)


def _add_code_object(digest: Any, code: types.CodeType) -> None:
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            _add_code_object(digest, constant)
        else:
            digest.update(repr(constant).encode())


def _channels_last(tensor: torch.Tensor) -> bool:
    return tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last)


def _inputs(examples: Sequence[torch.Tensor]) -> list[Any]:
    """One graph for a batch of 1 (torch specialises size 1) and one with a dynamic batch
    dimension for the larger sizes (the largest example traced), as ``torch.compile``
    itself ends up with after its second shape.

    Traced as the built-in handlers call the model, which the guards check: a batch made
    by ``preprocess`` (an ordinary tensor, not an inference tensor) under
    ``torch.inference_mode``."""
    from torch._dynamo.aot_compile import ModelInput

    ones = [e for e in examples if e.shape[0] == 1]
    larger = sorted((e for e in examples if e.shape[0] > 1), key=lambda e: e.shape[0])
    inputs = []
    if ones:
        inputs.append(ModelInput((ones[0].clone(),), {}, [torch.inference_mode()]))
    if larger:
        batch = larger[-1].clone()
        torch._dynamo.mark_dynamic(batch, 0)
        inputs.append(ModelInput((batch,), {}, [torch.inference_mode()]))
    return inputs


def _compile(model: torch.nn.Module, mode: str, examples: Sequence[torch.Tensor]) -> Any:
    inputs = _inputs(examples)
    with torch._dynamo.config.patch(enable_aot_compile=True):
        compiled: Any = torch.compile(model, mode=mode, fullgraph=True)  # an OptimizedModule
        compiled._aot_compile(inputs)
    _count("compiled", len(inputs))
    return compiled


def _save(compiled: Any, path: Path, traced_at: int) -> None:
    """Written whole or not at all (a worker killed mid-write leaves no half file)."""
    try:
        with torch._dynamo.config.patch(enable_aot_compile=True):
            data = compiled._save_aot_compiled_module()
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_bytes(HEADER + f"{traced_at}\n".encode() + data)
        partial.replace(path)
    except Exception as error:  # the model is compiled: only later workers lose
        log.warning("compile: the compiled graphs were not saved to %s (%s)", path, error)
        return
    log.info("compile: graphs compiled ahead of their first call, saved to %s", path)


def _load(model: torch.nn.Module, mode: str, path: Path) -> tuple[Any, int]:
    """The compiled module and the thread count its graphs were traced at. Loaded under
    ``torch.inference_mode``: the guards are rebuilt against the dispatch state they are
    loaded in, which must be the one the worker calls them in."""
    header, _, data = path.read_bytes().partition(b"\n")
    if not header.startswith(HEADER):
        raise ValueError("not a file of Ferry's saved graphs")
    traced_at = int(header.removeprefix(HEADER))
    compiled: Any = torch.compile(model, mode=mode, fullgraph=True)  # an OptimizedModule
    with torch._dynamo.config.patch(enable_aot_compile=True), torch.inference_mode():
        compiled._load_aot_compiled_module(data)
    graphs = len(compiled.forward.compiled_results)
    _count("loaded", graphs)
    log.info(
        "compile: %d graphs compiled by an earlier worker (%d torch threads) loaded from %s",
        graphs,
        traced_at,
        path,
    )
    return compiled, traced_at


def _count(what: str, graphs: int) -> None:
    from torch._dynamo.utils import counters

    counters[COUNTERS][what] += graphs


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
