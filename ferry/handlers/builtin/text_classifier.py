"""``TextClassifier``: TorchServe's text classification handler.

- preprocess: each request's text (``data`` or ``body``; bytes decoded as UTF-8), cleaned
  and tokenised as TorchServe 0.12's (:func:`~ferry.handlers.builtin.text_normalize.text_tokens`:
  HTML tags and character references removed, lower case, contractions expanded, ``'``,
  accents and punctuation removed, torchtext's ``basic_english``), then the tokens and their
  bigrams (``ngrams``, 2 as in TorchServe) looked up in ``source_vocab.pt`` (a
  ``{token: index}`` dict, ``collections.Counter`` or a list of tokens, saved with
  ``torch.save``). A token or bigram not in it takes the ``<unk>`` id, else 0: what
  torchtext's vocabulary with ``<unk>`` as its default index answers. The batch is
  ``(ids, offsets)``, one flat id tensor plus each text's start, the input of an
  ``nn.EmbeddingBag`` model; TorchServe's handler takes one text at a time, with offsets
  ``[0]``, which is the same for a batch of one.
  Without a vocabulary the batch is the list of raw texts, for models that tokenise
  themselves (TorchServe's handler refuses to load there).
- inference: ``model(ids, offsets)`` or ``model(texts)``.
- postprocess: softmax over the classes, on the dimension PyTorch picks when none is named
  (as TorchServe calls it: the second of a ``(texts, classes)`` output), one
  ``{label: probability}`` per text, labels from ``index_to_name.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.builtin.optimize import begin_graph_tree_step, copy_graph_tree_outputs
from ferry.handlers.builtin.text_normalize import text_tokens, with_ngrams
from ferry.handlers.contract.context import Context
from ferry.handlers.contract.exceptions import PredictionException
from ferry.handlers.torchserve.ts_utils import map_class_to_label

VOCAB_FILE = "source_vocab.pt"


class TextClassifier(BaseHandler):
    vocab: dict[str, int] | None = None
    ngrams = 2
    """Tokens and runs of up to this many tokens are looked up (TorchServe's attribute)."""

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
        ids = [
            [vocab.get(gram, unknown) for gram in with_ngrams(text_tokens(text), self.ngrams)]
            for text in texts
        ]
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
        scores = torch.as_tensor(data).float()
        probs = torch.softmax(scores, dim=implicit_softmax_dim(scores.dim())).tolist()
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


def implicit_softmax_dim(ndim: int) -> int:
    """The dimension ``F.softmax`` picks when none is named (TorchServe names none): the
    first for 0-, 1- and 3-D input, else the second."""
    return 0 if ndim in (0, 1, 3) else 1


def _text_of(row: Any) -> str:
    value = row.get("data") or row.get("body") if isinstance(row, dict) else row
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
        raise PredictionException("expected text in the request body", 400)
    return value
