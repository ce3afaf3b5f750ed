"""``TextIteratorStreamerBatch`` (``ts.handler_utils.hf_batch_streamer``): per row, the
text Hugging Face's ``TextIteratorStreamer`` would release, a whole word at a time."""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest
import torch

from ferry.handlers.torchserve.text_streamer import TextIteratorStreamer, TextIteratorStreamerBatch

PAD = 0


class CharTokenizer:
    """One id per character; 0 is a special token (padding)."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: list[int], **kwargs: Any) -> str:
        skip = kwargs.get("skip_special_tokens", False)
        return "".join(chr(i) for i in token_ids if not (skip and i == PAD))


def column_by_column(streamer: Any, rows: list[str]) -> None:
    """Feed ``rows`` one token per row a step, as ``generate`` does, then end."""
    width = max(len(r) for r in rows)
    ids = [CharTokenizer().encode(r) + [PAD] * (width - len(r)) for r in rows]
    for step in range(width):
        streamer.put(torch.tensor([row[step] for row in ids]))
    streamer.end()


def test_each_rows_text_comes_back_whole_and_in_step() -> None:
    """TorchServe's own test of the batch streamer, with a tokenizer of our own."""
    streamer = TextIteratorStreamerBatch(CharTokenizer(), batch_size=2, skip_special_tokens=True)
    column_by_column(streamer, ["hello world", "good day"])
    steps = list(streamer)
    assert all(len(step) == 2 for step in steps)
    assert "".join(step[0]["text"] for step in steps) == "hello world"
    assert "".join(step[1]["text"] for step in steps) == "good day"


def test_text_is_released_a_word_at_a_time() -> None:
    streamer = TextIteratorStreamerBatch(CharTokenizer(), batch_size=1)
    column_by_column(streamer, ["ab cd\nef"])
    released = [step[0]["text"] for step in streamer]
    assert [text for text in released if text] == ["ab ", "cd\n", "ef"]


def test_a_cjk_character_is_released_at_once() -> None:
    streamer = TextIteratorStreamer(CharTokenizer())
    column_by_column(streamer, ["日本"])
    assert list(streamer) == ["日", "本", ""]


def test_skip_prompt_drops_the_first_put_only() -> None:
    streamer = TextIteratorStreamerBatch(CharTokenizer(), batch_size=2, skip_prompt=True)
    streamer.put(torch.tensor([CharTokenizer().encode("hi "), CharTokenizer().encode("yo ")]))
    column_by_column(streamer, ["ok ", "no "])
    steps = list(streamer)
    assert ["".join(step[i]["text"] for step in steps) for i in (0, 1)] == ["ok ", "no "]


def test_generation_on_another_thread_streams_as_it_goes() -> None:
    streamer = TextIteratorStreamerBatch(CharTokenizer(), batch_size=1, timeout=5)
    go_on = threading.Event()

    def generate() -> None:
        for token in CharTokenizer().encode("one "):
            streamer.put(torch.tensor([token]))
        go_on.wait(5)
        streamer.put(torch.tensor([ord("2")]))
        streamer.end()

    thread = threading.Thread(target=generate)
    thread.start()
    texts = iter(streamer)
    assert [next(texts)[0]["text"] for _ in range(4)] == ["", "", "", "one "]
    go_on.set()
    assert [step[0]["text"] for step in texts] == ["", "2"]
    thread.join()


def test_a_batch_of_the_wrong_size_is_refused() -> None:
    streamer = TextIteratorStreamerBatch(CharTokenizer(), batch_size=2)
    with pytest.raises(ValueError, match="batch size is set to 2 but got input tensor of shape"):
        streamer.put(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="one row of tokens"):
        TextIteratorStreamer(CharTokenizer()).put(torch.tensor([[1], [2]]))


def test_a_timeout_ends_a_wait_for_text_that_never_comes() -> None:
    streamer = TextIteratorStreamerBatch(CharTokenizer(), batch_size=1, timeout=0.01)
    with pytest.raises(queue.Empty):
        next(streamer)
