"""One rule for every "did you mean": ``ferry.suggest``."""

from __future__ import annotations

import doctest

import ferry.suggest
from ferry.suggest import close_matches, did_you_mean


def test_a_swapped_letter_finds_the_setting() -> None:
    keys = ["default_workers_per_model", "default_response_timeout", "job_queue_size"]
    assert close_matches("defualt_workers_per_model", keys) == ["default_workers_per_model"]


def test_closest_first_and_at_most_limit() -> None:
    names = ["tinystory", "tiny", "tinyst", "tinystories", "resnet"]
    assert close_matches("tinysto", names, limit=2) == ["tinyst", "tinystory"]


def test_case_is_ignored_but_kept_in_the_answer() -> None:
    assert close_matches("Batchsize", ["batchSize", "maxBatchDelay"]) == ["batchSize"]


def test_unrelated_names_get_no_suggestion() -> None:
    assert close_matches("resnet", ["bert", "mnist_gpu"]) == []
    assert did_you_mean("resnet", ["bert"]) == ""


def test_the_word_itself_is_not_offered() -> None:
    assert close_matches("batchSize", ["batchSize"]) == []


def test_did_you_mean_is_a_suffix_for_a_message() -> None:
    hint = did_you_mean("batchSzie", ["batchSize", "maxBatchDelay"])
    assert hint == " (did you mean 'batchSize'?)"


def test_docstring_examples_hold() -> None:
    assert doctest.testmod(ferry.suggest).failed == 0
