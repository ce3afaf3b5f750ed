"""``optimization: compile`` compiled once, for real (torch's compiler and g++): the first
load compiles the warm-up shapes ahead of their first call and saves them; a second load
of the model, as a later worker makes it, traces and compiles nothing and answers as the
eager model does, at the warm-up sizes and between them; a call the saved guards reject
is compiled the ordinary way and answers the same; a ``BaseHandler`` whose batches are
padded to their bucket runs them on the saved graphs, as it runs unpadded ones. Through a
real server (two workers, the second loading the first's graphs), in
tests/integration/test_aot_inductor.py.

Compiling needs a C++ compiler: without one these tests skip, saying so (CI has one).
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config

from ferry.handlers.builtin import precompile
from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.contract.context import Context
from tests.fixtures.models import DOUBLING_MODEL, Doubler

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None,
    reason="torch.compile compiles C++: no C++ compiler (g++) here",
)


class SmallConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.norm(self.conv(x))).mean(dim=(2, 3))
        result: torch.Tensor = self.head(features)
        return result


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return SmallConvNet().eval()


def _examples() -> list[torch.Tensor]:
    return [torch.zeros(size, 3, 8, 8) for size in (1, 4)]


def _snapshot() -> Counter[str]:
    """Dynamo's traces, Inductor's compiles and cache loads, and the saved graphs' counts."""
    seen = Counter[str]()
    seen["traced graphs"] = counters["stats"]["unique_graphs"]
    seen["inductor compiled"] = counters["inductor"]["fxgraph_cache_miss"]
    seen["inductor loaded"] = counters["inductor"]["fxgraph_cache_hit"]
    for what in ("compiled", "loaded"):
        seen[f"saved graphs {what}"] = counters[precompile.COUNTERS][what]
    return seen


def _answers_as_eager(compiled: nn.Module, eager: nn.Module, sizes: tuple[int, ...]) -> None:
    for size in sizes:
        batch = torch.randn(size, 3, 8, 8)  # as preprocess makes it
        with torch.inference_mode():
            torch.testing.assert_close(compiled(batch), eager(batch), rtol=1e-4, atol=1e-5)


def test_a_second_load_compiles_nothing_and_answers_as_the_eager_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    before = _snapshot()
    first_model = _model(seed=0)
    first = precompile.compile_once(first_model, "default", _examples())
    compiled_first = _snapshot() - before
    assert compiled_first["saved graphs compiled"] == 2  # a batch of 1, a dynamic batch
    saved = list((tmp_path / precompile.FOLDER).iterdir())
    assert len(saved) == 1 and saved[0].suffix == ".bin"
    _answers_as_eager(first, first_model, (1, 4))

    # A later worker: a new process in production; the same model, other weights.
    torch._dynamo.reset()
    second_model = _model(seed=1)
    before_second = _snapshot()
    second = precompile.compile_once(second_model, "default", _examples())
    _answers_as_eager(second, second_model, (1, 4, 3, 8))  # 3 and 8: the dynamic graph
    done = _snapshot() - before_second
    assert done["saved graphs loaded"] == 2
    assert done["traced graphs"] == 0 and done["inductor compiled"] == 0, done

    # A call the guards reject (an inference tensor): compiled as torch.compile would.
    with torch.inference_mode():
        batch = torch.randn(4, 3, 8, 8)
        torch.testing.assert_close(second(batch), second_model(batch), rtol=1e-4, atol=1e-5)
    assert (_snapshot() - before_second)["traced graphs"] > 0


def test_a_worker_with_another_thread_count_loads_the_graphs_and_compiles_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A scale-up splits the cores again: the first worker compiled with 2 torch threads,
    the next has 1. Its saved graphs' kernels run with any count (as Ferry's workers make
    them), so it loads them and neither traces nor compiles, at any batch size."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    threads = torch.get_num_threads()
    try:
        with inductor_config.patch({"cpp.dynamic_threads": True}):
            torch.set_num_threads(2)
            torch._dynamo.reset()
            precompile.compile_once(_model(seed=0), "default", _examples())
            torch.set_num_threads(1)
            torch._dynamo.reset()
            before = _snapshot()
            eager = _model(seed=1)
            second = precompile.compile_once(eager, "default", _examples())
            _answers_as_eager(second, eager, (1, 4, 3))
            done = _snapshot() - before
    finally:
        torch.set_num_threads(threads)
    assert done["saved graphs loaded"] == 2
    assert done["traced graphs"] == 0 and done["inductor compiled"] == 0, done


def test_padded_and_unpadded_batches_run_on_the_saved_graphs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A batch padded to its bucket is made inside the handler's inference; the graphs'
    guards would send an inference tensor to be compiled again."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    (tmp_path / "doubler_model.py").write_text(DOUBLING_MODEL)
    torch.save(Doubler().state_dict(), tmp_path / "doubler.pt")
    manifest = {"model": {"serializedFile": "doubler.pt", "modelFile": "doubler_model.py"}}
    config = {
        "optimization": {
            "compile": "default",
            "batch_buckets": [1, 4],
            "warmup": {"input_shape": [3]},
        }
    }
    handler = BaseHandler()
    handler.initialize(Context("m", str(tmp_path), manifest, 4, None, model_yaml_config=config))
    assert isinstance(handler.model.forward, precompile.GuardedForward)
    before = _snapshot()
    for rows in (1, 2, 3, 4):  # 2 and 3 padded to 4
        batch = torch.randn(rows, 3)  # as preprocess makes it
        torch.testing.assert_close(handler.inference(batch), batch * 2)
    assert (_snapshot() - before)["traced graphs"] == 0
