"""Generated text, streamed per row of a batch: TorchServe's ``TextIteratorStreamerBatch``
(``ts.handler_utils.hf_batch_streamer``), written for Ferry without transformers.

A model's ``generate(..., streamer=s)`` (Hugging Face's protocol) calls ``s.put(token_ids)``
with the prompt, then with each step's new tokens (one per row), and ``s.end()`` when done,
usually on another thread; the handler iterates ``s`` and sends each step's text with
``send_intermediate_predict_response``::

    streamer = TextIteratorStreamerBatch(tokenizer, batch_size=2, skip_prompt=True)
    Thread(target=model.generate, kwargs={**inputs, "streamer": streamer}).start()
    for texts in streamer:  # [{"text": "Hello "}, {"text": "Bonjour "}]
        send_intermediate_predict_response(texts, request_ids, "ok", 200, context)

Each row decodes as Hugging Face's ``TextIteratorStreamer`` does: text is released a whole
word at a time (up to the last space), at once after a CJK character, and whole at a
newline or at the end. Any tokenizer with ``decode(ids, **kwargs) -> str`` serves.
"""

from __future__ import annotations

import queue
from typing import Any, Protocol


class Tokenizer(Protocol):
    def decode(self, token_ids: list[int], **kwargs: Any) -> str: ...


_END = object()
"""What a row's queue holds after its last text."""

_CJK_BLOCKS = (
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xF900, 0xFAFF),
    (0x20000, 0x2CEAF),
    (0x2F800, 0x2FA1F),
)
"""Unicode's CJK ideograph blocks: such a character is a word of its own."""


def _is_cjk(character: str) -> bool:
    code = ord(character)
    return any(low <= code <= high for low, high in _CJK_BLOCKS)


class TextIteratorStreamer:
    """One row's text, as an iterator fed by ``put``/``end`` from the generating thread.
    ``skip_prompt``: drop the first ``put`` (the prompt's tokens); ``timeout``: seconds
    iteration waits for the next text before ``queue.Empty`` (None: forever);
    ``decode_kwargs`` go to ``tokenizer.decode`` (``skip_special_tokens=True`` ...)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        skip_prompt: bool = False,
        timeout: float | None = None,
        **decode_kwargs: Any,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_prompt = skip_prompt
        self.timeout = timeout
        self.decode_kwargs = decode_kwargs
        self.texts: queue.Queue[object] = queue.Queue()
        self._tokens: list[int] = []
        self._released = 0  # characters of the decoded tokens already released
        self._next_is_prompt = True

    def put(self, value: Any) -> None:
        """One row's token ids: a 1-D tensor, or 2-D with one row."""
        shape = tuple(value.shape)
        if len(shape) > 1:
            if shape[0] > 1:
                raise ValueError(f"a row's streamer takes one row of tokens, got shape {shape}")
            value = value[0]
        if self.skip_prompt and self._next_is_prompt:
            self._next_is_prompt = False
            return
        self._next_is_prompt = False
        self._tokens.extend(int(token) for token in value.tolist())
        text = self.tokenizer.decode(self._tokens, **self.decode_kwargs)
        self.texts.put(self._releasable(text), timeout=self.timeout)

    def end(self) -> None:
        """Release what is held back, then end the iteration."""
        text = ""
        if self._tokens:
            text = self.tokenizer.decode(self._tokens, **self.decode_kwargs)[self._released :]
        self._tokens, self._released = [], 0
        self._next_is_prompt = True
        self.texts.put(text, timeout=self.timeout)
        self.texts.put(_END, timeout=self.timeout)

    def _releasable(self, text: str) -> str:
        """The part of ``text`` (all tokens so far, decoded) ready to go out now: a token
        may still change how the last, unfinished word decodes."""
        if text.endswith("\n"):
            ready = text[self._released :]
            self._tokens, self._released = [], 0
            return ready
        if text and _is_cjk(text[-1]):
            ready = text[self._released :]
        else:
            ready = text[self._released : text.rfind(" ") + 1]
        self._released += len(ready)
        return ready

    def __iter__(self) -> TextIteratorStreamer:
        return self

    def __next__(self) -> str:
        text = self.texts.get(timeout=self.timeout)
        if text is _END:
            raise StopIteration
        assert isinstance(text, str)
        return text


class TextIteratorStreamerBatch:
    """A ``TextIteratorStreamer`` per row of a batch of ``batch_size``: ``put`` takes the
    batch's tokens (first dimension ``batch_size``); iterating yields, per step, a list of
    ``{"text": ...}``, one per row, and stops when any row has ended."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        batch_size: int,
        skip_prompt: bool = False,
        timeout: float | None = None,
        **decode_kwargs: Any,
    ) -> None:
        self.batch_size = batch_size
        self.streamers = [
            TextIteratorStreamer(tokenizer, skip_prompt, timeout, **decode_kwargs)
            for _ in range(batch_size)
        ]

    def put(self, value: Any) -> None:
        if value.shape[0] != self.batch_size:
            raise ValueError(
                f"TextIteratorStreamerBatch batch size is set to {self.batch_size} "
                f"but got input tensor of shape {tuple(value.shape)}"
            )
        for index, streamer in enumerate(self.streamers):
            streamer.put(value[index : index + 1])

    def end(self) -> None:
        for streamer in self.streamers:
            streamer.end()

    def __iter__(self) -> TextIteratorStreamerBatch:
        return self

    def __next__(self) -> list[dict[str, str]]:
        texts = [next(streamer, None) for streamer in self.streamers]
        if any(text is None for text in texts):
            raise StopIteration
        return [{"text": text} for text in texts if text is not None]
