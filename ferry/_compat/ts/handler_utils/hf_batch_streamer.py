"""TorchServe compatibility: ``ts.handler_utils.hf_batch_streamer``."""

from ferry.handlers.torchserve.text_streamer import TextIteratorStreamerBatch

__all__ = ["TextIteratorStreamerBatch"]
