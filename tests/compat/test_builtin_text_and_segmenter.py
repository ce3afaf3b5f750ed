"""TorchServe 0.12's built-in ``text_classifier`` and ``image_segmenter`` beside Ferry's,
served from the same archives: bit-identical answers.

Both servers run the model with the same number of torch threads (TorchServe's through
``OMP_NUM_THREADS``, Ferry's a lone worker's share of the cores): a deep model's answer moves
with the thread count as much as with the last bit of its input (docs/handlers.md, "The
model's input, as TorchServe's"). Needs TorchServe in its own virtual environment and
Java; skipped without.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from benchmarks.common import detailed_photo
from ferry.config.settings import available_cores, threads_per_worker
from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.models import write_config
from tests.fixtures.server import RunningServer, ferry_server
from tests.fixtures.torchserve import VENV_VARIABLE, torchserve_available, torchserve_server

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(
        torchserve_available() is None,
        reason=f"no TorchServe 0.12 environment (run scripts/torchserve-venv.sh or set "
        f"{VENV_VARIABLE}) or no java",
    ),
]

TEXT_MODEL = """
from torch import nn


class BagOfWords(nn.Module):
    # TorchServe's text handler explains through an attribute named embedding.
    def __init__(self):
        super().__init__()
        self.embedding = nn.EmbeddingBag(32, 16)
        self.fc = nn.Linear(16, 4)

    def forward(self, text, offsets):
        return self.fc(self.embedding(text, offsets))
"""

VOCABULARY = [
    "<unk>", "bloomberg", "has", "decided", "to", "publish", "a", "new", "report", "on",
    "global", "economic", "situation", "bloomberg has", "new report", "economic situation",
    "the", "cafe", "team", "won", "does", "not", "does not", "will", "will not", "it", "is",
    "it is", "match", "the match",
]  # fmt: skip
"""Tokens and bigrams, index as position; each text below also has some that are not here."""

TEXTS = [
    "Bloomberg has decided to publish a new report on global economic situation.",
    "<p>The Café's team <b>WON'T</b> publish &amp; doesn't report: it's the match!</p>",
    "Naïve \u201cquotes\u201d \u2014 and nothing the vocabulary knows",
]

SEGMENTER_MODEL = """
from torch import nn
from torch.nn import functional as F


class DilatedSegmenter(nn.Module):
    # The shape of torchvision's FCN in small: a strided stem, dilated 3x3 convolutions
    # with batch norm, 1x1 class scores upsampled to the input's size.
    def __init__(self):
        super().__init__()
        layers = [nn.Conv2d(3, 32, 7, stride=4, padding=3), nn.BatchNorm2d(32), nn.ReLU()]
        for dilation in (1, 2, 4, 2):
            layers += [
                nn.Conv2d(32, 32, 3, padding=dilation, dilation=dilation),
                nn.BatchNorm2d(32),
                nn.ReLU(),
            ]
        self.features = nn.Sequential(*layers)
        self.classes = nn.Conv2d(32, 21, 1)

    def forward(self, x):
        scores = self.classes(self.features(x))
        return {"out": F.interpolate(scores, size=x.shape[-2:], mode="bilinear")}
"""


def _archive(store: Path, name: str, handler: str, source: str, extra: dict[str, bytes]) -> str:
    """``handler`` over the one class in ``source``, seeded random weights, ``extra`` files."""
    scratch = store / f".{name}-src"
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / f"{name}_model.py").write_text(source)
    namespace: dict[str, object] = {}
    exec(source, namespace)  # the archive's own class, for its state dict
    model_class = next(v for v in namespace.values() if isinstance(v, type) and v.__module__)
    assert issubclass(model_class, torch.nn.Module)
    torch.manual_seed(0)
    torch.save(model_class().state_dict(), scratch / f"{name}.pt")
    for file_name, content in extra.items():
        (scratch / file_name).write_bytes(content)
    spec = ArchiveSpec(
        model_name=name,
        handler=handler,
        serialized_file=scratch / f"{name}.pt",
        model_file=scratch / f"{name}_model.py",
        extra_files=tuple(scratch / file_name for file_name in extra),
        config_file=write_config(scratch, {"minWorkers": 1, "maxWorkers": 1}),
    )
    return write_archive(spec, store, force=True).name


def _text_archive(store: Path) -> str:
    # A Counter answers 0 (here "<unk>") for a token it lacks, as torchtext's vocabulary
    # with a default index does, and torch.load reads it without weights_only=False.
    vocab = collections.Counter({token: index for index, token in enumerate(VOCABULARY)})
    torch.save(vocab, store / "vocab.pt")
    labels = {"0": "World", "1": "Sports", "2": "Business", "3": "Sci/Tec"}
    extra = {
        "source_vocab.pt": (store / "vocab.pt").read_bytes(),
        "index_to_name.json": json.dumps(labels).encode(),
    }
    return _archive(store, "text", "text_classifier", TEXT_MODEL, extra)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, ...]]:
    tmp = tmp_path_factory.mktemp("builtin")
    store = tmp / "store"
    store.mkdir()
    models = [
        f"text={_text_archive(store)}",
        f"segmenter={_archive(store, 'segmenter', 'image_segmenter', SEGMENTER_MODEL, {})}",
    ]
    (tmp / "ts").mkdir()
    (tmp / "ferry").mkdir()
    threads = threads_per_worker(available_cores(), 1)  # Ferry's, for a lone worker
    with pytest.MonkeyPatch.context() as environment:
        environment.setenv("OMP_NUM_THREADS", str(threads))  # TorchServe's worker reads it
        with (
            torchserve_server(store, models, tmp / "ts") as torchserve,
            ferry_server(store, models, tmp / "ferry") as ferry,
        ):
            yield torchserve, ferry


def _both(servers: tuple[RunningServer, ...], model: str, body: bytes) -> list[object]:
    answers = []
    for server in servers:
        response = httpx.post(f"{server.url}/predictions/{model}", content=body, timeout=120)
        assert response.status_code == 200, response.text
        answers.append(response.json())
    return answers


@pytest.mark.parametrize("text", TEXTS)
def test_the_text_classifier_answers_the_same(
    servers: tuple[RunningServer, ...], text: str
) -> None:
    theirs, ours = _both(servers, "text", text.encode())
    assert ours == theirs


@pytest.mark.parametrize(("size", "fmt"), [((640, 491), "JPEG"), ((491, 640), "PNG")])
def test_the_image_segmenter_answers_the_same(
    servers: tuple[RunningServer, ...], size: tuple[int, int], fmt: str
) -> None:
    """Every pixel's class and probability, bit for bit, on photo-like images the size of
    TorchServe's examples/image_segmenter/persons.jpg."""
    theirs, ours = _both(servers, "segmenter", detailed_photo(*size, seed=3, fmt=fmt))
    assert torch.tensor(theirs).shape == (224, 224, 2)
    assert ours == theirs
