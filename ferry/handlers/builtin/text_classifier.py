"""``TextClassifier``: TorchServe's text classification handler, in a small form.

- preprocess: each request's text (``data`` or ``body``; bytes decoded as UTF-8). With a
  ``source_vocab.pt`` in the model folder (a ``{token: index}`` dict, or a list of tokens,
  saved with ``torch.save``), the text is lower-cased, split on whitespace and turned into
  token ids; the batch is ``(ids, offsets)``, one flat id tensor plus each text's start, the
  input of an ``nn.EmbeddingBag`` model. Unknown tokens take the ``<unk>`` id (else 0).
  Without a vocabulary the batch is the list of texts, for models that tokenize themselves.
- inference: ``model(ids, offsets)`` or ``model(texts)``.
- postprocess: softmax over the classes, one ``{label: probability}`` per text, labels from
  ``index_to_name.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.builtin.optimize import begin_graph_tree_step, copy_graph_tree_outputs
from ferry.handlers.contract.context import Context
from ferry.handlers.contract.exceptions import PredictionException
from ferry.handlers.torchserve.ts_utils import map_class_to_label

VOCAB_FILE = "source_vocab.pt"


class TextClassifier(BaseHandler):
    vocab: dict[str, int] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.vocab = None

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        self.vocab = load_vocab(Path(context.system_properties["model_dir"]) / VOCAB_FILE)

    def preprocess(self, data: list[dict[str, Any]]) -> Any:
        texts = [_text_of(row) for row in data]
        vocab = self.vocab
        if vocab is None:
            return texts
        unknown = vocab.get("<unk>", 0)
        ids = [[vocab.get(token, unknown) for token in text.lower().split()] for text in texts]
        lengths = [len(row) for row in ids]
        offsets = torch.tensor([0, *lengths[:-1]]).cumsum(0)
        flat = torch.tensor([i for row in ids for i in row], dtype=torch.long)
        return self.to_device(flat), self.to_device(offsets)

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        with torch.inference_mode():
            begin_graph_tree_step(self.optimizations)
            if isinstance(data, tuple):
                answer = self.model(*data, *args, **kwargs)
            else:
                answer = self.model(data, *args, **kwargs)
            return copy_graph_tree_outputs(answer, self.optimizations)

    def postprocess(self, data: Any) -> list[Any]:
        probs = torch.softmax(torch.as_tensor(data).float(), dim=1).tolist()
        return map_class_to_label(probs, self.mapping)


def load_vocab(path: Path) -> dict[str, int] | None:
    """``source_vocab.pt`` as ``{token: index}``; None when the model has none."""
    if not path.is_file():
        return None
    vocab = torch.load(path, weights_only=True)
    if isinstance(vocab, list):
        return {str(token): index for index, token in enumerate(vocab)}
    if isinstance(vocab, dict):
        return {str(token): int(index) for token, index in vocab.items()}
    raise PredictionException(f"{VOCAB_FILE} must hold a dict or a list of tokens", 500)


def _text_of(row: Any) -> str:
    value = row.get("data") or row.get("body") if isinstance(row, dict) else row
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise PredictionException("expected text in the request body", 400)
    return value
