"""TorchServe 0.12's own ``TextClassifier.preprocess`` (run in its environment, from the
installed ``ts`` package) beside Ferry's: the same tokens and bigrams, in the same order,
for every entry of TorchServe's contraction table and texts with markup, accents and
punctuation. The served answers are compared in tests/compat/test_builtin_text_classifier.py.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from ferry.handlers.builtin.text_classifier import TextClassifier
from ferry.handlers.builtin.text_normalize import basic_english, text_tokens, with_ngrams
from tests.fixtures.torchserve import VENV_VARIABLE, torchserve_available

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(
        torchserve_available() is None,
        reason=f"no TorchServe 0.12 environment (run scripts/torchserve-venv.sh or set "
        f"{VENV_VARIABLE})",
    ),
]

# Each text through TorchServe's preprocess, with a vocabulary that numbers every token or
# n-gram it is asked for, so that the ids read back as the strings looked up.
_TORCHSERVE = """
import json, sys
import torch
from ts.handler_utils.text_utils import get_tokenizer
from ts.torch_handler.contractions import CONTRACTION_MAP
from ts.torch_handler.text_classifier import TextClassifier

class Numbering(dict):
    def __missing__(self, key):
        self[key] = len(self)
        return self[key]

texts = json.load(sys.stdin)
handler = TextClassifier()
handler.device = torch.device("cpu")
looked_up = []
for text in texts:
    handler.source_vocab = Numbering()
    ids, _ = handler.preprocess([{"body": text.encode()}])
    names = {index: key for key, index in handler.source_vocab.items()}
    looked_up.append([names[i] for i in ids.tolist()])
tokenize = get_tokenizer("basic_english")
json.dump({
    "contractions": list(CONTRACTION_MAP),
    "ngrams": TextClassifier.ngrams,
    "looked_up": looked_up,
    "basic_english": [tokenize(text) for text in texts],
}, sys.stdout)
"""

TEXTS = [
    "Bloomberg has decided to publish a new report on the world's economic situation.",
    "<p>The <b>Café</b> &amp; bar&#39;s menu &#x27;naïve&#x27;: 3 courses, (cheap)!</p>",
    "It\u2019s \u201cquoted\u201d \u2014 with ½ a dash… and €5 東京 and tabs\tand\nnew lines",
    "&AMP; upper-case references <stay\nacross lines> y'all'd've o'clock 'cause",
    "Don't WON'T can't've sha'n't isn'tit rock 'n' roll's ain't",
    "",
    "!!! ... ???",
    'He said "no." a:b;c<br />d',
]


def _torchserve(texts: list[str]) -> dict[str, object]:
    venv = torchserve_available()
    assert venv is not None
    answer = subprocess.run(
        [str(venv / "bin" / "python"), "-c", _TORCHSERVE],
        input=json.dumps(texts),
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result: dict[str, object] = json.loads(answer.stdout)
    return result


@pytest.fixture(scope="module")
def contraction_texts() -> list[str]:
    """Every contraction of TorchServe's table, in lower, title and upper case, in a
    sentence."""
    keys = _torchserve([])["contractions"]
    assert isinstance(keys, list) and len(keys) > 100
    return [f"so {case} then" for key in keys for case in (key.lower(), key.title(), key.upper())]


def test_the_same_tokens_and_bigrams_are_looked_up(contraction_texts: list[str]) -> None:
    texts = TEXTS + contraction_texts
    theirs = _torchserve(texts)
    assert theirs["ngrams"] == TextClassifier.ngrams == 2
    ours = [with_ngrams(text_tokens(text), TextClassifier.ngrams) for text in texts]
    looked_up = theirs["looked_up"]
    assert isinstance(looked_up, list)
    differing = [(t, a, b) for t, a, b in zip(texts, looked_up, ours, strict=True) if a != b]
    assert not differing, differing[:5]


def test_basic_english_splits_punctuation_as_torchserves() -> None:
    assert _torchserve(TEXTS)["basic_english"] == [basic_english(text) for text in TEXTS]
