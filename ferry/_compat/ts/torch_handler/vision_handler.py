from ferry.handlers.image_classifier import VisionHandler

__all__ = ["VisionHandler"]
