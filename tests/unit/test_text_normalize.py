"""The built-in text_classifier's steps, each against answers worked by hand from TorchServe
0.12's documented behaviour (tests/compat/test_text_parity.py runs TorchServe's own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from ferry.handlers.builtin.contractions import CONTRACTIONS
from ferry.handlers.builtin.text_classifier import TextClassifier, implicit_softmax_dim
from ferry.handlers.builtin.text_normalize import (
    basic_english,
    expand_contractions,
    remove_accents,
    remove_markup,
    remove_punctuation,
    text_tokens,
    with_ngrams,
)
from ferry.handlers.torchserve.mock_context import MockContext


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<p>Good <b>news</b></p>", "Good news"),
        ("fish &amp; chips &#39;n&#x27; peas", "fish  chips n peas"),
        ("&AMP; stays, upper case", "&AMP; stays, upper case"),
        ("a <tag\nover lines> stays", "a <tag\nover lines> stays"),
        ("1 < 2 > 0", "1  0"),
    ],
)
def test_markup_is_removed(text: str, expected: str) -> None:
    assert remove_markup(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("i don't know", "i do not know"),
        ("Don't", "Do not"),
        ("WON'T", "Will not"),  # the match keeps its first character only
        ("ain't", "as not"),  # "is not" after the match's own "a"
        ("'cause", "ecause"),
        ("wouldn't've", "would notve"),  # the shorter form matches first
        ("she'd said", "she would said"),
        ("isn'tit", "is notit"),  # no word boundary
        ("rock 'n' roll's", "rock n rolls"),  # other apostrophes just dropped
        ("o'clock y'all", "of the clock you all"),
    ],
)
def test_contractions_are_expanded_and_apostrophes_dropped(text: str, expected: str) -> None:
    assert expand_contractions(text) == expected


def test_no_contraction_starts_another() -> None:
    """What lets the table be matched in any order and still answer as TorchServe's."""
    keys = sorted(CONTRACTIONS)
    assert all(not b.startswith(a) for a in keys for b in keys if a != b)
    assert all(key == key.lower() and "'" in key for key in keys)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("café naïve", "cafe naive"), ("ﬁne ½", "fine 12"), ("it\u2019s €5 東京", "its 5 ")],
)
def test_accents_are_removed(text: str, expected: str) -> None:
    assert remove_accents(text) == expected


def test_punctuation_is_removed_without_a_space() -> None:
    assert remove_punctuation("e-mail: a.b@c, (now)!") == "email abc now"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "You can now install TorchText using pip!",
            ["you", "can", "now", "install", "torchtext", "using", "pip", "!"],
        ),
        ('He said "no." (twice)', ["he", "said", "no", ".", "(", "twice", ")"]),
        ("it's a:b;c<br />d", ["it", "'", "s", "a", "b", "c", "d"]),
        ("why?  really,\tyes", ["why", "?", "really", ",", "yes"]),
    ],
)
def test_basic_english(text: str, expected: list[str]) -> None:
    assert basic_english(text) == expected


def test_text_tokens_runs_every_step_in_torchserves_order() -> None:
    text = "<p>Bloomberg doesn't publish the CAFÉ's report, &amp; it's global.</p>"
    assert text_tokens(text) == [
        "bloomberg",
        "does",
        "not",
        "publish",
        "the",
        "cafes",
        "report",
        "it",
        "is",
        "global",
    ]


def test_ngrams_follow_the_tokens() -> None:
    tokens = ["a", "b", "c"]
    assert with_ngrams(tokens, 1) == tokens
    assert with_ngrams(tokens, 2) == ["a", "b", "c", "a b", "b c"]
    assert with_ngrams(tokens, 3) == ["a", "b", "c", "a b", "b c", "a b c"]
    assert with_ngrams(["a"], 2) == ["a"]


@pytest.mark.parametrize("shape", [(4,), (1, 4), (2, 1, 4), (1, 4, 2, 2)])
def test_softmax_takes_the_dimension_torch_picks_unnamed(shape: tuple[int, ...]) -> None:
    scores = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="Implicit dimension"):
        expected = F.softmax(scores)
    assert torch.equal(torch.softmax(scores, dim=implicit_softmax_dim(scores.dim())), expected)


class _Bag(torch.nn.Module):
    """Each id's one-hot over 6 ids, summed per text: the ids and offsets, visible."""

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        bag = torch.nn.functional.embedding_bag(ids, torch.eye(6), offsets, mode="sum")
        return bag


def test_the_handler_looks_up_tokens_and_bigrams(tmp_path: Path) -> None:
    vocab = {"<unk>": 0, "do": 1, "not": 2, "do not": 3, "go": 4, "not go": 5}
    torch.save(vocab, tmp_path / "source_vocab.pt")
    context = MockContext(model_pt_file=None, model_dir=str(tmp_path))
    handler = TextClassifier()
    handler.initialize(context)
    rows: Any = [{"data": b"Don't go!"}, {"body": "go away"}]
    ids, offsets = handler.preprocess(rows)
    # do, not, go, "do not", "not go" | go, away (unknown), "go away" (unknown)
    assert ids.tolist() == [1, 2, 4, 3, 5, 4, 0, 0]
    assert offsets.tolist() == [0, 5]
    handler.model = _Bag()
    scores = handler.inference((ids, offsets))
    assert scores.tolist()[1] == [2, 0, 0, 0, 1, 0]
    answers = handler.postprocess(scores)
    assert answers[0]["1"] == pytest.approx(answers[0]["5"])
