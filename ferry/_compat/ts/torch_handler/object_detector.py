from ferry.handlers.vision_tasks import ObjectDetector

__all__ = ["ObjectDetector"]
