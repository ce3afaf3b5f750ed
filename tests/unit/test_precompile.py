"""torch.compile compiled once per model, without compiling: the saved graphs' key (what
invalidates them, what does not), the inputs they are compiled for, the dispatch by
guards with the ordinary torch.compile behind it, and the fall-backs when the capture or
the saved file fails. Compiling for real is in tests/integration/test_aot_inductor.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch._inductor import config as inductor_config

from ferry.config.sections import parse_optimization
from ferry.handlers.builtin import precompile
from ferry.handlers.builtin.optimize import Optimizations, optimize_model
from ferry.handlers.builtin.precompile import GuardedForward, artifact_path, precompilable

ROOT = Path("/cache")


def _mlp(hidden: int = 4) -> nn.Module:
    return nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, 2)).eval()


def _examples(*sizes: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.zeros(size, 3, dtype=dtype) for size in sizes]


def test_the_key_holds_what_the_graphs_were_compiled_for_but_not_the_weights() -> None:
    model = _mlp()
    path = artifact_path(ROOT, model, "default", _examples(1, 4))
    assert path.parent == ROOT / precompile.FOLDER
    retrained = _mlp()
    with torch.no_grad():
        for parameter in retrained.parameters():
            parameter.add_(1.0)
    # The graphs read the weights from the model at each call: new weights, same file.
    assert artifact_path(ROOT, retrained, "default", _examples(1, 4)) == path
    changed = {
        "mode": artifact_path(ROOT, model, "max-autotune-no-cudagraphs", _examples(1, 4)),
        "batch sizes": artifact_path(ROOT, model, "default", _examples(1, 8)),
        "dtype": artifact_path(ROOT, model, "default", _examples(1, 4, dtype=torch.float16)),
        "structure": artifact_path(ROOT, _mlp(hidden=5), "default", _examples(1, 4)),
        "parameter dtype": artifact_path(ROOT, _mlp().half(), "default", _examples(1, 4)),
    }
    assert all(other != path for other in changed.values()), changed
    assert len(set(changed.values())) == len(changed)


NET = """
import torch
from torch import nn


def shift(x):
    return x + {shift}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return {forward}
