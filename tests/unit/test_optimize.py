"""Optimisation switches answer the same classes as fp32; bucketing never leaks padded rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ferry.errors import ConfigError
from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.builtin.optimize import Optimizations, finish_output, warm_up
from ferry.handlers.contract.context import Context
from tests.fixtures.models import save_torchscript


def _cnn() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    ).eval()


EAGER = """
from torch import nn


class Net(nn.Sequential):
    def __init__(self):
        super().__init__(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(32, 10),
        )
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights as TorchScript (cnn.pt) and as eager state_dict (cnn_state.pt)."""
    folder = tmp_path_factory.mktemp("model")
    model = _cnn()
    save_torchscript(model, folder / "cnn.pt")
    torch.save(model.state_dict(), folder / "cnn_state.pt")
    (folder / "cnn_net.py").write_text(EAGER)
    return folder


def _handler(model_dir: Path, eager: bool = False, **optimization: Any) -> BaseHandler:
    handler = BaseHandler()
    manifest = {"model": {"serializedFile": "cnn.pt"}}
    if eager:
        manifest = {"model": {"serializedFile": "cnn_state.pt", "modelFile": "cnn_net.py"}}
    config = {"optimization": optimization} if optimization else {}
    handler.initialize(Context("cnn", str(model_dir), manifest, 8, None, model_yaml_config=config))
    return handler


INPUT = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))

SWITCHES = [
    pytest.param({"precision": "bf16"}, 0.15, id="bf16"),
    pytest.param({"precision": "fp16"}, 0.05, id="fp16"),
    pytest.param({"channels_last": True}, 1e-4, id="channels_last"),
    pytest.param({"torchscript_freeze": True}, 1e-4, id="torchscript_freeze"),
    pytest.param({"batch_buckets": [4, 8]}, 1e-4, id="batch_buckets"),
    pytest.param({"compile": "default", "eager": True}, 1e-4, id="compile"),
    # Freezing makes the weights constants: the casts and layout must come before it
    # (after it, bf16 inputs met fp32 weights: "Input type ... BFloat16 ... weight type").
    pytest.param({"torchscript_freeze": True, "precision": "bf16"}, 0.15, id="freeze+bf16"),
    pytest.param(
        {"torchscript_freeze": True, "channels_last": True}, 1e-4, id="freeze+channels_last"
    ),
]


@pytest.mark.parametrize(("switch", "tolerance"), SWITCHES)
def test_switch_answers_like_fp32(
    model_dir: Path, switch: dict[str, Any], tolerance: float
) -> None:
    reference = _handler(model_dir).inference(INPUT)
    output = _handler(model_dir, **switch).inference(INPUT)
    assert torch.allclose(_handler(model_dir, eager=True).inference(INPUT), reference, atol=1e-5)
    assert output.dtype == torch.float32 and output.shape == reference.shape
    assert torch.equal(output.argmax(1), reference.argmax(1))
    assert torch.allclose(output, reference, atol=tolerance * reference.abs().max().item())


class _Recorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.shapes.append(tuple(x.shape))
        return x.flatten(1).sum(1, keepdim=True) + torch.arange(x.shape[0]).unsqueeze(1)


def test_padded_rows_never_reach_postprocess() -> None:
    handler = BaseHandler()
    handler.model = recorder = _Recorder()
    handler.device = torch.device("cpu")
    handler.optimizations = Optimizations(batch_buckets=(4, 8))
    out = handler.inference(torch.ones(3, 2))
    assert recorder.shapes == [(4, 2)]  # the model ran on the bucket
    assert out.tolist() == [[2.0], [3.0], [4.0]]  # only the three real rows come back
    assert handler.inference(torch.ones(9, 2)).shape == (9, 1)  # beyond the largest bucket
    assert recorder.shapes[-1] == (9, 2)
    assert handler.postprocess(handler.inference(torch.ones(5, 2))) == [
        [2.0],
        [3.0],
        [4.0],
        [5.0],
        [6.0],
    ]


def test_warm_up_runs_each_configured_batch_size() -> None:
    recorder = _Recorder()
    options = Optimizations(warmup_shape=(3, 8, 8), warmup_batch_sizes=(1, 4))
    warm_up(recorder, options, torch.device("cpu"))
    assert recorder.shapes == [(1, 3, 8, 8), (4, 3, 8, 8)]
    warm_up(recorder, Optimizations(), torch.device("cpu"))  # nothing configured: no run
    assert len(recorder.shapes) == 2


def test_graph_trees_warm_up_until_they_replay() -> None:
    """Under reduce-overhead a size compiles on its first call and records its graph on
    the second: warm-up makes three, so the first request replays."""
    recorder = _Recorder()
    options = Optimizations(
        warmup_shape=(3, 8, 8), warmup_batch_sizes=(2,), compile_mode="reduce-overhead"
    )
    warm_up(recorder, options, torch.device("cpu"))
    assert recorder.shapes == [(2, 3, 8, 8)] * 3


def test_invalid_switches_name_the_section(model_dir: Path) -> None:
    for bad in ({"precision": "fp8"}, {"compile": "fastest"}, {"batch_buckets": [0]}):
        with pytest.raises(ConfigError, match="optimization"):
            Optimizations.from_model_config({"optimization": bad})
    with pytest.raises(ConfigError, match="compile needs an eager"):
        _handler(model_dir, compile="default")
    with pytest.raises(ConfigError, match="torchscript_freeze needs"):
        _handler(model_dir, eager=True, torchscript_freeze=True)
    handler = BaseHandler()
    handler.initialize(
        Context(
            "cnn",
            str(model_dir),
            {"model": {"serializedFile": "cnn.pt"}},
            1,
            None,
            model_yaml_config={},
        )
    )
    assert handler.optimizations == Optimizations()


def test_onnx_model_answers_like_torch(tmp_path: Path) -> None:
    import warnings

    from ferry.handlers.builtin.formats import load_model
    from ferry.handlers.builtin.model_loading import select_device
    from ferry.handlers.builtin.onnx_model import OnnxModel

    model = _cnn()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (INPUT[:2],),
            str(tmp_path / "cnn.onnx"),
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            dynamo=False,
        )
    loaded = load_model(tmp_path, "cnn.onnx", None, select_device(None))
    assert isinstance(loaded, OnnxModel) and loaded.providers == ["CPUExecutionProvider"]
    with torch.inference_mode():
        expected = model(INPUT)
    assert torch.allclose(loaded(INPUT), expected, atol=1e-4)
    handler = BaseHandler()
    handler.model, handler.device = loaded, torch.device("cpu")
    handler.optimizations = Optimizations(batch_buckets=(8,))
    assert torch.allclose(handler.inference(INPUT[:3]), expected[:3], atol=1e-4)
    # precision casts a torch model's input; an fp32 ONNX file still gets fp32 (it refused
    # fp16 input: "Unexpected input data type. Actual: (tensor(float16))").
    handler.optimizations = Optimizations(precision="fp16")
    assert torch.allclose(handler.inference(INPUT), expected, atol=0.05)


def test_cuda_graphs_need_fixed_shapes_and_no_compile() -> None:
    with pytest.raises(ConfigError, match=r"cuda_graphs needs warmup\.input_shape"):
        Optimizations.from_model_config({"optimization": {"cuda_graphs": True}})
    with pytest.raises(ConfigError, match="reduce-overhead"):
        Optimizations.from_model_config(
            {
                "optimization": {
                    "cuda_graphs": True,
                    "compile": True,
                    "batch_buckets": [8],
                    "warmup": {"input_shape": [3, 8, 8]},
                }
            }
        )
    options = Optimizations.from_model_config(
        {"optimization": {"cuda_graphs": True, "warmup": {"input_shape": [3], "batch_sizes": [2]}}}
    )
    assert options.graph_batch_sizes == (2,)


def test_cuda_graphs_are_ignored_on_cpu(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from ferry.handlers.builtin.optimize import graph_model

    model = _Recorder()
    options = Optimizations(cuda_graphs=True, warmup_shape=(2,), batch_buckets=(4,))
    with caplog.at_level(logging.WARNING, "ferry.handlers"):
        assert graph_model(model, options, torch.device("cpu")) is model
    assert "cuda_graphs needs a GPU" in caplog.text


def test_graphed_model_replays_captured_shapes_and_runs_others_eagerly() -> None:
    from ferry.handlers.builtin.optimize import GraphedModel

    captured: list[tuple[int, Any]] = []
    replayed: list[tuple[int, ...]] = []

    def capture(model: Any, example: torch.Tensor, pool: Any) -> tuple[Any, Any]:
        captured.append((example.shape[0], pool))

        def replay(batch: torch.Tensor) -> Any:
            replayed.append(tuple(batch.shape))
            return model(batch)

        return replay, "shared-pool"

    recorder = _Recorder()
    examples = [torch.zeros(size, 2) for size in (1, 8, 4)]
    graphed = GraphedModel(recorder, examples, capture)
    # Largest first; later captures share the first one's memory pool.
    assert captured == [(8, None), (4, "shared-pool"), (1, "shared-pool")]
    assert graphed.captured_batch_sizes == [1, 4, 8]
    graphed(torch.ones(4, 2))
    graphed(torch.ones(3, 2))  # not captured: eager
    graphed(torch.ones(4, 2, dtype=torch.float64))  # another dtype: eager
    assert replayed == [(4, 2)]
    assert graphed.shapes[-3:] == [(4, 2), (3, 2), (4, 2)]  # attributes reach the model

    handler = BaseHandler()
    handler.device = torch.device("cpu")
    handler.model = graphed
    handler.optimizations = Optimizations(batch_buckets=(4, 8))
    # A batch of 3 pads to the captured bucket of 4; the padded row never comes back.
    assert handler.inference(torch.ones(3, 2)).tolist() == [[2.0], [3.0], [4.0]]
    assert replayed[-1] == (4, 2)


def test_graph_tree_outputs_are_copies_whatever_the_precision() -> None:
    """Under fp16 a model may still answer fp32 (``.float()`` is then no copy): the
    output that leaves the inference stage must not be the graph's static buffer."""
    static = torch.ones(4, 3)
    for precision in ("fp32", "fp16"):
        options = Optimizations(precision=precision, compile_mode="reduce-overhead")
        out = finish_output(static, 4, 4, options)
        assert out.untyped_storage().data_ptr() != static.untyped_storage().data_ptr()
        assert torch.equal(out, static)
    plain = finish_output(static, 4, 4, Optimizations())
    assert plain is static  # no graph trees: no copy
