"""Close-match suggestions for names a person typed: one rule for every "did you mean".

Settings (``config.properties`` keys, ``FERRY_*`` variables), CLI flags, handler names,
``model-config.yaml`` keys and model names all suggest through these two functions, so a
typo is answered the same way wherever it is made::

    >>> close_matches("defualt_workers_per_model", ["default_workers_per_model", "job_queue_size"])
    ['default_workers_per_model']
    >>> did_you_mean("batchSzie", ["batchSize", "maxBatchDelay"])
    " (did you mean 'batchSize'?)"
    >>> did_you_mean("resnet", ["bert"])
    ''

The cutoff (0.75 of ``difflib``'s similarity ratio) catches a swapped, missing or doubled
letter in names of five letters or more and leaves unrelated names alone; short names are
compared case-insensitively, so ``Batchsize`` still finds ``batchSize``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.75
"""The least ``difflib.SequenceMatcher`` ratio a choice needs to be offered."""


def close_matches(
    word: str, choices: Iterable[str], limit: int = 3, *, cutoff: float = CUTOFF
) -> list[str]:
    """Up to ``limit`` of ``choices`` that look like ``word``, closest first.

    Compared case-insensitively; the choices come back as they were given. ``word`` itself
    is never offered (a name that is already valid needs no suggestion).
    """
    by_folded: dict[str, str] = {}
    for choice in choices:
        if choice != word:
            by_folded.setdefault(choice.casefold(), choice)
    folded = difflib.get_close_matches(word.casefold(), list(by_folded), n=limit, cutoff=cutoff)
    return [by_folded[name] for name in folded]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'X'?)"`` naming the closest of ``choices``, or ``""`` when none is close.

    Meant to be appended to an error or warning message as it stands.
    """
    close = close_matches(word, choices, limit=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