"""


def _net(tmp_path: Path, name: str, forward: str, shift: str = "1.0") -> nn.Module:
    """``Net`` from a file of its own, as a model file is imported from an archive."""
    import importlib.util

    source = tmp_path / name / "model.py"
    source.parent.mkdir()
    source.write_text(NET.format(forward=forward, shift=shift))
    spec = importlib.util.spec_from_file_location("model", source)  # as every worker names it
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model: nn.Module = module.Net().eval()
    return model


def _made_at_run_time(forward: str) -> nn.Module:
    namespace: dict[str, Any] = {}
    exec(NET.format(forward=forward, shift="1.0"), namespace)  # no source file to read
    model: nn.Module = namespace["Net"]().eval()
    return model


def test_the_key_changes_with_the_models_code_and_not_with_its_file_name(
    tmp_path: Path,
) -> None:
    """Two models whose ``Net`` differs only in ``forward`` (issue 47's case), a helper
    beside the class changed, and classes made at run time: each its own file."""
    examples = _examples(1, 4)

    def key(model: nn.Module) -> Path:
        return artifact_path(ROOT, model, "default", examples)

    plus = key(_net(tmp_path, "plus", "self.lin(x) + 1.0"))
    assert key(_net(tmp_path, "plus_again", "self.lin(x) + 1.0")) == plus
    assert key(_net(tmp_path, "minus", "self.lin(x) * 0.0 - 100.0")) != plus
    assert key(_net(tmp_path, "helper", "shift(self.lin(x))")) != key(
        _net(tmp_path, "helper_changed", "shift(self.lin(x))", shift="2.0")
    )
    assert key(_made_at_run_time("self.lin(x) + 1.0")) != key(
        _made_at_run_time("self.lin(x) * 0.0 - 100.0")
    )
    assert key(_made_at_run_time("self.lin(x) + 1.0")) == key(
        _made_at_run_time("self.lin(x) + 1.0")
    )


def test_the_key_holds_a_graph_modules_generated_code() -> None:
    traced = torch.fx.symbolic_trace(_mlp())
    other = torch.fx.symbolic_trace(_mlp())
    node = next(n for n in other.graph.nodes if n.op == "call_module" and n.target == "1")
    node.target = "0"  # the same modules, called in another order
    other.recompile()
    assert artifact_path(ROOT, traced, "default", _examples(1)) != artifact_path(
        ROOT, other, "default", _examples(1)
    )


@pytest.mark.parametrize("any_count", [True, False])
def test_the_key_holds_the_thread_count_only_for_kernels_made_for_one(any_count: bool) -> None:
    model, examples = _mlp(), _examples(1, 4)
    with inductor_config.patch({"cpp.dynamic_threads": any_count}):
        path = artifact_path(ROOT, model, "default", examples)
        threads = torch.get_num_threads()
        torch.set_num_threads(threads + 1)
        try:
            other_count = artifact_path(ROOT, model, "default", examples)
        finally:
            torch.set_num_threads(threads)
    assert (other_count == path) is any_count


def test_the_key_tells_a_channels_last_input_from_a_contiguous_one() -> None:
    model = nn.Conv2d(3, 2, 1).eval()
    contiguous = torch.zeros(2, 3, 4, 4)
    channels_last = contiguous.contiguous(memory_format=torch.channels_last)
    assert artifact_path(ROOT, model, "default", [contiguous]) != artifact_path(
        ROOT, model, "default", [channels_last]
    )


def test_a_batch_of_one_gets_its_own_graph_and_the_larger_sizes_one_dynamic_graph() -> None:
    inputs = precompile._inputs(_examples(8, 1, 4))
    assert [tuple(i.args[0].shape) for i in inputs] == [(1, 3), (8, 3)]
    # As preprocess makes a batch: not an inference tensor (the guards tell them apart).
    assert not any(i.args[0].is_inference() for i in inputs)
    assert 0 in getattr(inputs[1].args[0], "_dynamo_dynamic_indices", set())
    assert not hasattr(inputs[0].args[0], "_dynamo_dynamic_indices")
    only_larger = precompile._inputs(_examples(2, 4))
    assert [tuple(i.args[0].shape) for i in only_larger] == [(4, 3)]


def test_it_applies_to_eager_modules_with_examples_only() -> None:
    assert precompilable(_mlp(), _examples(1))
    assert not precompilable(_mlp(), [])  # no warm-up shape: nothing to compile ahead for
    assert not precompilable(torch.jit.script(_mlp()), _examples(1))
    assert not precompilable(lambda x: x, _examples(1))


class _Graph:
    """A saved graph as torch's dispatch sees it: a guard and a call."""

    def __init__(self, accepts: int, answer: str) -> None:
        self.accepts, self.answer = accepts, answer
        self.seen: list[Any] = []
        self.threads_seen: list[int] = []
        self.checks_its_own_guards = True

    def disable_guard_check(self) -> None:
        self.checks_its_own_guards = False

    def guard_check(self, model: Any, batch: torch.Tensor) -> bool:
        self.seen.append(model)
        self.threads_seen.append(torch.get_num_threads())
        return batch.shape[0] == self.accepts

    def __call__(self, model: Any, batch: torch.Tensor) -> str:
        return self.answer


class _Saved:
    def __init__(self, *graphs: _Graph) -> None:
        self.compiled_results = list(graphs)


def test_a_call_goes_to_the_first_graph_whose_guards_accept_it_else_to_torch_compile() -> None:
    model = _mlp()
    one, many = _Graph(1, "graph for 1"), _Graph(4, "graph for 4")
    fallback_calls: list[tuple[int, ...]] = []

    def fallback(batch: torch.Tensor) -> str:
        fallback_calls.append(tuple(batch.shape))
        return "compiled as it runs"

    forward = GuardedForward(model, _Saved(one, many), fallback)
    assert forward(torch.zeros(1, 3)) == "graph for 1"
    assert forward(torch.zeros(4, 3)) == "graph for 4"
    assert forward(torch.zeros(3, 3)) == "compiled as it runs"
    assert fallback_calls == [(3, 3)]
    assert all(seen is model for seen in one.seen + many.seen)
    # Checked here, and not again by the graph as it is called.
    assert not one.checks_its_own_guards and not many.checks_its_own_guards


def test_guards_are_checked_at_the_thread_count_the_graphs_were_traced_at() -> None:
    """Dynamo guards on the count; a worker with another one runs the graphs all the
    same (their kernels are made for any count), and keeps its own count."""
    threads = torch.get_num_threads()
    graph = _Graph(1, "graph for 1")
    forward = GuardedForward(_mlp(), _Saved(graph), lambda _: "compiled as it runs", threads + 1)
    assert forward(torch.zeros(1, 3)) == "graph for 1"
    assert forward(torch.zeros(2, 3)) == "compiled as it runs"
    assert graph.threads_seen == [threads + 1, threads + 1]
    assert torch.get_num_threads() == threads
    same = _Graph(1, "graph for 1")
    GuardedForward(_mlp(), _Saved(same), lambda _: None, threads)(torch.zeros(1, 3))
    assert same.threads_seen == [threads]


def test_a_model_the_capture_cannot_take_is_compiled_the_ordinary_way(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(precompile, "cache_root", lambda: tmp_path)

    def graph_break(*_: Any) -> Any:
        raise RuntimeError("Graph break in user code\nmore detail")

    monkeypatch.setattr(precompile, "_compile", graph_break)
    model = _mlp()
    compiled = precompile.compile_once(model, "default", _examples(1))
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert not isinstance(compiled.forward, GuardedForward)
    assert "cannot be compiled ahead of its first call (RuntimeError: Graph break" in caplog.text
    assert not (tmp_path / precompile.FOLDER).exists()


@pytest.mark.parametrize(
    ("removed", "named"),
    [
        ("method", "torch._dynamo.eval_frame.OptimizedModule._aot_compile"),
        ("module", "torch._dynamo.aot_compile.ModelInput"),
        ("renamed", "torch._dynamo.config.no_such_flag"),
    ],
)
def test_a_torch_without_the_capture_compiles_the_ordinary_way_and_says_why(
    removed: str,
    named: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As on a torch older than 2.13 (the device's 2.11, say), simulated: a method or the
    module of the capture missing, or a piece renamed (a later torch)."""
    monkeypatch.setattr(precompile, "cache_root", lambda: tmp_path)
    if removed == "method":
        monkeypatch.delattr(torch._dynamo.eval_frame.OptimizedModule, "_aot_compile")
    elif removed == "module":
        monkeypatch.setitem(sys.modules, "torch._dynamo.aot_compile", None)  # ImportError
    else:
        renamed = ("torch._dynamo.config", "no_such_flag")
        monkeypatch.setattr(precompile, "CAPTURE", (*precompile.CAPTURE, renamed))

    def compiled_anyway(*_: Any) -> Any:
        raise AssertionError("the capture was tried")

    monkeypatch.setattr(precompile, "_compile", compiled_anyway)
    precompile.missing_capture.cache_clear()
    try:
        assert named in precompile.missing_capture()
        compiled = precompile.compile_once(_mlp(), "default", _examples(1, 4))
    finally:
        precompile.missing_capture.cache_clear()
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert not isinstance(compiled.forward, GuardedForward)
    assert f"lacks the ahead-of-time capture ({named}" in caplog.text
    assert not (tmp_path / precompile.FOLDER).exists()


@pytest.mark.skipif(torch.__version__ < "2.13", reason="the capture is torch 2.13's")
def test_torch_2_13_has_every_piece_of_the_capture() -> None:
    precompile.missing_capture.cache_clear()
    assert precompile.missing_capture() == ()


def test_a_saved_file_that_does_not_load_is_compiled_again_and_replaced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(precompile, "cache_root", lambda: tmp_path)
    model, examples = _mlp(), _examples(1)
    damaged = artifact_path(tmp_path, model, "default", examples)
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"not a pickle")
    compiled_again: list[bool] = []

    class _Compiled:
        forward: Any = _Saved(_Graph(1, "fresh"))

        def _save_aot_compiled_module(self) -> bytes:
            return b"fresh graphs"

    def fresh(*_: Any) -> Any:
        compiled_again.append(True)
        return _Compiled()

    monkeypatch.setattr(precompile, "_compile", fresh)
    compiled = precompile.compile_once(model, "default", examples)
    assert compiled_again == [True]
    assert compiled.forward(torch.zeros(1, 3)) == "fresh"
    assert "did not load" in caplog.text and str(damaged) in caplog.text
    threads = torch.get_num_threads()
    # Replaced whole, with the thread count the graphs were traced at.
    assert damaged.read_bytes() == precompile.HEADER + f"{threads}\n".encode() + b"fresh graphs"
    assert list(damaged.parent.iterdir()) == [damaged]  # no partial file left


def test_compile_with_a_warm_up_shape_compiles_ahead_and_without_one_as_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, list[tuple[int, ...]]]] = []

    def compile_once(model: Any, mode: str, examples: list[torch.Tensor]) -> str:
        calls.append((mode, [tuple(e.shape) for e in examples]))
        return "compiled once"

    monkeypatch.setattr("ferry.handlers.builtin.optimize.compile_once", compile_once)
    cpu = torch.device("cpu")
    warmed = Optimizations.from_section(
        parse_optimization(
            {"compile": "default", "warmup": {"input_shape": [3], "batch_sizes": [1, 4, 4]}}
        )
    )
    assert optimize_model(_mlp(), warmed, cpu) == "compiled once"
    assert calls == [("default", [(1, 3), (4, 3)])]
    bucketed = Optimizations.from_section(
        parse_optimization(
            {"compile": "default", "batch_buckets": [2, 8], "warmup": {"input_shape": [3]}}
        )
    )
    optimize_model(_mlp(), bucketed, cpu)
    assert calls[-1] == ("default", [(2, 3), (8, 3)])
    plain = Optimizations.from_section(parse_optimization({"compile": "default"}))
    unwarmed = optimize_model(_mlp(), plain, cpu)
    assert isinstance(unwarmed, torch._dynamo.eval_frame.OptimizedModule)
    assert len(calls) == 2
