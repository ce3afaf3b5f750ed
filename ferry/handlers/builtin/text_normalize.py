"""Text to tokens, step by step as TorchServe 0.12's ``TextClassifier`` does it.

TorchServe's text handlers clean a text, tokenise it with torchtext's ``basic_english``
tokenizer (TorchServe 0.12 carries its own version, with no torchtext) and add its n-grams:

>>> text_tokens("<p>Bloomberg doesn't publish.</p>")
['bloomberg', 'does', 'not', 'publish']
>>> with_ngrams(['here', 'we', 'are'], 2)
['here', 'we', 'are', 'here we', 'we are']

Written from the documented behaviour; ``tests/compat/test_text_parity.py`` runs TorchServe's
own handler beside these functions.
"""

from __future__ import annotations

import re
import string
import unicodedata

from ferry.handlers.builtin.contractions import CONTRACTIONS

_MARKUP = re.compile(r"<.*?>|&(?:[a-z0-9]+|#[0-9]{1,6}|#x[0-9a-f]{1,6});")
"""A tag on one line, or a character reference (``&amp;``, ``&#39;``, ``&#x27;``) in lower
case; TorchServe's pattern, applied before the text is lower-cased."""

_CONTRACTION = re.compile(
    "|".join(re.escape(key) for key in sorted(CONTRACTIONS)), flags=re.IGNORECASE
)
_PUNCTUATION = str.maketrans("", "", string.punctuation)

# torchtext's basic_english: each pattern replaced in turn, then split on whitespace.
_BASIC_ENGLISH = [
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"'", " '  "),
        (r'"', ""),
        (r"\.", " . "),
        (r"<br />", " "),
        (r",", " , "),
        (r"\(", " ( "),
        (r"\)", " ) "),
        (r"!", " ! "),
        (r"\?", " ? "),
        (r";", " "),
        (r":", " "),
        (r"\s+", " "),
    )
]


def remove_markup(text: str) -> str:
    """Drop HTML tags and character references (not decoded: ``&amp;`` leaves nothing)."""
    return _MARKUP.sub("", text)


def expand_contractions(text: str) -> str:
    """``don't`` to ``do not``, in any case and anywhere in a word (``CONTRACTIONS``), then
    every remaining ``'`` dropped. The expansion keeps the match's first character
    (``Don't`` reads ``Do not``)."""

    def expanded(match: re.Match[str]) -> str:
        found = match.group(0)
        return found[0] + CONTRACTIONS[found.lower()][1:]

    return _CONTRACTION.sub(expanded, text).replace("'", "")


def remove_accents(text: str) -> str:
    """Compatibility decomposition, then only ASCII kept: ``café`` to ``cafe``; characters
    with no ASCII base (``€``, the right quote U+2019, CJK) vanish."""
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def remove_punctuation(text: str) -> str:
    """Drop every character of ``string.punctuation`` (no space put in its place)."""
    return text.translate(_PUNCTUATION)


def basic_english(text: str) -> list[str]:
    """torchtext's ``basic_english`` tokenizer: lower case; ``.`` ``,`` ``(`` ``)`` ``!``
    ``?`` and ``'`` split off as tokens of their own; ``"`` dropped; ``;``, ``:`` and
    ``<br />`` read as spaces; then split on whitespace.

    >>> basic_english('You can now install TorchText using pip!')
    ['you', 'can', 'now', 'install', 'torchtext', 'using', 'pip', '!']
    """
    line = text.lower()
    for pattern, replacement in _BASIC_ENGLISH:
        line = pattern.sub(replacement, line)
    return line.split()


def text_tokens(text: str) -> list[str]:
    """TorchServe's ``TextClassifier.preprocess`` up to the vocabulary: markup removed,
    lower case, contractions expanded, accents and punctuation removed, ``basic_english``."""
    text = remove_markup(text).lower()
    text = remove_punctuation(remove_accents(expand_contractions(text)))
    return basic_english(text)


def with_ngrams(tokens: list[str], n: int) -> list[str]:
    """The tokens, then every run of 2, then of 3, ... up to ``n`` tokens joined by a space
    (torchtext's ``ngrams_iterator`` order)."""
    grams = list(tokens)
    for size in range(2, n + 1):
        grams += [" ".join(tokens[i : i + size]) for i in range(len(tokens) - size + 1)]
    return grams
