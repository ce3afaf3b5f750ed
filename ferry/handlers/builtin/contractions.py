"""English contractions and what TorchServe's text handlers expand them to.

Keys are lower case; :func:`ferry.handlers.builtin.text_normalize.expand_contractions`
matches them in any case. TorchServe's table also lists longer forms built on a shorter
one (``would've`` after ``would``, ``you'll've`` after ``you'll``), but tries its entries
in order and the shorter one always matches first, so those never apply and are left out
here: ``wouldn't've`` becomes ``would not`` followed by ``'ve``, as in TorchServe. A few
expansions start with another letter than their contraction (``ain't``, ``'cause``); the
match keeps its own first character, so they read ``as not`` and ``'ecause``.
``tests/compat/test_text_parity.py`` checks every entry of TorchServe's table against this one.
"""

from __future__ import annotations

_NOT = {
    "ain't": "is not",
    "aren't": "are not",
    "can't": "cannot",
    "couldn't": "could not",
    "didn't": "did not",
    "doesn't": "does not",
    "don't": "do not",
    "hadn't": "had not",
    "hasn't": "has not",
    "haven't": "have not",
    "isn't": "is not",
    "mayn't": "may not",
    "mightn't": "might not",
    "mustn't": "must not",
    "needn't": "need not",
    "oughtn't": "ought not",
    "shan't": "shall not",
    "sha'n't": "shall not",
    "shouldn't": "should not",
    "wasn't": "was not",
    "weren't": "were not",
    "won't": "will not",
    "wouldn't": "would not",
}

_PRONOUN_FORMS = {
    # pronoun: the suffixes it takes in the table ('d would, 'll will, 's is, 're are, 've have)
    "he": ("'d", "'ll", "'s"),
    "i": ("'d", "'ll", "'m", "'ve"),
    "it": ("'d", "'ll", "'s"),
    "she": ("'d", "'ll", "'s"),
    "they": ("'d", "'ll", "'re", "'ve"),
    "we": ("'d", "'ll", "'re", "'ve"),
    "you": ("'d", "'ll", "'re", "'ve"),
    "that": ("'d", "'s"),
    "there": ("'d", "'s"),
    "what": ("'ll", "'re", "'s", "'ve"),
    "who": ("'ll", "'s", "'ve"),
    "where": ("'s", "'ve"),
    "when": ("'s", "'ve"),
    "why": ("'s", "'ve"),
}
_SUFFIX_WORDS = {"'d": "would", "'ll": "will", "'s": "is", "'re": "are", "'ve": "have", "'m": "am"}

_OTHERS = {
    "'cause": "because",
    "could've": "could have",
    "how'd": "how did",
    "how'll": "how will",
    "how's": "how is",
    "let's": "let us",
    "ma'am": "madam",
    "might've": "might have",
    "must've": "must have",
    "o'clock": "of the clock",
    "should've": "should have",
    "so've": "so have",
    "so's": "so as",
    "to've": "to have",
    "where'd": "where did",
    "will've": "will have",
    "would've": "would have",
    "y'all": "you all",
}


def _contractions() -> dict[str, str]:
    table = dict(_NOT)
    for pronoun, suffixes in _PRONOUN_FORMS.items():
        for suffix in suffixes:
            table[pronoun + suffix] = f"{pronoun} {_SUFFIX_WORDS[suffix]}"
    table.update(_OTHERS)
    return table


CONTRACTIONS = _contractions()
"""``{contraction: expansion}``, lower case; no key is the start of another."""
