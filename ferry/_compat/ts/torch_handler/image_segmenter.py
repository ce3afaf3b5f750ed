from ferry.handlers.builtin.vision_tasks import ImageSegmenter

__all__ = ["ImageSegmenter"]
