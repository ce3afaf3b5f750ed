from ferry.handlers.builtin.vision_tasks import ObjectDetector

__all__ = ["ObjectDetector"]
