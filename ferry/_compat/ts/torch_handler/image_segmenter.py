from ferry.handlers.vision_tasks import ImageSegmenter

__all__ = ["ImageSegmenter"]
