"""Several requests of one batch through one ``predict_fn`` call.

The toolkit runs every request alone, even when TorchServe hands it a batch. Ferry, given
a batch of several requests (the model's ``batchSize`` above 1), decodes each with
``input_fn``, then calls ``predict_fn`` once for each group of inputs that stack:
tensors of two or more dimensions, equal in every dimension but the first, of one dtype
and on one device. They are concatenated along the first dimension; the prediction must
be a tensor whose first dimension is the group's total, and is split back by each
request's row count (``split_rows``) for that request's ``output_fn``.

    >>> groups = stackable_groups({0: torch.ones(1, 4), 1: torch.ones(3, 4), 2: torch.ones(4)})
    >>> groups
    [[0, 1]]
    >>> [part.shape[0] for part in split_rows(torch.zeros(4, 2), [1, 3]) or []]
    [1, 3]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

StackKey = tuple[tuple[int, ...], torch.dtype, torch.device]


def stack_key(value: Any) -> StackKey | None:
    """What inputs must share to be concatenated: their trailing shape, dtype and device;
    None for anything but a tensor of two or more dimensions (a 1-D tensor is one
    sample to many models, not rows)."""
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return None
    return tuple(value.shape[1:]), value.dtype, value.device


def stackable_groups(inputs: Mapping[int, Any]) -> list[list[int]]:
    """The keys of ``inputs`` that stack together, in groups of two or more, each group in
    the inputs' order."""
    groups: dict[StackKey, list[int]] = {}
    for index, value in inputs.items():
        key = stack_key(value)
        if key is not None:
            groups.setdefault(key, []).append(index)
    return [group for group in groups.values() if len(group) > 1]


def split_rows(prediction: Any, sizes: Sequence[int]) -> list[Any] | None:
    """``prediction`` cut into one part per input, of ``sizes`` rows each; None when it
    is not a tensor whose first dimension is their sum (then the prediction is not one
    row per input row, and the inputs must run alone)."""
    if not isinstance(prediction, torch.Tensor) or prediction.dim() == 0:
        return None
    if prediction.shape[0] != sum(sizes):
        return None
    return list(torch.split(prediction, list(sizes)))
